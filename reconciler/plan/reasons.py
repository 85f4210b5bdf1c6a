"""Human reasons for a change, traced back to the specs (pure).

A Workflow's steps carry their rendered configs, so comparing a model's new Workflow with the one
it supersedes tells *why* it re-runs: a dataset digest moved, a hyperparameter changed — and which
steps will be cache hits. Reasons explain; nothing at apply time branches on them.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.plan.change import Action, Change
from renderers.hardware import export_reasons
from renderers.labels import KIND, MODEL_VERSION, NAME, ROLE
from renderers.stepargs import decode_step_config
from renderers.workflow import task_templates


def workflow_steps(workflow: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Step name → {"key": memoize key, "config": step config} of a rendered Workflow."""
    return {name: {"key": memoize.get("key", ""), "config": decode_step_config(run["container"])}
            for name, (memoize, run) in task_templates(workflow).items() if memoize and "container" in run}


#: Keys that name the items of a spec list (metrics and variants by `name`, thresholds by
#: `metric`, cleaning steps by `op`, stages by `type`), tried in this order; the first one every
#: item has, as a string, and no two items share, pairs the two versions of the list.
NAME_KEYS = ("name", "metric", "op", "type")
ABSENT = "∅"


@dataclass(frozen=True)
class SpecChange:
    """One difference between two versions of a spec: the path as a reviewer reads it (list items
    by name: `metrics[success-rate].min`), the same path by index into the newer document (or the
    older one when the item is gone, ``in_old``) to find its line, and the two values."""

    op: str  # add | remove | change
    path: str
    keys: tuple[str | int, ...]
    old: Any
    new: Any
    in_old: bool = False

    def line(self) -> str:
        """"`path` old → new"."""
        return f"`{self.path}` {_fmt(self.old)} → {_fmt(self.new)}"


def _fmt(value: Any) -> str:
    if value is _MISSING:
        return ABSENT
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


class _Missing:
    def __repr__(self) -> str:
        return ABSENT


_MISSING: Any = _Missing()


def _name_key(items: list[Any]) -> str | None:
    if not items or not all(isinstance(i, dict) for i in items):
        return None
    for key in NAME_KEYS:
        names = [i.get(key) for i in items]
        if all(isinstance(n, str) for n in names) and len(set(names)) == len(names):
            return key
    return None


def _label(path: str, key: str | int, named: bool = False) -> str:
    if named or isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _walk(old: Any, new: Any, path: str, keys: tuple[str | int, ...], old_keys: tuple[str | int, ...],
          out: list[SpecChange]) -> None:
    if old is None and isinstance(new, (dict, list)) and new:
        old = type(new)()
    if new is None and isinstance(old, (dict, list)) and old:
        new = type(old)()
    if isinstance(old, dict) and isinstance(new, dict):
        for k in [*new, *(k for k in old if k not in new)]:
            a, b = old.get(k, _MISSING), new.get(k, _MISSING)
            if a is _MISSING and b is None or b is _MISSING and a is None:
                continue  # an unset optional field is not a change
            if a != b:
                _walk(a, b, _label(path, k), keys + (k,), old_keys + (k,), out)
        return
    if isinstance(old, list) and isinstance(new, list):
        named_old, named_new = _name_key(old), _name_key(new)
        key = named_new if not old else named_old if not new else named_old if named_old == named_new else None
        if key is not None:
            before = {item[key]: (i, item) for i, item in enumerate(old)}
            after = {item[key]: (i, item) for i, item in enumerate(new)}
            for name, (i, item) in after.items():
                if name not in before:
                    out.append(SpecChange("add", _label(path, name, True), keys + (i,), _MISSING, item))
                elif before[name][1] != item:
                    _walk(before[name][1], item, _label(path, name, True), keys + (i,), old_keys + (before[name][0],), out)
            for name, (i, item) in before.items():
                if name not in after:
                    out.append(SpecChange("remove", _label(path, name, True), old_keys + (i,), item, _MISSING, in_old=True))
            return
        if all(isinstance(i, dict) for i in old + new) and old and new:
            # Unnamed items (canary steps): aligned as a sequence, so a step taken out reads as
            # that step removed, not as every later step changed.
            seq_a = [json.dumps(i, sort_keys=True) for i in old]
            seq_b = [json.dumps(i, sort_keys=True) for i in new]
            for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, seq_a, seq_b, autojunk=False).get_opcodes():
                if tag == "equal":
                    continue
                pairs = min(i2 - i1, j2 - j1)
                for k in range(pairs):
                    _walk(old[i1 + k], new[j1 + k], _label(path, j1 + k), keys + (j1 + k,), old_keys + (i1 + k,), out)
                for i in range(i1 + pairs, i2):
                    out.append(SpecChange("remove", _label(path, i), old_keys + (i,), old[i], _MISSING, in_old=True))
                for j in range(j1 + pairs, j2):
                    out.append(SpecChange("add", _label(path, j), keys + (j,), _MISSING, new[j]))
            return
    if old is _MISSING:
        out.append(SpecChange("add", path, keys, old, new))
    elif new is _MISSING:
        out.append(SpecChange("remove", path, old_keys, old, new, in_old=True))
    else:
        out.append(SpecChange("change", path, keys, old, new))


def spec_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[SpecChange]:
    """Every difference between two versions of a spec (plain dicts, as dumped by alias), lists
    of named items paired by name (see :data:`NAME_KEYS`), other lists of mappings by position,
    lists of scalars compared whole. Values absent on one side are :data:`ABSENT` when shown."""
    out: list[SpecChange] = []
    _walk(dict(old), dict(new), "", (), (), out)
    return out


def spec_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """"`path` old → new" for every difference between two spec dicts (see :func:`spec_diff`)."""
    return [c.line() for c in spec_diff(old, new)]


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((obj or {}).get("metadata", {}).get("labels")) or {}


def workflows_by_model(changes: Iterable[Change]) -> dict[str | None, list[Change]]:
    """The plan's Workflow changes by the model they belong to (its `forge.dev/name` label), in
    plan order: what :func:`reasons_for` compares a Workflow with, found without scanning every
    change of the plan for each Workflow (quadratic with thousands of models)."""
    index: dict[str | None, list[Change]] = {}
    for c in changes:
        if c.ref.kind == "Workflow":
            index.setdefault(_labels(c.after or c.before).get(NAME), []).append(c)
    return index


def _workflow_reasons(change: Change, changes: Iterable[Change],
                      by_model: Mapping[str | None, list[Change]] | None = None) -> list[str]:
    model = _labels(change.after or change.before).get(NAME, "?")
    if by_model is None:
        by_model = workflows_by_model(changes)
    siblings = [c for c in by_model.get(model, ()) if c is not change]
    if change.action is Action.DELETE:
        newer = [c for c in siblings if c.action is Action.CREATE]
        if newer:
            return [f"superseded by version {_labels(newer[0].after).get(MODEL_VERSION)} of model `{model}`"]
        return [f"model `{model}` is no longer in the specs"]
    if change.action is not Action.CREATE or change.after is None:
        return []
    version = _labels(change.after).get(MODEL_VERSION, "?")
    previous = next((c.before for c in siblings if c.before is not None), None)
    new_steps = workflow_steps(change.after)
    exports = export_reasons(new_steps)  # which export each hardware target gets
    if previous is None:
        return [f"new model `{model}` version {version}: " + " → ".join(new_steps) + " will run", *exports]
    old_steps = workflow_steps(previous)
    reasons: list[str] = []
    old_prep = old_steps.get("prepare-data", {}).get("config", {})
    new_prep = new_steps.get("prepare-data", {}).get("config", {})
    old_digest = old_prep.get("spec", {}).get("digest")
    new_digest = new_prep.get("spec", {}).get("digest")
    if old_digest and new_digest and old_digest != new_digest:
        reasons.append(f"dataset `{new_prep.get('dataset')}` digest changed {old_digest[:19]}… → {new_digest[:19]}… → retrain model `{model}`")
    old_train: dict[str, Any] = next((s["config"] for n, s in old_steps.items() if n in ("train", "train-trial-0")), {})
    new_train: dict[str, Any] = next((s["config"] for n, s in new_steps.items() if n in ("train", "train-trial-0")), {})
    reasons += spec_changes(old_train.get("spec", {}), new_train.get("spec", {}))
    for name, kind in (("compress", "variant"),):
        old_v = {n: s["config"].get(kind) for n, s in old_steps.items() if n.startswith(name)}
        new_v = {n: s["config"].get(kind) for n, s in new_steps.items() if n.startswith(name)}
        for step in sorted(set(old_v) | set(new_v)):
            if old_v.get(step) != new_v.get(step):
                reasons.append(f"compression `{step.removeprefix('compress-')}` changed")
    reasons += exports
    old_keys = {s["key"] for s in old_steps.values()}
    hits = [n for n, s in new_steps.items() if s["key"] in old_keys]
    runs = [n for n in new_steps if n not in hits]
    if hits:
        reasons.append("cache hit (unchanged since the last run): " + ", ".join(hits))
    if runs:
        reasons.append("will run: " + ", ".join(runs))
    if not reasons:
        reasons.append(f"model `{model}` version {version} (runtime or rendering changed)")
    return reasons


def _seldon_reasons(change: Change) -> list[str]:
    if change.action is Action.CREATE and change.after is not None:
        versions = {p["name"]: p["labels"].get(MODEL_VERSION) for p in change.after.get("spec", {}).get("predictors", [])}
        return [f"serve version {versions.get('stable')} as stable"]
    if change.action is not Action.UPDATE or change.before is None or change.after is None:
        return []

    def by_role(obj: Mapping[str, Any]) -> dict[str, tuple[str | None, int]]:
        return {p.get("labels", {}).get(ROLE, p["name"]): (p.get("labels", {}).get(MODEL_VERSION), p.get("traffic", 0))
                for p in obj.get("spec", {}).get("predictors", [])}

    old, new = by_role(change.before), by_role(change.after)
    reasons = []
    for role in ("stable", "canary"):
        if old.get(role) != new.get(role):
            o, n = old.get(role), new.get(role)
            if n is None:
                reasons.append(f"{role} removed (was version {o[0]})" if o else f"{role} removed")
            elif o is None:
                reasons.append(f"{role}: version {n[0]} at {n[1]} % of traffic")
            else:
                reasons.append(f"{role}: version {o[0]} → {n[0]}, traffic {o[1]} % → {n[1]} %")
    return reasons


def reasons_for(change: Change, changes: list[Change],
                by_model: Mapping[str | None, list[Change]] | None = None) -> list[str]:
    """The reasons for ``change`` given every change of the plan (``by_model``: the plan's
    :func:`workflows_by_model`, when the caller asks for the reasons of many changes)."""
    if change.action is Action.NOOP:
        return []  # nothing happens, nothing to explain (and large plans are mostly no-ops)
    if change.ref.kind == "Workflow":
        return _workflow_reasons(change, changes, by_model)
    if change.ref.kind == "SeldonDeployment":
        reasons = _seldon_reasons(change)
        if reasons:
            return reasons
    if change.action is Action.UPDATE:
        kind, name = _labels(change.after).get(KIND), _labels(change.after).get(NAME)
        owner = f" ({kind} `{name}` changed)" if kind else ""
        return [f"{len(change.diff)} field{'s differ' if len(change.diff) != 1 else ' differs'} from the live object{owner}"]
    if change.action is Action.DELETE:
        return ["owned by Forge and no longer rendered from the specs"]
    return []
