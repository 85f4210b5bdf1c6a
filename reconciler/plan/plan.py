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
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from reconciler.budgets import Spent
from reconciler.plan.change import Action, Change
from reconciler.plan.diff import field_diff, same_after_apply
from reconciler.plan.reasons import reasons_for, workflows_by_model
from reconciler.plan.risks import Finding
from reconciler.resources import ObjectRef
from reconciler.rollout.preview import PlannedRollout
from renderers.bundle import sort_key
from renderers.labels import PRUNE

# Action and Change live in reconciler.plan.change (reasons.py and risks.py read them without importing
# the planner); they stay importable from here, where callers have always found them.
__all__ = ["PLAN_FORMAT", "Action", "Change", "Cost", "DocumentChange", "Plan", "ServingBase", "ServingCost", "TrainingBase",
           "TrainingCost", "build_plan", "fingerprint", "settle"]

PLAN_FORMAT = 1


@dataclass(frozen=True)
class DocumentChange:
    """A spec-level change of a pull request (the plan's `specChanges`): one field of one spec
    document, or the whole document added or removed (``path`` empty), with the file:line it is at
    (the head's, or the base's for what is gone). Named apart from
    :class:`reconciler.specdiff.SpecChange`, the field difference it is made from."""

    kind: str
    name: str
    op: str  # add | remove | change
    path: str
    #: The values before and after, as JSON (a spec field holds any JSON value); None for `add` / `remove`.
    old: Any
    new: Any
    file: str | None
    line: int | None
    #: How to show a long or multi-line string change (:func:`reconciler.plan.diff.value_diff`).
    value_diff: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"kind": self.kind, "name": self.name, "op": self.op, "path": self.path, "old": self.old, "new": self.new,
               "file": self.file, "line": self.line}
        if self.value_diff is not None:
            out["valueDiff"] = self.value_diff
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DocumentChange:
        return cls(data["kind"], data["name"], data["op"], data.get("path", ""), data.get("old"), data.get("new"),
                   data.get("file"), data.get("line"), data.get("valueDiff"))


@dataclass(frozen=True)
class TrainingBase:
    """What the base revision had for a Model's training, where the pull request changes it."""

    gpus: int
    nodes: int | None
    accelerator: str | None
    gpu_hours: float | None
    #: The `before this change: …` line the views show under the estimate.
    line: str

    def to_json(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "nodes": self.nodes, "accelerator": self.accelerator, "gpuHours": self.gpu_hours}


@dataclass(frozen=True)
class ServingBase:
    """What the base revision had for an Endpoint's accelerators, where the pull request changes them."""

    gpus: int
    accelerator: str | None

    @property
    def note(self) -> str:
        """What the estimate's line gets appended."""
        return f" (before this change: {self.gpus} × {self.accelerator})"

    def to_json(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "accelerator": self.accelerator}


@dataclass(frozen=True)
class TrainingCost:
    """One Model's training in the plan's cost: its estimate and, in pull-request mode, the base's."""

    #: renderers/cost.py's `TrainingEstimate.to_json()` (docs/plan-json.md): the memory arithmetic,
    #: FLOPs and GPU-hours. Kept as that JSON: a saved plan reads it back, and only the views read
    #: its figures, from the JSON.
    estimate: Mapping[str, Any]
    base: TrainingBase | None = None

    def to_json(self) -> dict[str, Any]:
        out = dict(self.estimate)
        if self.base is not None:
            out["lines"] = [*out["lines"], self.base.line]
            out["base"] = self.base.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainingCost:
        if "base" not in data:
            return cls(dict(data))
        b = data["base"]
        estimate = {k: v for k, v in data.items() if k != "base"} | {"lines": list(data["lines"][:-1])}
        return cls(estimate, TrainingBase(b["gpus"], b.get("nodes"), b.get("accelerator"), b.get("gpuHours"), data["lines"][-1]))


@dataclass(frozen=True)
class ServingCost:
    """One Endpoint's accelerators in the plan's cost: its estimate and, in pull-request mode, the base's."""

    #: renderers/cost.py's `ServingEstimate.to_json()` (docs/plan-json.md).
    estimate: Mapping[str, Any]
    base: ServingBase | None = None

    def to_json(self) -> dict[str, Any]:
        out = dict(self.estimate)
        if self.base is not None:
            out["line"] = out["line"] + self.base.note
            out["base"] = self.base.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServingCost:
        if "base" not in data:
            return cls(dict(data))
        base = ServingBase(data["base"]["gpus"], data["base"].get("accelerator"))
        return cls({k: v for k, v in data.items() if k != "base"} | {"line": data["line"].removesuffix(base.note)}, base)


@dataclass(frozen=True)
class Cost:
    """The GPU arithmetic and cost of the training steps a plan runs and the endpoints it changes
    (renderers/cost.py's estimate, compared with the base revision's in pull-request mode)."""

    utilisation: float
    usable_fraction: float
    training_gpus: int
    training_gpu_hours: float | None
    serving_gpus: int
    training: tuple[TrainingCost, ...] = ()
    serving: tuple[ServingCost, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"utilisation": self.utilisation, "usableFraction": self.usable_fraction, "trainingGpus": self.training_gpus,
                "trainingGpuHours": self.training_gpu_hours, "servingGpus": self.serving_gpus,
                "training": [t.to_json() for t in self.training], "serving": [s.to_json() for s in self.serving]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Cost:
        return cls(data["utilisation"], data["usableFraction"], data["trainingGpus"], data.get("trainingGpuHours"),
                   data["servingGpus"], tuple(TrainingCost.from_json(t) for t in data.get("training", [])),
                   tuple(ServingCost.from_json(s) for s in data.get("serving", [])))


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
    #: The spec-level changes (pull-request mode), each with its file:line.
    spec_changes: tuple[DocumentChange, ...] = ()
    #: The GPU arithmetic and cost, when computed.
    cost: Cost | None = None
    #: Pull-request mode: the revisions compared (``head`` `working tree` for the working tree).
    base: str | None = None
    head: str | None = None
    #: Pull-request mode against a cluster: the plan of the head's specs against the live state.
    live: Plan | None = None
    #: The rollouts applying it starts, as the rollout controller will walk them.
    rollouts: tuple[PlannedRollout, ...] = ()

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
        """The plan as plain data: the one author of the plan's JSON, the live plan's and the pull
        request's alike (docs/plan-json.md); the human views render from this. Its long values are
        compared within one budget (:data:`reconciler.budgets.MAX_TOKEN_PAIRS_TOTAL`)."""
        spent = Spent()
        out: dict[str, Any] = {
            "format": PLAN_FORMAT,
            "environment": self.environment,
            "target": self.target,
            "revision": self.revision,
            "liveFingerprint": self.live_fingerprint,
            "summary": self.counts(),
            "blockers": [b.to_json() for b in self.blockers],
            "risks": [r.to_json() for r in self.risks],
            "specChanges": [c.to_json() for c in self.spec_changes],
            "cost": self.cost.to_json() if self.cost is not None else None,
            "notes": list(self.notes),
            "rollouts": [r.to_json() for r in self.rollouts],
            "changes": [c.to_json(spent) for c in self.changes],
        }
        if self.base is not None or self.head is not None:
            out["base"], out["head"] = self.base, self.head
        if self.live is not None:
            out["live"] = self.live.to_json()
        return out

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
            tuple(DocumentChange.from_json(c) for c in data.get("specChanges", [])),
            Cost.from_json(data["cost"]) if data.get("cost") is not None else None,
            data.get("base"),
            data.get("head"),
            Plan.from_json(data["live"]) if data.get("live") is not None else None,
            tuple(PlannedRollout.from_json(r) for r in data.get("rollouts", [])),
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
    unchanged: Collection[ObjectRef] = (),
) -> Plan:
    """Pair desired with live by identity and compare: missing live → create; different → update;
    equal → no-op; live and owned but no longer desired → delete, unless it opts out of pruning or
    ``keep`` names it (with the reason). A desired object named in ``unchanged`` is a no-op
    without comparing: its live digest says it is what Forge last sent (the live object there may
    be its metadata only, :func:`reconciler.plan.session.complete_live`)."""
    live_list = list(live)
    live_by_ref = {ObjectRef.of(o): o for o in live_list}
    desired_by_ref = {ObjectRef.of(o): dict(o) for o in desired}
    changes: list[Change] = []
    for ref, want in desired_by_ref.items():
        have = live_by_ref.get(ref)
        if have is None:
            changes.append(Change(ref, Action.CREATE, None, want))
            continue
        diff = () if ref in unchanged else tuple(field_diff(want, have, exact=exact))
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
