"""A caller's assignment key → one experiment arm, as a gateway can decide it with regular
expressions alone: the arm is chosen by the key's first :data:`KEY_DIGITS` hex digits.

A Gateway API `HTTPRoute` cannot hash a header (its matches are `Exact` and `RegularExpression`;
`sessionPersistence` is experimental-channel and not implemented by Traefik's provider). What it
can do is match a *prefix*: if callers send a key that is already uniformly spread (a UUID, or a
hex digest of the user id), its first three hex digits are a bucket in ``0 … 4095``, and each arm
owns a contiguous range of buckets proportional to its share. One key always lands in one bucket,
so in one arm (sticky); 1,000 users spread over the arms by the shares. A key that does not start
with three hex digits matches no arm's pattern and is split per request like a caller without one.

:func:`arm_buckets` cuts the ranges; :func:`prefix_pattern` writes the regular expression
(RE2-compatible: the Gateway API's implementations use Go's `regexp`, Python's `re` reads it the
same) matching the keys of one range, in either case.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Hex digits of the key that choose the bucket: 4,096 buckets, so an integer share is met to 0.025 %.
KEY_DIGITS = 3
BUCKETS = 16**KEY_DIGITS
_HEX = "0123456789abcdef"


def arm_buckets(shares: Sequence[tuple[str, int]]) -> list[tuple[str, int, int]]:
    """(arm, first bucket, last bucket + 1) of each arm with a share (percent, as the route's
    weights), in the order given: contiguous ranges covering ``0 … BUCKETS``, an arm's width its
    part of the shares' sum (rounded at the cumulative bounds, so no bucket is lost or shared); an
    arm at 0 gets none, and no shares at all give no ranges."""
    total = sum(share for _, share in shares)
    if total <= 0:
        return []
    out: list[tuple[str, int, int]] = []
    cumulative = 0
    for arm, share in shares:
        lo = round(BUCKETS * cumulative / total)
        cumulative += share
        hi = round(BUCKETS * cumulative / total)
        if hi > lo:
            out.append((arm, lo, hi))
    return out


def bucket_of(key: str) -> int | None:
    """The bucket of ``key`` (its first :data:`KEY_DIGITS` hex digits), None when it has none: what
    the patterns of :func:`prefix_pattern` decide, written out for tests and tools."""
    head = key[:KEY_DIGITS].lower()
    if len(head) < KEY_DIGITS or any(c not in _HEX for c in head):
        return None
    return int(head, 16)


def _digits(lo: int, hi: int) -> str:
    """A character class for the hex digits ``lo … hi`` (inclusive), upper and lower case."""
    if lo == 0 and hi == 15:
        return "[0-9a-fA-F]"
    if lo == hi and lo < 10:
        return str(lo)
    parts: list[str] = []
    dec_lo, dec_hi = lo, min(hi, 9)
    if dec_lo <= dec_hi:
        parts.append(str(dec_lo) if dec_lo == dec_hi else f"{dec_lo}-{dec_hi}")
    let_lo, let_hi = max(lo, 10), hi
    if let_lo <= let_hi:
        a, b = _HEX[let_lo], _HEX[let_hi]
        parts.append(f"{a}{a.upper()}" if a == b else f"{a}-{b}{a.upper()}-{b.upper()}")
    return "[" + "".join(parts) + "]"


def _alternatives(lo: int, hi: int, width: int) -> list[str]:
    """Patterns of ``width`` hex digits whose value lies in ``lo … hi`` (inclusive): the range
    split at digit boundaries, as a numeric range is turned into a regular expression."""
    if width == 0:
        return [""]
    step = 16 ** (width - 1)
    lo_digit, lo_rest = divmod(lo, step)
    hi_digit, hi_rest = divmod(hi, step)
    if lo_digit == hi_digit:
        return [_digits(lo_digit, lo_digit) + p for p in _alternatives(lo_rest, hi_rest, width - 1)]
    out: list[str] = []
    first, last = lo_digit, hi_digit
    if lo_rest != 0:  # a partial first digit
        out += [_digits(lo_digit, lo_digit) + p for p in _alternatives(lo_rest, step - 1, width - 1)]
        first += 1
    tail: list[str] = []
    if hi_rest != step - 1:  # a partial last digit
        tail = [_digits(hi_digit, hi_digit) + p for p in _alternatives(0, hi_rest, width - 1)]
        last -= 1
    if first <= last:
        out.append(_digits(first, last) + "[0-9a-fA-F]" * (width - 1))
    return out + tail


def prefix_pattern(lo: int, hi: int) -> str:
    """The part of a regular expression that matches a key whose bucket is in ``lo … hi - 1``
    (a range of :func:`arm_buckets`), not anchored: the caller puts it after ``^`` (a header) or
    after the cookie's name."""
    if not 0 <= lo < hi <= BUCKETS:
        raise ValueError(f"bucket range {lo}…{hi} is not within 0…{BUCKETS}")
    return "(?:" + "|".join(_alternatives(lo, hi - 1, KEY_DIGITS)) + ")"
