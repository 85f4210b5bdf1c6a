"""Shared training and measuring primitives: tensors of a split, losses, metrics, a small fit loop.

The full trainer (checkpoints, DDP, DeepSpeed) is ``runtimes.train``; compression's fine-tuning,
distillation and quantization-aware training use the small :func:`fit` here.

A split as the steps after training read it is :class:`Rows` (:func:`split_rows`): in memory for
a non-sharded data set, streamed a bounded batch at a time for a sharded one; :func:`measure_rows`
and :func:`fit_rows` take either.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from runtimes._step import forge_cache


def torch_env() -> None:
    """Process-wide settings: DeepSpeed's op build cache under the forge cache; a fixed cuBLAS
    workspace (what deterministic cuBLAS needs; the size PyTorch picks on Hopper anyway)."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(forge_cache() / "torch_extensions"))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def seed_everything(seed: int, deterministic: bool = True) -> None:
    """Seed Python, NumPy and torch; ``deterministic``: PyTorch's deterministic kernels where it
    has them (a warning for the ops that have none). They cost GPU time — sort-based scatters,
    uninitialised memory filled, fewer kernel choices for TorchInductor — so the train step turns
    them on only when the Model says ``deterministic: true``; on a CPU nothing Forge runs changes."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


def split_tensors(split: dict[str, np.ndarray], meta: dict[str, Any], context_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of a prepared split. Text becomes windows of ``context_length + 1`` bytes."""
    if meta["task"] == "lm":
        ctx = int(context_length or 128)
        tokens = torch.from_numpy(split["tokens"].astype(np.int64))
        n = (len(tokens) - 1) // ctx
        if n <= 0:
            return torch.zeros((0, ctx), dtype=torch.long), torch.zeros((0, ctx), dtype=torch.long)
        x = tokens[: n * ctx].view(n, ctx)
        y = tokens[1 : n * ctx + 1].view(n, ctx)
        return x, y
    x = torch.from_numpy(split["x"].astype(np.float32))
    y = torch.from_numpy(split["y"])
    y = y.float() if meta["task"] == "regression" else y.long()
    return x, y


#: Rows of a sharded split read at a time by the steps that go over all of it (measuring, verifying).
STREAM_ROWS = 4096


class Rows:
    """A prepared split's (inputs, targets) as the steps after training read it. A non-sharded
    split is two tensors in memory (``x``, ``y``: small files by design, read as before); a
    sharded one stays in its Parquet files (``reader``, a runtimes.shard_stream.SplitReader) and is
    read ``batch_rows`` rows at a time, so that no step holds more of it than a batch or a bounded
    sample. Only tabular data sets are sharded: a streamed split's inputs are features."""

    def __init__(self, x: torch.Tensor | None = None, y: torch.Tensor | None = None, reader: Any = None,
                 batch_rows: int = STREAM_ROWS) -> None:
        self.x, self.y, self.reader, self.batch_rows = x, y, reader, batch_rows

    @property
    def streamed(self) -> bool:
        return self.reader is not None

    def __len__(self) -> int:
        return int(self.reader.rows) if self.reader is not None else len(cast(torch.Tensor, self.x))

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of a split in memory (not of a streamed one)."""
        assert self.x is not None and self.y is not None, "a streamed split is read by batches"
        return self.x, self.y

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(inputs, targets), ``batch_rows`` rows at a time, in order."""
        if self.reader is not None:
            for x, y in self.reader.batches(self.batch_rows):
                yield torch.from_numpy(x), torch.from_numpy(y)
            return
        x, y = self.tensors()
        for i in range(0, len(x), self.batch_rows):
            yield x[i : i + self.batch_rows], y[i : i + self.batch_rows]

    def head(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``rows`` rows: what a step needs only a sample of (rows to explain, to attack,
        to time) is read bounded."""
        if self.reader is not None:
            x, y = self.reader.head(rows)
            return torch.from_numpy(x), torch.from_numpy(y)
        x, y = self.tensors()
        return x[:rows], y[:rows]

    def sample(self, rows: int, seed: int) -> torch.Tensor:
        """Inputs to calibrate INT8 ranges on: in memory, a seeded random draw of ``rows`` rows; a
        streamed split's are a bounded sample taken from every shard alike (SplitReader.spread)
        rather than a draw from the whole split, which would read all of it."""
        if self.reader is not None:
            return torch.from_numpy(self.reader.spread(rows)[0])
        x, _ = self.tensors()
        return x[torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:rows]]


def split_rows(data: Any, name: str, context_length: int | None = None) -> Rows:
    """A split of ``data`` (runtimes.data.load_prepared) as :class:`Rows`: a sharded data set's
    streamed from its files, any other's in memory (split_tensors)."""
    if data.sharded:
        from runtimes.shard_stream import SplitReader

        return Rows(reader=SplitReader(data.folder, data.meta, name))
    return Rows(*split_tensors(data.split(name), data.meta, context_length))


def loss_fn(task: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if task == "regression":
        return lambda out, y: F.mse_loss(out.float().squeeze(-1), y)
    if task == "lm":
        return lambda out, y: F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))
    return lambda out, y: F.cross_entropy(out.float(), y)


def device_of(model: object) -> torch.device:
    """Device of a module's first parameter (CPU for modules without parameters)."""
    params = getattr(model, "parameters", None)
    if callable(params):
        for p in params():
            return p.device
    return torch.device("cpu")


@torch.no_grad()
def predict(model: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """Outputs of ``model`` on ``x`` (on the CPU), computed on the model's device in batches."""
    if getattr(model, "training", False) and not _is_exported(model):
        cast(nn.Module, model).eval()  # only modules carry `training`
    device = device_of(model)
    outs = [model(x[i : i + batch_size].to(device)).float().cpu() for i in range(0, len(x), batch_size)]
    return torch.cat(outs) if outs else torch.zeros(0)


@torch.no_grad()
def _measure_lm(model: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Loss, perplexity and next-token accuracy of an LM, streamed: its logits ([N, T, vocab])
    are never held for the whole split (50k-token vocabularies make that gigabytes)."""
    if getattr(model, "training", False) and not _is_exported(model):
        cast(nn.Module, model).eval()  # only modules carry `training`
    device = device_of(model)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    count = 0
    rows = None
    i = 0
    while i < len(x):
        xb = x[i : i + (rows or 1)].to(device)
        yb = y[i : i + (rows or 1)].to(device)
        out = model(xb).float()
        if rows is None:  # about 2^27 logits (512 MiB in fp32) per batch
            rows = max(1, min(512, (1 << 27) // max(1, out[0].numel())))
        loss_sum += F.cross_entropy(out.reshape(-1, out.shape[-1]), yb.reshape(-1), reduction="sum").double()
        correct += (out.argmax(-1) == yb).sum()
        count += yb.numel()
        i += len(xb)
    loss = float(loss_sum) / max(1, count)
    return {"loss": loss, "perplexity": float(math.exp(min(loss, 50))), "accuracy": int(correct) / max(1, count)}


def _is_exported(model: object) -> bool:
    """torch.export / PT2E graph modules refuse .eval(); they are traced in inference mode."""
    return type(model).__name__ == "GraphModule" or hasattr(model, "meta") and "_exported" in str(type(model))


def measure(model: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor, task: str) -> dict[str, float]:
    """Loss and task metrics of a model on (x, y)."""
    if len(x) == 0:
        return {}
    if task == "lm":
        return _measure_lm(model, x, y)
    out = predict(model, x)
    loss = float(loss_fn(task)(out, y))
    if task == "regression":
        return {"loss": loss, "mse": loss}
    pred = out.argmax(-1)
    metrics = {"loss": loss, "accuracy": float((pred == y).float().mean())}
    metrics.update(_class_figures(*_class_counts(pred, y)))
    return metrics


def _class_counts(pred: torch.Tensor, y: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per class index: the rows predicted as it, the rows of it, and the rows of it predicted right."""
    n = max(int(pred.max()), int(y.max())) + 1 if len(y) else 0
    predicted, actual = np.bincount(pred.numpy(), minlength=n), np.bincount(y.numpy(), minlength=n)
    return predicted, actual, np.bincount(y[pred == y].numpy(), minlength=n)


def _class_figures(predicted: np.ndarray, actual: np.ndarray, hits: np.ndarray) -> dict[str, float]:
    """Macro precision, recall and F1 over the classes predicted or present, from their counts."""
    precisions, recalls, f1s = [], [], []
    for c in np.flatnonzero(predicted + actual):
        tp, fp, fn = int(hits[c]), int(predicted[c] - hits[c]), int(actual[c] - hits[c])
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        precisions.append(p)
        recalls.append(r)
        f1s.append(2 * p * r / (p + r) if p + r else 0.0)
    return {"precision": float(np.mean(precisions)), "recall": float(np.mean(recalls)), "f1": float(np.mean(f1s))}


def _padded_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    size = max(len(a), len(b))
    return np.pad(a, (0, size - len(a))) + np.pad(b, (0, size - len(b)))


@torch.no_grad()
def measure_batches(model: Callable[[torch.Tensor], torch.Tensor], batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                    task: str) -> dict[str, float]:
    """:func:`measure`'s figures of a classifier or a regression over (x, y) batches, accumulated
    so that only one batch is held: the summed loss and, per class, the counts the macro figures
    need (each batch's own precision would not average to the split's). Equal to ``measure`` on
    the batches joined, up to float rounding."""
    loss_sum, rows, correct = 0.0, 0, 0
    counts = [np.zeros(0, dtype=np.int64)] * 3
    criterion = loss_fn(task)
    for x, y in batches:
        if not len(x):
            continue
        out = predict(model, x)
        loss_sum += float(criterion(out, y)) * len(y)  # the batch's mean, back to its sum
        rows += len(y)
        if task != "regression":
            pred = out.argmax(-1)
            correct += int((pred == y).sum())
            counts = [_padded_sum(total, new) for total, new in zip(counts, _class_counts(pred, y))]
    if not rows:
        return {}
    loss = loss_sum / rows
    if task == "regression":
        return {"loss": loss, "mse": loss}
    return {"loss": loss, "accuracy": correct / rows, **_class_figures(*counts)}


def measure_rows(model: Callable[[torch.Tensor], torch.Tensor], rows: Rows, task: str) -> dict[str, float]:
    """:func:`measure` of a split: at once when it is in memory, batch by batch when it is streamed."""
    if rows.reader is None:
        x, y = rows.tensors()
        return measure(model, x, y, task)
    return measure_batches(model, rows.batches(), task)


def latency_ms(model: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, runs: int = 200, batch: int = 1) -> dict[str, float]:
    """CPU latency of one forward pass at ``batch`` rows: median and p99 in milliseconds."""
    sample = x[:batch]
    times = []
    with torch.no_grad():
        for _ in range(min(20, runs)):
            model(sample)
        for i in range(runs):
            start = time.perf_counter()
            model(x[(i * batch) % max(1, len(x) - batch) :][:batch] if len(x) > batch else sample)
            times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {"p50": times[len(times) // 2], "p99": times[min(len(times) - 1, int(len(times) * 0.99))]}


def compare_latency(a: Callable[[torch.Tensor], torch.Tensor], b: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rounds: int = 7, runs: int = 40) -> tuple[float, float]:
    """Batch-1 latency (ms) of two models, measured in alternating rounds; each figure is the
    lowest per-round median, which is robust to other load on a shared CPU."""
    sample = x[:1]
    best = [float("inf"), float("inf")]
    with torch.no_grad():
        for model in (a, b):
            for _ in range(10):
                model(sample)
        for _ in range(rounds):
            for i, model in enumerate((a, b)):
                times = []
                for _ in range(runs):
                    start = time.perf_counter()
                    model(sample)
                    times.append((time.perf_counter() - start) * 1000)
                times.sort()
                best[i] = min(best[i], times[len(times) // 2])
    return best[0], best[1]


def fit(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    log: Callable[[str], None] | None = None,
) -> nn.Module:
    """A plain AdamW loop with a cosine schedule over (x, y), reshuffled each epoch; ``loss(out, y, x)``
    (x for distillation)."""
    gen = torch.Generator().manual_seed(seed)

    def epoch_batches(_: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), batch_size):
            idx = perm[i : i + batch_size]
            yield x[idx], y[idx]

    return fit_batches(model, epoch_batches, len(x), epochs, lr, batch_size, loss, log)


def fit_rows(model: nn.Module, rows: Rows, epochs: int, lr: float, batch_size: int, seed: int,
             loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
             log: Callable[[str], None] | None = None) -> nn.Module:
    """:func:`fit` on a split: in memory as before; a streamed split's epochs come from a
    ShardStream (rows shuffled within blocks, seeded by (seed, epoch)), a block at a time."""
    if rows.reader is None:
        x, y = rows.tensors()
        return fit(model, x, y, epochs, lr, batch_size, seed, loss, log)
    stream = rows.reader.shuffled(batch_size, seed)

    def epoch_batches(epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        stream.set_epoch(epoch)
        return iter(stream)

    return fit_batches(model, epoch_batches, len(rows), epochs, lr, batch_size, loss, log)


def fit_batches(model: nn.Module, epoch_batches: Callable[[int], Iterable[tuple[torch.Tensor, torch.Tensor]]], rows: int,
                epochs: int, lr: float, batch_size: int, loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                log: Callable[[str], None] | None = None) -> nn.Module:
    """The loop of :func:`fit` over each epoch's batches (``epoch_batches(epoch)``) of ``rows`` rows."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    steps = max(1, epochs * math.ceil(rows / batch_size))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    model.train()
    for epoch in range(epochs):
        total = 0.0
        for xb, yb in epoch_batches(epoch):
            out = model(xb)
            value = loss(out, yb, xb)
            opt.zero_grad(set_to_none=True)
            value.backward()
            opt.step()
            sched.step()
            total += float(value) * len(xb)
        if log:
            log(f"epoch {epoch + 1}/{epochs} loss {total / rows:.4f}")
    model.eval()
    return model
