"""What the in-cluster controller says of an environment, read back from its `Sync` objects
(`forge.dev/v1alpha1`, written by :mod:`reconciler.controller.manager`): the kstatus conditions,
the revisions last applied and attempted, the last plan's summary, the leader and every endpoint's
rollout line. `forgectl status --env …` and `forgectl rollout status` show it beside what they read
of the environment itself.

The Syncs live in the controller's namespace (`forge-system` by default), not the environment's:
they are listed cluster-wide and kept when their spec names this environment and namespace. A
credential that may not list them cluster-wide (docs/rbac/forgectl-role.yaml grants no such
right) is asked in the environment's namespace and in `forge-system`; what it may read nowhere is
a note, never an error — `status` must show the environment whether or not a controller runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.controller.syncstatus import RolloutLine
from reconciler.errors import ForbiddenError, TargetError
from reconciler.resources import SYNC
from reconciler.targets.base import ClusterAPI

#: The namespace `forgectl install` puts the controller (and its Syncs) in by default.
CONTROLLER_NAMESPACE = "forge-system"


@dataclass(frozen=True)
class Condition:
    """One kstatus condition of a Sync."""

    type: str
    status: str
    reason: str
    message: str
    since: str


@dataclass(frozen=True)
class SyncView:
    """One Sync as the controller last wrote it."""

    name: str
    namespace: str
    url: str
    branch: str
    environment: str
    conditions: tuple[Condition, ...]
    applied: str | None
    attempted: str | None
    leader: str | None
    last_sync: str | None
    #: The last applied plan's change counts (created, configured, deleted, unchanged).
    plan: Mapping[str, int] | None
    #: The endpoints' rollout lines the status lists (all, or the most worth a look of many:
    #: :func:`reconciler.controller.syncstatus.listed_rollouts`) and how many are in each phase.
    rollouts: tuple[RolloutLine, ...]
    phases: Mapping[str, int] = field(default_factory=dict)

    def condition(self, kind: str) -> Condition | None:
        """The condition of type ``kind`` (`Ready`, `Reconciling`, `Stalled`), if written."""
        return next((c for c in self.conditions if c.type == kind), None)

    def rollout(self, endpoint: str) -> RolloutLine | None:
        """The rollout line of ``endpoint``, if the controller walked it."""
        return next((r for r in self.rollouts if r.endpoint == endpoint), None)

    def to_json(self) -> dict[str, Any]:
        """Plain data, for `-o json`."""
        return {"name": self.name, "namespace": self.namespace, "url": self.url, "branch": self.branch,
                "environment": self.environment,
                "conditions": [{"type": c.type, "status": c.status, "reason": c.reason, "message": c.message,
                                "lastTransitionTime": c.since} for c in self.conditions],
                "lastAppliedRevision": self.applied, "lastAttemptedRevision": self.attempted, "leader": self.leader,
                "lastSyncTime": self.last_sync, "plan": dict(self.plan) if self.plan is not None else None,
                "rollouts": [r.to_json() for r in self.rollouts], "rolloutPhases": dict(self.phases)}


def sync_view(obj: Mapping[str, Any]) -> SyncView:
    """A Sync object (as the API server returns it) as a :class:`SyncView`."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    conditions = tuple(Condition(str(c.get("type", "")), str(c.get("status", "Unknown")), str(c.get("reason", "")),
                                 str(c.get("message", "")), str(c.get("lastTransitionTime", "")))
                       for c in status.get("conditions") or [])
    rollouts = tuple(RolloutLine(str(r.get("endpoint", "")), str(r.get("phase", "")), int(r.get("step", -1)),
                                 int(r.get("weight", 0)), str(r.get("reason", "")))
                     for r in status.get("rollouts") or [])
    plan = status.get("plan")
    phases = status.get("rolloutPhases")
    return SyncView(str(meta.get("name", "")), str(meta.get("namespace", "")), str(spec.get("url", "")),
                    str(spec.get("branch", "")), str(spec.get("environment", "")), conditions,
                    status.get("lastAppliedRevision"), status.get("lastAttemptedRevision"), status.get("leader"),
                    status.get("lastSyncTime"), {k: int(v) for k, v in plan.items()} if isinstance(plan, Mapping) else None,
                    rollouts, {str(k): int(v) for k, v in phases.items()} if isinstance(phases, Mapping) else {})


def syncs_of(items: Iterable[Mapping[str, Any]], environment: str, namespace: str) -> list[SyncView]:
    """The Syncs among ``items`` that apply ``environment`` into ``namespace``, by name."""
    found = {}
    for obj in items:
        spec = obj.get("spec") or {}
        if spec.get("environment") == environment and spec.get("namespace") == namespace:
            view = sync_view(obj)
            found[(view.namespace, view.name)] = view
    return [found[k] for k in sorted(found)]


@dataclass(frozen=True)
class SyncsRead:
    """The Syncs of an environment, and why none could be read when that is so."""

    syncs: tuple[SyncView, ...]
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain data, for `-o json`."""
        return {"syncs": [s.to_json() for s in self.syncs], "note": self.note}


def read_syncs(api: ClusterAPI | None, environment: str, namespace: str) -> SyncsRead:
    """The Syncs of ``environment`` in ``namespace`` through ``api`` (None: no cluster, no
    controller). Listed cluster-wide; on a 403 in the environment's namespace and in
    :data:`CONTROLLER_NAMESPACE`. No Sync CRD: no controller installed."""
    if api is None:
        return SyncsRead((), None)
    places = [None, namespace, CONTROLLER_NAMESPACE]
    items: list[Mapping[str, Any]] = []
    forbidden: list[str] = []
    for place in dict.fromkeys(places):
        try:
            data = api.read_path(SYNC.path(place), what=f"syncs.forge.dev{f' in {place}' if place else ''}")
        except ForbiddenError:
            forbidden.append(place or "cluster-wide")
            continue
        except TargetError as exc:
            return SyncsRead((), f"the controller's Syncs could not be read: {str(exc).splitlines()[0]}")
        if data is None:  # the CRD is not there: no controller was ever installed
            return SyncsRead((), None)
        items.extend(data.get("items") or [])
        if place is None:
            break  # cluster-wide: every namespace read
    syncs = syncs_of(items, environment, namespace)
    if not syncs and len(forbidden) == len(dict.fromkeys(places)):
        return SyncsRead((), "the controller's Syncs could not be read: the credential may not list syncs.forge.dev")
    return SyncsRead(tuple(syncs), None)


def sync_lines(read: Mapping[str, Any], endpoint: str | None = None) -> list[str]:
    """Rich markup of :meth:`SyncsRead.to_json` for a terminal: each Sync's Ready condition with
    its reason and message, the revisions, the leader and the last plan's summary; then every
    endpoint's rollout as the controller last walked it (only ``endpoint``'s when given; of an
    environment with more than the status lists, the count in each phase first)."""
    from rich.markup import escape

    if read.get("note"):
        return [f"  [yellow]{escape(str(read['note']))}[/yellow]"]
    if not read.get("syncs"):
        return ["  no controller applies this environment (no Sync names it)"]
    colour = {"True": "green", "False": "red"}
    lines = []
    for sync in read["syncs"]:
        ready = next((c for c in sync["conditions"] if c["type"] == "Ready"), None)
        state = f"[{colour.get(ready['status'], 'yellow')}]Ready={ready['status']}[/] {escape(ready['reason'])}" if ready \
            else "[yellow]not reported yet[/yellow]"
        lines.append(f"  sync/{escape(sync['name'])} ({escape(sync['namespace'])})  {state}  "
                     f"{escape(sync['url'])} {escape(sync['branch'])}")
        others = [f"{c['type']}={c['status']}" for c in sync["conditions"] if c["type"] != "Ready"]
        if others:
            lines.append(f"    {', '.join(others)}" + (f"  since {escape(ready['lastTransitionTime'])}" if ready else ""))
        if ready and ready["message"]:
            lines.extend(f"    {escape(line)}" for line in ready["message"].splitlines()[:8])
        applied, attempted = sync.get("lastAppliedRevision"), sync.get("lastAttemptedRevision")
        lines.append(f"    applied {escape(str(applied or '—'))}" + (
            f"  attempted {escape(str(attempted))}" if attempted and attempted != applied else ""))
        if sync.get("leader"):
            lines.append(f"    leader {escape(sync['leader'])}, last sync {escape(str(sync.get('lastSyncTime') or '—'))}")
        plan = sync.get("plan")
        if plan:
            lines.append(f"    last plan: {plan.get('created', 0)} created, {plan.get('configured', 0)} configured, "
                         f"{plan.get('deleted', 0)} deleted, {plan.get('unchanged', 0)} unchanged")
        phases, listed = sync.get("rolloutPhases") or {}, sync.get("rollouts") or []
        if sum(phases.values()) > len(listed) and endpoint is None:
            counts = ", ".join(f"{count:,} {escape(phase)}" for phase, count in phases.items())
            lines.append(f"    rollouts: {counts} — {len(listed)} of {sum(phases.values()):,} listed (in progress first)")
        for rollout in listed:
            if endpoint is not None and rollout["endpoint"] != endpoint:
                continue
            step = f"step {rollout['step'] + 1}" if rollout["step"] >= 0 else "no step yet"
            why = f": {escape(rollout['reason'])}" if rollout.get("reason") else ""
            lines.append(f"    rollout {escape(rollout['endpoint'])}: {escape(rollout['phase'])}, {step}, "
                         f"canary {rollout['weight']} %{why}")
    return lines
