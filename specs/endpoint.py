"""`Endpoint`: serve a model version behind the Open Inference (v2) protocol, rolled out by a policy."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from specs.base import Duration, LaterFieldsModel, Name, Quantity, SpecModel
from specs.experiment import Experiment, Shadow
from specs.traffic import TrafficRouting


class ResourceList(SpecModel):
    """CPU, memory and accelerators of one model server."""

    cpu: Quantity | None = Field(default=None, description="CPU, e.g. `500m`.")
    memory: Quantity | None = Field(default=None, description="Memory, e.g. `512Mi`.")
    gpus: int = Field(default=0, ge=0, le=64, description="Accelerators (of the Compute pool's resource name).")


class Resources(SpecModel):
    """Requests and limits of one model server."""

    requests: ResourceList = Field(default_factory=lambda: ResourceList(cpu="250m", memory="256Mi"), description="Requested resources.")
    limits: ResourceList = Field(default_factory=ResourceList, description="Resource limits.")


class Autoscaling(SpecModel):
    """Horizontal autoscaling of the stable predictor."""

    min_replicas: int = Field(ge=1, le=1000, description="Fewest replicas.")
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas.")
    target_cpu_utilization: int = Field(default=70, ge=1, le=100, description="Average CPU percent to aim for.")

    @model_validator(mode="after")
    def _ordered(self) -> Autoscaling:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"maxReplicas ({self.max_replicas}) is below minReplicas ({self.min_replicas})")
        return self


class Batching(LaterFieldsModel):
    """Dynamic (adaptive) batching: requests arriving close together run as one batch."""

    enabled: bool = Field(default=True, description="Batch concurrent requests.")
    max_batch_size: int = Field(default=16, ge=1, le=4096, description="Largest batch.")
    max_latency_ms: float = Field(default=5.0, gt=0, le=10_000, description="Longest a request waits for its batch to fill.")
    p99_target_ms: float | None = Field(
        default=None, gt=0, le=60_000,
        description="The p99 latency budget of a request. When set, the server batches by load instead of MLServer's "
        "fixed window: a request that finds the model idle runs at once (no hold at low load); requests that arrive "
        "while the model computes run together as the next batch (up to `maxBatchSize`); a batch is held for more "
        "arrivals only while the measured arrival rate says it will fill, at most `maxLatencyMs` and never past the "
        "budget left after the measured compute time. Unset: MLServer's adaptive batching, which holds every batch "
        "(even a lone request) up to `maxLatencyMs`.",
    )

    @model_validator(mode="after")
    def _budget(self) -> Batching:
        if self.p99_target_ms is not None and self.p99_target_ms <= self.max_latency_ms:
            raise ValueError(f"p99TargetMs ({self.p99_target_ms:g}) must be larger than maxLatencyMs ({self.max_latency_ms:g}): "
                             "a request may be held up to maxLatencyMs before it computes, so a budget at or below it cannot be kept")
        return self

    added_later = {"p99_target_ms": None}


class ServingBackend(SpecModel):
    """Which registered variant of the version a server runs (PyTorch fp32, INT8, ONNX Runtime, …),
    and with how many threads."""

    select: Literal["variant", "fastest"] = Field(
        default="variant",
        description="`variant`: serve the Endpoint's `variant` as it is. `fastest`: at start-up the server reads the "
        "version's registry record and serves the variant with the highest throughput the `benchmark` step measured "
        "(at the batch size nearest `batching.maxBatchSize`, or 1 without batching) among those whose accuracy is "
        "within `maxAccuracyDrop` points of the base's; the Endpoint's `variant` when no variant has figures.",
    )
    max_accuracy_drop: float = Field(
        default=1.0, ge=0, le=100,
        description="With `select: fastest`: most accuracy a served variant may lose against the base, in points (1.0 = one percentage point).",
    )
    threads: int | None = Field(
        default=None, ge=1, le=256,
        description="Intra-op threads of the model (PyTorch and ONNX Runtime; one server process, one batch computing "
        "at a time). Default: the CPUs the server may use (its cgroup CPU limit, else its CPU affinity).",
    )


class FaultInjection(LaterFieldsModel):
    """Injected faults for rollback drills: never set this in production."""

    error_rate: float = Field(default=0.0, ge=0, le=1, description="Fraction of requests answered with HTTP 500.")
    added_latency_ms: float = Field(default=0.0, ge=0, le=60_000, description="Latency added to every request.")
    after: Duration | None = Field(
        default=None, description="A canary that degrades late: each server is healthy for this long after it started "
        "serving, then the faults begin (with `afterRequests`, whichever comes last). Unset: from the start.",
    )
    after_requests: int | None = Field(
        default=None, ge=1, le=1_000_000_000,
        description="A canary that degrades late: each server answers this many inference requests healthy, then the "
        "faults begin (with `after`, whichever comes last). Unset: from the first request.",
    )

    @model_validator(mode="after")
    def _delays_a_fault(self) -> FaultInjection:
        if (self.after is not None or self.after_requests is not None) and not (self.error_rate or self.added_latency_ms):
            raise ValueError("`after` and `afterRequests` delay a fault: set `errorRate` or `addedLatencyMs` too")
        return self

    added_later = {"after": None, "after_requests": None}


class EndpointSpec(LaterFieldsModel):
    """A served model. When the model's version changes, the rollout policy moves traffic to it."""

    model_ref: Name = Field(description="Name of the Model to serve.")
    variant: Name = Field(default="base", description="`base` (uncompressed), a Compression variant's name, or an ONNX "
                          "export of one (`<variant>-onnx`, and `<variant>-onnx-int8` on a CPU/ARM target), served by ONNX Runtime.")
    rollout_policy_ref: Name | None = Field(
        default=None, description="Name of the RolloutPolicy; default the Environment's `defaults.rolloutPolicyRef`."
    )
    compute_ref: Name | None = Field(default=None, description="Compute pool for the servers; default CPU nodes.")
    replicas: int = Field(default=1, ge=0, le=1000, description="Replicas of the stable predictor.")
    resources: Resources = Field(default_factory=Resources, description="Resources of each server.")
    autoscaling: Autoscaling | None = Field(default=None, description="Horizontal autoscaling; none keeps `replicas`.")
    batching: Batching = Field(default_factory=Batching, description="Dynamic batching.")
    backend: ServingBackend | None = Field(
        default=None, description="How the variant to serve is chosen (`select: fastest` picks by the benchmark's "
        "measurements within an accuracy bound) and the model's thread count; unset: the `variant` as it is."
    )
    protocol: Literal["v2", "seldon"] = Field(
        default="v2", description="`v2` (Open Inference protocol, MLServer) or `seldon` (Seldon v1 wrapper)."
    )
    fault_injection: FaultInjection | None = Field(
        default=None, description="Injected faults for rollback drills; applied to the canary of a rollout only."
    )
    experiment: Experiment | None = Field(
        default=None,
        description="An A/B(/n) experiment: arms with shares of traffic, decided by a sequential test on a primary "
        "metric, with guardrails, a minimum sample per arm and a deadline (docs/experiments.md).",
    )
    shadow: Shadow | None = Field(
        default=None, description="A shadow predictor that gets a copy of live requests; its answers are discarded."
    )
    traffic: TrafficRouting | None = Field(
        default=None, description="What splits this Endpoint's traffic between its predictors in a cluster "
        "(`target: kubernetes`; the local target routes requests itself); replaces the Environment's `traffic` as a "
        "whole. Default: the Environment's, else `router: seldon`.",
    )

    def required_variant(self, variant: str | None = None) -> str | None:
        """The variant a server of this Endpoint must find registered to start: ``variant`` (an
        arm's or the shadow's own) or the Endpoint's — none under `backend.select: fastest`, whose
        server picks among the variants registered. The offline gates and the servers' wait ask it."""
        if self.backend is not None and self.backend.select == "fastest":
            return None
        return variant or self.variant

    @model_validator(mode="after")
    def _v2_only(self) -> EndpointSpec:
        if self.protocol == "seldon":
            used = [name for name, on in (("backend", self.backend is not None), ("batching.p99TargetMs", self.batching.p99_target_ms is not None)) if on]
            if used:
                raise ValueError(f"{' and '.join(used)} need protocol v2 (the MLServer runtime); the seldon wrapper serves the "
                                 f"Endpoint's variant with its own batching — remove {' and '.join(used)} or use protocol: v2")
        return self

    added_later = {"experiment": None, "shadow": None, "backend": None, "traffic": None}
