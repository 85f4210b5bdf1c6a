"""The Sync object's status, in the conventions of the ecosystem (kstatus, fluxcd/pkg `runtime/conditions`):
conditions `Ready`, `Reconciling` and `Stalled` with a reason, a message, the generation they were
computed for and when each last changed, beside the revisions, the last plan's summary and every
endpoint's rollout. Pure: values in, the status object out; the controller writes it.

What each outcome of a sync says:

======================  =====  ===========  =======  ==========================================
reason                  Ready  Reconciling  Stalled  when
======================  =====  ===========  =======  ==========================================
Progressing             Unknown True        False    a revision is being fetched, planned, applied
Succeeded               True   False        False    the revision is applied (or already was)
ValidationFailed        False  False        True     the specs at the revision do not load: the
                                                     previous revision keeps running; a new commit
                                                     is needed (the message names file:line)
Blocked                 False  False        True     the target cannot run the plan
FetchFailed             False  True         False    git did not answer; retried next interval
ApplyFailed             False  True         False    the apply stopped part-way; retried
======================  =====  ===========  =======  ==========================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reconciler.resources import SYNC
from reconciler.rollout.machine import ACTIVE, Phase
from reconciler.rollout.steering import FAILED

#: Outcome reason → (Ready, Reconciling, Stalled), as the module docstring's table.
CONDITIONS: dict[str, tuple[str, str, str]] = {
    "Progressing": ("Unknown", "True", "False"),
    "Succeeded": ("True", "False", "False"),
    "ValidationFailed": ("False", "False", "True"),
    "Blocked": ("False", "False", "True"),
    "FetchFailed": ("False", "True", "False"),
    "ApplyFailed": ("False", "True", "False"),
}
#: Field manager of everything the controller writes of its own.
MANAGER = "forge-controller"
#: The annotation asking the leader for a sync now, as Flux's `reconcile.fluxcd.io/requestedAt`:
#: whichever replica a push webhook reaches writes it (the Service picks a replica, not the leader),
#: and so can a person (`kubectl annotate sync/NAME forge.dev/requested-at="$(date +%s)" --overwrite`).
#: A new value is one sync at once; the value itself is not read.
REQUESTED_AT = "forge.dev/requested-at"
#: The field manager of that annotation when a webhook writes it.
WEBHOOK_MANAGER = "forge-controller-webhook"
#: Longest condition message kept (the CRD allows 32 KiB; a status is read by people).
MAX_MESSAGE = 4000
#: Most rollout lines a status lists: every endpoint's up to this many; beyond it (an environment of
#: thousands of endpoints would make a status of megabytes, past etcd's 1.5 MiB per object and
#: rewritten at every change) those in progress first, then those that failed, then the rest, and
#: ``rolloutPhases`` counts every endpoint by phase.
MAX_ROLLOUTS = 100


@dataclass(frozen=True)
class RolloutLine:
    """One endpoint's rollout as the last pass left it."""

    endpoint: str
    phase: str
    step: int
    weight: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "phase": self.phase, "step": self.step, "weight": self.weight,
                "reason": self.reason[:1000]}


@dataclass(frozen=True)
class SyncReport:
    """What the controller knows of one source after a sync or a rollout pass."""

    reason: str
    message: str
    attempted: str | None = None
    applied: str | None = None
    leader: str | None = None
    summary: Mapping[str, int] | None = None
    rollouts: Sequence[RolloutLine] = field(default_factory=tuple)
    time: str = ""


#: Rank of a phase in a status's list of many (lower first): in progress, failed, promoted, the rest.
_RANK = {**{phase.value: 0 for phase in ACTIVE}, **{phase.value: 1 for phase in FAILED}, Phase.PROMOTED.value: 2}


def listed_rollouts(lines: Sequence[RolloutLine], limit: int = MAX_ROLLOUTS) -> list[RolloutLine]:
    """The lines a status lists: all of them, by endpoint, when there are at most ``limit``; else the
    ``limit`` most worth a look (:data:`_RANK`), by endpoint."""
    chosen = sorted(lines, key=lambda line: (_RANK.get(line.phase, 3), line.endpoint))[:limit]
    return sorted(chosen, key=lambda line: line.endpoint)


def rollout_phases(lines: Sequence[RolloutLine]) -> dict[str, int]:
    """How many endpoints' rollouts are in each phase."""
    return dict(sorted(Counter(line.phase for line in lines).items()))


def conditions(previous: Sequence[Mapping[str, Any]], reason: str, message: str, generation: int,
               now: str) -> list[dict[str, Any]]:
    """The three conditions for ``reason`` (see :data:`CONDITIONS`); each keeps its
    `lastTransitionTime` from ``previous`` while its status does not change."""
    ready, reconciling, stalled = CONDITIONS[reason]
    before = {c.get("type"): c for c in previous}
    text = message[:MAX_MESSAGE]
    out = []
    for kind, status in (("Ready", ready), ("Reconciling", reconciling), ("Stalled", stalled)):
        old = before.get(kind) or {}
        since = old.get("lastTransitionTime") if old.get("status") == status and old.get("lastTransitionTime") else now
        # A condition that is False says why in Ready's terms: its reason is the outcome's.
        out.append({"type": kind, "status": status, "reason": reason, "message": text if status != "False" or kind == "Ready" else "",
                    "observedGeneration": generation, "lastTransitionTime": since})
    return out


def sync_object(name: str, namespace: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The Sync object as the controller applies it (its spec: the configured source)."""
    return {"apiVersion": SYNC.api_version, "kind": SYNC.kind, "metadata": {"name": name, "namespace": namespace},
            "spec": dict(spec)}


def request_object(name: str, namespace: str, stamp: str) -> dict[str, Any]:
    """The patch that asks for a sync now (:data:`REQUESTED_AT` set to ``stamp``)."""
    return {"apiVersion": SYNC.api_version, "kind": SYNC.kind,
            "metadata": {"name": name, "namespace": namespace, "annotations": {REQUESTED_AT: stamp}}}


def requested_at(stored: Mapping[str, Any] | None) -> str | None:
    """The Sync's :data:`REQUESTED_AT`, or None."""
    value = ((stored or {}).get("metadata") or {}).get("annotations", {}).get(REQUESTED_AT)
    return str(value) if value else None


def status_object(stored: Mapping[str, Any], report: SyncReport) -> dict[str, Any]:
    """The status patch for ``stored`` (the Sync as read back) after ``report``: conditions, the
    revisions (an unset one keeps what was there), the plan's summary and the rollouts (at most
    :data:`MAX_ROLLOUTS` lines, and the count of every phase)."""
    meta = stored.get("metadata") or {}
    old = stored.get("status") or {}
    generation = int(meta.get("generation") or 0)
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": conditions(old.get("conditions") or [], report.reason, report.message, generation, report.time),
        "lastSyncTime": report.time,
    }
    for key, value in (("lastAttemptedRevision", report.attempted or old.get("lastAttemptedRevision")),
                       ("lastAppliedRevision", report.applied or old.get("lastAppliedRevision")),
                       ("leader", report.leader or old.get("leader"))):
        if value:
            status[key] = value
    summary = report.summary if report.summary is not None else old.get("plan")
    if summary:
        status["plan"] = {k: int(summary.get(k, 0)) for k in ("created", "configured", "deleted", "unchanged")}
    if report.rollouts:
        status["rollouts"] = [r.to_json() for r in listed_rollouts(report.rollouts)]
        status["rolloutPhases"] = rollout_phases(report.rollouts)
    else:
        for key in ("rollouts", "rolloutPhases"):
            if old.get(key):
                status[key] = old[key]
    return {"apiVersion": SYNC.api_version, "kind": SYNC.kind,
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")}, "status": status}
