"""Human reasons for a change, traced back to the specs (pure).

A Workflow's steps carry their rendered configs, so comparing a model's new Workflow with the one
it supersedes tells *why* it re-runs: a dataset digest moved, a hyperparameter changed — and which
steps will be cache hits. Reasons explain; nothing at apply time branches on them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from reconciler.plan.change import Action, Change
from reconciler.specdiff import spec_changes
from renderers.hardware import export_reasons
from renderers.labels import KIND, MODEL_VERSION, NAME, ROLE, VARIANT
from renderers.workflow import search_reasons, workflow_steps
from specs.shards import changed_groups, group_digests


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
    exports = [*search_reasons(new_steps), *export_reasons(new_steps)]  # the search; which export each target gets
    if previous is None:
        return [f"new model `{model}` version {version}: " + " → ".join(new_steps) + " will run", *exports]
    old_steps = workflow_steps(previous)
    reasons: list[str] = []
    old_prep = old_steps.get("prepare-data", {}).get("config", {})
    new_prep = new_steps.get("prepare-data", {}).get("config", {})
    old_digest = old_prep.get("spec", {}).get("digest")
    new_digest = new_prep.get("spec", {}).get("digest")
    if old_digest and new_digest and old_digest != new_digest:
        shards = _shard_delta(old_prep.get("spec", {}), new_prep.get("spec", {}))
        reasons.append(f"dataset `{new_prep.get('dataset')}` digest changed {old_digest[:19]}… → {new_digest[:19]}…"
                       + (f" ({shards})" if shards else "") + f" → retrain model `{model}`")
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


def _shard_delta(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """How a sharded data set's pinned shards moved between two Dataset specs (as step configs
    hold them): shards changed, added and removed by name, and the groups whose digest changed
    (whether one is prepared again is the step cache's to say: "will run" lists the fan-out items
    that are not hits); None unless both are sharded."""
    old_shards = (old.get("source") or {}).get("shards")
    new_shards = (new.get("source") or {}).get("shards")
    if not old_shards or not new_shards:
        return None
    before = {f["name"]: f["digest"] for f in old_shards.get("files", [])}
    after = [(f["name"], f["digest"]) for f in new_shards.get("files", [])]
    changed = [n for n, d in after if n in before and before[n] != d]
    added = [n for n, _ in after if n not in before]
    removed = [n for n in before if n not in dict(after)]
    size = int(new_shards.get("groupSize") or 1)
    groups = changed_groups(group_digests(list(before.values()), int(old_shards.get("groupSize") or 1)),
                            group_digests([d for _, d in after], size))
    kept = sum(1 for n, _ in after if n in before)  # the shards both pin: what "changed" is counted of
    parts = [f"{len(changed)} of {kept} shards changed" + (f" ({_names(changed)})" if changed else "")]
    if added:
        parts.append(f"{len(added)} added ({_names(added)})")
    if removed:
        parts.append(f"{len(removed)} removed ({_names(removed)})")
    total_groups = -(-len(after) // size)
    parts.append(f"{len(groups)} of {total_groups} group{'s' if total_groups != 1 else ''} changed")
    return ", ".join(parts)


def _names(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f", … {len(names) - most} more" if len(names) > most else "")


def _seldon_reasons(change: Change) -> list[str]:
    if change.action is Action.CREATE and change.after is not None:
        predictors = change.after.get("spec", {}).get("predictors", [])
        versions = {p["name"]: p["labels"].get(MODEL_VERSION) for p in predictors}
        if "stable" in versions:
            return [f"serve version {versions['stable']} as stable"]
        # an experiment's arms (a shadow gets copies, not a share)
        arms = [f"{p['name']} ({p['labels'].get(MODEL_VERSION)}, variant {p['labels'].get(VARIANT)}) {p.get('traffic', 0)} %"
                for p in predictors if not p.get("shadow")]
        return [f"start an experiment: {', '.join(arms)}"]
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
