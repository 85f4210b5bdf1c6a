"""What the specs will cost on their accelerators, and whether the target can run them (pure).

For the plan a reviewer reads: per training step, the GPU arithmetic that decided its width (from
`renderers.scheduling`, part by part — nothing is computed twice) and an estimate of its
GPU-hours; per endpoint, replicas × GPUs; and the problems a target cannot get past.

GPU-hours, with the formula shown in the plan:

    FLOPs      transformers (gpt):   6 · N · tokens   (forward 2·N·D + backward 4·N·D, Kaplan et al.
                                     2020), 8 · N · tokens with gradient checkpointing (the forward
                                     runs again in the backward pass)
               others:               samples × epochs × FLOPs per sample, where a sample costs
                                     6 · N for an MLP or a custom architecture (every weight is used
                                     once per sample) and 6 × the convolutions' multiply-adds for a
                                     CNN (weights are reused at every pixel)
               × search trials (each trains the same way)
    tokens     text sources are read as bytes (vocabulary 256): bytes × the train split × epochs;
               other sources: samples × contextLength
    seconds    FLOPs ÷ (the accelerator's dense peak for the precision × UTILISATION)
    GPU-hours  seconds ÷ 3600; the job holds `gpus` of them, so its wall time is GPU-hours ÷ gpus

`hyperparameters.maxSteps` caps the work at maxSteps × batchSize × gradientAccumulationSteps ×
data-parallel ranks samples (× contextLength tokens). How much data a Dataset holds is known for
scikit-learn's data sets; for a file the caller measures it (its size, from git or the working
tree) and passes a :class:`DataSize`; otherwise the estimate says it is unknown.

Capacity (:func:`capacity_problems`) is a pure check of the specs against what the target
declares: a Compute pool's `maxGpus` and `gpusPerNode`, and the `local` target's `local.gpus` (the
accelerators this machine offers, 0 unless the Environment says otherwise) — nothing is probed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from renderers.queues import admission_ceiling, queued
from renderers.scheduling import (
    GIB,
    USABLE_FRACTION,
    MemoryBreakdown,
    Schedule,
    SchedulingError,
    data_shape,
    schedule_resources,
)
from specs import Compute, Dataset, Endpoint, Environment, Model, SpecSet
from specs.model import CNN, GPT

#: The share of the accelerator's dense peak a training job is assumed to reach (model FLOPs
#: utilisation). 40 % is typical of well-tuned data-parallel training of transformers; small
#: models reach less, so their estimate is a lower bound.
UTILISATION = 0.40

#: Dense peak TFLOP/s per device: (16-bit tensor cores — bf16/fp16, fp32). Vendor figures without
#: sparsity; `None` where Forge has none (the estimate then says so).
PEAK_TFLOPS: dict[str, tuple[float | None, float | None]] = {
    "nvidia-a100-40gb": (312.0, 19.5),
    "nvidia-a100-80gb": (312.0, 19.5),
    "nvidia-h100-80gb": (989.4, 66.9),  # SXM
    "nvidia-h200-141gb": (989.4, 66.9),
    "nvidia-l4": (121.0, 30.3),
    "nvidia-jetson-orin": (42.5, 5.3),  # AGX Orin 64 GB, GPU only
    "amd-mi300x": (1307.4, 163.4),
    "intel-gaudi2": (432.0, None),
    "aws-trainium2": (667.0, 181.0),
    "custom": (None, None),
    "cpu": (None, None),
}

#: Rows of the data sets scikit-learn ships (what `sklearn://` loads).
SKLEARN_ROWS: dict[str, int] = {"digits": 1797, "iris": 150, "wine": 178, "breast_cancer": 569, "diabetes": 442}


@dataclass(frozen=True)
class DataSize:
    """How much one pass over a Dataset holds, as far as the plan knows: rows, or bytes of text."""

    samples: int | None = None
    bytes: int | None = None
    #: Where the figure comes from, for the plan (`scikit-learn's digits`, `data/x.txt at HEAD`).
    source: str = ""


def known_size(dataset: Dataset) -> DataSize | None:
    """The size of a data set the specs alone determine (scikit-learn's), else None."""
    uri = dataset.spec.source.uri
    if uri.startswith("sklearn://"):
        name = uri.removeprefix("sklearn://")
        return DataSize(samples=SKLEARN_ROWS[name], source=f"scikit-learn's {name}")
    return None


def _num(value: float) -> str:
    """A number for a formula: integers with separators, others with 3 significant digits."""
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.3g}"


def sci(value: float) -> str:
    """A large number in short scientific notation (`3.99e14`); small ones as they are."""
    if abs(value) < 1e6:
        return _num(value)
    mantissa, exponent = f"{value:.3g}".split("e")
    return f"{mantissa}e{int(exponent)}"


def gib(value: float) -> str:
    """Bytes in binary units with one decimal (`28.4 GiB`, `199.0 KiB`)."""
    for unit, scale in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def params_text(count: int) -> str:
    """`6.59B parameters (6,592,012,288)`, `124.4M parameters (…)`, `5,226 parameters`."""
    if count >= 10**9:
        return f"{count / 1e9:.2f}B parameters ({count:,})"
    if count >= 10**6:
        return f"{count / 1e6:.1f}M parameters ({count:,})"
    return f"{count:,} parameters"


def hours(value: float) -> str:
    """Hours for a plan, with a sensible precision."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}"
    if value >= 0.01:
        return f"{value:.2f}"
    return f"{value:.2g}"


@dataclass(frozen=True)
class TrainingEstimate:
    """One Model's training: the width, the memory arithmetic behind it and the GPU-hours."""

    model: str
    pool: str
    accelerator: str
    schedule: Schedule | None
    error: str = ""
    breakdown: MemoryBreakdown | None = None
    flops: float | None = None
    flops_formula: str = ""
    work: str = ""
    peak_tflops: float | None = None
    gpu_hours: float | None = None
    unknown: str = ""
    trials: int = 1
    precision: str = ""
    min_gpus: int = 0
    max_gpus: int = 0
    gpus_per_node: int = 0

    @property
    def gpus(self) -> int:
        """GPUs the job holds (0 on a CPU pool or when it cannot be scheduled)."""
        return self.schedule.gpus if self.schedule else 0

    def memory_lines(self) -> list[str]:
        """The per-GPU arithmetic, one line per term, then the decision."""
        b = self.breakdown
        if b is None:
            return []
        names = ("weights", "gradients", "optimizer state")
        parts = []
        for what, per, div, value in zip(names, b.bytes_per_parameter, b.partitions, (b.weights, b.gradients, b.optimizer_state)):
            if div == 0:
                parts.append(f"{what} {per:g} B/param offloaded to CPU = 0")
                continue
            split = b.tensor_parallel * b.pipeline_parallel
            over = f" ÷ {div} (ZeRO-{b.zero_stage})" if div > 1 else ""
            over += f" ÷ {split} (tp × pp)" if split > 1 else ""
            parts.append(f"{what} {per:g} B × {sci(b.parameters)}{over} = {gib(value)}")
        ckpt = "with" if b.checkpointing else "without"
        other = "without" if b.checkpointing else "with"
        acts = f"activations {gib(b.activations)} {ckpt} gradient checkpointing ({b.activation_formula})"
        if b.activations_other != b.activations:
            acts += f"; {gib(b.activations_other)} {other}"
        head = (f"{params_text(b.parameters)}, {b.precision} {b.optimizer}, ZeRO-{b.zero_stage}"
                + (f", offload {b.offload}" if b.offload != "none" else "")
                + f", at {b.gpus} GPU{'s' if b.gpus != 1 else ''} ({b.data_parallel} data-parallel"
                + (f" × tp {b.tensor_parallel} × pp {b.pipeline_parallel}" if b.tensor_parallel * b.pipeline_parallel > 1 else "")
                + "):")
        fits = "≤" if b.total <= b.usable else ">"
        total = (f"= {gib(b.total)} per GPU {fits} {gib(b.usable)} usable "
                 f"({b.device_gib:g} GiB {self.accelerator} × {USABLE_FRACTION * 100:g} %)")
        return [head, *(f"  {p}" for p in parts), f"  {acts}", f"  {total}"]

    def decision(self) -> str:
        """How the width was chosen: fits from N → whole nodes within min/max."""
        s = self.schedule
        if s is None:
            return self.error
        if s.gpus == 0:
            return f"{params_text(s.parameters)} on a CPU pool: one node, no accelerators"
        nodes = f"{s.nodes} node{'s' if s.nodes != 1 else ''} × {s.gpus_per_node}"
        why = f"fits from {s.fits_on} GPU{'s' if s.fits_on != 1 else ''}"
        if s.gpus != s.fits_on:
            why += f"; rounded to whole nodes of {self.gpus_per_node} within minGpus {self.min_gpus}..maxGpus {self.max_gpus}"
        return f"{why} → {s.gpus} × {self.accelerator} = {nodes} ({'PyTorchJob' if s.multi_node else 'one pod'})"

    def cost_lines(self) -> list[str]:
        """The FLOPs formula with its numbers, and the GPU-hours."""
        if self.flops is None:
            return [f"GPU-hours: unknown — {self.unknown}"] if self.unknown else []
        lines = [f"FLOPs = {self.flops_formula} = {sci(self.flops)}", f"  {self.work}"]
        if self.gpus == 0:
            lines.append("  no accelerators (CPU pool): no GPU-hours")
        elif self.peak_tflops is None or self.gpu_hours is None:
            lines.append(f"  GPU-hours: unknown — {self.unknown}")
        else:
            wall = self.gpu_hours / self.gpus
            lines.append(f"GPU-hours = FLOPs ÷ ({self.peak_tflops:g} TFLOP/s {self.precision} peak × {UTILISATION * 100:g} % utilisation) ÷ 3600 "
                         f"≈ {hours(self.gpu_hours)} GPU-hours (≈ {hours(wall)} h on {self.gpus} GPU{'s' if self.gpus != 1 else ''})")
        return lines

    def to_json(self) -> dict[str, Any]:
        """Plain data for the plan's JSON (docs/plan-json.md)."""
        s, b = self.schedule, self.breakdown
        return {
            "model": self.model, "pool": self.pool, "accelerator": self.accelerator,
            "parameters": (s.parameters if s else (b.parameters if b else None)),
            "gpus": s.gpus if s else None, "nodes": s.nodes if s else None,
            "gpusPerNode": s.gpus_per_node if s else None, "fitsOn": s.fits_on if s else None,
            "minGpus": self.min_gpus, "maxGpus": self.max_gpus,
            "memory": None if b is None else {
                "gpus": b.gpus, "dataParallel": b.data_parallel, "tensorParallel": b.tensor_parallel,
                "pipelineParallel": b.pipeline_parallel, "precision": b.precision, "optimizer": b.optimizer,
                "zeroStage": b.zero_stage, "offload": b.offload, "bytesPerParameter": list(b.bytes_per_parameter),
                "partitions": list(b.partitions), "weightsBytes": round(b.weights), "gradientsBytes": round(b.gradients),
                "optimizerStateBytes": round(b.optimizer_state), "activationsBytes": round(b.activations),
                "activationsOtherBytes": round(b.activations_other), "gradientCheckpointing": b.checkpointing,
                "activationFormula": b.activation_formula, "totalBytes": round(b.total), "usableBytes": round(b.usable),
                "deviceGiB": b.device_gib, "usableFraction": USABLE_FRACTION,
            },
            "flops": self.flops, "flopsFormula": self.flops_formula, "work": self.work, "trials": self.trials,
            "peakTflops": self.peak_tflops, "precision": self.precision, "utilisation": UTILISATION, "gpuHours": self.gpu_hours,
            "wallHours": (self.gpu_hours / self.gpus) if self.gpu_hours is not None and self.gpus else None,
            "unknown": self.unknown or None, "error": self.error or None,
            "lines": [*self.memory_lines(), self.decision(), *self.cost_lines()],
        }


def _cnn_macs(arch: CNN) -> int:
    """Multiply-adds of one forward pass of the runtime's CNN (3×3 convolutions, padding 1, a 2×2
    max-pool after each block while the side is at least 4), excluding the head."""
    macs, c_in, side = 0, arch.in_channels, arch.image_size
    for c in arch.channels:
        macs += c_in * c * 9 * side * side
        if side >= 4:
            side //= 2
        c_in = c
    return macs


def _flops(model: Model, dataset: Dataset, params: int, dp: int, size: DataSize | None) -> tuple[float | None, str, str, str]:
    """(FLOPs, formula, the work it counts, why unknown)."""
    spec = model.spec
    hp = spec.hyperparameters
    arch = spec.architecture
    split = dataset.spec.splits.train
    trials = spec.search.trials if spec.search else 1
    per_step = hp.batch_size * hp.gradient_accumulation_steps * max(dp, 1)
    times_trials = f" × {trials} trials" if trials > 1 else ""
    if isinstance(arch, GPT):
        factor = 8 if spec.gradient_checkpointing else 6
        formula = f"{factor} · N · tokens{times_trials}"
        if size is not None and size.bytes is not None and dataset.spec.source.format == "text":
            per_epoch = int(size.bytes * split)
            source = f"{size.bytes:,} bytes ({size.source}) × {split:g} train split (byte tokens)"
        elif size is not None and size.samples is not None:
            per_epoch = int(size.samples * split) * arch.context_length
            source = f"{size.samples:,} samples ({size.source}) × {split:g} train split × {arch.context_length:,} tokens"
        else:
            per_epoch = 0
            source = ""
        tokens = per_epoch * hp.epochs
        if hp.max_steps is not None:
            cap = hp.max_steps * per_step * arch.context_length
            if not per_epoch or cap < tokens:
                tokens = cap
                source = (f"maxSteps {hp.max_steps:,} × {per_step:,} sequences/step (batch {hp.batch_size} × accumulation "
                          f"{hp.gradient_accumulation_steps} × {max(dp, 1)} ranks) × {arch.context_length:,} tokens")
            else:
                source += f" × {hp.epochs} epoch{'s' if hp.epochs != 1 else ''}"
        elif per_epoch:
            source += f" × {hp.epochs} epoch{'s' if hp.epochs != 1 else ''}"
        if not tokens:
            return None, formula, "", f"how much text Dataset `{dataset.name}` holds is not known at plan time; set `hyperparameters.maxSteps` for a bound"
        flops: float = factor * params * tokens * trials
        work = f"N = {params:,} parameters; tokens = {source} = {tokens:,}"
        formula = f"{factor} × {sci(params)} × {tokens:,}{f' × {trials}' if trials > 1 else ''}"
        formula = f"{factor} · N · tokens{times_trials} = {formula}"
        return float(flops), formula, work, ""
    if isinstance(arch, CNN):
        head = arch.channels[-1] * data_shape(dataset)[1]
        per_sample = 6 * (_cnn_macs(arch) + head)
        what = f"6 × ({_cnn_macs(arch):,} conv + {head:,} head multiply-adds)"
    else:
        per_sample = 6 * params
        what = f"6 · N = 6 × {params:,}"
    samples = int(size.samples * split) if size is not None and size.samples is not None else 0
    total: float = samples * hp.epochs
    source = (f"{size.samples:,} samples ({size.source}) × {split:g} train split × {hp.epochs} epochs"
              if size is not None and samples else "")
    if hp.max_steps is not None:
        cap = hp.max_steps * per_step
        if not total or cap < total:
            total = cap
            source = (f"maxSteps {hp.max_steps:,} × {per_step:,} samples/step (batch {hp.batch_size} × accumulation "
                      f"{hp.gradient_accumulation_steps} × {max(dp, 1)} ranks)")
    if not total:
        return None, "", "", f"how many samples Dataset `{dataset.name}` holds is not known at plan time; set `hyperparameters.maxSteps` for a bound"
    flops = float(per_sample) * total * trials
    formula = (f"samples × epochs × FLOPs/sample{times_trials} = {total:,} × {per_sample:,}"
               f"{f' × {trials}' if trials > 1 else ''}")
    return flops, formula, f"samples × epochs = {source} = {total:,}; FLOPs/sample = {what} = {per_sample:,}", ""


def training_estimate(specs: SpecSet, model: Model, env: Environment, size: DataSize | None = None) -> TrainingEstimate:
    """The width, memory arithmetic and GPU-hours of one Model's training on its pool."""
    dataset = specs.dataset_of(model)
    compute = specs.compute_of(model, env)
    acc = compute.spec.accelerator.type
    size = size or known_size(dataset)
    limits: dict[str, Any] = {"min_gpus": compute.spec.min_gpus, "max_gpus": compute.spec.max_gpus,
                              "gpus_per_node": compute.spec.gpus_per_node}
    trials = model.spec.search.trials if model.spec.search else 1
    try:
        schedule = schedule_resources(model, dataset, compute)
    except SchedulingError as exc:
        return TrainingEstimate(model.name, compute.name, acc, None, str(exc), exc.breakdown, trials=trials,
                                precision=model.spec.precision, **limits)
    split = model.spec.distributed.tensor_parallel * model.spec.distributed.pipeline_parallel
    dp = schedule.gpus // split if schedule.gpus else 1
    flops, formula, work, unknown = _flops(model, dataset, schedule.parameters, dp, size)
    peak16, peak32 = PEAK_TFLOPS.get(acc, (None, None))
    peak = peak32 if model.spec.precision == "fp32" else peak16
    gpu_hours = 0.0 if flops is not None and not schedule.gpus else None  # a CPU pool holds no accelerator
    if flops is not None and schedule.gpus:
        if peak is None:
            unknown = f"no peak FLOP/s known for {acc} in {model.spec.precision}"
        else:
            gpu_hours = flops / (peak * 1e12 * UTILISATION) / 3600
    return TrainingEstimate(model.name, compute.name, acc, schedule, breakdown=schedule.breakdown, flops=flops,
                            flops_formula=formula, work=work, peak_tflops=peak if schedule.gpus else None,
                            gpu_hours=gpu_hours, unknown=unknown, trials=trials, precision=model.spec.precision, **limits)


@dataclass(frozen=True)
class ServingEstimate:
    """One Endpoint's accelerators: replicas × GPUs per replica, and one more replica while a new
    version rolls out (the canary, or blue-green's preview)."""

    endpoint: str
    pool: str | None
    accelerator: str | None
    replicas: int
    max_replicas: int
    gpus_per_replica: int
    rollout_replicas: int

    @property
    def gpus(self) -> int:
        """GPUs of the stable predictor (at its most replicas with autoscaling)."""
        return self.max_replicas * self.gpus_per_replica

    def line(self) -> str:
        """`2 replicas × 1 GPU = 2 × nvidia-h100-80gb (pool …); +1 … during a rollout`."""
        reps = f"{self.replicas}" if self.replicas == self.max_replicas else f"{self.replicas}..{self.max_replicas} (autoscaling)"
        if not self.gpus_per_replica:
            where = f"pool {self.pool}" if self.pool else "CPU nodes"
            return f"{reps} replica{'s' if self.max_replicas != 1 else ''} on {where}, no accelerators"
        line = (f"{reps} replica{'s' if self.max_replicas != 1 else ''} × {self.gpus_per_replica} GPU"
                f"{'s' if self.gpus_per_replica != 1 else ''} = {self.gpus} × {self.accelerator} (pool {self.pool})")
        if self.rollout_replicas:
            line += f"; + {self.rollout_replicas * self.gpus_per_replica} during a rollout ({self.rollout_replicas} canary/preview replica)"
        return line

    def to_json(self) -> dict[str, Any]:
        """Plain data for the plan's JSON."""
        return {"endpoint": self.endpoint, "pool": self.pool, "accelerator": self.accelerator, "replicas": self.replicas,
                "maxReplicas": self.max_replicas, "gpusPerReplica": self.gpus_per_replica, "gpus": self.gpus,
                "rolloutGpus": self.rollout_replicas * self.gpus_per_replica, "line": self.line()}


def serving_estimate(specs: SpecSet, endpoint: Endpoint) -> ServingEstimate:
    """Replicas × GPUs of one Endpoint."""
    compute = specs.serving_compute_of(endpoint)
    res = endpoint.spec.resources
    per = max(res.requests.gpus, res.limits.gpus)
    auto = endpoint.spec.autoscaling
    low = auto.min_replicas if auto else endpoint.spec.replicas
    high = auto.max_replicas if auto else endpoint.spec.replicas
    return ServingEstimate(endpoint.name, compute.name if compute else None,
                           compute.spec.accelerator.type if compute else None, low, high, per if compute else 0, 1)


@dataclass(frozen=True)
class Estimate:
    """Training and serving of every spec, for one environment."""

    training: tuple[TrainingEstimate, ...] = ()
    serving: tuple[ServingEstimate, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Plain data for the plan's JSON."""
        known = [t.gpu_hours for t in self.training if t.gpu_hours is not None]
        return {
            "utilisation": UTILISATION,
            "usableFraction": USABLE_FRACTION,
            "trainingGpus": sum(t.gpus for t in self.training),
            "trainingGpuHours": sum(known) if known else None,
            "servingGpus": sum(s.gpus for s in self.serving),
            "training": [t.to_json() for t in self.training],
            "serving": [s.to_json() for s in self.serving],
        }


def estimate(specs: SpecSet, env: Environment, sizes: dict[str, DataSize] | None = None,
             models: set[str] | None = None) -> Estimate:
    """The estimate of every Model (or those named in ``models``) and every Endpoint; ``sizes``
    gives measured Dataset sizes by name."""
    sizes = sizes or {}
    training = tuple(training_estimate(specs, m, env, sizes.get(m.spec.dataset_ref))
                     for m in specs.of(Model) if models is None or m.name in models)
    serving = tuple(serving_estimate(specs, e) for e in specs.of(Endpoint))
    return Estimate(training, serving)


@dataclass(frozen=True)
class CapacityProblem:
    """Something the target cannot run, with the spec (kind, name, field path) that asks for it."""

    kind: str
    name: str
    path: tuple[str | int, ...]
    message: str
    #: A second place to point at (the Environment or pool that declares the capacity).
    declared_by: tuple[str, str, tuple[str | int, ...]] | None = field(default=None)


def capacity_problems(specs: SpecSet, env: Environment, est: Estimate) -> list[CapacityProblem]:
    """What the environment's target cannot satisfy, from declared capacity only (pure)."""
    problems: list[CapacityProblem] = []
    local = env.spec.target == "local"
    have = env.spec.local.gpus if local else None
    for t in est.training:
        if t.schedule is None:
            problems.append(CapacityProblem("Model", t.model, ("spec", "computeRef"), t.error,
                                            ("Compute", t.pool, ("spec", "maxGpus"))))
            continue
        compute = specs.get(Compute, t.pool)
        ceiling = admission_ceiling(compute) if compute is not None and queued(compute, env) else None
        if ceiling is not None and t.gpus > ceiling:
            queue = compute.spec.queue if compute is not None else None
            borrow = " plus its borrowing limit" if queue is not None and queue.cohort is not None else ""
            problems.append(CapacityProblem(
                "Model", t.model, ("spec", "computeRef"),
                f"model `{t.model}` trains on {t.gpus} × {t.accelerator} in one gang; pool `{t.pool}`'s queue admits at most "
                f"{ceiling} (its quota{borrow}): Kueue would never admit it", ("Compute", t.pool, ("spec", "queue", "quota", "gpus"))))
        if not local or not t.gpus:
            continue
        if t.schedule.multi_node:
            problems.append(CapacityProblem(
                "Model", t.model, ("spec", "computeRef"),
                f"model `{t.model}` trains on {t.schedule.nodes} nodes ({t.gpus} × {t.accelerator}, a PyTorchJob): the local "
                f"target runs one machine; use a cluster environment", ("Environment", env.name, ("spec", "target"))))
        elif have is not None and t.gpus > have:
            problems.append(CapacityProblem(
                "Model", t.model, ("spec", "computeRef"),
                f"model `{t.model}` needs {t.gpus} × {t.accelerator} to train (pool `{t.pool}`); the local target of "
                f"environment `{env.name}` declares {have} GPU{'s' if have != 1 else ''} (`spec.local.gpus`)",
                ("Environment", env.name, ("spec", "local", "gpus"))))
    for s in est.serving:
        if not s.gpus_per_replica:
            continue
        compute = specs.get(Compute, s.pool)
        per_node = compute.spec.gpus_per_node if compute else 0
        if per_node and s.gpus_per_replica > per_node:
            problems.append(CapacityProblem(
                "Endpoint", s.endpoint, ("spec", "resources"),
                f"endpoint `{s.endpoint}` asks {s.gpus_per_replica} GPUs per replica; a node of pool `{s.pool}` has "
                f"{per_node} (`gpusPerNode`): no pod can be scheduled", ("Compute", s.pool or "", ("spec", "gpusPerNode"))))
        elif local and have is not None and s.gpus_per_replica > have:
            problems.append(CapacityProblem(
                "Endpoint", s.endpoint, ("spec", "resources"),
                f"endpoint `{s.endpoint}` serves on {s.gpus_per_replica} × {s.accelerator} per replica; the local target "
                f"of environment `{env.name}` declares {have} GPU{'s' if have != 1 else ''} (`spec.local.gpus`)",
                ("Environment", env.name, ("spec", "local", "gpus"))))
    return problems
