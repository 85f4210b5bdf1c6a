"""A `Compute` pool's queue: the Kueue quota, borrowing, lending and preemption of its GPUs.

A pool with a `queue` renders (on a `kubernetes` target) a Kueue `ResourceFlavor` and
`ClusterQueue`, a `LocalQueue` in the environment's namespace and the `WorkloadPriorityClass`es
its training runs at (renderers/queues.py); its training pods and PyTorchJobs are labelled for
the queue, so they wait for quota instead of sitting Pending. One pool is one flavor: pools share
idle GPUs through a common `cohort`. Cohorts do not nest here (Kueue's `Cohort` objects with a
parent are not rendered), so no cohort cycle can be written.

The rules Kueue's own webhook applies to a ClusterQueue (sigs.k8s.io/kueue v0.17.0,
pkg/webhooks/clusterqueue_webhook.go) are checked here, where the spec's line is known: a
borrowing or lending limit needs a cohort, a lending limit is at most the nominal quota, and
`borrowWithinCohort` needs `reclaimWithinCohort` other than `Never`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from specs.base import Name, Quantity, SpecModel, quantity_value

#: The most GPUs one quota, limit or pool may name (the same bound as a pool's `maxGpus`).
MAX_QUOTA_GPUS = 4096


class QueueResources(SpecModel):
    """GPUs, CPU and memory of one quota or limit; unset means "not limited here" for a limit, and
    "derived from the pool" for a quota (see :class:`Queue`)."""

    gpus: int | None = Field(default=None, ge=0, le=MAX_QUOTA_GPUS, description="Accelerators (the pool's extended resource).")
    cpu: Quantity | None = Field(default=None, description="CPU, e.g. `768` or `500m`.")
    memory: Quantity | None = Field(default=None, description="Memory, e.g. `14400Gi`.")


class BorrowWithinCohort(SpecModel):
    """Whether a workload that borrows may preempt workloads of other queues of the cohort."""

    policy: Literal["Never", "LowerPriority"] = Field(
        default="Never", description="`LowerPriority`: a borrowing workload may preempt lower-priority workloads of "
        "other queues in the cohort; `Never` (default): it waits.")
    max_priority_threshold: int | None = Field(
        default=None, ge=-(2**31), le=2**31 - 1,
        description="Only workloads at or below this priority value may be preempted by a borrowing one.")


class QueuePreemption(SpecModel):
    """Kueue's preemption policy of the pool's ClusterQueue (its `spec.preemption`)."""

    reclaim_within_cohort: Literal["Never", "LowerPriority", "Any"] = Field(
        default="Any", description="When this queue needs its own nominal quota back from a queue of the cohort that "
        "borrowed it: `Any` (default) preempts the borrower's workloads whatever their priority, `LowerPriority` only "
        "lower-priority ones, `Never` waits.")
    within_cluster_queue: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = Field(
        default="LowerPriority", description="Within this queue, a pending workload that does not fit preempts admitted "
        "ones of lower priority (default), also newer ones of equal priority, or never.")
    borrow_within_cohort: BorrowWithinCohort = Field(
        default_factory=BorrowWithinCohort, description="Preemption in other queues of the cohort while borrowing.")

    @model_validator(mode="after")
    def _kueue_rule(self) -> QueuePreemption:
        if self.reclaim_within_cohort == "Never" and self.borrow_within_cohort.policy != "Never":
            raise ValueError("`borrowWithinCohort.policy` other than Never needs `reclaimWithinCohort` other than Never "
                             "(Kueue's webhook refuses the pair)")
        return self


class QueueFairSharing(SpecModel):
    """The pool's weight when Kueue's fair sharing (a setting of the Kueue installation) divides idle quota."""

    weight: Quantity = Field(default="1", description="Relative share of the cohort's unused quota; `0` always yields.")


class Queue(SpecModel):
    """The Kueue queue of a pool. `quota` is the pool's nominal quota; `gpus` is required on an
    accelerator pool (at least `minGpus`); `cpu` and `memory` default to the pool's nodes
    (`node.cpu`, `node.memory`) times the nodes the GPU quota fills (one node on a CPU pool)."""

    cohort: Name | None = Field(
        default=None, description="Cohort the pool's ClusterQueue joins (e.g. the organisation): queues of one cohort "
        "lend each other their unused quota. Required for borrowing and lending limits.")
    quota: QueueResources = Field(default_factory=QueueResources, description="Nominal quota of the pool's flavor.")
    borrowing_limit: QueueResources | None = Field(
        default=None, description="Most this queue may borrow from the cohort beyond its quota, per resource; unset: "
        "no limit (all the cohort lends).")
    lending_limit: QueueResources | None = Field(
        default=None, description="Most of its unused quota this queue lends to the cohort, per resource (at most the "
        "quota); unset: all of it.")
    preemption: QueuePreemption = Field(default_factory=QueuePreemption, description="Reclaiming lent quota and preempting lower priority.")
    fair_sharing: QueueFairSharing | None = Field(
        default=None, description="The queue's weight under fair sharing (effective where Kueue enables it).")

    @model_validator(mode="after")
    def _limits(self) -> Queue:
        for name, limit in (("borrowingLimit", self.borrowing_limit), ("lendingLimit", self.lending_limit)):
            if limit is not None and self.cohort is None:
                raise ValueError(f"`{name}` needs a `cohort`: a queue outside a cohort has no one to borrow from or lend to")
        lend = self.lending_limit
        if lend is not None:
            for resource in ("gpus", "cpu", "memory"):
                limit, quota = getattr(lend, resource), getattr(self.quota, resource)
                if limit is not None and quota is not None and _amount(limit) > _amount(quota):
                    raise ValueError(f"`lendingLimit.{resource}` ({limit}) is above `quota.{resource}` ({quota}): a queue "
                                     "lends at most its own quota")
        return self


def _amount(value: int | str) -> float:
    return float(value) if isinstance(value, int) else quantity_value(value)


__all__ = ["BorrowWithinCohort", "MAX_QUOTA_GPUS", "Queue", "QueueFairSharing", "QueuePreemption", "QueueResources"]
