"""The Plan: a plain value listing typed changes — create, update, delete, no-op — each with the
object's identity, before, after, a field-level diff and the human reasons for it.

`build_plan` pairs desired with live objects, normalizes and compares (pure). Reasons explain;
nothing at apply time branches on them. A Plan round-trips through JSON so it can be saved,
reviewed, and applied later exactly as reviewed (refused when the live state moved since).

What a reviewer decides on travels with it (`reconciler/plan/review.py` fills it in): the spec-level
changes with their file:line, the GPU arithmetic and cost, the risk flags, and the blockers — what
the target cannot run, which `apply` refuses. docs/plan-json.md is the JSON's schema.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from reconciler.plan.change import Action, Change
from reconciler.plan.diff import field_diff, same_after_apply
from reconciler.plan.reasons import reasons_for, workflows_by_model
from reconciler.plan.risks import Finding
from reconciler.resources import ObjectRef
from renderers.bundle import sort_key
from renderers.labels import PRUNE

# Action and Change live in reconciler.plan.change (reasons.py and risks.py read them without importing
# the planner); they stay importable from here, where callers have always found them.
__all__ = ["PLAN_FORMAT", "Action", "Change", "Plan", "build_plan", "fingerprint", "settle"]

PLAN_FORMAT = 1


@dataclass(frozen=True)
class Plan:
    """Every change for one environment, and the live state it was computed against."""

    environment: str
    target: str
    changes: tuple[Change, ...]
    live_fingerprint: str = ""
    revision: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Risk flags (reconciler/plan/risks.py), most important first.
    risks: tuple[Finding, ...] = ()
    #: What the target cannot run; `apply` refuses a plan with any.
    blockers: tuple[Finding, ...] = ()
    #: The spec-level changes (pull-request mode): `{kind, name, op, path, old, new, file, line}`.
    spec_changes: tuple[Mapping[str, Any], ...] = ()
    #: The GPU arithmetic and cost (renderers/cost.py's `Estimate.to_json()`), when computed.
    cost: Mapping[str, Any] | None = None

    @property
    def has_changes(self) -> bool:
        """True when applying would write anything."""
        return any(c.action is not Action.NOOP for c in self.changes)

    def counts(self) -> dict[str, int]:
        """How many changes of each action."""
        out = {a.value: 0 for a in Action}
        for change in self.changes:
            out[change.action.value] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        """The plan as plain data; the human views render from this."""
        return {
            "format": PLAN_FORMAT,
            "environment": self.environment,
            "target": self.target,
            "revision": self.revision,
            "liveFingerprint": self.live_fingerprint,
            "summary": self.counts(),
            "blockers": [b.to_json() for b in self.blockers],
            "risks": [r.to_json() for r in self.risks],
            "specChanges": [dict(c) for c in self.spec_changes],
            "cost": self.cost,
            "notes": list(self.notes),
            "changes": [c.to_json() for c in self.changes],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        """Inverse of :meth:`to_json`; rejects other formats."""
        if data.get("format") != PLAN_FORMAT:
            raise ValueError(f"not a Forge plan of format {PLAN_FORMAT}")
        return cls(
            data["environment"],
            data["target"],
            tuple(Change.from_json(c) for c in data["changes"]),
            data.get("liveFingerprint", ""),
            data.get("revision"),
            tuple(data.get("notes", [])),
            tuple(Finding.from_json(r) for r in data.get("risks", [])),
            tuple(Finding.from_json(b) for b in data.get("blockers", [])),
            tuple(data.get("specChanges", [])),
            data.get("cost"),
        )


def fingerprint(live: Iterable[Mapping[str, Any]]) -> str:
    """A digest of the identities and resourceVersions of the live objects: it moves when
    anything Forge owns is created, changed or deleted."""
    items = sorted(
        (str(ObjectRef.of(o)), str(o.get("metadata", {}).get("resourceVersion", ""))) for o in live
    )
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


def _prunable(obj: Mapping[str, Any]) -> bool:
    return (obj.get("metadata", {}).get("annotations") or {}).get(PRUNE) != "disabled"


def build_plan(
    desired: Iterable[Mapping[str, Any]],
    live: Iterable[Mapping[str, Any]],
    *,
    environment: str,
    target: str,
    revision: str | None = None,
    exact: bool = False,
    keep: Mapping[ObjectRef, str] | None = None,
) -> Plan:
    """Pair desired with live by identity and compare: missing live → create; different → update;
    equal → no-op; live and owned but no longer desired → delete, unless it opts out of pruning or
    ``keep`` names it (with the reason)."""
    live_list = list(live)
    live_by_ref = {ObjectRef.of(o): o for o in live_list}
    desired_by_ref = {ObjectRef.of(o): dict(o) for o in desired}
    changes: list[Change] = []
    for ref, want in desired_by_ref.items():
        have = live_by_ref.get(ref)
        if have is None:
            changes.append(Change(ref, Action.CREATE, None, want))
            continue
        diff = tuple(field_diff(want, have, exact=exact))
        version = have.get("metadata", {}).get("resourceVersion")
        action = Action.UPDATE if diff else Action.NOOP
        changes.append(Change(ref, action, dict(have), want, diff, live_version=version))
    for ref, have in live_by_ref.items():
        if ref in desired_by_ref:
            continue
        version = have.get("metadata", {}).get("resourceVersion")
        if keep and ref in keep:
            changes.append(Change(ref, Action.NOOP, dict(have), None, (), (keep[ref],), version))
        elif _prunable(have):
            changes.append(Change(ref, Action.DELETE, dict(have), None, live_version=version))
        else:
            changes.append(Change(ref, Action.NOOP, dict(have), None, (), (f"kept: annotated {PRUNE}: disabled",), version))
    changes = _keep_namespaces_of_kept(changes)
    changes.sort(key=lambda c: _order(c))
    by_model = workflows_by_model(changes)
    with_reasons = tuple(replace(c, reasons=c.reasons + tuple(reasons_for(c, changes, by_model))) for c in changes)
    return Plan(environment, target, with_reasons, fingerprint(live_list), revision)


def _keep_namespaces_of_kept(changes: list[Change]) -> list[Change]:
    """A namespace is not deleted while it holds an object that stays: deleting it would delete
    that object too (the workspace claim, kept by `forge.dev/prune: disabled`, holds the models)."""
    staying: dict[str, ObjectRef] = {}
    for c in changes:
        if c.action is not Action.DELETE and c.ref.kind != "Namespace" and c.ref.namespace:
            staying.setdefault(c.ref.namespace, c.ref)
    out = []
    for c in changes:
        if c.action is Action.DELETE and c.ref.kind == "Namespace" and c.ref.name in staying:
            held = staying[c.ref.name]
            c = replace(c, action=Action.NOOP, after=None,
                        reasons=c.reasons + (f"kept: holds {held.kind} {held.name}, which stays",))
        out.append(c)
    return out


def _order(change: Change) -> tuple[int, Any]:
    obj = change.after or change.before or {}
    # Deletions go last, in reverse dependency order.
    if change.action is Action.DELETE:
        key = sort_key(obj)
        return (1, (-key[0], -key[1], *key[2:]))
    return (0, sort_key(obj))


def settle(plan: Plan, dry_runs: Mapping[ObjectRef, Mapping[str, Any]]) -> Plan:
    """Turn updates into no-ops where a server-side dry-run apply showed that applying would leave
    the live object unchanged (the server's own defaults and formats, not drift)."""
    settled = []
    for change in plan.changes:
        result = dry_runs.get(change.ref)
        if change.action is Action.UPDATE and result is not None and change.before is not None and same_after_apply(result, change.before):
            change = replace(change, action=Action.NOOP, diff=(), reasons=())
        settled.append(change)
    return replace(plan, changes=tuple(settled))
