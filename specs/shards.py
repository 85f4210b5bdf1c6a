"""The Merkle-style digest of a sharded data set and the cache identity of each group: pure
functions shared by the spec's validator (the `digest` must be the root of the pinned shards), the
renderer (one memoized fan-out item per group) and the runtimes (which check what they read).

A sharded data set is an ordered list of Parquet shards, grouped into groups of ``groupSize``
consecutive shards. Its digest is two levels deep:

    shard digest  = sha256 of the file (what `sha256sum` prints)
    group digest  = sha256 over "<shard digest>\\n" of the group's shards, in order
    root digest   = sha256 over "<group digest>\\n" of the groups, in order

so a changed shard changes its group's digest and the root, and leaves every other group's digest
(and so the cache key of the step that prepares that group) as it was.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def combine(digests: Sequence[str]) -> str:
    """One level of the tree: the digest of an ordered list of digests."""
    return "sha256:" + hashlib.sha256("".join(f"{d}\n" for d in digests).encode()).hexdigest()


def groups_of(items: Sequence[T], group_size: int) -> list[list[T]]:
    """Consecutive runs of ``group_size`` items (the last one may be shorter)."""
    return [list(items[i : i + group_size]) for i in range(0, len(items), group_size)]


def group_digests(shard_digests: Sequence[str], group_size: int) -> list[str]:
    return [combine(g) for g in groups_of(shard_digests, group_size)]


def root_digest(shard_digests: Sequence[str], group_size: int) -> str:
    """The data set's digest: the root of the tree over its shards' digests, in order."""
    return combine(group_digests(shard_digests, group_size))


def group_identity(group_digest: str, first_shard: int, settings: dict[str, Any]) -> str:
    """What a prepared group's content depends on: its shards (the group digest), where they sit
    in the data set (a row's split is drawn from a generator seeded by its shard's index) and the
    preparation settings (label, features, clips, splits, seed). 32 hex digits, used as the
    group's folder name on the workspace, so a group prepared once is found again by any version
    whose group is the same, whatever the rest of the data set became."""
    text = json.dumps({"group": group_digest, "first": first_shard, "settings": settings}, sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def changed_groups(old: Sequence[str], new: Sequence[str]) -> list[int]:
    """Indexes of the groups of ``new`` whose digest differs from ``old``'s at the same index."""
    return [i for i, d in enumerate(new) if i >= len(old) or old[i] != d]


__all__ = ["changed_groups", "combine", "group_digests", "group_identity", "groups_of", "root_digest"]


def labels_shard_name(glob: str, file_digest: str) -> str | None:
    """The name of a shard of merged labels (`forgectl labels merge`): ``labels-<12 hex of its
    digest>.parquet``, or the source's glob with its one ``*`` replaced by ``labels-<12 hex>`` when
    that plain name would not match the glob (``part-*.parquet`` → ``part-labels-….parquet``);
    None when neither matches."""
    import fnmatch

    short = file_digest.removeprefix("sha256:")[:12]
    plain = f"labels-{short}.parquet"
    if fnmatch.fnmatchcase(plain, glob):
        return plain
    if glob.count("*") == 1 and not any(c in glob for c in "?["):
        named = glob.replace("*", f"labels-{short}")
        if fnmatch.fnmatchcase(named, glob):
            return named
    return None
