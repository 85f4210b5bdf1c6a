"""Read a sharded data set's prepared splits (``manifest.json`` of runtimes/shard_steps.py).

Training streams: :class:`ShardStream` is a ``torch.utils.data.IterableDataset`` over the train
split's files that never holds more than a shuffle block. The split's rows, in manifest order
(groups → shards), are numbered 0…N-1; each DDP rank takes one contiguous range of them and each
DataLoader worker of that rank one contiguous part of its range (:func:`row_range`), so every row
is read by exactly one (rank, worker) — or, with ``even`` (what DDP needs: every rank must take the
same number of optimizer steps), every rank takes ⌊N / world⌋ rows and the last ``N mod world``
rows of the epoch are left out. A reader skips the Parquet row groups before its range from the
file's footer and reads only the feature and label columns, batch by batch. Rows are shuffled
within blocks of ``shuffle_rows`` by a generator seeded by (seed, epoch, rank, worker), so an
epoch's order is reproducible (a resumed run replays it) and memory stays bounded.

Every other read goes through :class:`SplitReader`, which never holds more than a batch: the
train step's validation, evaluation and the steps after it iterate over a split ``batch_rows`` rows
at a time, or read a bounded sample of it (:meth:`SplitReader.head`, :meth:`SplitReader.spread`).
(Parquet reads a row group's column chunks whole, so the bound is the larger of a batch and a row
group — a property of the prepared files, not of the split's length.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtimes._step import in_workspace, read_json
from runtimes.errors import StepFailed


@dataclass(frozen=True)
class SplitFile:
    """One prepared file of a split and its row count (from the Parquet footer)."""

    path: str
    rows: int


def manifest_of(folder: Path, meta: dict[str, Any]) -> dict[str, Any]:
    return read_json(folder / meta["sharded"]["manifest"])


def split_files(manifest: dict[str, Any], split: str) -> list[SplitFile]:
    """The split's files in manifest order (a shard with no row in this split has no file)."""
    import pyarrow.parquet as pq

    files = []
    for group in manifest["groups"]:
        for shard in group["shards"]:
            path = in_workspace(group["folder"]) / split / f"{Path(shard['name']).stem}.parquet"
            if path.is_file():
                files.append(SplitFile(str(path), pq.ParquetFile(path).metadata.num_rows))
    return files


def row_range(total: int, world: int, rank: int, workers: int, worker: int, even: bool = False) -> tuple[int, int]:
    """The contiguous rows [start, stop) of one (rank, worker): rank ``r`` takes rows
    ``[r·N/world, (r+1)·N/world)`` (with ``even``: ``⌊N/world⌋`` rows each), and its workers split
    that range the same way."""
    if even:
        per = total // world
        start, stop = rank * per, (rank + 1) * per
    else:
        start, stop = rank * total // world, (rank + 1) * total // world
    size = stop - start
    return start + worker * size // workers, start + (worker + 1) * size // workers


def batches_per_rank(total: int, world: int, workers: int, batch_rows: int, even: bool = True) -> int:
    """Batches one rank's DataLoader yields in an epoch (each worker ends with its own short batch);
    with ``even`` the same on every rank."""
    workers = max(1, workers)
    return sum(math.ceil((b - a) / batch_rows) for a, b in (row_range(total, world, 0, workers, w, even) for w in range(workers)))


def _targets(values: np.ndarray, task: str) -> np.ndarray:
    return values.astype(np.float32) if task == "regression" else values.astype(np.int64)


def _read(files: list[SplitFile], features: list[str], label: str, start: int, stop: int, batch_rows: int) -> Any:
    """(x, y) numpy chunks of rows [start, stop) of the concatenated files, one Parquet batch at a time."""
    import pyarrow.parquet as pq

    offset = 0
    for f in files:
        lo, hi = max(start, offset), min(stop, offset + f.rows)
        if lo < hi:
            parquet = pq.ParquetFile(f.path)
            meta = parquet.metadata
            groups, first, at = [], None, offset
            for g in range(meta.num_row_groups):
                n = meta.row_group(g).num_rows
                if at + n > lo and at < hi:
                    groups.append(g)
                    first = at if first is None else first
                at += n
            position = first if first is not None else offset
            for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=groups, columns=[*features, label]):
                a, b = max(lo, position), min(hi, position + batch.num_rows)
                if a < b:
                    part = batch.slice(a - position, b - a)
                    x = np.column_stack([part.column(c).to_numpy(zero_copy_only=False) for c in features]).astype(np.float32)
                    yield x, part.column(label).to_numpy(zero_copy_only=False)
                position += batch.num_rows
                if position >= hi:
                    break
        offset += f.rows
        if offset >= stop:
            return


class SplitReader:
    """One split of a sharded data set, read in manifest order a bounded batch at a time: what the
    train step's validation, evaluation and the steps after training go over, so that their memory
    does not grow with the split."""

    def __init__(self, folder: Path, meta: dict[str, Any], split: str) -> None:
        manifest = manifest_of(folder, meta)
        self.folder, self.meta, self.split = folder, meta, split
        self.files = split_files(manifest, split)
        self.features, self.label = list(manifest["features"]), str(manifest["label"])
        self.task = str(meta["task"])
        self.rows = sum(f.rows for f in self.files)

    def batches(self, batch_rows: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(x, y) of rows [start, stop) (all by default), at most ``batch_rows`` rows each; the
        targets typed as training's (float32 for a regression, int64 for classes)."""
        stop = self.rows if stop is None else min(stop, self.rows)
        for x, y in _read(self.files, self.features, self.label, start, stop, batch_rows):
            yield x, _targets(y, self.task)

    def head(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``rows`` rows, together: a bounded sample (the rows a step explains or times)."""
        return self._join(self.batches(max(1, min(rows, 65_536)), 0, rows))

    def spread(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` rows (all, from a smaller split) taken from every file in proportion to its size,
        the first ones of each: a bounded sample that sees every shard — calibration data — read
        without going through the split."""
        take = min(rows, self.rows)
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        offset = 0
        for f in self.files:
            # Cumulative shares, so that the counts add up to `take` exactly.
            count = take * (offset + f.rows) // max(1, self.rows) - take * offset // max(1, self.rows)
            if count:
                parts.extend(self.batches(max(1, min(count, 65_536)), offset, offset + count))
            offset += f.rows
        return self._join(parts)

    def shuffled(self, batch_rows: int, seed: int) -> ShardStream:
        """The split as a shuffled stream (a block of rows at a time): fine-tuning's epochs."""
        return ShardStream(self.folder, self.meta, self.split, batch_rows=batch_rows, seed=seed)

    def _join(self, chunks: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for x, y in chunks:
            xs.append(x)
            ys.append(y)
        if not xs:
            return np.zeros((0, len(self.features)), dtype=np.float32), _targets(np.zeros((0,)), self.task)
        return np.concatenate(xs), np.concatenate(ys)


def read_split(folder: Path, meta: dict[str, Any], split: str) -> dict[str, np.ndarray]:
    """A whole split in memory, ``{"x", "y"}`` as a non-sharded prepared split. For tests and
    tools on small data: no step reads a sharded split whole (:class:`SplitReader`)."""
    reader = SplitReader(folder, meta, split)
    x, y = reader.head(reader.rows)
    return {"x": x, "y": y}


def _torch_iterable() -> type:
    from torch.utils.data import IterableDataset

    return IterableDataset


class ShardStream(_torch_iterable()):  # type: ignore[misc]
    """The train split as a stream of ``(x, y)`` tensor batches for one DDP rank (module docstring).
    Use with ``DataLoader(stream, batch_size=None, num_workers=…)``: each worker reads its own rows."""

    def __init__(self, folder: Path, meta: dict[str, Any], split: str = "train", *, batch_rows: int, rank: int = 0,
                 world: int = 1, even: bool = False, seed: int = 0, shuffle_rows: int = 16_384) -> None:
        self.reader = SplitReader(folder, meta, split)
        self.files, self.features, self.label = self.reader.files, self.reader.features, self.reader.label
        self.task, self.total = self.reader.task, self.reader.rows
        self.batch_rows, self.rank, self.world, self.even = batch_rows, rank, world, even
        self.seed, self.shuffle_rows = seed, max(shuffle_rows, batch_rows)
        self.epoch = 0
        if self.total == 0:
            raise StepFailed(f"the {split} split is empty")

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose shuffle to draw (the loader's workers copy the dataset at each epoch's start)."""
        self.epoch = epoch

    def __iter__(self) -> Any:
        import torch
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        start, stop = row_range(self.total, self.world, self.rank, workers, worker, self.even)
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, worker])
        block_x: list[np.ndarray] = []
        block_y: list[np.ndarray] = []
        held = 0

        def emit(final: bool) -> Any:
            nonlocal block_x, block_y, held
            x, y = np.concatenate(block_x), np.concatenate(block_y)
            order = rng.permutation(len(x))
            x, y = x[order], y[order]
            usable = len(x) if final else len(x) // self.batch_rows * self.batch_rows
            for i in range(0, usable, self.batch_rows):
                yield torch.from_numpy(x[i : i + self.batch_rows]), torch.from_numpy(_targets(y[i : i + self.batch_rows], self.task))
            block_x, block_y, held = [x[usable:]], [y[usable:]], len(x) - usable

        for x, y in _read(self.files, self.features, self.label, start, stop, self.batch_rows):
            block_x.append(x)
            block_y.append(y)
            held += len(x)
            if held >= self.shuffle_rows:
                yield from emit(final=False)
        if held:
            yield from emit(final=True)

    def sample(self, rows: int) -> tuple[Any, Any]:
        """The first ``rows`` rows of the split as tensors (the training metrics of the final weights)."""
        import torch

        x, y = self.reader.head(rows)
        return torch.from_numpy(x), torch.from_numpy(y)
