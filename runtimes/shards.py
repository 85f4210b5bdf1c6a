"""Sharded, streaming preparation: the core of issue 18's last item (not yet a Dataset field nor a
rendered step — see docs/runtimes.md, "Sharded preparation").

A sharded data set is an ordered list of Parquet shards, grouped into groups of consecutive
shards. Its digest is Merkle-style, two levels deep:

    shard digest  = sha256 of the file (what `sha256sum` prints)
    group digest  = sha256 over "<shard digest>\\n" of the group's shards, in order
    root digest   = sha256 over "<group digest>\\n" of the groups, in order

so a changed shard changes its group's digest and the root, and leaves every other group's digest
— and so the cache key of a step that prepares that group — as it was.

:func:`prepare_group` streams a group's shards with pyarrow's dataset scanner, batch by batch:
each shard's digest is checked (hashed in 1 MiB chunks), its rows are clipped and split
(train/validation/test by a generator seeded by (seed, shard index), so a row's split depends
only on its shard and position), and each split is written to ``<split>/<shard>.parquet`` with a
``ParquetWriter`` closed at the end of the shard. Nothing holds more than one batch: the peak memory is set by ``batch_rows``
and the number of columns, not by the data's size (``bench/prepare.py`` measures it).

``python -m runtimes.shards --help`` runs it on one group (the benchmark's child process).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CHUNK = 1 << 20
SPLITS = ("train", "validation", "test")


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def combine(digests: Sequence[str]) -> str:
    """One level of the tree: the digest of an ordered list of digests."""
    return "sha256:" + hashlib.sha256("".join(f"{d}\n" for d in digests).encode()).hexdigest()


def groups_of(items: Sequence[Any], group_size: int) -> list[list[Any]]:
    return [list(items[i : i + group_size]) for i in range(0, len(items), group_size)]


def tree(shard_digests: Sequence[str], group_size: int) -> dict[str, Any]:
    """``{"groups": [group digest…], "root": root digest}`` of shard digests in order."""
    groups = [combine(g) for g in groups_of(shard_digests, group_size)]
    return {"groups": groups, "root": combine(groups)}


class _SplitFiles:
    """The split files of the shard being read, ``<split>/<shard>.parquet``: each opened on its
    first rows, all closed with the shard (one file per shard and split: a writer keeps every row
    group's metadata until it closes, which would grow with the data); rows counted per split."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.writers: dict[str, Any] = {}
        self.rows = dict.fromkeys(SPLITS, 0)

    def write(self, stem: str, batch: Any, which: Any) -> None:
        """Each row of ``batch`` into the split ``which`` names for it (an index into SPLITS)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        for i, name in enumerate(SPLITS):
            mask = which == i
            if not mask.any():
                continue
            part = batch.filter(pa.array(mask))
            if name not in self.writers:
                (self.output / name).mkdir(exist_ok=True)
                self.writers[name] = pq.ParquetWriter(self.output / name / f"{stem}.parquet", part.schema, use_dictionary=False)
            self.writers[name].write_batch(part)
            self.rows[name] += part.num_rows

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()


def _clipped(batch: Any, label: str, clip: tuple[float, float]) -> Any:
    """The record batch with every floating-point column but the label clipped to [min, max]."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arrays = []
    for name, column in zip(batch.schema.names, batch.columns):
        if name != label and pa.types.is_floating(column.type):
            column = pc.max_element_wise(pc.min_element_wise(column, clip[1]), clip[0])
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def prepare_group(shards: Sequence[Path], digests: Sequence[str] | None, output: Path, label: str,
                  splits: tuple[float, float, float] = (0.8, 0.1, 0.1), seed: int = 0, first_index: int = 0,
                  clip: tuple[float, float] | None = None, batch_rows: int = 16_384) -> dict[str, Any]:
    """Stream one group of shards into ``output/{train,validation,test}/<shard>.parquet``; return counts,
    bytes read, seconds and the group digest."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.dataset as ds
    from pyarrow.fs import LocalFileSystem

    from runtimes.errors import DigestMismatch

    output.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    files = _SplitFiles(output)
    bytes_read = 0
    seen: list[str] = []
    edges = np.cumsum(splits)
    try:
        for offset, path in enumerate(shards):
            digest = file_digest(path)
            if digests is not None and digest != digests[offset]:
                raise DigestMismatch(f"shard {path.name}: digest {digest} differs from the pinned {digests[offset]}")
            seen.append(digest)
            bytes_read += path.stat().st_size
            rng = np.random.default_rng([seed, first_index + offset])
            # No read-ahead and no pre-buffering: by default the scanner buffers whole row groups of
            # several fragments ahead (hundreds of MiB), the opposite of a bounded stream.
            scanner = ds.dataset(str(path), format="parquet", filesystem=LocalFileSystem(use_mmap=False)).scanner(
                batch_size=batch_rows, use_threads=False, batch_readahead=0, fragment_readahead=0,
                fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=False))
            for batch in scanner.to_batches():
                if batch.num_rows == 0:
                    continue
                if clip is not None:
                    batch = _clipped(batch, label, clip)
                draw = rng.random(batch.num_rows)
                files.write(path.stem, batch, np.searchsorted(edges, draw, side="right").clip(0, 2))
            files.close()
            del scanner
            pa.default_memory_pool().release_unused()  # hand the shard's buffers back to the OS
    finally:
        files.close()
    seconds = time.perf_counter() - start
    return {"shards": len(shards), "rows": files.rows, "bytes": bytes_read, "seconds": round(seconds, 3),
            "mbPerSecond": round(bytes_read / 1e6 / seconds, 1) if seconds > 0 else None, "groupDigest": combine(seen)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtimes.shards", description="Stream one group of Parquet shards into splits.")
    parser.add_argument("shards", nargs="+", type=Path)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--label", required=True)
    parser.add_argument("--batch-rows", type=int, default=16_384)
    parser.add_argument("--clip", type=float, nargs=2, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = prepare_group(args.shards, None, args.output, args.label, seed=args.seed,
                           clip=tuple(args.clip) if args.clip else None, batch_rows=args.batch_rows)
    # VmHWM, this process's own peak: ru_maxrss would carry over the parent's resident set from
    # before the exec (Linux keeps it across fork and execve).
    status = Path("/proc/self/status").read_text()
    result["peakRssBytes"] = int(status.split("VmHWM:")[1].split()[0]) * 1024
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
