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
                   layers L, heads a, with 2-byte activations:
                     without checkpointing   s·b·h·L·(34 + 5·a·s/h)
                     with checkpointing      2·s·b·h·L  +  one layer's full activations
                   (fp32 doubles them); MLP/CNN: 4 bytes × batch × sum of layer widths × 3.
                   Divided by tp (and by pp for the layers one stage holds).
    usable memory  90 % of the device memory (CUDA context, allocator fragmentation).

The job gets the smallest N that fits, rounded up to whole nodes of the pool and kept within its
`minGpus`..`maxGpus`; when nothing fits, a :class:`SchedulingError` names the numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from renderers.errors import RenderError
from specs import Compute, Dataset, Model
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


class SchedulingError(RenderError):
    """The model cannot fit the pool; the message names the numbers."""


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


def activation_bytes(model: Model, dataset: Dataset) -> float:
    """Activation memory of one micro-batch on one GPU, before tensor/pipeline splitting."""
    arch = model.spec.architecture
    batch = model.spec.hyperparameters.batch_size
    scale = 1.0 if model.spec.precision in ("bf16", "fp16") else 2.0
    if isinstance(arch, GPT):
        s, h, layers, a = arch.context_length, arch.d_model, arch.layers, arch.heads
        per_layer = s * batch * h * (34 + 5 * a * s / h)
        if model.spec.gradient_checkpointing:
            return scale * (2 * s * batch * h * layers + per_layer)
        return scale * per_layer * layers
    features, classes = data_shape(dataset)
    widths = [features, classes]
    if isinstance(arch, MLP):
        widths += arch.hidden_sizes
    elif isinstance(arch, CNN):
        widths += [c * arch.image_size**2 for c in arch.channels]
    return 4.0 * batch * sum(widths) * 3


def per_gpu_bytes(model: Model, dataset: Dataset, params: int, dp: int) -> float:
    """Estimated peak memory of one GPU with ``dp`` data-parallel ranks."""
    dist = model.spec.distributed
    split = dist.tensor_parallel * dist.pipeline_parallel
    p_b, g_b, o_b = _state_bytes(model)
    if dist.offload in ("optimizer", "optimizer+parameters"):
        o_b = 0.0
    if dist.offload == "optimizer+parameters":
        p_b = 0.0
    stage = dist.zero_stage
    p_share = p_b / dp if stage >= 3 else p_b
    g_share = g_b / dp if stage >= 2 else g_b
    o_share = o_b / dp if stage >= 1 else o_b
    states = params * (p_share + g_share + o_share) / split
    acts = activation_bytes(model, dataset) / dist.tensor_parallel / dist.pipeline_parallel
    return states + acts


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
        raise SchedulingError(
            f"model {model.name!r} ({params / 1e9:.2f}B parameters, {label}) needs "
            f"{need / GIB:.1f} GiB per GPU even on {last} GPUs, more than the "
            f"{usable / GIB:.1f} GiB usable of a {acc.type} ({acc.effective_memory_gib:g} GiB × "
            f"{USABLE_FRACTION:.0%}) in pool {compute.name!r} (maxGpus {spec.max_gpus}); raise the ZeRO "
            "stage, enable gradient checkpointing or offload, lower the batch size, or use a larger pool"
        )
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
    )
