"""What the plan says of each Kueue queue a change touches (pure): its quota as rendered, and — only
when the live ClusterQueue's status was read — what is in use and pending now; for each new
Workflow whose training is queued, whether Kueue can admit it now or what it waits for; and which
changes lower a quota (the `queue-quota-lowered` risk flag, reconciler/plan/risks.py).

Nothing here is estimated: "in use" is the `status.flavorsUsage` Kueue's controller writes,
"pending" and "admitted" its `status.pendingWorkloads` and `status.admittedWorkloads`. A queue
that is new, or whose live object came without a status (no Kueue controller running, or a
metadata-only read), shows its quota alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from renderers.queues import QUEUE_NAME, queue_object_name
from specs.base import quantity_value

if TYPE_CHECKING:
    from reconciler.plan.change import Change

#: The resources every queue covers besides its accelerator's.
PLAIN_RESOURCES = ("cpu", "memory")


@dataclass(frozen=True)
class Quota:
    """One resource of a ClusterQueue's flavor: nominal quota and limits, as the manifest writes them."""

    nominal: str
    borrowing_limit: str | None = None
    lending_limit: str | None = None


@dataclass(frozen=True)
class QueueState:
    """A ClusterQueue read from a manifest: its quotas by resource and, when it has a status, what is used."""

    name: str
    cohort: str | None
    quotas: Mapping[str, Quota]
    #: resource → (in use, borrowed), summed over the flavors; empty without a status.
    usage: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    pending: int | None = None
    admitted: int | None = None

    @property
    def accelerator(self) -> str | None:
        """The accelerator's extended resource, if the queue covers one."""
        return next((r for r in self.quotas if r not in PLAIN_RESOURCES), None)


def queue_state(obj: Mapping[str, Any]) -> QueueState:
    """The :class:`QueueState` of a ClusterQueue manifest or live object."""
    spec = obj.get("spec") or {}
    quotas: dict[str, Quota] = {}
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for r in flavor.get("resources") or []:
                quotas[str(r.get("name"))] = Quota(str(r.get("nominalQuota", "0")), _opt(r.get("borrowingLimit")),
                                                   _opt(r.get("lendingLimit")))
    status = obj.get("status") or {}
    usage: dict[str, tuple[float, float]] = {}
    for flavor in status.get("flavorsUsage") or []:
        for r in flavor.get("resources") or []:
            total, borrowed = usage.get(str(r.get("name")), (0.0, 0.0))
            usage[str(r.get("name"))] = (total + _amount(r.get("total")), borrowed + _amount(r.get("borrowed")))
    return QueueState(
        name=str((obj.get("metadata") or {}).get("name", "")),
        cohort=spec.get("cohortName") or None,
        quotas=quotas,
        usage={k: (_text(t), _text(b)) for k, (t, b) in usage.items()},
        pending=status.get("pendingWorkloads") if "pendingWorkloads" in status else None,
        admitted=status.get("admittedWorkloads") if "admittedWorkloads" in status else None,
    )


def _opt(value: Any) -> str | None:
    return None if value is None else str(value)


def _amount(value: Any) -> float:
    """A quantity as a number (0 when absent or not one Forge reads)."""
    if value is None:
        return 0.0
    try:
        return quantity_value(str(value))
    except ValueError:
        return 0.0


def _text(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def queue_line(after: Mapping[str, Any], before: Mapping[str, Any] | None) -> str:
    """The plan's line for one pool's queue: the quota of ``after`` (the desired ClusterQueue), and
    in use / pending from ``before``'s status when the live object has one."""
    want = queue_state(after)
    labels = (after.get("metadata") or {}).get("labels") or {}
    pool = labels.get("forge.dev/name", want.name)
    parts = []
    first = [want.accelerator] if want.accelerator else []
    for resource, quota in sorted(want.quotas.items(), key=lambda rq: (rq[0] not in first, rq[0])):
        limits = [f"borrow ≤ {quota.borrowing_limit}" if quota.borrowing_limit is not None else "",
                  f"lend ≤ {quota.lending_limit}" if quota.lending_limit is not None else ""]
        extra = ", ".join(x for x in limits if x)
        parts.append(f"{quota.nominal} {resource}" + (f" ({extra})" if extra else ""))
    line = (f"queue of pool `{pool}` (ClusterQueue {want.name}"
            + (f", cohort {want.cohort}" if want.cohort else "") + "): quota " + ", ".join(parts))
    if before is None:
        return line + "; new: nothing in use yet"
    live = queue_state(before)
    if live.pending is None and not live.usage:
        return line  # a rendered manifest (pull-request mode), or a live one Kueue has not reported on
    used = []
    for resource in ([want.accelerator] if want.accelerator else []) + list(PLAIN_RESOURCES):
        if resource in live.usage:
            total, borrowed = live.usage[resource]
            used.append(f"{total} {resource}" + (f" ({borrowed} borrowed)" if _amount(borrowed) else ""))
    line += "; live: " + (", ".join(used) + " in use" if used else "nothing in use")
    if live.pending is not None:
        line += f", {live.pending} workload{'s' if live.pending != 1 else ''} pending"
    if live.admitted is not None:
        line += f", {live.admitted} admitted"
    return line


def queue_notes(changes: Iterable[Change]) -> list[str]:
    """One line per ClusterQueue the plan keeps or creates (:func:`queue_line`), by name."""
    lines = [(c.ref.name, queue_line(c.after, c.before)) for c in changes
             if c.ref.kind == "ClusterQueue" and c.after is not None]
    return [line for _, line in sorted(lines)]


@dataclass(frozen=True)
class QueuedStep:
    """The largest queued workload of a Workflow: its step, its pool's queue, what it asks of the
    queue's accelerator resource at once (every replica of a PyTorchJob: one gang), and whether it
    is a gang."""

    step: str
    pool: str
    requests: Mapping[str, float]
    gang: bool


def _requests(pod_spec: Mapping[str, Any], replicas: int = 1) -> dict[str, float]:
    """What a pod spec's containers request, times ``replicas``."""
    out: dict[str, float] = {}
    for container in pod_spec.get("containers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            out[name] = out.get(name, 0.0) + _amount(value) * replicas
    return out


def queued_steps(workflow: Mapping[str, Any]) -> list[QueuedStep]:
    """The steps of a rendered Workflow that Kueue admits (labelled with a queue): a train pod
    (its template's labels and container), or a PyTorchJob its resource template creates (the
    job's labels; every replica's requests together)."""
    out = []
    for template in (workflow.get("spec") or {}).get("templates") or []:
        labels = (template.get("metadata") or {}).get("labels") or {}
        if labels.get(QUEUE_NAME) and "container" in template:
            out.append(QueuedStep(template["name"], labels[QUEUE_NAME], _requests({"containers": [template["container"]]}), False))
        manifest = (template.get("resource") or {}).get("manifest")
        if manifest:
            try:
                job = json.loads(manifest)
            except ValueError:
                continue
            pool = ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_NAME)
            if pool and job.get("kind") == "PyTorchJob":
                total: dict[str, float] = {}
                for replica in ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).values():
                    for name, value in _requests((replica.get("template") or {}).get("spec") or {},
                                                 int(replica.get("replicas", 1))).items():
                        total[name] = total.get(name, 0.0) + value
                out.append(QueuedStep(template["name"], pool, total, True))
    return out


def admission_line(workflow: str, step: QueuedStep, queue: QueueState | None, queue_name: str) -> str:
    """What Kueue will do with ``step`` of a new Workflow, by the live ClusterQueue ``queue`` (None:
    not in the plan): admitted now when its accelerator request fits the nominal quota left free,
    else what it waits for and how many workloads are pending before it; without a status read,
    the quota alone."""
    resource = (queue.accelerator if queue is not None else None) or next(
        (r for r in step.requests if r not in PLAIN_RESOURCES), "cpu")
    need = step.requests.get(resource, 0.0)
    what = (f"Workflow {workflow}: {step.step} asks {_text(need)} {resource}"
            + (" at once (a PyTorchJob: all replicas or none)" if step.gang else "") + f" of ClusterQueue {queue_name}")
    if queue is None or resource not in queue.quotas:
        return what + ": not rendered by this plan; Kueue's state not read"
    nominal = _amount(queue.quotas[resource].nominal)
    if queue.pending is None and not queue.usage:
        return what + f" (quota {_text(nominal)}): queued; Kueue's state not read"
    in_use = _amount(queue.usage.get(resource, ("0", "0"))[0])
    free = max(0.0, nominal - in_use)
    pending = queue.pending or 0
    borrow = queue.quotas[resource].borrowing_limit
    cohort = (f"; may borrow up to {borrow} in cohort {queue.cohort}" if borrow is not None
              else f"; may borrow idle quota in cohort {queue.cohort}") if queue.cohort else ""
    if need <= free and not pending:
        return what + f": admitted now ({_text(free)} of {_text(nominal)} free)"
    if need <= free:
        return what + (f": fits the {_text(free)} free, behind {pending} pending workload{'s' if pending != 1 else ''} "
                       "(admitted now unless they take it first)")
    return what + (f": waits for {_text(need - free)} more {resource} ({_text(free)} of {_text(nominal)} free"
                   + (f", behind {pending} pending workload{'s' if pending != 1 else ''}" if pending else "") + cohort + ")")


def admission_notes(changes: Iterable[Change]) -> list[str]:
    """One line per new Workflow's largest queued step (:func:`admission_line`), against the live
    ClusterQueue of its pool in the same plan."""
    changes = list(changes)
    queues = {c.ref.name: queue_state(c.before) if c.before is not None else queue_state(c.after)
              for c in changes if c.ref.kind == "ClusterQueue" and c.after is not None}
    lines = []
    for c in changes:
        if c.ref.kind != "Workflow" or c.action.value != "create" or c.after is None:
            continue
        steps = queued_steps(c.after)
        if not steps:
            continue
        step = max(steps, key=lambda s: sum(v for r, v in s.requests.items() if r not in PLAIN_RESOURCES))
        name = queue_object_name(c.ref.namespace, step.pool)
        lines.append((c.ref.name, admission_line(c.ref.name, step, queues.get(name), name)))
    return [line for _, line in sorted(lines)]


@dataclass(frozen=True)
class LoweredQuota:
    """A ClusterQueue whose nominal quota of ``resource`` the change lowers; ``in_use`` when the
    live status says how much is admitted now."""

    change: Change
    resource: str
    old: str
    new: str
    in_use: str | None


def lowered_quotas(changes: Iterable[Change]) -> list[LoweredQuota]:
    """Every resource whose nominal quota an update of a ClusterQueue lowers."""
    out = []
    for change in changes:
        if change.ref.kind != "ClusterQueue" or change.before is None or change.after is None:
            continue
        old, new = queue_state(change.before), queue_state(change.after)
        for resource, quota in new.quotas.items():
            was = old.quotas.get(resource)
            if was is None or _amount(quota.nominal) >= _amount(was.nominal):
                continue
            in_use = old.usage.get(resource, (None, None))[0]
            out.append(LoweredQuota(change, resource, was.nominal, quota.nominal, in_use))
    return out
