"""How many accelerators a training job needs: `schedule_resources`.

The arithmetic, per GPU, for P parameters on N = dp × tp × pp GPUs (ZeRO, Rajbhandari et al. 2020):

    model states   = params + grads + optimizer state
      bytes/param    fp32:        params 4, grads 4, Adam m+v 8            (= 16; SGD+momentum 12)
                     bf16/fp16:   params 2, grads 2, Adam fp32 master+m+v 12 (= 16; SGD+momentum 12)
      ZeRO stage 0:  everything replicated on every data-parallel rank
      ZeRO stage 1:  optimizer state / dp
      ZeRO stage 2:  (optimizer state + grads) / dp
      ZeRO stage 3:  (optimizer state + grads + params) / dp
      optimizer offload moves the optimizer state to CPU memory; parameter offload the params too.
      Tensor and pipeline parallelism split every model state over tp × pp.
    activations    transformer (Korthikanti et al. 2022), per micro-batch b, sequence s, hidden h,
                   layers L, heads a, vocabulary v, with 2-byte activations: a layer saves
                   34·s·b·h (fused attention) or s·b·h·(34 + 5·a·s/h) (`attention: math`, which
                   stores the scores); the logits are held through the backward pass (2·s·b·v)
                   and the head's peak adds 12 bytes a logit (fp32 log-probabilities, two grads):
                     without checkpointing   L layers  +  14·s·b·v
                     with checkpointing      2·s·b·h·L  +  2·s·b·v  +  max(one layer, 12·s·b·v)
                     in k segments           2·s·b·h·k  +  2·s·b·v  +  max(⌈L/k⌉ layers, 12·s·b·v)
                                             (`sqrt`: k = ⌈L/⌈√L⌉⌉; `auto`: the k of least
                                             peak; specs/checkpointing.py places the peak)
                   (fp32 doubles the layers' terms and the logits held); MLP/CNN: 4 bytes × batch × sum of layer
                   widths × 3. Divided by tp (and by pp for the layers one stage holds).
    usable memory  90 % of the device memory (CUDA context, allocator fragmentation).

The job gets the smallest N that fits, rounded up to whole nodes of the pool and kept within its
`minGpus`..`maxGpus`; when nothing fits, a :class:`SchedulingError` names the numbers.

:func:`memory_breakdown` gives the same arithmetic part by part (weights, gradients, optimizer
state, activations with and without checkpointing) for the plan to show; `per_gpu_bytes` and the
breakdown share every term, so what the plan explains is what decided the width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from renderers.errors import RenderError
from specs import Compute, Dataset, Model
from specs.checkpointing import BlockCosts, peak_bytes
from specs.dataset import SKLEARN_DATASETS
from specs.model import CNN, GPT, MLP

GIB = 1024**3
USABLE_FRACTION = 0.9

#: (features, classes) of the data sets scikit-learn ships, used to size MLPs.
SKLEARN_SHAPES: dict[str, tuple[int, int]] = {
    "digits": (64, 10),
    "iris": (4, 3),
    "wine": (13, 3),
    "breast_cancer": (30, 2),
    "diabetes": (10, 1),
}
assert set(SKLEARN_SHAPES) == set(SKLEARN_DATASETS)


@dataclass(frozen=True)
class MemoryBreakdown:
    """One GPU's share of a training job at ``gpus`` GPUs (``data_parallel`` ranks × tp × pp), part
    by part, in bytes — the terms `per_gpu_bytes` adds up."""

    parameters: int
    precision: str
    optimizer: str
    zero_stage: int
    offload: str
    data_parallel: int
    tensor_parallel: int
    pipeline_parallel: int
    #: Bytes per parameter of (weights, gradients, optimizer state) before partitioning/offload.
    bytes_per_parameter: tuple[float, float, float]
    #: Divisor of each part by the ZeRO stage (1 = replicated on every rank; 0 = offloaded to CPU).
    partitions: tuple[int, int, int]
    weights: float
    gradients: float
    optimizer_state: float
    activations: float
    #: The activations of the other setting of gradient checkpointing (what turning it on saves,
    #: or off costs); equal to ``activations`` where the estimate does not depend on it.
    activations_other: float
    checkpointing: bool
    activation_formula: str
    usable: float
    device_gib: float

    @property
    def states(self) -> float:
        """Weights + gradients + optimizer state on one GPU."""
        return self.weights + self.gradients + self.optimizer_state

    @property
    def total(self) -> float:
        """Everything on one GPU."""
        return self.states + self.activations

    @property
    def gpus(self) -> int:
        """GPUs of the job this breakdown is for."""
        return self.data_parallel * self.tensor_parallel * self.pipeline_parallel


class SchedulingError(RenderError):
    """The model cannot fit the pool; the message names the numbers, ``breakdown`` holds them (at
    the widest job tried) for the plan to show."""

    def __init__(self, message: str, breakdown: MemoryBreakdown | None = None) -> None:
        super().__init__(message)
        self.breakdown = breakdown


@dataclass(frozen=True)
class Schedule:
    """Where and how wide a training job runs, and the estimate that decided it."""

    gpus: int
    nodes: int
    gpus_per_node: int
    resource_name: str | None
    parameters: int
    bytes_per_gpu: int
    usable_bytes_per_gpu: int
    explanation: str
    #: The fewest GPUs the memory estimate alone allows (before whole nodes and minGpus).
    fits_on: int = 0
    #: The per-GPU arithmetic at ``gpus`` (None on a CPU pool).
    breakdown: MemoryBreakdown | None = None

    @property
    def multi_node(self) -> bool:
        """True when the job spans more than one node (then a PyTorchJob runs it)."""
        return self.nodes > 1


def data_shape(dataset: Dataset) -> tuple[int, int]:
    """(features, classes) of a data set, known for scikit-learn's, estimated otherwise."""
    uri = dataset.spec.source.uri
    if uri.startswith("sklearn://"):
        return SKLEARN_SHAPES[uri.removeprefix("sklearn://")]
    features = len(dataset.spec.features) or 64
    classes = len(dataset.spec.labeling.classes) or 10
    return features, classes


def parameter_count(model: Model, dataset: Dataset) -> int:
    """Parameters of the model: the spec's `parameters`, else counted from the architecture."""
    if model.spec.parameters is not None:
        return model.spec.parameters
    arch = model.spec.architecture
    features, classes = data_shape(dataset)
    if isinstance(arch, MLP):
        widths = [features, *arch.hidden_sizes, classes]
        return sum(a * b + b for a, b in zip(widths, widths[1:]))
    if isinstance(arch, CNN):
        chans = [arch.in_channels, *arch.channels]
        convs = sum(c_in * c_out * 9 + c_out + 2 * c_out for c_in, c_out in zip(chans, chans[1:]))
        return convs + chans[-1] * classes + classes
    if isinstance(arch, GPT):
        h, layers = arch.d_model, arch.layers
        per_layer = 12 * h * h + 13 * h  # attention 4h² + MLP 8h², biases and two layer norms
        return layers * per_layer + arch.vocab_size * h + arch.context_length * h + 2 * h
    raise SchedulingError(f"model {model.name!r}: set `parameters` for a custom architecture")


def _state_bytes(model: Model) -> tuple[float, float, float]:
    """Bytes per parameter of (params, grads, optimizer state)."""
    mixed = model.spec.precision in ("bf16", "fp16")
    optimizer = model.spec.hyperparameters.optimizer
    if mixed:
        opt = 12.0 if optimizer in ("adam", "adamw") else 8.0  # fp32 master + m + v | master + momentum
        return 2.0, 2.0, opt
    opt = 8.0 if optimizer in ("adam", "adamw") else 4.0
    return 4.0, 4.0, opt


def _activations(model: Model, dataset: Dataset, checkpointing: bool) -> tuple[float, str]:
    """Activation memory of one micro-batch on one GPU (before tensor/pipeline splitting) with or
    without gradient checkpointing (with it: in the spec's mode, per layer when the spec has it
    off), and the formula used."""
    arch = model.spec.architecture
    batch = model.spec.hyperparameters.batch_size
    scale = 1.0 if model.spec.precision in ("bf16", "fp16") else 2.0
    if isinstance(arch, GPT):
        s, h, layers, a, v = arch.context_length, arch.d_model, arch.layers, arch.heads, arch.vocab_size
        # A layer saves 34·s·b·h (Korthikanti et al.); the explicit attention also its a × s × s
        # scores, softmax and mask (5·a·s/h more), which the fused kernel never stores.
        scores = arch.attention == "math"
        per_layer = s * batch * h * (34 + 5 * a * s / h if scores else 34)
        shape = "(34 + 5·a·s/h)" if scores else "34"
        # Per logit, the logits the step holds through its backward pass (2 B in bf16, 4 B in fp32)
        # and the head's peak beside them: the loss's fp32 log-probabilities and, in its backward,
        # their gradient and the logits' fp32 gradient (12 B) — 14 B in all in bf16, eager (the
        # H200 measured 14.3 B; bench/README.md).
        logit = 4 if scale == 2.0 else 2
        layer, kept = ("2·", "4") if scale == 2.0 else ("", "2")
        if not checkpointing:
            return (scale * per_layer * layers + (logit + 12) * s * batch * v,
                    f"{layer}s·b·h·L·{shape} + {logit + 12}·s·b·v")
        # The peak (specs/checkpointing.py): the logits held, every kept block input, and the larger
        # of one segment's recomputation and the head. `auto` cuts where it is least.
        costs = BlockCosts.uniform(layers, round(scale * 2 * s * batch * h), round(scale * per_layer),
                                   head=12 * s * batch * v, held=logit * s * batch * v)
        segments = model.spec.checkpoint_segments(layers, costs) or layers
        auto = ", auto: the least of this formula" if model.spec.gradient_checkpointing == "auto" else ""
        if segments == layers:
            return (float(peak_bytes(costs, segments)),
                    f"{kept}·s·b·h·L + {logit}·s·b·v + max({layer}s·b·h·{shape}, 12·s·b·v){auto}")
        return (float(peak_bytes(costs, segments)),
                f"{kept}·s·b·h·k + {logit}·s·b·v + max(⌈L/k⌉·{layer}s·b·h·{shape}, 12·s·b·v), k = {segments} segments{auto}")
    features, classes = data_shape(dataset)
    widths = [features, classes]
    if isinstance(arch, MLP):
        widths += arch.hidden_sizes
    elif isinstance(arch, CNN):
        widths += [c * arch.image_size**2 for c in arch.channels]
    return 4.0 * batch * sum(widths) * 3, "4 B × batch × Σ layer widths × 3"


def activation_bytes(model: Model, dataset: Dataset) -> float:
    """Activation memory of one micro-batch on one GPU, before tensor/pipeline splitting."""
    return _activations(model, dataset, model.spec.gradient_checkpointing is not False)[0]


def _shares(model: Model, dp: int) -> tuple[tuple[float, float, float], tuple[float, float, float], tuple[int, int, int]]:
    """(bytes/param of weights, grads, optimizer state), the same after offload and ZeRO
    partitioning over ``dp`` ranks, and each part's divisor (0: offloaded to CPU)."""
    dist = model.spec.distributed
    raw = _state_bytes(model)
    p_b, g_b, o_b = raw
    p_div = o_div = 1
    if dist.offload in ("optimizer", "optimizer+parameters"):
        o_b, o_div = 0.0, 0
    if dist.offload == "optimizer+parameters":
        p_b, p_div = 0.0, 0
    stage = dist.zero_stage
    p_share = p_b / dp if stage >= 3 else p_b
    g_share = g_b / dp if stage >= 2 else g_b
    o_share = o_b / dp if stage >= 1 else o_b
    divisors = (p_div and (dp if stage >= 3 else 1), dp if stage >= 2 else 1, o_div and (dp if stage >= 1 else 1))
    return raw, (p_share, g_share, o_share), divisors


def per_gpu_bytes(model: Model, dataset: Dataset, params: int, dp: int) -> float:
    """Estimated peak memory of one GPU with ``dp`` data-parallel ranks."""
    dist = model.spec.distributed
    split = dist.tensor_parallel * dist.pipeline_parallel
    _, (p_share, g_share, o_share), _ = _shares(model, dp)
    states = params * (p_share + g_share + o_share) / split
    acts = activation_bytes(model, dataset) / dist.tensor_parallel / dist.pipeline_parallel
    return states + acts


def memory_breakdown(model: Model, dataset: Dataset, compute: Compute, params: int, dp: int) -> MemoryBreakdown:
    """:func:`per_gpu_bytes` part by part, with ``dp`` data-parallel ranks on ``compute``'s GPUs."""
    dist = model.spec.distributed
    split = dist.tensor_parallel * dist.pipeline_parallel
    raw, (p_share, g_share, o_share), divisors = _shares(model, dp)
    ckpt = model.spec.gradient_checkpointing is not False
    acts, formula = _activations(model, dataset, ckpt)
    other, _ = _activations(model, dataset, not ckpt)
    acc = compute.spec.accelerator
    return MemoryBreakdown(
        parameters=params, precision=model.spec.precision, optimizer=model.spec.hyperparameters.optimizer,
        zero_stage=dist.zero_stage, offload=dist.offload, data_parallel=dp, tensor_parallel=dist.tensor_parallel,
        pipeline_parallel=dist.pipeline_parallel, bytes_per_parameter=raw, partitions=divisors,
        weights=params * p_share / split, gradients=params * g_share / split, optimizer_state=params * o_share / split,
        activations=acts / split, activations_other=other / split, checkpointing=ckpt, activation_formula=formula,
        usable=acc.effective_memory_gib * GIB * USABLE_FRACTION, device_gib=acc.effective_memory_gib,
    )


def _fewest(model: Model, dataset: Dataset, params: int, usable: float, largest: int) -> int:
    """The fewest GPUs (a multiple of tp × pp, at most ``largest``) whose per-GPU need fits
    ``usable``, or 0. The need never grows with more data-parallel ranks: a bisection."""
    dist = model.spec.distributed
    split = dist.tensor_parallel * dist.pipeline_parallel
    if dist.data_parallel is not None or dist.strategy == "none":
        dp = dist.data_parallel or 1
        return dp * split if per_gpu_bytes(model, dataset, params, dp) <= usable else 0
    lo, hi = 1, max(largest // split, 1)
    if per_gpu_bytes(model, dataset, params, hi) > usable:
        return 0
    while lo < hi:
        mid = (lo + hi) // 2
        if per_gpu_bytes(model, dataset, params, mid) <= usable:
            hi = mid
        else:
            lo = mid + 1
    return lo * split


def schedule_resources(model: Model, dataset: Dataset, compute: Compute) -> Schedule:
    """The accelerators a Model's training needs on a pool (see the module docstring)."""
    params = parameter_count(model, dataset)
    spec = compute.spec
    acc = spec.accelerator
    if acc.type == "cpu":
        return Schedule(0, 1, 0, None, params, 0, 0, f"{params:,} parameters on a CPU pool: one node")
    dist = model.spec.distributed
    split = dist.tensor_parallel * dist.pipeline_parallel
    usable = acc.effective_memory_gib * GIB * USABLE_FRACTION
    per_node = spec.gpus_per_node
    # Whole nodes only: a pool smaller than a node is the one exception.
    if spec.max_gpus < per_node:
        candidates = [spec.max_gpus] if spec.max_gpus % split == 0 else []
    else:
        candidates = [n * per_node for n in range(1, spec.max_gpus // per_node + 1) if (n * per_node) % split == 0]
    if dist.data_parallel is not None:
        candidates = [dist.data_parallel * split]
    elif dist.strategy == "none":
        candidates = [split]  # one process: no data parallelism to spread the states over
    chosen = None
    need = 0.0
    for n in candidates:
        need = per_gpu_bytes(model, dataset, params, n // split)
        if need <= usable and n <= spec.max_gpus:
            chosen = n
            break
    label = f"{model.spec.precision} {model.spec.hyperparameters.optimizer}, ZeRO-{dist.zero_stage}"
    if model.spec.gradient_checkpointing:
        label += ", gradient checkpointing"
    if chosen is None:
        last = candidates[-1] if candidates else split
        error = SchedulingError(
            f"model {model.name!r} ({params / 1e9:.2f}B parameters, {label}) needs "
            f"{need / GIB:.1f} GiB per GPU even on {last} GPUs, more than the "
            f"{usable / GIB:.1f} GiB usable of a {acc.type} ({acc.effective_memory_gib:g} GiB × "
            f"{USABLE_FRACTION:.0%}) in pool {compute.name!r} (maxGpus {spec.max_gpus}); raise the ZeRO "
            "stage, enable gradient checkpointing or offload, lower the batch size, or use a larger pool"
        )
        error.breakdown = memory_breakdown(model, dataset, compute, params, max(last // split, 1))
        raise error
    if dist.strategy == "none":
        gpus, nodes = chosen, 1  # one process uses what it asked for, never a whole node
    else:
        nodes = math.ceil(max(chosen, spec.min_gpus) / per_node)
        gpus = min(nodes * per_node, max(spec.max_gpus, chosen))
    return Schedule(
        gpus=gpus,
        nodes=nodes,
        gpus_per_node=min(gpus, per_node),
        resource_name=acc.effective_resource_name,
        parameters=params,
        bytes_per_gpu=int(per_gpu_bytes(model, dataset, params, max(gpus // split, 1))),
        usable_bytes_per_gpu=int(usable),
        explanation=(
            f"{params / 1e9:.2f}B parameters, {label}: {need / GIB:.1f} GiB per GPU at {chosen} GPUs "
            f"≤ {usable / GIB:.1f} GiB usable → {gpus} × {acc.type} on {nodes} node{'s' if nodes > 1 else ''}"
        ),
        fits_on=_fewest(model, dataset, params, usable, spec.max_gpus) or chosen,
        breakdown=memory_breakdown(model, dataset, compute, params, max(gpus // split, 1)),
    )
