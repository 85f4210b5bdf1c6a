"""`Compute`: a pool of nodes with accelerators, its size limits and scheduling constraints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator, model_validator

from specs.base import Quantity, SpecModel, check_label_value, check_qualified_name, check_selector

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

Priority = Literal["high", "medium", "low"]


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
