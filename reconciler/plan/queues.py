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

from renderers.queues import PRIORITY_CLASS, QUEUE_NAME, queue_object_name
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
    #: `spec.preemption.withinClusterQueue` (Kueue's default when unset: `Never`).
    within_queue: str = "Never"

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
        within_queue=str((spec.get("preemption") or {}).get("withinClusterQueue") or "Never"),
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
    #: The WorkloadPriorityClass it is labelled with (``kueue.x-k8s.io/priority-class``), if any.
    priority_class: str | None = None


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
            out.append(QueuedStep(template["name"], labels[QUEUE_NAME], _requests({"containers": [template["container"]]}),
                                  False, labels.get(PRIORITY_CLASS)))
        manifest = (template.get("resource") or {}).get("manifest")
        if manifest:
            try:
                job = json.loads(manifest)
            except ValueError:
                continue
            job_labels = (job.get("metadata") or {}).get("labels") or {}
            pool = job_labels.get(QUEUE_NAME)
            if pool and job.get("kind") == "PyTorchJob":
                total: dict[str, float] = {}
                for replica in ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).values():
                    for name, value in _requests((replica.get("template") or {}).get("spec") or {},
                                                 int(replica.get("replicas", 1))).items():
                        total[name] = total.get(name, 0.0) + value
                out.append(QueuedStep(template["name"], pool, total, True, job_labels.get(PRIORITY_CLASS)))
    return out


@dataclass(frozen=True)
class AdmittedWorkload:
    """A Kueue ``Workload`` holding quota (its ``QuotaReserved`` condition true), read from the
    cluster: what a preemption could pick."""

    name: str
    #: Its owner, as ``Kind name`` (the Argo step's pod, or the PyTorchJob).
    owner: str
    cluster_queue: str
    priority: int
    #: What its pod sets hold of the queue, by resource (``status.admission.podSetAssignments[].resourceUsage``).
    usage: Mapping[str, float]
    #: When its quota was reserved (RFC 3339; Kueue preempts the most recently admitted first).
    reserved_at: str
    evicted: bool = False
    uid: str = ""


def admitted_workloads(items: Iterable[Mapping[str, Any]]) -> list[AdmittedWorkload]:
    """The Workloads among ``items`` (live objects) that hold quota now."""
    out = []
    for obj in items:
        status = obj.get("status") or {}
        admission = status.get("admission") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        reserved = conditions.get("QuotaReserved") or {}
        if not admission or reserved.get("status") != "True":
            continue
        usage: dict[str, float] = {}
        for pod_set in admission.get("podSetAssignments") or []:
            for name, value in (pod_set.get("resourceUsage") or {}).items():
                usage[name] = usage.get(name, 0.0) + _amount(value)
        meta = obj.get("metadata") or {}
        owners = [f"{o.get('kind')} {o.get('name')}" for o in meta.get("ownerReferences") or []]
        out.append(AdmittedWorkload(
            name=str(meta.get("name", "")), owner=owners[0] if owners else "", cluster_queue=str(admission.get("clusterQueue", "")),
            priority=int((obj.get("spec") or {}).get("priority") or 0), usage=usage,
            reserved_at=str(reserved.get("lastTransitionTime") or ""),
            evicted=(conditions.get("Evicted") or {}).get("status") == "True", uid=str(meta.get("uid", ""))))
    return out


def preemption_targets(requests: Mapping[str, float], queue: QueueState, priority: int,
                       workloads: Iterable[AdmittedWorkload]) -> list[AdmittedWorkload]:
    """The admitted workloads of ``queue`` Kueue would preempt to admit a new workload asking
    ``requests`` at ``priority`` within the queue's nominal quota, by its classical preemption
    (``pkg/scheduler/preemption``): candidates of lower priority (the queue's `withinClusterQueue`
    policy other than `Never`), ordered as its ``CandidatesOrdering`` orders them — evicted ones
    first, then lowest priority, then the most recently admitted — taken one by one until the
    request fits, then each but the last given back when the request still fits without it
    (``fillBackWorkloads``). Empty when preempting cannot make it fit. Borrowing from the cohort
    and fair sharing are not weighed."""
    if queue.within_queue == "Never":
        return []
    resources = [r for r, v in requests.items() if v > 0 and r in queue.quotas]
    free = {r: _amount(queue.quotas[r].nominal) - _amount(queue.usage.get(r, ("0", "0"))[0]) for r in resources}

    def fits(freed: Mapping[str, float]) -> bool:
        return all(requests[r] <= free[r] + freed.get(r, 0.0) + 1e-9 for r in resources)

    candidates = sorted((w for w in workloads if w.cluster_queue == queue.name and w.priority < priority),
                        key=lambda w: (not w.evicted, w.priority, _descending(w.reserved_at), w.uid))
    chosen: list[AdmittedWorkload] = []
    freed: dict[str, float] = {}
    for w in candidates:
        chosen.append(w)
        for r, v in w.usage.items():
            freed[r] = freed.get(r, 0.0) + v
        if fits(freed):
            break
    else:
        return []
    for i in range(len(chosen) - 2, -1, -1):
        without = {r: v - chosen[i].usage.get(r, 0.0) for r, v in freed.items()}
        if fits(without):
            freed = without
            del chosen[i]
    return chosen


def _descending(text: str) -> tuple[int, ...]:
    """A sort key ordering RFC 3339 times (same format, UTC) newest first."""
    return tuple(-ord(ch) for ch in text)


def admission_line(workflow: str, step: QueuedStep, queue: QueueState | None, queue_name: str, *,
                   priority: int | None = None, workloads: Iterable[AdmittedWorkload] | None = None) -> str:
    """What Kueue will do with ``step`` of a new Workflow, by the live ClusterQueue ``queue`` (None:
    not in the plan): admitted now when its accelerator request fits the nominal quota left free;
    else, when the queue's admitted ``workloads`` were read and its ``priority`` is known, the
    lower-priority ones it will preempt (:func:`preemption_targets`); else what it waits for and
    how many workloads are pending before it; without a status read, the quota alone."""
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
    targets = preemption_targets(step.requests, queue, priority, workloads) if (
        workloads is not None and priority is not None) else []
    if targets:
        named = ", ".join(f"{w.name} ({w.owner}, priority {w.priority})" if w.owner else f"{w.name} (priority {w.priority})"
                          for w in targets)
        return what + (f": will preempt {named}: lower priority than its {priority} ({_text(free)} of {_text(nominal)} "
                       f"free; withinClusterQueue {queue.within_queue}); a preempted step is retried and waits again")
    return what + (f": waits for {_text(need - free)} more {resource} ({_text(free)} of {_text(nominal)} free"
                   + (f", behind {pending} pending workload{'s' if pending != 1 else ''}" if pending else "") + cohort + ")")


def admission_notes(changes: Iterable[Change], workloads: Iterable[AdmittedWorkload] | None = None) -> list[str]:
    """One line per new Workflow's largest queued step (:func:`admission_line`), against the live
    ClusterQueue of its pool in the same plan and, when they were read, the Workloads admitted
    there; the step's priority is the value of the WorkloadPriorityClass it is labelled with."""
    changes = list(changes)
    queues = {c.ref.name: queue_state(c.before) if c.before is not None else queue_state(c.after)
              for c in changes if c.ref.kind == "ClusterQueue" and c.after is not None}
    values = {c.ref.name: int(c.after.get("value") or 0) for c in changes
              if c.ref.kind == "WorkloadPriorityClass" and c.after is not None}
    admitted = list(workloads) if workloads is not None else None
    lines = []
    for c in changes:
        if c.ref.kind != "Workflow" or c.action.value != "create" or c.after is None:
            continue
        steps = queued_steps(c.after)
        if not steps:
            continue
        step = max(steps, key=lambda s: sum(v for r, v in s.requests.items() if r not in PLAIN_RESOURCES))
        name = queue_object_name(c.ref.namespace, step.pool)
        lines.append((c.ref.name, admission_line(c.ref.name, step, queues.get(name), name, workloads=admitted,
                                                 priority=values.get(step.priority_class or ""))))
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
