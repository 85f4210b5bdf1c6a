"""Assignment keys → arms by their first three hex digits (renderers/keybuckets.py): every bucket
belongs to exactly one arm, in proportion to the shares, and the regular expressions the route
carries pick exactly the keys of their arm's range — checked over all 4,096 prefixes, in both
cases, and on keys that have no hex prefix."""

from __future__ import annotations

import re

import pytest

from renderers.keybuckets import BUCKETS, arm_buckets, bucket_of, prefix_pattern

SHARES = [
    [("a", 50), ("b", 50)],
    [("control", 70), ("treatment", 30)],
    [("a", 1), ("b", 33), ("c", 33), ("d", 33)],
    [("a", 99), ("b", 1)],
    [("a", 0), ("b", 100)],
]


@pytest.mark.parametrize("shares", SHARES, ids=lambda s: "-".join(str(w) for _, w in s))
def test_the_ranges_cover_every_bucket_once_in_proportion(shares: list[tuple[str, int]]) -> None:
    ranges = arm_buckets(shares)
    assert ranges[0][1] == 0 and ranges[-1][2] == BUCKETS
    assert all(a[2] == b[1] for a, b in zip(ranges, ranges[1:], strict=False))  # contiguous, no overlap
    width = {arm: hi - lo for arm, lo, hi in ranges}
    for arm, share in shares:
        assert abs(width.get(arm, 0) / BUCKETS - share / 100) <= 1 / BUCKETS, (arm, width)
    assert "a" not in width or dict(shares)["a"] > 0  # an arm at 0 owns no bucket


@pytest.mark.parametrize("shares", SHARES, ids=lambda s: "-".join(str(w) for _, w in s))
def test_each_prefix_matches_the_pattern_of_its_own_arm_only(shares: list[tuple[str, int]]) -> None:
    patterns = {arm: re.compile("^" + prefix_pattern(lo, hi)) for arm, lo, hi in arm_buckets(shares)}
    owner = {b: arm for arm, lo, hi in arm_buckets(shares) for b in range(lo, hi)}
    for bucket in range(BUCKETS):
        for key in (f"{bucket:03x}-rest-of-key", f"{bucket:03X}9"):
            matched = [arm for arm, p in patterns.items() if p.match(key)]
            assert matched == [owner[bucket]], (key, matched)
            assert bucket_of(key) == bucket


def test_keys_without_a_hex_prefix_match_no_arm() -> None:
    patterns = [re.compile("^" + prefix_pattern(lo, hi)) for _, lo, hi in arm_buckets([("a", 50), ("b", 50)])]
    for key in ("", "ab", "user-42", "xyz123", "0g1", " abc"):
        assert not any(p.match(key) for p in patterns), key
        assert bucket_of(key) is None


def test_a_range_outside_the_buckets_is_refused() -> None:
    with pytest.raises(ValueError, match="not within"):
        prefix_pattern(10, 10)
    with pytest.raises(ValueError, match="not within"):
        prefix_pattern(0, BUCKETS + 1)
