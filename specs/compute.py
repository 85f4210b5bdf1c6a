"""`Compute`: a pool of nodes with accelerators, its size limits and scheduling constraints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator, model_validator

from specs.base import Priority, Quantity, SpecModel, check_label_value, check_qualified_name, check_selector
from specs.queue import Queue

#: Most accelerators one pool may offer a job (and so the most `plan` ever considers).
MAX_GPUS = 4096
MAX_TOLERATIONS = 64


@dataclass(frozen=True)
class AcceleratorInfo:
    """What Forge knows of an accelerator type: its extended resource and memory."""

    resource_name: str | None
    memory_gib: float
    vendor: str


#: Known accelerator types. `resourceName` and `memoryGiB` in a Compute spec override these, and
#: `type: custom` needs both.
ACCELERATORS: dict[str, AcceleratorInfo] = {
    "cpu": AcceleratorInfo(None, 0.0, "none"),
    "nvidia-a100-40gb": AcceleratorInfo("nvidia.com/gpu", 40.0, "nvidia"),
    "nvidia-a100-80gb": AcceleratorInfo("nvidia.com/gpu", 80.0, "nvidia"),
    "nvidia-h100-80gb": AcceleratorInfo("nvidia.com/gpu", 80.0, "nvidia"),
    "nvidia-h200-141gb": AcceleratorInfo("nvidia.com/gpu", 141.0, "nvidia"),
    "nvidia-l4": AcceleratorInfo("nvidia.com/gpu", 24.0, "nvidia"),
    "nvidia-jetson-orin": AcceleratorInfo("nvidia.com/gpu", 32.0, "nvidia"),
    "amd-mi300x": AcceleratorInfo("amd.com/gpu", 192.0, "amd"),
    "intel-gaudi2": AcceleratorInfo("habana.ai/gaudi", 96.0, "intel"),
    "aws-trainium2": AcceleratorInfo("aws.amazon.com/neuron", 96.0, "aws"),
    "custom": AcceleratorInfo(None, 0.0, "custom"),
}

AcceleratorType = Literal[
    "cpu",
    "nvidia-a100-40gb",
    "nvidia-a100-80gb",
    "nvidia-h100-80gb",
    "nvidia-h200-141gb",
    "nvidia-l4",
    "nvidia-jetson-orin",
    "amd-mi300x",
    "intel-gaudi2",
    "aws-trainium2",
    "custom",
]


class Accelerator(SpecModel):
    """The accelerator on each node of the pool."""

    type: AcceleratorType = Field(description="Accelerator model; `cpu` for a pool without accelerators.")
    resource_name: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9.\-]+/[a-z0-9.\-_]+$",
        description="Extended resource requested per device, e.g. `nvidia.com/gpu`, `amd.com/gpu`, "
        "`habana.ai/gaudi`; defaults from `type`.",
    )
    memory_gi_b: float | None = Field(
        default=None,
        gt=0,
        alias="memoryGiB",
        description="Memory of one device in GiB; defaults from `type`. Used to derive GPU counts.",
    )

    @model_validator(mode="after")
    def _custom_needs_details(self) -> Accelerator:
        if self.type == "custom" and (self.resource_name is None or self.memory_gi_b is None):
            raise ValueError("`type: custom` needs `resourceName` and `memoryGiB`")
        if self.type == "cpu" and self.resource_name is not None:
            raise ValueError("a `cpu` pool has no extended resource; remove `resourceName`")
        return self

    @property
    def effective_resource_name(self) -> str | None:
        """The extended resource name, explicit or from the catalogue."""
        return self.resource_name or ACCELERATORS[self.type].resource_name

    @property
    def effective_memory_gib(self) -> float:
        """Device memory in GiB, explicit or from the catalogue."""
        return self.memory_gi_b if self.memory_gi_b is not None else ACCELERATORS[self.type].memory_gib


class Toleration(SpecModel):
    """A Kubernetes toleration copied onto the pods of the pool."""

    key: str | None = Field(default=None, description="Taint key; empty with `operator: Exists` tolerates all.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="`Equal` or `Exists`.")
    value: str | None = Field(default=None, description="Taint value for `operator: Equal`.")

    @field_validator("key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        return None if value is None else check_qualified_name(value, "toleration key", reserved=False)

    @field_validator("value")
    @classmethod
    def _value(cls, value: str | None) -> str | None:
        return None if value is None else check_label_value(value, "toleration value")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; empty means all."
    )


class NodeResources(SpecModel):
    """CPU and memory of one node that a training pod may use."""

    cpu: Quantity = Field(default="2", description="CPU per node, e.g. `8` or `500m`.")
    memory: Quantity = Field(default="4Gi", description="Memory per node, e.g. `64Gi`.")


class ComputeSpec(SpecModel):
    """A pool of identical nodes. Forge derives how many accelerators a Model needs and rounds up
    to whole nodes within `minGpus`..`maxGpus`."""

    accelerator: Accelerator = Field(description="Accelerator on each node.")
    gpus_per_node: int = Field(default=0, ge=0, le=64, description="Accelerators per node (0 for a CPU pool).")
    min_gpus: int = Field(default=0, ge=0, le=MAX_GPUS, description="Fewest accelerators a job in this pool is given.")
    max_gpus: int = Field(
        default=0, ge=0, le=MAX_GPUS, description=f"Most accelerators a job in this pool may use (at most {MAX_GPUS})."
    )
    priority: Priority = Field(
        default="medium",
        description="Default priority of work in this pool; training always runs `high` and "
        "inference `medium` unless this pool says `low`.",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the pods must match.")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=MAX_TOLERATIONS, description="Taints the pods tolerate."
    )
    node: NodeResources = Field(default_factory=NodeResources, description="CPU and memory per node.")
    queue: Queue | None = Field(
        default=None, description="Admit the pool's training through a Kueue queue (quota, borrowing, lending, "
        "preemption; specs/queue.py, docs/queues.md); unset: pods are scheduled as they come.")

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, value: dict[str, str]) -> dict[str, str]:
        return check_selector(value, "nodeSelector")

    @model_validator(mode="after")
    def _sizes(self) -> ComputeSpec:
        if self.accelerator.type == "cpu":
            if self.gpus_per_node or self.min_gpus or self.max_gpus:
                raise ValueError("a `cpu` pool has no GPUs: leave gpusPerNode, minGpus and maxGpus at 0")
            return self
        if self.gpus_per_node < 1:
            raise ValueError("an accelerator pool needs `gpusPerNode` of at least 1")
        if self.max_gpus < 1:
            raise ValueError("an accelerator pool needs `maxGpus` of at least 1")
        if self.min_gpus > self.max_gpus:
            raise ValueError(f"minGpus ({self.min_gpus}) is above maxGpus ({self.max_gpus})")
        if self.max_gpus >= self.gpus_per_node and self.max_gpus % self.gpus_per_node:
            raise ValueError(
                f"maxGpus ({self.max_gpus}) must be a whole number of nodes of {self.gpus_per_node} GPUs"
            )
        return self


def queue_problems(spec: ComputeSpec) -> list[tuple[tuple[str | int, ...], str]]:
    """(field path, message) of each way the pool's queue could never admit its own jobs: no GPU
    quota on an accelerator pool, a GPU quota on a CPU pool, a quota below `minGpus` (every job of
    the pool asks at least that many, so none would be admitted without borrowing, and a borrowed
    admission is the first reclaimed)."""
    queue = spec.queue
    if queue is None:
        return []
    at: tuple[str | int, ...] = ("spec", "queue", "quota", "gpus")
    gpus = queue.quota.gpus
    if spec.accelerator.type == "cpu":
        problems = [(at, "a `cpu` pool has no GPUs: remove `queue.quota.gpus`")] if gpus is not None else []
        for key, limit in (("borrowingLimit", queue.borrowing_limit), ("lendingLimit", queue.lending_limit)):
            if limit is not None and limit.gpus is not None:
                problems.append((("spec", "queue", key, "gpus"), f"a `cpu` pool has no GPUs: remove `queue.{key}.gpus`"))
        return problems + _flavor_problems(spec)
    if gpus is None:
        return [(("spec", "queue", "quota"), "an accelerator pool's queue needs `quota.gpus`: the GPUs its training "
                 f"may hold at once (at least minGpus, {spec.min_gpus})")]
    if gpus < spec.min_gpus:
        return [(at, f"queue quota of {gpus} GPU{'s' if gpus != 1 else ''} is below the pool's minGpus ({spec.min_gpus}): "
                 "every job of the pool asks at least minGpus, so none would ever be admitted on the quota alone")]
    return _flavor_problems(spec)


#: Kueue's ResourceFlavor holds at most 8 node labels and 8 taints (its CRD's maxProperties/maxItems).
MAX_FLAVOR_ENTRIES = 8


def _flavor_problems(spec: ComputeSpec) -> list[tuple[tuple[str | int, ...], str]]:
    """A queued pool's node selector and tainting tolerations must fit one Kueue ResourceFlavor."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    if len(spec.node_selector) > MAX_FLAVOR_ENTRIES:
        problems.append((("spec", "nodeSelector"), f"a queued pool's nodeSelector becomes its Kueue ResourceFlavor's "
                         f"nodeLabels, which hold at most {MAX_FLAVOR_ENTRIES}; this one has {len(spec.node_selector)}"))
    taints = [t for t in spec.tolerations if t.key is not None and t.effect is not None]
    if len(taints) > MAX_FLAVOR_ENTRIES:
        problems.append((("spec", "tolerations"), f"a queued pool's tolerations with a key and an effect become its "
                         f"Kueue ResourceFlavor's nodeTaints, which hold at most {MAX_FLAVOR_ENTRIES}; this one has {len(taints)}"))
    return problems
