"""`Model`: what to train (architecture, hyperparameters), on what data and compute, how to
distribute it, how to search hyperparameters and which offline thresholds gate it."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from specs.base import MAX_SEED, ImportRef, LaterFieldsModel, Name, Precision, Priority, SpecModel, Threshold
from specs.checkpointing import BlockCosts, least_peak_segments, segment_length

#: Limits on counts a Model spec derives work from (docs/security.md lists them all).
MAX_LAYERS = 64
MAX_OPTIONS = 64
MAX_CHOICES = 1000
MAX_STEPS = 1_000_000_000
MAX_PARAMETERS = 10**14
MAX_DATA_PARALLEL = 4096
MAX_SEGMENTS = 1024


class MLP(SpecModel):
    """A multi-layer perceptron for tabular/flattened inputs."""

    type: Literal["mlp"] = Field(description="Architecture family.")
    hidden_sizes: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=lambda: [128, 64], min_length=1, max_length=MAX_LAYERS,
        description=f"Width of each hidden layer (at most {MAX_LAYERS} layers)."
    )
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout after each hidden layer.")


class CNN(SpecModel):
    """A small convolutional network for images (conv → BN → ReLU blocks, then a linear head)."""

    type: Literal["cnn"] = Field(description="Architecture family.")
    channels: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [16, 32], min_length=1, max_length=MAX_LAYERS,
        description=f"Output channels of each conv block (at most {MAX_LAYERS} blocks)."
    )
    image_size: int = Field(default=8, ge=4, le=1024, description="Side of the square input image in pixels.")
    in_channels: int = Field(default=1, ge=1, le=16, description="Input channels (1 grey, 3 RGB).")


class GPT(LaterFieldsModel):
    """A GPT-style decoder-only language model."""

    type: Literal["gpt"] = Field(description="Architecture family.")
    layers: int = Field(default=4, ge=1, le=256, description="Transformer blocks.")
    d_model: int = Field(default=256, ge=8, le=65536, description="Hidden size.")
    heads: int = Field(default=4, ge=1, le=256, description="Attention heads; must divide `dModel`.")
    context_length: int = Field(default=128, ge=8, le=1_048_576, description="Tokens per training sequence.")
    vocab_size: int = Field(default=256, ge=2, le=1_048_576, description="Vocabulary size (256 = bytes).")
    attention: Literal["fused", "math"] = Field(
        default="fused",
        description="`fused`: PyTorch's `scaled_dot_product_attention`, which runs a flash or "
        "memory-efficient kernel where the device has one; `math`: the explicit softmax(QKᵀ/√d)·V "
        "(slower, memory quadratic in the context; a reference for numerics and benchmarks).",
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> GPT:
        if self.d_model % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide dModel ({self.d_model})")
        return self

    added_later = {"attention": "fused"}


class CustomArchitecture(SpecModel):
    """A user-supplied architecture built by a Python callable."""

    type: Literal["custom"] = Field(description="Architecture family.")
    entrypoint: ImportRef = Field(description="`module:function` returning a `torch.nn.Module`.")
    options: dict[str, int | float | str | bool] = Field(
        default_factory=dict, max_length=MAX_OPTIONS,
        description=f"Keyword arguments passed to the entrypoint (at most {MAX_OPTIONS}).",
    )


Architecture = Annotated[MLP | CNN | GPT | CustomArchitecture, Field(discriminator="type")]


class Hyperparameters(SpecModel):
    """Training hyperparameters. A change here retrains the model."""

    learning_rate: float = Field(default=1e-3, gt=0, le=10, description="Peak learning rate.")
    batch_size: int = Field(default=64, ge=1, le=1_048_576, description="Samples per step per data-parallel rank.")
    epochs: int = Field(default=10, ge=1, le=100_000, description="Passes over the training split.")
    max_steps: int | None = Field(default=None, ge=1, le=MAX_STEPS, description="Stop after this many optimizer steps.")
    optimizer: Literal["adamw", "adam", "sgd"] = Field(default="adamw", description="Optimizer.")
    weight_decay: float = Field(default=0.0, ge=0, le=1, description="Decoupled weight decay.")
    momentum: float = Field(default=0.9, ge=0, lt=1, description="Momentum (sgd only).")
    warmup_steps: int = Field(default=0, ge=0, le=MAX_STEPS, description="Linear warm-up steps.")
    gradient_accumulation_steps: int = Field(default=1, ge=1, le=4096, description="Micro-batches per optimizer step.")
    seed: int = Field(
        default=0, ge=0, le=MAX_SEED, description="Seed of every random generator (0 to 2³²−1): runs are reproducible."
    )


Parallelism = Literal["none", "ddp", "deepspeed"]


class Distributed(SpecModel):
    """How training is spread over devices and nodes."""

    strategy: Parallelism = Field(
        default="none",
        description="`none` (one process), `ddp` (torchrun, PyTorch DistributedDataParallel) or "
        "`deepspeed` (ZeRO).",
    )
    data_parallel: int | None = Field(
        default=None, ge=1, le=MAX_DATA_PARALLEL,
        description="Data-parallel ranks; default derived from model size and the pool.",
    )
    tensor_parallel: int = Field(default=1, ge=1, le=64, description="Tensor-parallel degree.")
    pipeline_parallel: int = Field(default=1, ge=1, le=64, description="Pipeline-parallel stages.")
    zero_stage: int = Field(default=0, ge=0, le=3, description="DeepSpeed ZeRO stage (0–3).")
    offload: Literal["none", "optimizer", "optimizer+parameters"] = Field(
        default="none",
        description="ZeRO-Offload to CPU memory: the optimizer state (stage ≥ 1) or also the parameters (stage 3).",
    )
    elastic: bool = Field(
        default=False, description="Multi-node jobs may run with fewer nodes than asked (min 1) and grow."
    )

    @model_validator(mode="after")
    def _zero_rules(self) -> Distributed:
        if self.zero_stage > 0 and self.strategy != "deepspeed":
            raise ValueError(f"zeroStage {self.zero_stage} needs `strategy: deepspeed`")
        if self.offload != "none" and self.strategy != "deepspeed":
            raise ValueError("offload needs `strategy: deepspeed`")
        if self.offload == "optimizer" and self.zero_stage < 1:
            raise ValueError("optimizer offload needs zeroStage 1 or more")
        if self.offload == "optimizer+parameters" and self.zero_stage != 3:
            raise ValueError("parameter offload needs zeroStage 3")
        return self


class Uniform(SpecModel):
    """A float drawn uniformly (or log-uniformly) between `min` and `max`."""

    type: Literal["uniform", "logUniform"] = Field(description="`uniform` or `logUniform`.")
    min: float = Field(description="Lower bound.")
    max: float = Field(description="Upper bound.")

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.max <= self.min:
            raise ValueError(f"max ({self.max:g}) must be above min ({self.min:g})")
        if self.type == "logUniform" and self.min <= 0:
            raise ValueError("a logUniform range needs min > 0")
        return self


class IntRange(SpecModel):
    """An integer between `min` and `max` inclusive."""

    type: Literal["int"] = Field(description="Integer range.")
    min: int = Field(description="Lower bound.")
    max: int = Field(description="Upper bound.")

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


class Choice(SpecModel):
    """One of a list of values."""

    type: Literal["choice"] = Field(description="A list of values.")
    values: list[float | int | str] = Field(
        min_length=1, max_length=MAX_CHOICES, description=f"The values to choose from (at most {MAX_CHOICES})."
    )


SearchDimension = Annotated[Uniform | IntRange | Choice, Field(discriminator="type")]
_SEARCHABLE = set(Hyperparameters.model_fields) - {"seed"}


class Search(LaterFieldsModel):
    """Hyperparameter search: a fan-out of trials and a pick-best step."""

    algorithm: Literal["grid", "random", "tpe"] = Field(
        default="random",
        description="`grid` (every combination of `choice` values, at most `trials`), `random` "
        "(seeded, so the same spec always renders the same trials) or `tpe` (Optuna's Tree-structured "
        "Parzen Estimator: each trial asks the study for values, learning from the trials done so far).",
    )
    early_stopping: Literal["asha", "median", "none"] = Field(
        default="none",
        description="Stop unpromising trials early: each trial reports its validation metric after every "
        "epoch and stops when pruned — `asha` (Optuna's asynchronous successive halving: rungs at 1, 3, 9, … "
        "epochs, the best third goes on), `median` (stop a trial below the median of the others at the same "
        "epoch) or `none` (every trial trains to the end).",
    )
    trials: int = Field(default=4, ge=1, le=1000, description="Number of trials (grid: at most this many).")
    parallelism: int = Field(default=2, ge=1, le=256, description="Trials run at the same time.")
    metric: str = Field(
        default="accuracy", max_length=63, pattern=r"^[A-Za-z][A-Za-z0-9_]*$",
        description="Validation metric that picks the best trial.",
    )
    goal: Literal["maximize", "minimize"] = Field(default="maximize", description="Whether higher is better.")
    space: dict[str, SearchDimension] = Field(
        min_length=1, description="Hyperparameter (camelCase name) → range to search."
    )

    added_later = {"early_stopping": "none"}

    @property
    def uses_study(self) -> bool:
        """Whether the trials run against an Optuna study (TPE asks it for values, a pruner reads
        every trial's intermediate values from it); grid and random trials without early stopping
        are rendered whole and need none."""
        return self.algorithm == "tpe" or self.early_stopping != "none"

    @model_validator(mode="after")
    def _known_parameters(self) -> Search:
        known = {Hyperparameters.model_fields[n].alias or n for n in _SEARCHABLE}
        for name in self.space:
            if name not in known:
                raise ValueError(
                    f"search space names unknown hyperparameter {name!r}; expected one of {', '.join(sorted(known))}"
                )
        if self.algorithm == "grid":
            for name, dim in self.space.items():
                if not isinstance(dim, Choice):
                    raise ValueError(f"grid search needs `type: choice` for every dimension ({name!r} is {dim.type})")
        return self


EvaluationMetric = Literal["accuracy", "f1", "precision", "recall", "loss", "perplexity", "latencyP99Ms",
                           "epsilon", "fgsmAccuracy", "pgdAccuracy"]


class Privacy(SpecModel):
    """Differential privacy: train with DP-SGD (Opacus). Every per-sample gradient is clipped to
    `maxGradNorm` and Gaussian noise is added, calibrated so that the whole run (all epochs, Poisson
    sampled batches) spends at most `epsilon` at `delta`. The accountant's spent ε is recorded
    with the version (metric `epsilon`, usable in a threshold)."""

    epsilon: float = Field(gt=0, le=100, description="Privacy budget ε the run may spend (lower is more private).")
    delta: float = Field(
        default=1e-5, gt=0, lt=1,
        description="δ of (ε, δ)-differential privacy; keep it below 1 / (training rows).",
    )
    max_grad_norm: float = Field(default=1.0, gt=0, le=1000, description="Per-sample gradient clipping bound (L2).")


Attack = Literal["fgsm", "pgd"]
AttributionMethod = Literal["integratedGradients", "saliency", "inputXGradient"]


def _default_methods() -> list[AttributionMethod]:
    """Integrated gradients first (the primary), saliency to compare it with."""
    return ["integratedGradients", "saliency"]


class Robustness(SpecModel):
    """Accuracy under adversarial attack on the held-out split: FGSM (one signed-gradient step) and
    PGD (`pgdSteps` projected steps of `stepSize`, random start), both in the L∞ ball of radius
    `epsilon` around each input, in the model's input space (after the Dataset's cleaning and
    standardisation). Recorded as the metrics `fgsmAccuracy` and `pgdAccuracy`."""

    epsilon: float = Field(gt=0, le=1000, description="Radius of the L∞ ball the attacker may move each input within.")
    attacks: list[Attack] = Field(
        default_factory=lambda: list[Attack](get_args(Attack)), min_length=1, max_length=2, description="Attacks to run."
    )
    pgd_steps: int = Field(default=10, ge=1, le=1000, description="PGD iterations.")
    step_size: float | None = Field(
        default=None, gt=0, description="PGD step; default 2.5 · epsilon / pgdSteps (Madry et al.)."
    )
    samples: int = Field(default=1000, ge=1, le=1_000_000, description="Held-out rows attacked (the first ones).")


class Explanations(SpecModel):
    """An `explain` step after `evaluate`: attributions (Captum) on a sample of the test split,
    per-class summaries, PNG attribution maps for images, and a randomised-weights sanity check."""

    methods: list[AttributionMethod] = Field(
        default_factory=_default_methods, min_length=1, max_length=3,
        description="Attribution methods; the first is the primary one, the others are compared with it.",
    )
    samples: int = Field(default=200, ge=1, le=100_000, description="Test rows explained (the first ones).")
    steps: int = Field(default=32, ge=2, le=1000, description="Integrated Gradients: steps of the path integral.")
    maps_per_class: int = Field(default=1, ge=0, le=20, description="PNG attribution maps per class (image data).")


class ModelThreshold(Threshold):
    """An offline gate: the evaluate step fails, and nothing is compressed, registered or served,
    unless the metric on the held-out split meets it."""

    metric: EvaluationMetric = Field(description="Metric on the held-out test split.")


class Evaluation(LaterFieldsModel):
    """Offline evaluation on the held-out split."""

    thresholds: list[ModelThreshold] = Field(default_factory=list, description="Bounds every one of which must hold.")
    robustness: Robustness | None = Field(
        default=None, description="Adversarial accuracy (FGSM/PGD) at a stated ε, as metrics thresholds can use."
    )

    added_later = {"robustness": None}

    @model_validator(mode="after")
    def _unique(self) -> Evaluation:
        seen: set[str] = set()
        for t in self.thresholds:
            if t.metric in seen:
                raise ValueError(f"metric {t.metric!r} has two thresholds; merge them into one with min and max")
            seen.add(t.metric)
        robust = {t.metric for t in self.thresholds} & {"fgsmAccuracy", "pgdAccuracy"}
        for metric in sorted(robust):
            if self.robustness is None or metric.removesuffix("Accuracy") not in self.robustness.attacks:
                raise ValueError(f"a threshold on {metric} needs `robustness` with attack "
                                 f"{metric.removesuffix('Accuracy')!r}")
        return self


class TrainingFaultInjection(SpecModel):
    """Injected faults for retry drills (and Forge's end-to-end test): never set this in production."""

    hold_first_attempt_seconds: int = Field(
        default=0, ge=0, le=3600,
        description="The train step's first attempt waits this long before it trains, after printing "
        '`{"event": "hold"}`, so that a drill can kill it (delete its pod) while it certainly runs — Argo records '
        "an Error and retries — instead of racing a step that may have finished already. The attempt leaves a "
        "marker in its output folder (`checkpoints/fault-injection-held`); a later attempt finds it and does not "
        "wait. Not killed, the attempt carries on after the wait. 0: no hold.",
    )
    kill_first_attempt: bool = Field(
        default=False,
        description="The train step's first attempt kills itself with SIGKILL before it trains, after printing "
        '`{"event": "kill"}` — the exit status 137 of a process the kernel killed (out of memory, a lost node) — so '
        "a drill sees Argo record a failed attempt and retry it, deterministically: the attempt leaves a marker in "
        "its output folder (`checkpoints/fault-injection-killed`) and a later attempt finds it and trains.",
    )


class ModelSpec(LaterFieldsModel):
    """A trainable model and the workflow that produces it: prepare → train → evaluate → compress → register."""

    dataset_ref: Name = Field(description="Name of the Dataset to train on.")
    compute_ref: Name | None = Field(
        default=None, description="Name of the Compute pool; default the Environment's `defaults.computeRef`."
    )
    compression_ref: Name | None = Field(default=None, description="Name of the Compression to run after evaluation.")
    architecture: Architecture = Field(description="Architecture and its shape.")
    parameters: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PARAMETERS,
        description="Parameter count used for scheduling; default computed from the architecture "
        "(required for `custom`).",
    )
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters, description="Training hyperparameters.")
    precision: Precision = Field(
        default="fp32", description="`fp32`, or mixed precision `bf16` / `fp16` (fp16 uses loss scaling)."
    )
    gradient_checkpointing: bool | Literal["sqrt", "auto"] | Annotated[int, Field(ge=1, le=MAX_SEGMENTS)] = Field(
        default=False,
        description="Recompute activations in the backward pass to save memory. `true`: every block is "
        "checkpointed (saved activations: each block's input, still O(layers)); `sqrt`: the blocks are cut "
        "into segments of ⌈√layers⌉ and only each segment's input is kept, one segment recomputed at a time "
        "(saved activations O(√layers)); `auto`: the segment count whose activation peak is least, from "
        "what each block keeps and saves and what the head holds, measured on the first batch (every cut "
        "recomputes each block once, so only the peak differs); an integer: that many segments (1: the "
        f"whole stack recomputed once; at most {MAX_SEGMENTS}). `false`: keep every activation.",
    )
    compile: bool = Field(
        default=False,
        description="Compile the model with `torch.compile` (TorchInductor): faster steps after a "
        "one-time compilation at the start of the run (tens of seconds to minutes; a last partial "
        "batch of an epoch compiles once more). Not applied with `strategy: deepspeed`.",
    )
    deterministic: bool = Field(
        default=False,
        description="Use PyTorch's deterministic kernels (`torch.use_deterministic_algorithms`, "
        "warning for ops that have none) so that GPU runs repeat bit for bit where PyTorch can. "
        "Slower on GPUs (sort-based scatters, uninitialised memory filled, fewer kernel choices "
        "for `compile`); on a CPU the kernels Forge's models use repeat bit for bit either way. "
        "Off by default, as in PyTorch.",
    )
    distributed: Distributed = Field(default_factory=Distributed, description="Distribution strategy.")
    search: Search | None = Field(default=None, description="Hyperparameter search; none trains once.")
    evaluation: Evaluation = Field(default_factory=Evaluation, description="Offline evaluation gates.")
    privacy: Privacy | None = Field(
        default=None, description="Differential privacy (DP-SGD with Opacus); none trains without it."
    )
    explanations: Explanations | None = Field(
        default=None, description="Attributions after evaluation (Captum); none skips the `explain` step."
    )
    priority: Priority | None = Field(
        default=None,
        description="Priority of this model's training in its pool: with a queued pool (Kueue), a pending `high` "
        "training preempts admitted `low` ones of the same queue (docs/queues.md); the preempted step is retried "
        "and resumes from its last checkpoint. Unset: the pool's training priority (`high` unless the pool says "
        "`low`). Placement only: not part of the model version.",
    )
    retries: int = Field(default=2, ge=0, le=10, description="Retries of a failed step, with exponential backoff.")
    fault_injection: TrainingFaultInjection | None = Field(
        default=None, description="Injected faults for retry drills (the training's first attempt held, to be "
        "killed): never set this in production.",
    )

    added_later = {"compile": False, "deterministic": False, "fault_injection": None, "priority": None,
                   "privacy": None, "explanations": None}

    #: Fields that place the training, not shape what it produces: out of the model's version,
    #: its step keys and its search's seeds.
    PLACEMENT_FIELDS: ClassVar[frozenset[str]] = frozenset({"priority"})

    def result_dump(self) -> dict[str, Any]:
        """The spec as JSON without its placement (:data:`PLACEMENT_FIELDS`): what its version
        and its search's draws are digests of."""
        return self.model_dump(mode="json", by_alias=True, exclude=set(self.PLACEMENT_FIELDS))

    @field_validator("gradient_checkpointing", mode="wrap")
    @classmethod
    def _checkpointing_mode(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # One diagnostic instead of one per member of the union (bool, `sqrt`, an integer).
        try:
            return handler(value)
        except ValidationError:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise ValueError(f"expected true, false, `sqrt`, `auto` or a number of segments from 1 to {MAX_SEGMENTS}; "
                             f"got {shown}") from None

    def checkpoint_segments(self, blocks: int, costs: BlockCosts | None = None) -> int:
        """How many checkpointed segments `gradientCheckpointing` cuts a stack of `blocks` blocks
        into: 0 off, `blocks` per block (`true`), ⌈blocks ÷ ⌈√blocks⌉⌉ for `sqrt` (segments of
        ⌈√blocks⌉ blocks, so both the kept segment inputs and the one segment recomputed at a time
        grow as √blocks), for `auto` the count of least activation peak under ``costs`` (required
        then: specs/checkpointing.py), or for an integer k as many as segments of ⌈blocks ÷ k⌉
        blocks make, as runtimes/models.py cuts them (k, or fewer: 16 blocks asked in 12 are 8
        segments of 2)."""
        mode = self.gradient_checkpointing
        if mode is False or blocks < 1:
            return 0
        if mode is True:
            return blocks
        if mode == "auto":
            if costs is None or costs.blocks != blocks:
                raise ValueError(f"gradientCheckpointing: auto needs the costs of the {blocks} blocks to cut")
            return least_peak_segments(costs)
        if mode == "sqrt":
            length = math.isqrt(blocks - 1) + 1  # ⌈√blocks⌉, exact in integers
        else:
            length = segment_length(blocks, int(mode))
        return -(-blocks // length)

    @model_validator(mode="after")
    def _custom_needs_size(self) -> ModelSpec:
        if self.privacy is None and any(t.metric == "epsilon" for t in self.evaluation.thresholds):
            raise ValueError("a threshold on epsilon needs `privacy` (a model trained without it has no ε)")
        if self.privacy is not None:
            # What Opacus's per-sample gradients and accountant do not cover here; the layers
            # Opacus cannot make private (BatchNorm, …) are refused by the train step, by name.
            refused = [why for bad, why in (
                (self.distributed.strategy != "none", f"strategy {self.distributed.strategy}"),
                (self.precision != "fp32", f"precision {self.precision}"),
                (self.compile, "compile"),
                (self.hyperparameters.gradient_accumulation_steps != 1, "gradientAccumulationSteps > 1"),
            ) if bad]
            if refused:
                raise ValueError("privacy (DP-SGD) trains one fp32 process without compile or gradient "
                                 f"accumulation; not with {', '.join(refused)}")
        if isinstance(self.architecture, CustomArchitecture) and self.parameters is None:
            raise ValueError("a `custom` architecture needs `parameters` (its size) for scheduling")
        if self.search is not None and self.search.parallelism > self.search.trials:
            raise ValueError(
                f"search.parallelism ({self.search.parallelism}) exceeds search.trials ({self.search.trials})"
            )
        if self.search is not None and self.search.uses_study:
            # Every process of a trial would ask the study for a trial of its own (different values
            # per rank): a trial that runs against the study is one training process.
            dist = self.distributed
            if dist.strategy != "none" or max(dist.data_parallel or 1, dist.tensor_parallel, dist.pipeline_parallel) > 1:
                raise ValueError(f"search.algorithm {self.search.algorithm} with earlyStopping {self.search.early_stopping} "
                                 "runs each trial as one training process against the study: not with a distributed "
                                 "strategy or parallel ranks")
        if self.search is not None and self.search.early_stopping != "none":
            # A pruner compares trials epoch by epoch: one epoch gives it nothing to stop.
            if "epochs" not in self.search.space and self.hyperparameters.epochs < 2:
                raise ValueError(f"search.earlyStopping {self.search.early_stopping} stops trials between epochs; "
                                 "it needs `hyperparameters.epochs` of 2 or more")
            if self.privacy is not None:
                # DP-SGD trains in its own loop (runtimes/privacy.py), which reports no epoch to the pruner.
                raise ValueError("search.earlyStopping reports each epoch of the training loop: not with privacy")
        return self
