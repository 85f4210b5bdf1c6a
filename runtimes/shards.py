"""Sharded, streaming preparation: the core of a sharded Dataset's `prepare-group` steps
(runtimes/shard_steps.py; docs/runtimes.md, "Sharded preparation").

The digest is Merkle-style (shard → group → root; specs/shards.py, shared with the spec's
validator and the renderer), so a changed shard changes its group's digest and the root, and
leaves every other group's digest — and so the cache key of the step that prepares that group —
as it was.

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
from pathlib import Path, PurePosixPath
from typing import Any

from specs.shards import combine, group_digests, groups_of

CHUNK = 1 << 20
SPLITS = ("train", "validation", "test")
Clip = tuple[float, float, Sequence[str] | None]
"""A clip of the features: (min, max, the columns; None: every floating-point column but the label)."""

__all__ = ["combine", "file_digest", "groups_of", "prepare_group", "tree"]


def file_digest(path: Path | str, filesystem: Any = None) -> str:
    """sha256 of a file, read in 1 MiB chunks: a local path, or a path of a pyarrow filesystem (S3)."""
    h = hashlib.sha256()
    if filesystem is None:
        with Path(path).open("rb") as fh:
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                h.update(chunk)
    else:
        with filesystem.open_input_stream(str(path)) as stream:
            while chunk := stream.read(CHUNK):
                h.update(chunk)
    return "sha256:" + h.hexdigest()


def tree(shard_digests: Sequence[str], group_size: int) -> dict[str, Any]:
    """``{"groups": [group digest…], "root": root digest}`` of shard digests in order."""
    groups = group_digests(shard_digests, group_size)
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


def _clipped(batch: Any, label: str, clips: Sequence[Clip]) -> Any:
    """The record batch with its features clipped to [min, max], clip by clip: the named columns,
    or every floating-point column but the label."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arrays = list(batch.columns)
    for low, high, columns in clips:
        for i, (name, column) in enumerate(zip(batch.schema.names, arrays)):
            chosen = name in columns if columns else name != label and pa.types.is_floating(column.type)
            if chosen:
                arrays[i] = pc.max_element_wise(pc.min_element_wise(column, high), low)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


class _LabelStats:
    """The label column's range and whether every value is integral (the join decides the task)."""

    def __init__(self) -> None:
        self.low: float | None = None
        self.high: float | None = None
        self.integral = True

    def add(self, column: Any) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if column.null_count:
            from runtimes.errors import StepFailed

            raise StepFailed("the label column has missing values")
        bounds = pc.min_max(column).as_py()
        if bounds["min"] is None:
            return
        self.low = bounds["min"] if self.low is None else min(self.low, bounds["min"])
        self.high = bounds["max"] if self.high is None else max(self.high, bounds["max"])
        if self.integral and not pa.types.is_integer(column.type):
            self.integral = bool(pc.all(pc.equal(pc.floor(column), column)).as_py())

    def to_json(self) -> dict[str, Any]:
        return {"min": self.low, "max": self.high, "integral": self.integral}


def prepare_group(shards: Sequence[Path | str], digests: Sequence[str] | None, output: Path, label: str,
                  splits: tuple[float, float, float] = (0.8, 0.1, 0.1), seed: int = 0, first_index: int = 0,
                  clip: tuple[float, float] | None = None, batch_rows: int = 16_384, clips: Sequence[Clip] = (),
                  filesystem: Any = None) -> dict[str, Any]:
    """Stream one group of shards (local paths, or paths of ``filesystem``: S3) into
    ``output/{train,validation,test}/<shard>.parquet``; return counts, bytes read, seconds, the
    group digest, the label's range and the columns."""
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
    fs = filesystem if filesystem is not None else LocalFileSystem(use_mmap=False)
    all_clips = [*([(clip[0], clip[1], None)] if clip is not None else []), *clips]
    labels = _LabelStats()
    columns: list[str] = []
    try:
        for offset, path in enumerate(shards):
            name = PurePosixPath(str(path)).name
            digest = file_digest(path, filesystem)
            if digests is not None and digest != digests[offset]:
                raise DigestMismatch(f"shard {name}: digest {digest} differs from the pinned {digests[offset]}")
            seen.append(digest)
            bytes_read += fs.get_file_info(str(path)).size
            rng = np.random.default_rng([seed, first_index + offset])
            # No read-ahead and no pre-buffering: by default the scanner buffers whole row groups of
            # several fragments ahead (hundreds of MiB), the opposite of a bounded stream.
            scanner = ds.dataset(str(path), format="parquet", filesystem=fs).scanner(
                batch_size=batch_rows, use_threads=False, batch_readahead=0, fragment_readahead=0,
                fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=False))
            for batch in scanner.to_batches():
                if batch.num_rows == 0:
                    continue
                if label not in batch.schema.names:
                    from runtimes.errors import StepFailed

                    raise StepFailed(f"shard {name}: no label column {label!r} (columns: {', '.join(batch.schema.names)})")
                columns = columns or list(batch.schema.names)
                if all_clips:
                    batch = _clipped(batch, label, all_clips)
                labels.add(batch.column(label))
                draw = rng.random(batch.num_rows)
                files.write(PurePosixPath(name).stem, batch, np.searchsorted(edges, draw, side="right").clip(0, 2))
            files.close()
            del scanner
            pa.default_memory_pool().release_unused()  # hand the shard's buffers back to the OS
    finally:
        files.close()
    seconds = time.perf_counter() - start
    return {"shards": len(shards), "rows": files.rows, "bytes": bytes_read, "seconds": round(seconds, 3),
            "mbPerSecond": round(bytes_read / 1e6 / seconds, 1) if seconds > 0 else None, "groupDigest": combine(seen),
            "label": labels.to_json(), "columns": columns}


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
