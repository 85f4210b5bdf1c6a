"""``python -m runtimes train``: train one Model (or one search trial) on prepared data.

Single process, DDP under ``torchrun`` (gloo on CPU, NCCL on GPUs) or DeepSpeed ZeRO 0–3 from
the rendered config (``DS_ACCELERATOR=cpu`` and gloo on a CPU machine). Mixed precision: bf16
autocast, or fp16 autocast with a GradScaler. Gradient checkpointing and accumulation.
Deterministic for a seed: the batch order of an epoch is a function of (seed, epoch), and the
checkpoint holds the RNG state, so a run killed and resumed ends with the same weights as one
that never stopped.

Writes into ``output``: ``model.pt`` + ``model.json`` (the bundle), ``metrics.json``,
``checkpoints/last.pt`` (or ``checkpoints/deepspeed/``) every ``checkpointEvery`` optimizer steps,
and ``progress.json`` (the last progress event). ``metrics.json`` holds the run's own
throughput (``throughput``: tokens/s, step times after warm-up, the warm-up — compilation
included —, peak and activation memory; see :class:`StepMeter`). Progress goes to stdout as JSON lines:
``{"event": "progress", "step": 40, "total": 600, "epoch": 2, "loss": 0.31, "lr": 0.002}``,
then ``{"event": "done", ...}``; ``{"event": "resume", "step": N}`` when it picks up a checkpoint.
A Model with ``faultInjection.holdFirstAttemptSeconds`` (retry drills, never production) holds its
first attempt before anything else, ``{"event": "hold", ...}`` first (runtimes._step.hold_first_attempt);
with ``faultInjection.killFirstAttempt`` the first attempt kills itself (SIGKILL, exit 137) instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtimes._step import emit, hold_first_attempt, in_workspace, kill_first_attempt, parse_config, run_step, write_json
from runtimes.errors import StepFailed
from runtimes.ports import free_ports
from runtimes.study import TrialRun
from specs.checkpointing import BlockCosts, peak_bytes
from specs.model import Hyperparameters
from specs.stepconfig import TrainConfig

if TYPE_CHECKING:  # runtimes.learn imports torch when imported; this module only when it runs
    from runtimes.learn import Rows

log = logging.getLogger("forge.train")


def effective_hyperparameters(config: TrainConfig, asked: dict[str, float | int | str] | None = None) -> Hyperparameters:
    """The spec's hyperparameters with a search trial's: the rendered ``overrides``, then the values
    ``asked`` of the study (TPE)."""
    values = {**config.spec.hyperparameters.to_yaml_dict(), **config.overrides, **(asked or {})}
    for key in ("batchSize", "epochs", "maxSteps", "warmupSteps", "gradientAccumulationSteps", "seed"):
        if isinstance(values.get(key), float) and float(values[key]).is_integer():
            values[key] = int(values[key])
    try:
        return Hyperparameters.model_validate(values)
    except Exception as exc:
        raise StepFailed(f"overrides do not make valid hyperparameters: {exc}") from None


def _single_process_env() -> None:
    """A one-process 'world' for DeepSpeed when no launcher set one up."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_ports("127.0.0.1", 1)[0]))


def _config_fingerprint(config: TrainConfig, asked: dict[str, float | int | str] | None = None) -> str:
    data = config.model_dump(mode="json", by_alias=True, exclude={"checkpoint_every", "output"})
    if asked:
        data["asked"] = asked
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def deepspeed_config(config: TrainConfig, hp: Hyperparameters, cpu: bool) -> dict[str, Any]:
    """The rendered DeepSpeed config, with what the spec implies filled in where it is silent."""
    ds = json.loads(json.dumps(config.deepspeed or {}))
    dist = config.spec.distributed
    ds.setdefault("train_micro_batch_size_per_gpu", hp.batch_size)
    ds.setdefault("gradient_accumulation_steps", hp.gradient_accumulation_steps)
    ds.pop("train_batch_size", None)  # derived by DeepSpeed from the two above and the world size
    zero = ds.setdefault("zero_optimization", {})
    zero.setdefault("stage", dist.zero_stage)
    if dist.offload in ("optimizer", "optimizer+parameters"):
        zero.setdefault("offload_optimizer", {"device": "cpu"})
    if dist.offload == "optimizer+parameters":
        zero.setdefault("offload_param", {"device": "cpu"})
    if config.spec.precision == "bf16":
        ds.setdefault("bf16", {"enabled": True})
    elif config.spec.precision == "fp16":
        if cpu:
            raise StepFailed("DeepSpeed on CPU cannot train in fp16; use precision bf16 or fp32")
        ds.setdefault("fp16", {"enabled": True})
    ds.setdefault("steps_per_print", 10**9)
    ds.setdefault("wall_clock_breakdown", False)
    return ds


class StepMeter:
    """Throughput and memory of a run, measured by the train step itself.

    Each optimizer step is timed from its first micro-batch to the end of its optimizer update,
    so checkpoint writes and progress output fall outside the timings. On CUDA the two ends are
    CUDA events on the step's stream, read back later without a synchronisation per step (the host
    keeps queueing work while the device runs): a step's time is the device's, from the moment it
    reached the step's start (when the host got there first, the wait for the host's launches
    included) to the end of the update. On a CPU it is the wall clock. The first ``WARMUP_STEPS``
    steps — where ``torch.compile`` compiles and kernels are autotuned — are reported apart
    (``warmupSeconds``); rates are over the rest.

    Memory: on CUDA, ``peakMemoryBytes`` is the allocator's peak over the run and
    ``activationMemoryBytes`` the peak within a step (after the first) above what stays
    allocated between steps (weights, optimizer state): activations, gradients, temporaries.
    ``savedTensorBytes`` (any device, eager runs) counts the distinct tensors autograd saved for
    backward in the first forward pass, parameters excluded — with gradient checkpointing only
    each checkpointed segment's input (a block's, per layer; ⌈√n⌉ of them with ``sqrt``); the one
    segment recomputed at a time in the backward pass is not in it (the CUDA peak has it). On
    CPU, ``activationMemoryBytes`` is that count and ``peakMemoryBytes`` the process's peak
    resident set.
    """

    WARMUP_STEPS = 3

    def __init__(self, device: Any, tokens_per_sample: int | None):
        import torch

        self._torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.tokens_per_sample = tokens_per_sample
        self.times: list[float | None] = []
        self.samples: list[int] = []
        self.saved_tensor_bytes: int | None = None
        self._start: float | None = None
        self._start_event: Any = None
        self._pending: list[tuple[int, Any, Any]] = []  # (index in times, start event, end event)
        self._peak = 0
        self._baseline: int | None = None
        self._step_peak = 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)

    def begin(self) -> None:
        """Called before the first micro-batch of an optimizer step."""
        if self._start is None:
            self._start = time.perf_counter()
            if self.cuda:
                self._start_event = self._torch.cuda.Event(enable_timing=True)
                self._start_event.record()

    def end(self, samples: int) -> None:
        """Called once the optimizer step is done (queued: nothing here waits for the device)."""
        torch = self._torch
        if self.cuda:
            if self._start_event is None:
                self.begin()
            stop = torch.cuda.Event(enable_timing=True)
            stop.record()
            self._pending.append((len(self.times), self._start_event, stop))
            self.times.append(None)
            self._collect(wait=False)
        else:
            now = time.perf_counter()
            self.times.append(now - (self._start if self._start is not None else now))
        self.samples.append(samples)
        self._start = None
        self._start_event = None
        if self.cuda:
            # The allocator's figures are the host's bookkeeping: no synchronisation needed.
            peak = torch.cuda.max_memory_allocated(self.device)
            self._peak = max(self._peak, peak)
            if self._baseline is not None:
                self._step_peak = max(self._step_peak, peak - self._baseline)
            self._baseline = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def _collect(self, wait: bool) -> None:
        """Turn the event pairs the device has passed into seconds (all of them with ``wait``)."""
        if wait and self._pending:
            self._pending[-1][2].synchronize()
        while self._pending and (wait or self._pending[0][2].query()):
            index, start, stop = self._pending.pop(0)
            self.times[index] = start.elapsed_time(stop) / 1000.0

    @contextlib.contextmanager
    def saved_tensors(self, model: Any, enabled: bool):
        """Count what autograd saves for backward inside the block (once, when ``enabled``)."""
        if not enabled or self.saved_tensor_bytes is not None:
            yield
            return
        from runtimes.models import parameter_storages, storage_of

        torch = self._torch
        params = parameter_storages(model)
        seen: dict[int, int] = {}

        def pack(t: Any) -> Any:
            found = storage_of(t)
            if found is not None and found[0] not in params:
                seen[found[0]] = found[1]
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self.saved_tensor_bytes = sum(seen.values())

    def summary(self) -> dict[str, Any]:
        self._collect(wait=True)
        n = len(self.times)
        warm = min(self.WARMUP_STEPS, n - 1) if n > 1 else 0
        times = [t or 0.0 for t in self.times]
        timed, samples = times[warm:], sum(self.samples[warm:])
        seconds = sum(timed)
        ordered = sorted(timed)
        rate = samples / seconds if seconds > 0 else None
        if self.cuda:
            peak: int | None = max(self._peak, self._torch.cuda.max_memory_allocated(self.device))
            activation = self._step_peak if n > 1 else None
            source = "cuda-allocator"
        else:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
            activation = self.saved_tensor_bytes
            source = "autograd-saved-tensors"
        return {
            "steps": n,
            "warmupSteps": warm,
            "warmupSeconds": round(sum(times[:warm]), 4),
            "timedSteps": len(timed),
            "timedSeconds": round(seconds, 4),
            "stepSeconds": {
                "median": round(ordered[len(ordered) // 2], 5) if ordered else None,
                "mean": round(seconds / len(timed), 5) if timed else None,
                "min": round(ordered[0], 5) if ordered else None,
                "max": round(ordered[-1], 5) if ordered else None,
            },
            "samplesPerSecond": round(rate, 2) if rate else None,
            "tokensPerSecond": round(rate * self.tokens_per_sample, 1) if rate and self.tokens_per_sample else None,
            "peakMemoryBytes": peak,
            "activationMemoryBytes": activation,
            "savedTensorBytes": self.saved_tensor_bytes,
            "memorySource": source,
        }


#: Left in ``checkpoints/`` by an attempt held by ``faultInjection`` (see hold_first_attempt).
HOLD_MARKER = "fault-injection-held"
#: Left in ``checkpoints/`` by an attempt ``faultInjection`` killed (see kill_first_attempt).
KILL_MARKER = "fault-injection-killed"


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(TrainConfig, argv, "python -m runtimes train")
    faults = config.spec.fault_injection
    if faults is not None and faults.hold_first_attempt_seconds:
        # A retry drill: before anything is read or written, so a killed attempt leaves nothing half-done.
        hold_first_attempt(in_workspace(config.output) / "checkpoints" / HOLD_MARKER, faults.hold_first_attempt_seconds)
    if faults is not None and faults.kill_first_attempt:
        kill_first_attempt(in_workspace(config.output) / "checkpoints" / KILL_MARKER)
    from runtimes.learn import torch_env

    torch_env()
    strategy = config.spec.distributed.strategy
    if strategy == "deepspeed":
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return Trainer(config).run()


class _BatchSource:
    """The training batches on the step's device. On a GPU a training set of at most
    ``DEVICE_RESIDENT_BYTES`` is copied there once, so a batch is an index on the device (no host
    copy and no synchronisation per step — a plain host-to-device copy waits for the device);
    a larger one is gathered on the host into pinned memory and copied without blocking. On a CPU
    a batch is the index, as before."""

    DEVICE_RESIDENT_BYTES = 1 << 30

    def __init__(self, x: Any, y: Any, device: Any):
        self.device = device
        self.cuda = device.type == "cuda"
        self.resident = self.cuda and x.nbytes + y.nbytes <= self.DEVICE_RESIDENT_BYTES
        self.x, self.y = (x.to(device), y.to(device)) if self.resident else (x, y)

    def order(self, perm: Any) -> Any:
        """An epoch's sample order, where the batches are gathered."""
        return perm.contiguous().pin_memory().to(self.device, non_blocking=True) if self.resident else perm

    def get(self, idx: Any) -> tuple[Any, Any]:
        if self.resident or not self.cuda:
            return self.x[idx], self.y[idx]
        return (self.x[idx].pin_memory().to(self.device, non_blocking=True),
                self.y[idx].pin_memory().to(self.device, non_blocking=True))


def _autocast_dtype(precision: str) -> Any:
    """The dtype a step autocasts to under ``precision`` (None for fp32: no autocast)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


@dataclass
class _Data:
    """The training split as the loop reads it, and what the final measurement needs of it."""

    arch: dict[str, Any]
    ctx: int | None  # context length (language models), else None
    task: str
    x: Any  # a sharded data set's: its first rows only (the final training metrics)
    y: Any
    batches: _BatchSource | None
    samples: int
    stream: Any = None
    """A sharded data set's train split (runtimes.shard_stream.ShardStream), streamed, never whole in memory."""
    loader_workers: int = 0


@dataclass
class _Parts:
    """A fresh model with its loss, optimizer and schedule, and the step budget: what both
    training loops (plain and DP-SGD) start from."""

    model: Any
    criterion: Any
    optimizer: Any
    scheduler: Any
    micro_per_epoch: int
    total: int  # optimizer steps of the whole run
    ckpt_dir: Path


@dataclass
class _Wrapped:
    """The model as the plain loop drives it: ``net`` (DeepSpeed's engine, DDP, compiled or the
    model itself) is what runs forward; ``model`` stays the bare module, whose weights are
    checkpointed and measured."""

    model: Any
    net: Any
    engine: Any | None
    optimizer: Any
    scheduler: Any
    scaler: Any | None
    criterion: Any
    autocast_dtype: Any | None
    input_dtype: Any | None


@dataclass
class _Progress:
    """What the plain loop counts and times as it goes. ``state`` is the position checkpoints
    hold (``epoch`` and ``micro`` stay where the run started; ``step`` counts on)."""

    state: dict[str, int]
    meter: StepMeter
    samples: int = 0  # samples of every rank, for samplesPerSecond
    step_samples: int = 0  # samples of the optimizer step under way


@dataclass
class _Outcome:
    """How a training loop ended: the final fp32 weights and the figures ``metrics.json`` reports."""

    final: dict[str, Any]
    state: dict[str, int]
    resumed_from: int
    elapsed: float
    samples: int
    throughput: dict[str, Any]
    privacy: dict[str, Any] | None = None


def _lr_schedule(hp: Hyperparameters, total: int) -> Callable[[int], float]:
    """The learning-rate factor at each optimizer step: linear warm-up, then a cosine decay to 10 %."""

    def lr_at(step: int) -> float:
        if hp.warmup_steps and step < hp.warmup_steps:
            return (step + 1) / hp.warmup_steps
        progress = (step - hp.warmup_steps) / max(1, total - hp.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return lr_at


class Trainer:
    def __init__(self, config: TrainConfig):
        import torch

        from runtimes.data import is_sharded, load_prepared

        self.config = config
        self.trial: TrialRun | None = None
        if config.trial is not None:
            from runtimes.study import start_trial

            self.trial = start_trial(config.trial.study, config.trial.index, config.output, config.overrides)
            log.info("search trial %d (task %d): %s", self.trial.number, config.trial.index,
                     json.dumps(self.trial.params or config.overrides, sort_keys=True))
        self.hp = effective_hyperparameters(config, self.trial.params if self.trial else None)
        self.strategy = config.spec.distributed.strategy
        self.out = in_workspace(config.output)
        # A sharded data set's splits are streamed: the train split by _streamed_data, the validation
        # split by runtimes.learn.split_rows (load_prepared reads neither).
        self.sharded = is_sharded(in_workspace(config.data))
        self.data = load_prepared(in_workspace(config.data), ("validation",) if self.sharded else ("train", "validation"))
        self.meta = self.data.meta
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cpu")
        self.rank, self.world = 0, 1
        # A checkpoint fits only the values it was trained with: a trial's asked values are part of it.
        self.fingerprint = _config_fingerprint(config, self.trial.params if self.trial else None)
        self._validation: Rows | None = None  # a search trial's validation split, once opened
        self.checkpoint_segments: int | None = None  # the segments the block stack was cut into, if cut

    # -- set-up -------------------------------------------------------------------------------
    def _init_distributed(self) -> None:
        import torch
        import torch.distributed as dist

        world = int(os.environ.get("WORLD_SIZE", "1"))
        if self.strategy == "deepspeed":
            import deepspeed

            _single_process_env()
            deepspeed.init_distributed(dist_backend="nccl" if self.cuda else "gloo")
        elif self.strategy == "ddp" or world > 1:
            if "RANK" not in os.environ:
                _single_process_env()  # ddp asked for but not under torchrun: a world of one
            dist.init_process_group(backend="nccl" if self.cuda else "gloo")
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            if not self.cuda and self.world > 1:
                torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", self.world))))
        if self.cuda:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)

    def run(self) -> int:
        """Set up, train (the plain loop, or DP-SGD's own), then measure and write the bundle.

        The phases run in this order because each seeds or consumes what the next depends on:
        the seed before the model is built (its initial weights), the model before the
        optimizer, the optimizer before a checkpoint is loaded into it."""
        from runtimes.learn import seed_everything

        self._init_distributed()
        seed_everything(self.hp.seed, deterministic=self.config.spec.deterministic)
        data = self._training_data()
        parts = self._build(data)
        outcome = self._train_private(data, parts) if self.config.spec.privacy is not None else self._train(data, parts)
        # The training state is not needed any more: free the device for the measurement in _finish.
        del parts
        return self._finish(data, outcome)

    def _training_data(self) -> _Data:
        """The training split as tensors, on the device where it fits (see _BatchSource)."""
        from runtimes.learn import split_tensors
        from runtimes.models import resolve_architecture

        arch = resolve_architecture(self.config.spec.architecture)
        ctx = arch.get("contextLength")
        if self.sharded:
            return self._streamed_data(arch)
        x, y = split_tensors(self.data.split("train"), self.meta, ctx)
        if len(x) == 0:
            raise StepFailed("the training split is empty")
        return _Data(arch, ctx, self.meta["task"], x, y, _BatchSource(x, y, self.device), len(x))

    def _streamed_data(self, arch: dict[str, Any]) -> _Data:
        """A sharded data set's train split as this rank's stream. Under DDP every rank takes the
        same number of rows (``even``), so that every rank takes the same number of steps."""
        from runtimes.shard_stream import ShardStream

        if self.config.spec.privacy is not None:
            raise StepFailed("DP-SGD samples batches from the whole training set in memory; it is not supported on a sharded data set")
        stream = ShardStream(in_workspace(self.config.data), self.meta, batch_rows=self.hp.batch_size, rank=self.rank,
                             world=self.world, even=self.world > 1, seed=self.hp.seed)
        x, y = stream.sample(4096)
        workers = int(self.meta["sharded"].get("loaderWorkers", 0))
        return _Data(arch, None, self.meta["task"], x, y, None, stream.total, stream, workers)

    def _stream_batches(self, data: _Data, epoch: int, first: int) -> Any:
        """This rank's batches of one epoch from its DataLoader (each worker streams its own rows),
        from the ``first``-th on (a resumed epoch replays the same order and skips what it did)."""
        from torch.utils.data import DataLoader

        data.stream.set_epoch(epoch)
        loader = DataLoader(data.stream, batch_size=None, num_workers=data.loader_workers,
                            pin_memory=self.cuda, persistent_workers=False)
        for i, (xb, yb) in enumerate(loader):
            if i >= first:
                yield xb.to(self.device, non_blocking=True), yb.to(self.device, non_blocking=True)

    def _block_costs(self, model: Any, criterion: Any, data: _Data) -> BlockCosts:
        """The model's block costs (runtimes/models.block_costs) on a first micro-batch of the
        training data, under the step's autocast: what `gradientCheckpointing: auto` cuts by."""
        import torch

        from runtimes.models import block_costs

        rows = min(self.hp.batch_size, len(data.x))
        xb, yb = data.x[:rows].to(self.device), data.y[:rows].to(self.device)
        dtype = _autocast_dtype(self.config.spec.precision)

        def step() -> Any:
            with torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
                out = model(xb)
            return criterion(out, yb)

        return block_costs(model, step)

    def _build(self, data: _Data) -> _Parts:
        """The fresh model on its device, its loss, optimizer and learning-rate schedule, and the
        run's step budget; the checkpoint folder made (rank 0)."""
        import torch

        from runtimes.learn import loss_fn
        from runtimes.models import build_model, count_parameters

        spec = self.config.spec
        model = build_model(data.arch, self.meta)
        model.to(self.device)
        criterion = loss_fn(data.task)
        if spec.gradient_checkpointing is not False:
            if hasattr(model, "gradient_checkpointing"):
                model.gradient_checkpointing = True
                blocks = getattr(model, "blocks", None)
                if blocks is not None:
                    # Segments of the model's block stack (runtimes/models.py): one per block for `true`
                    costs = self._block_costs(model, criterion, data) if spec.gradient_checkpointing == "auto" else None
                    model.checkpoint_segments = self.checkpoint_segments = spec.checkpoint_segments(len(blocks), costs)
                    log.info("gradient checkpointing: %d blocks in %d segments", len(blocks), model.checkpoint_segments)
                    if costs is not None:
                        sqrt = spec.model_copy(update={"gradient_checkpointing": "sqrt"}).checkpoint_segments(len(blocks))
                        log.info("auto: an estimated activation peak of %.1f MiB; %.1f MiB in %d segments (sqrt), %.1f MiB per block",
                                 peak_bytes(costs, model.checkpoint_segments) / 2**20, peak_bytes(costs, sqrt) / 2**20,
                                 sqrt, peak_bytes(costs, len(blocks)) / 2**20)
            else:
                log.warning("gradientCheckpointing: custom model %s has no `gradient_checkpointing` switch; ignored", type(model).__name__)
        params = count_parameters(model)
        if self.rank == 0:
            log.info("training %s v%s: %s, %d parameters, %d samples, strategy %s, precision %s, world %d",
                     self.config.model, self.config.version, data.arch["type"], params, data.samples, self.strategy,
                     spec.precision, self.world)
        micro_per_epoch, total = self._budget(data)
        optimizer = self._optimizer(model)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_schedule(self.hp, total))
        ckpt_dir = self.out / "checkpoints"
        if self.rank == 0:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
        return _Parts(model, criterion, optimizer, scheduler, micro_per_epoch, total, ckpt_dir)

    def _budget(self, data: _Data) -> tuple[int, int]:
        """(micro-batches per epoch on this rank, optimizer steps of the run): the epochs' steps,
        cut at ``maxSteps``. A stream's batches are counted as its loader's workers yield them."""
        hp = self.hp
        if data.stream is not None:
            from runtimes.shard_stream import batches_per_rank

            micro_per_epoch = batches_per_rank(data.samples, self.world, data.loader_workers, hp.batch_size, data.stream.even)
        else:
            micro_per_epoch = math.ceil(math.ceil(data.samples / self.world) / hp.batch_size)
        steps_per_epoch = math.ceil(micro_per_epoch / hp.gradient_accumulation_steps)
        total = hp.epochs * steps_per_epoch
        if hp.max_steps is not None:
            total = min(total, hp.max_steps)
        return micro_per_epoch, total

    def _wrap(self, parts: _Parts) -> _Wrapped:
        """The model under DeepSpeed's engine (which also takes over the optimizer, the schedule
        and the precision), or under DDP with autocast (and a GradScaler for fp16); compiled
        when the spec says so (not under DeepSpeed, which wraps the model itself)."""
        import torch

        spec = self.config.spec
        model, optimizer, scheduler, criterion = parts.model, parts.optimizer, parts.scheduler, parts.criterion
        engine = None
        net = model
        scaler = None
        autocast_dtype = _autocast_dtype(spec.precision)
        input_dtype = None
        if self.strategy == "deepspeed":
            import deepspeed

            ds_cfg = deepspeed_config(self.config, self.hp, cpu=not self.cuda)
            engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_cfg)
            net = engine
            autocast_dtype = None  # DeepSpeed casts the model itself (bf16/fp16 sections)
            input_dtype = torch.bfloat16 if ds_cfg.get("bf16", {}).get("enabled") else (torch.float16 if ds_cfg.get("fp16", {}).get("enabled") else None)
        else:
            if self.world > 1:
                from torch.nn.parallel import DistributedDataParallel

                net = DistributedDataParallel(model, device_ids=[self.device.index] if self.cuda else None)
            if spec.precision == "fp16":
                scaler = torch.amp.GradScaler(self.device.type)
        if spec.compile:
            if engine is not None:
                log.warning("compile: not applied with strategy deepspeed (DeepSpeed wraps the model itself)")
            else:
                net = torch.compile(net)  # compiles on the first step (timed as warm-up)
                # The loss too: TorchInductor fuses the fp32 upcast of the logits, the log-softmax
                # and its backward into a few passes over the (bf16) logits, where eager PyTorch
                # writes and reads [batch × context × vocabulary] fp32 tensors several times.
                criterion = torch.compile(criterion)
        return _Wrapped(model, net, engine, optimizer, scheduler, scaler, criterion, autocast_dtype, input_dtype)

    # -- the loops ------------------------------------------------------------------------------
    def _train_private(self, data: _Data, parts: _Parts) -> _Outcome:
        """DP-SGD (runtimes/privacy.py): its own loop over Poisson-sampled batches, no checkpoints."""
        from runtimes.privacy import train_private

        final, state, elapsed, samples, throughput, privacy = train_private(
            self, parts.model, parts.optimizer, parts.scheduler, parts.criterion, data.x, data.y, parts.total, StepMeter)
        return _Outcome(final, state, 0, elapsed, samples, throughput, privacy)

    def _train(self, data: _Data, parts: _Parts) -> _Outcome:
        """The plain loop: from the last checkpoint of this config (if any) to ``total`` steps."""
        w = self._wrap(parts)
        state = self._resume(w, parts.ckpt_dir, {"step": 0, "epoch": 0, "micro": 0})
        resumed_from = state["step"]
        start = time.perf_counter()
        progress = _Progress(state, StepMeter(self.device, data.ctx if data.task == "lm" else None))
        w.net.train()
        for epoch in range(state["epoch"], self.hp.epochs):
            if state["step"] >= parts.total:
                break
            self._epoch(w, data, parts, progress, epoch)
            if self.trial is not None and self._report_epoch(w, data, epoch + 1):
                break
        elapsed = time.perf_counter() - start
        throughput = progress.meter.summary()
        state["total"] = parts.total
        return _Outcome(self._final_weights(w.model, w.engine), state, resumed_from, elapsed, progress.samples, throughput)

    def _report_epoch(self, w: _Wrapped, data: _Data, epoch: int) -> bool:
        """A search trial's validation metric after ``epoch`` (1-based), reported to its study (the
        pruner compares it with the other trials at that epoch); True when the trial is pruned and
        the run stops here. Measured on the bare module's current weights, in eval mode."""
        import torch

        from runtimes.learn import measure_rows, split_rows

        assert self.trial is not None
        if self._validation is None:
            self._validation = split_rows(self.data, "validation", data.ctx)
        try:
            with torch.no_grad():
                metrics = measure_rows(w.model, self._validation, data.task)
        finally:
            w.model.train()
        pruned = self.trial.report(metrics, epoch)
        value = metrics.get(self.trial.metric)
        emit("trial", trial=self.trial.number, epoch=epoch, value=round(value, 6) if value is not None else None, pruned=pruned)
        if pruned:
            log.info("trial %d pruned after epoch %d (%s %.4g)", self.trial.number, epoch, self.trial.metric, value or float("nan"))
        return pruned

    def _epoch(self, w: _Wrapped, data: _Data, parts: _Parts, progress: _Progress, epoch: int) -> None:
        """One epoch (the rest of it, when resuming inside one), ending early once the run's
        ``total`` steps are done. The batch order is a function of (seed, epoch): a resumed run
        sees the batches the uninterrupted one would."""
        import torch

        hp, state, meter = self.hp, progress.state, progress.meter
        first = state["micro"] if epoch == state["epoch"] else 0
        if data.batches is not None:
            gen = torch.Generator().manual_seed(hp.seed * 100_003 + epoch)
            perm = data.batches.order(torch.randperm(len(data.x), generator=gen)[self.rank :: self.world])
        else:
            stream = self._stream_batches(data, epoch, first)
        running, count = torch.zeros((), dtype=torch.float64, device=self.device), 0
        for i in range(first, parts.micro_per_epoch):
            if data.batches is not None:
                idx = perm[i * hp.batch_size : (i + 1) * hp.batch_size]
                if len(idx) == 0:
                    continue
                meter.begin()
                xb, yb = data.batches.get(idx)
            else:
                meter.begin()
                xb, yb = next(stream)
                idx = yb
            if w.input_dtype is not None and xb.is_floating_point():
                xb = xb.to(w.input_dtype)
            last = i == parts.micro_per_epoch - 1
            loss, boundary = self._micro_step(w, meter, (xb, yb), (i + 1) % hp.gradient_accumulation_steps == 0 or last, last)
            running += loss.detach().double() * len(idx)  # stays on the device: no sync per micro-batch
            count += len(idx)
            progress.samples += len(idx) * self.world
            progress.step_samples += len(idx) * self.world
            if boundary and self._after_optimizer_step(w, parts, progress, (epoch, i), (running, count)):
                break
        if count and self.rank == 0:
            log.info("epoch %d/%d: loss %.4f", epoch + 1, hp.epochs, float(running) / count)

    def _micro_step(self, w: _Wrapped, meter: StepMeter, batch: tuple[Any, Any], boundary: bool, last: bool) -> tuple[Any, bool]:
        """Forward and backward of one micro-batch (inputs, targets), and the optimizer update at
        an accumulation boundary; returns (loss, whether this was a boundary). Under DeepSpeed the
        engine keeps the accumulation count; otherwise DDP skips the gradient all-reduce between
        boundaries."""
        import torch

        hp, spec = self.hp, self.config.spec
        xb, yb = batch
        if w.engine is not None:
            loss = w.criterion(w.engine(xb), yb)
            w.engine.backward(loss)
            w.engine.step()
            return loss, w.engine.is_gradient_accumulation_boundary() or last
        sync = contextlib.nullcontext() if boundary or self.world == 1 else w.net.no_sync()
        with sync:
            with meter.saved_tensors(w.model, enabled=not spec.compile):
                with torch.autocast(self.device.type, dtype=w.autocast_dtype, enabled=w.autocast_dtype is not None):
                    out = w.net(xb)
                loss = w.criterion(out, yb)
            scaled = loss / hp.gradient_accumulation_steps
            (w.scaler.scale(scaled) if w.scaler else scaled).backward()
        if boundary:
            if w.scaler:
                w.scaler.step(w.optimizer)
                w.scaler.update()
            else:
                w.optimizer.step()
            w.optimizer.zero_grad(set_to_none=True)
            w.scheduler.step()
        return loss, boundary

    def _after_optimizer_step(self, w: _Wrapped, parts: _Parts, progress: _Progress, at: tuple[int, int],
                              epoch_loss: tuple[Any, int]) -> bool:
        """After an optimizer step (micro-batch ``at`` = (epoch, index)): time it, report progress
        (rank 0, about 50 times a run) and checkpoint every ``checkpointEvery`` steps and at the
        end. Returns whether the run's ``total`` steps are done. ``epoch_loss`` = (the epoch's
        summed loss, on the device; its samples): read back only when a report needs it (a sync)."""
        epoch, i = at
        running, count = epoch_loss
        state, total = progress.state, parts.total
        progress.meter.end(progress.step_samples)
        progress.step_samples = 0
        state["step"] += 1
        if self.rank == 0 and (state["step"] % max(1, total // 50) == 0 or state["step"] == total):
            event = {"step": state["step"], "total": total, "epoch": epoch + 1, "loss": round(float(running) / max(1, count), 6),
                     "lr": w.optimizer.param_groups[0]["lr"]}
            emit("progress", **event)
            write_json(self.out / "progress.json", {"event": "progress", **event})
        if state["step"] % self.config.checkpoint_every == 0 or state["step"] >= total:
            ep, micro_next = (epoch + 1, 0) if i + 1 >= parts.micro_per_epoch else (epoch, i + 1)
            self._checkpoint(w, parts.ckpt_dir, {"step": state["step"], "epoch": ep, "micro": micro_next})
        return state["step"] >= total

    # -- the end --------------------------------------------------------------------------------
    def _finish(self, data: _Data, outcome: _Outcome) -> int:
        """Measure the final weights, write the bundle and ``metrics.json`` (rank 0), then wait for
        the other ranks."""
        import torch

        from runtimes.learn import split_rows

        if self.cuda:
            import gc

            gc.collect()
            torch.cuda.empty_cache()
        if self.rank == 0:
            from runtimes.models import build_model as _build
            from runtimes.models import save_bundle

            clean = _build(data.arch, self.meta)
            clean.load_state_dict(outcome.final)
            clean.eval()
            validation = split_rows(self.data, "validation", data.ctx)  # streamed when sharded
            val, train_metrics = self._measure(clean, validation, (data.x[:4096], data.y[:4096]), data.task)
            info = self._bundle_info(data, clean)
            save_bundle(self.out, clean, info)
            metrics = self._metrics(outcome, val, train_metrics, info["parameters"])
            if self.trial is not None:
                # The study learns the trial's end before pick-best reads it (after every trial task).
                metrics["trial"] = {"number": self.trial.number, "state": self.trial.finish(val),
                                    "epochsTrained": self.trial.reported, "prunedAtEpoch": self.trial.pruned_at,
                                    "asked": self.trial.params}
            write_json(self.out / "metrics.json", metrics)
            self._report_done(outcome, val)
        self._barrier()
        return 0

    def _bundle_info(self, data: _Data, clean: Any) -> dict[str, Any]:
        """``model.json``: what the servers and the later steps need to load and feed the model."""
        from runtimes.models import count_parameters

        return {
            "model": self.config.model,
            "version": self.config.version,
            "architecture": data.arch,
            "task": data.task,
            "inputKind": self.meta.get("inputKind", "features"),
            "numFeatures": self.meta.get("numFeatures"),
            "numClasses": self.meta.get("numClasses"),
            "classes": self.meta.get("classes", []),
            "imageShape": self.meta.get("imageShape"),
            "transform": self.meta.get("transform", {}),
            "dataDigest": self.meta.get("digest"),
            "precision": self.config.spec.precision,
            "parameters": count_parameters(clean),
            "compression": [],
        }

    def _metrics(self, outcome: _Outcome, val: dict[str, float], train_metrics: dict[str, float], parameters: int) -> dict[str, Any]:
        """``metrics.json``: the validation metrics at the top (the evaluate step and the registry
        read them there), then how the run went."""
        import torch

        spec, elapsed = self.config.spec, outcome.elapsed
        metrics = {
            "model": self.config.model,
            "version": self.config.version,
            **val,
            "validation": val,
            "train": train_metrics,
            "steps": outcome.state["step"],
            "resumedFromStep": outcome.resumed_from,
            "seconds": round(elapsed, 3),
            "samplesPerSecond": round(outcome.samples / elapsed, 1) if elapsed > 0 else None,
            "throughput": outcome.throughput,
            "device": torch.cuda.get_device_name(self.device) if self.cuda else "cpu",
            "compile": spec.compile and self.strategy != "deepspeed",
            "deterministic": spec.deterministic,
            "gradientCheckpointing": spec.gradient_checkpointing,
            "checkpointSegments": self.checkpoint_segments,
            "parameters": parameters,
            "strategy": self.strategy,
            "zeroStage": spec.distributed.zero_stage if self.strategy == "deepspeed" else None,
            "worldSize": self.world,
            "precision": spec.precision,
            "hyperparameters": self.hp.to_yaml_dict(),
        }
        if outcome.privacy is not None:
            metrics["privacy"] = outcome.privacy
            metrics["epsilon"] = outcome.privacy["epsilonSpent"]
        return metrics

    def _report_done(self, outcome: _Outcome, val: dict[str, float]) -> None:
        """The ``done`` event on stdout and its log line."""
        state, elapsed, throughput = outcome.state, outcome.elapsed, outcome.throughput
        rates = {k: throughput[k] for k in ("tokensPerSecond", "samplesPerSecond", "peakMemoryBytes") if throughput[k] is not None}
        emit("done", steps=state["step"], total=state.get("total", state["step"]), seconds=round(elapsed, 3), **rates, **{k: v for k, v in val.items()})
        log.info("done: %d steps in %.1fs (warm-up %.1fs, then %s/s, step %.4fs median); validation %s", state["step"], elapsed,
                 throughput["warmupSeconds"], f"{throughput['tokensPerSecond']:,.0f} tokens" if throughput["tokensPerSecond"] else
                 f"{throughput['samplesPerSecond'] or 0:,.1f} samples", throughput["stepSeconds"]["median"] or 0.0,
                 json.dumps({k: round(v, 4) for k, v in val.items()}))

    # -- helpers ------------------------------------------------------------------------------
    def _measure(self, clean: Any, validation: Rows, train: tuple[Any, Any], task: str) -> tuple[dict[str, float], dict[str, float]]:
        """Validation metrics (the split in memory, or a sharded one streamed a batch at a time) and
        training metrics (an (inputs, targets) pair) of the final weights, on the training device (a
        GPU measures a large LM in seconds where a CPU takes hours); on the CPU if the device runs
        out of memory."""
        import torch

        from runtimes.learn import measure, measure_rows

        tx, ty = train
        try:
            clean.to(self.device)
            return (measure_rows(clean, validation, task) if len(validation) else {}), measure(clean, tx, ty, task)
        except torch.cuda.OutOfMemoryError:
            log.warning("out of device memory measuring the final model; measuring on the CPU")
            clean.to("cpu")
            torch.cuda.empty_cache()
            return (measure_rows(clean, validation, task) if len(validation) else {}), measure(clean, tx, ty, task)
        finally:
            clean.to("cpu")

    def _optimizer(self, model: Any) -> Any:
        import torch

        hp = self.hp
        params = [p for p in model.parameters() if p.requires_grad]
        if hp.optimizer == "sgd":
            return torch.optim.SGD(params, lr=hp.learning_rate, momentum=hp.momentum, weight_decay=hp.weight_decay)
        # On CUDA the fused Adam(W) kernel: one pass over parameters, gradients and both moments
        # instead of the ~10 passes of the multi-tensor (foreach) default. DeepSpeed wraps the
        # optimizer in its own (flattened, partitioned) one: left as it is there.
        fused = {"fused": True} if self.cuda and self.strategy != "deepspeed" and all(p.is_cuda and p.is_floating_point() for p in params) else {}
        if hp.optimizer == "adam":
            return torch.optim.Adam(params, lr=hp.learning_rate, weight_decay=hp.weight_decay, **fused)
        return torch.optim.AdamW(params, lr=hp.learning_rate, weight_decay=hp.weight_decay, **fused)

    def _barrier(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def _rng(self) -> dict[str, Any]:
        import torch

        return {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if self.cuda else None}

    def _set_rng(self, rng: dict[str, Any]) -> None:
        import torch

        torch.set_rng_state(rng["cpu"])
        if self.cuda and rng.get("cuda") is not None:
            torch.cuda.set_rng_state_all(rng["cuda"])

    def _checkpoint(self, w: _Wrapped, ckpt_dir: Path, position: dict[str, int]) -> None:
        """Save where the run is (``position``: the next step, epoch and micro-batch), the weights,
        the optimizer, schedule and scaler states and the RNG: a resumed run ends identical."""
        import torch

        client = {**position, "fingerprint": self.fingerprint}
        if w.engine is not None:
            client["rng"] = self._rng()
            w.engine.save_checkpoint(str(ckpt_dir / "deepspeed"), tag="last", client_state=client)
        elif self.rank == 0:
            payload = {
                **client,
                "model": w.model.state_dict(),
                "optimizer": w.optimizer.state_dict(),
                "scheduler": w.scheduler.state_dict(),
                "scaler": w.scaler.state_dict() if w.scaler else None,
                "rng": self._rng(),
            }
            tmp = ckpt_dir / "last.pt.tmp"
            torch.save(payload, tmp)
            os.replace(tmp, ckpt_dir / "last.pt")
        if self.rank == 0:
            log.info("checkpoint at step %d", position["step"])
        self._barrier()

    def _resume(self, w: _Wrapped, ckpt_dir: Path, state: dict[str, int]) -> dict[str, int]:
        """The position to start from: that of the last checkpoint of this same config (its state
        loaded into ``w``), else ``state``."""
        import torch

        if w.engine is not None:
            if not (ckpt_dir / "deepspeed" / "latest").exists():
                return state
            path, client = w.engine.load_checkpoint(str(ckpt_dir / "deepspeed"), tag="last")
            if path is None or client.get("fingerprint") != self.fingerprint:
                log.warning("ignoring checkpoint of a different config in %s", ckpt_dir)
                return state
            payload = client
        else:
            file = ckpt_dir / "last.pt"
            if not file.exists():
                return state
            payload = torch.load(file, map_location=self.device, weights_only=False)
            if payload.get("fingerprint") != self.fingerprint:
                log.warning("ignoring checkpoint of a different config at %s", file)
                return state
            w.model.load_state_dict(payload["model"])
            w.optimizer.load_state_dict(payload["optimizer"])
            w.scheduler.load_state_dict(payload["scheduler"])
            if w.scaler is not None and payload.get("scaler"):
                w.scaler.load_state_dict(payload["scaler"])
        self._set_rng(payload["rng"])
        if self.rank == 0:
            log.info("resuming from checkpoint at step %d (epoch %d)", payload["step"], payload["epoch"] + 1)
            emit("resume", step=payload["step"])
        return {"step": payload["step"], "epoch": payload["epoch"], "micro": payload["micro"]}

    def _final_weights(self, model, engine) -> dict[str, Any]:
        """Full fp32 weights on CPU (gathered from ZeRO-3 partitions when needed)."""
        if engine is not None and engine.zero_optimization_stage() == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
                return {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}
        return {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
