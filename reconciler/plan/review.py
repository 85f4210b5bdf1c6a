"""What a reviewer decides from, added to a Plan: the spec-level changes with their file:line, the
GPU arithmetic and cost of every training step and endpoint, the risk flags, and the blockers (what
the target cannot run).

`annotate` is pure given its inputs. The two inputs that need I/O are measured at the edges, both
read-only and inert in pull-request mode: :func:`measure_data` reads the *sizes* of the data files
the Datasets name (from git's object database at a revision, or `stat` in the working tree — inside
the Environment's root, regular files only, never opened), and the caller passes the registry's
records where it has a target to read them from (never in pull-request mode without a cluster).
"""

from __future__ import annotations

import os
import stat as stat_module
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from reconciler.budgets import Spent
from reconciler.load.gitrepo import Repository, open_repository
from reconciler.load.loader import LoadResult
from reconciler.plan.diff import value_diff
from reconciler.plan.plan import Cost, DocumentChange, Plan, ServingBase, ServingCost, TrainingBase, TrainingCost
from reconciler.plan.queues import AdmittedWorkload, admission_notes, admitted_workloads, queue_notes, queued_steps
from reconciler.plan.rendercache import RenderCache
from reconciler.plan.risks import (
    FLAGS,
    UNSATISFIABLE,
    Finding,
    fault_injection_risks,
    locate,
    metric_risks,
    prune_risks,
    quota_risks,
    regression_risks,
    spec_risks,
)
from reconciler.plan.rollouts import planned_rollouts
from reconciler.registry.records import Record
from reconciler.specdiff import ABSENT, spec_diff
from reconciler.targets.base import Target
from renderers.bundle import RenderContext
from renderers.cost import DataSize, Estimate, ServingEstimate, TrainingEstimate, capacity_problems, estimate
from renderers.labels import MODEL_VERSION, NAME
from renderers.prerequisites import pod_security_note
from specs import Dataset, Environment, Model, SpecSet
from specs.safety import OutsideRoot, resolve_inside


def _dotted(keys: tuple[str | int, ...]) -> str:
    out = ""
    for k in keys:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def measure_data(specs: SpecSet, env: Environment, rev: str | None) -> dict[str, DataSize]:
    """Sizes of the `text://` and `file://` sources the Models train on: the blob's size at git
    revision ``rev`` of the working directory's repository (read as everything git is,
    :mod:`reconciler.load.gitrepo`), else the file's in the working tree. Paths stay inside the
    Environment's root; symlinks in git, FIFOs and devices are skipped; nothing is read but a size."""
    wanted = {m.spec.dataset_ref for m in specs.of(Model)}
    sizes: dict[str, DataSize] = {}
    cwd = Path.cwd()
    repo: Repository | None = None
    commit = ""
    for dataset in specs.of(Dataset):
        source = dataset.spec.source
        if dataset.name not in wanted or not source.uri.startswith(("text://", "file://")) or source.local_path is None:
            continue
        try:
            if rev is None:
                root = resolve_inside(cwd, env.spec.root, what="root")
                path = resolve_inside(root, source.local_path, what="source")
                info = path.stat()
                if stat_module.S_ISREG(info.st_mode):
                    sizes[dataset.name] = DataSize(bytes=info.st_size, source=f"{source.local_path} in the working tree")
                continue
            if repo is None:
                repo = open_repository(needed_by="--rev")
                commit = repo.commit(rev)
            # Lexically, as the path is in the revision's tree (a work-tree symlink moves nothing).
            relative = os.path.relpath(os.path.normpath(cwd / env.spec.root / source.local_path), repo.top)
            if relative == os.pardir or relative.startswith(os.pardir + os.sep):
                continue
            blob = repo.entry(commit, PurePosixPath(Path(relative)).as_posix(), rev=rev)
            if blob is not None and blob.type == "blob" and not blob.is_symlink and blob.size is not None:
                sizes[dataset.name] = DataSize(bytes=blob.size, source=f"{source.local_path} at {rev}")
        except (OutsideRoot, OSError, RuntimeError, ValueError):  # RuntimeError: a symlink loop (Path.resolve)
            continue  # unknown: the estimate says so
    return sizes


def _spec_changes(base: LoadResult, head: LoadResult) -> list[DocumentChange]:
    """Spec-level changes of every document, located in the head (or the base, for what is gone);
    their long values compared within one budget (:data:`reconciler.budgets.MAX_TOKEN_PAIRS_TOTAL`)."""
    out: list[DocumentChange] = []
    spent = Spent()
    old_docs = {(d.kind, d.name): d for d in base.specs}
    new_docs = {(d.kind, d.name): d for d in head.specs}
    for key in sorted(set(old_docs) | set(new_docs)):
        a, b = old_docs.get(key), new_docs.get(key)
        raw_new, raw_old = head.raws.get(key), base.raws.get(key)
        if a is None or b is None:
            raw = raw_new if b is not None else raw_old
            out.append(DocumentChange(key[0], key[1], "add" if a is None else "remove", "", None, None,
                                      raw.file if raw else None, raw.line if raw else None))
            continue
        dump_a = {"metadata": {"labels": a.metadata.labels, "annotations": a.metadata.annotations},
                  "spec": a.model_dump(mode="json", by_alias=True)["spec"]}
        dump_b = {"metadata": {"labels": b.metadata.labels, "annotations": b.metadata.annotations},
                  "spec": b.model_dump(mode="json", by_alias=True)["spec"]}
        for change in spec_diff(dump_a, dump_b):
            raw = raw_old if change.in_old else raw_new
            line = raw.position(change.keys)[0] if raw else None
            path = change.path.removeprefix("spec.").removeprefix("spec") if change.path.startswith("spec") else change.path
            out.append(DocumentChange(key[0], key[1], change.op, path, None if change.op == "add" else change.old,
                                      None if change.op == "remove" else change.new, raw.file if raw else None, line,
                                      value_diff(change.old, change.new, spent)))
    return out


def change_line(entry: Mapping[str, Any]) -> str:
    """`path` old → new, as the plan shows a spec change."""
    def fmt(value: Any, present: bool) -> str:
        import json

        if not present:
            return ABSENT
        return json.dumps(value) if isinstance(value, (list, dict)) else str(value)

    return (f"`{entry['path']}` {fmt(entry.get('old'), entry['op'] != 'add')} → "
            f"{fmt(entry.get('new'), entry['op'] != 'remove')}")


def _order(findings: Iterable[Finding]) -> list[Finding]:
    rank = {flag: i for i, flag in enumerate(FLAGS)}
    unique = list(dict.fromkeys(findings))
    return sorted(unique, key=lambda f: (rank.get(f.flag, len(rank)), f.file, f.line, f.message))


def annotate(plan: Plan, head: LoadResult, env: Environment, *, base: LoadResult | None = None, base_env: Environment | None = None,
             sizes: Mapping[str, DataSize] | None = None, records: Iterable[Record] | None = None,
             everything: bool = False, base_sizes: Mapping[str, DataSize] | None = None,
             workloads: Iterable[AdmittedWorkload] | None = None) -> Plan:
    """``plan`` with its review filled in. ``head`` and ``base`` are loader results (specs with
    their source positions); ``base`` only in pull-request mode. The cost covers the Models whose
    workflows the plan creates and the Endpoints whose deployments it creates or changes (every one
    with ``everything``: a blocked plan has no changes to choose by). ``workloads``: Kueue's
    admitted Workloads, when read, for the queued steps' admission lines."""
    models = endpoints = None
    if not everything:
        models = {(c.after or {}).get("metadata", {}).get("labels", {}).get(NAME, "") for c in plan.changes
                  if c.ref.kind == "Workflow" and c.action.value == "create"}
        endpoints = {(c.after or {}).get("metadata", {}).get("labels", {}).get(NAME, "") for c in plan.changes
                     if c.ref.kind == "SeldonDeployment" and c.action.value in ("create", "update")}
    # Capacity is checked for every Model and Endpoint, whether or not this plan changes it: one
    # that cannot run is a blocker either way.
    full = estimate(head.specs, env, dict(sizes or {}))
    est = replace(full, training=tuple(t for t in full.training if models is None or t.model in models),
                  serving=tuple(s for s in full.serving if endpoints is None or s.endpoint in endpoints))
    blockers = [Finding(UNSATISFIABLE, p.message, p.kind, p.name, _dotted(p.path), keys=p.path, declared=p.declared_by)
                for p in capacity_problems(head.specs, env, full)]
    risks: list[Finding] = []
    if base is not None:
        risks += spec_risks(base.specs, head.specs, base_env, env)
    risks += fault_injection_risks(head.specs, base.specs if base is not None else None)
    risks += prune_risks(plan.changes) + quota_risks(plan.changes)
    gate_notes: list[str] = []
    if records:
        risks += metric_risks(plan.changes, list(records))
        gate_risks, gate_notes = regression_risks(plan.changes, list(records), head.specs, env)
        risks += gate_risks
    base_raws = base.raws if base is not None else None
    before = estimate(base.specs, base_env, dict(base_sizes or {})) if base is not None and base_env is not None else None
    return replace(
        plan,
        rollouts=planned_rollouts(plan.changes, head.specs, env),
        blockers=tuple(_order(locate(blockers, head.raws, base_raws))),
        risks=tuple(_order(locate(risks, head.raws, base_raws))),
        spec_changes=tuple(_spec_changes(base, head)) if base is not None else (),
        cost=_cost(est, before),
        notes=(*plan.notes, *gate_notes, *_pod_security_notes(env), *queue_notes(plan.changes),
               *admission_notes(plan.changes, workloads)),
    )


def _pod_security_notes(env: Environment) -> list[str]:
    note = pod_security_note(env, RenderContext(env).namespace)
    return [note] if note else []


def _cost(est: Estimate, before: Estimate | None) -> Cost:
    """The plan's cost: the estimate, and in pull-request mode (``before``: the base revision's)
    what the base had for each Model and Endpoint where it differs."""
    data = est.to_json()
    was = {t.model: t for t in before.training} if before is not None else {}
    served = {s.endpoint: s for s in before.serving} if before is not None else {}
    return Cost(data["utilisation"], data["usableFraction"], data["trainingGpus"], data["trainingGpuHours"], data["servingGpus"],
                tuple(TrainingCost(entry, _training_base(entry, was.get(entry["model"]))) for entry in data["training"]),
                tuple(ServingCost(entry, _serving_base(entry, served.get(entry["endpoint"]))) for entry in data["serving"]))


def _training_base(entry: Mapping[str, Any], old: TrainingEstimate | None) -> TrainingBase | None:
    """What the base revision had for the Model whose estimate (as JSON) is ``entry``; None when
    it had none, or the same GPUs, nodes, accelerator and GPU-hours."""
    from renderers.cost import hours

    if old is None:
        return None
    nodes = old.schedule.nodes if old.schedule else None
    now_hours = entry["gpuHours"]
    same_hours = (old.gpu_hours is None) == (now_hours is None) and (
        old.gpu_hours is None or abs(old.gpu_hours - now_hours) <= 1e-9 * max(1.0, abs(now_hours)))
    if (old.gpus, nodes, old.accelerator) == (entry["gpus"], entry["nodes"], entry["accelerator"]) and same_hours:
        return None
    text = (f"{old.gpus} × {old.accelerator} on {nodes} node{'s' if nodes != 1 else ''}"
            if old.gpus else ("not schedulable" if old.schedule is None else "no accelerators"))
    if old.gpu_hours is not None:
        text += f", ≈ {hours(old.gpu_hours)} GPU-hours"
    return TrainingBase(old.gpus, nodes, old.accelerator, old.gpu_hours, f"before this change: {text}")


def _serving_base(entry: Mapping[str, Any], old: ServingEstimate | None) -> ServingBase | None:
    """What the base revision had for the Endpoint whose estimate (as JSON) is ``entry``, where it differs."""
    if old is None or (old.gpus, old.accelerator) == (entry["gpus"], entry["accelerator"]):
        return None
    return ServingBase(old.gpus, old.accelerator)


def blocked_plan(environment: str, target: str, head: LoadResult, env: Environment, *, base: LoadResult | None = None,
                 base_env: Environment | None = None, sizes: Mapping[str, DataSize] | None = None,
                 revision: str | None = None, base_sizes: Mapping[str, DataSize] | None = None) -> Plan | None:
    """A plan with no changes and the blockers, when a Model cannot be scheduled at all (so nothing
    can be rendered); None when every Model can."""
    est = estimate(head.specs, env, dict(sizes or {}))
    if all(t.schedule is not None for t in est.training):
        return None
    plan = annotate(Plan(environment, target, (), revision=revision), head, env, base=base, base_env=base_env, sizes=sizes,
                    everything=True, base_sizes=base_sizes)
    return replace(plan, notes=("no changes were computed: the specs cannot be rendered until every blocker is resolved",))


#: `forgectl plan` exit codes (README, docs/plan-json.md): Terraform's for `--detailed-exitcode`,
#: and one more for `--fail-on-risk`.
EXIT_OK, EXIT_ERROR, EXIT_CHANGES, EXIT_RISK = 0, 1, 2, 3


def parse_fail_on(values: Iterable[str] | None) -> frozenset[str]:
    """The flags of `--fail-on-risk FLAG[,FLAG]` (repeatable; `all` for every flag); an unknown
    name is a ForgeError listing the known ones."""
    from reconciler.diagnostics import ForgeError, printable

    chosen: set[str] = set()
    for value in values or ():
        for name in (part.strip() for part in value.split(",")):
            if not name:
                continue
            if name == "all":
                chosen |= set(FLAGS)
            elif name in FLAGS:
                chosen.add(name)
            else:
                raise ForgeError(f"--fail-on-risk: unknown flag {printable(name)!r}; expected `all` or one of "
                                 + ", ".join(FLAGS))
    return frozenset(chosen)


def exit_code(plan_json: Mapping[str, Any], *, detailed: bool, fail_on: frozenset[str]) -> int:
    """1 when the target cannot run the plan, else 3 when a flag of ``fail_on`` is raised, else 2
    with ``detailed`` and changes, else 0."""
    if plan_json.get("blockers"):
        return EXIT_ERROR
    if any(r["flag"] in fail_on for r in plan_json.get("risks") or []):
        return EXIT_RISK
    changed = any(plan_json["summary"][a] for a in ("create", "update", "delete"))
    return EXIT_CHANGES if detailed and changed else EXIT_OK


def _versions(obj: Mapping[str, Any]) -> list[str]:
    return sorted(p.get("labels", {}).get(MODEL_VERSION, "") for p in obj.get("spec", {}).get("predictors", []))


def _thin_workflow(obj: Mapping[str, Any]) -> bool:
    """A live Workflow a plan holds as its metadata only (no `spec`)."""
    return obj.get("kind") == "Workflow" and "spec" not in obj


def registry_records(plan: Plan, target: Target) -> list[Record]:
    """The registry's records, read only when the plan moves an endpoint to another version (the
    one risk they inform); [] when the target has none or cannot say."""
    moving: set[str] = set()  # the versions of the endpoints that move: what the risks compare
    for change in plan.changes:
        if change.ref.kind != "SeldonDeployment" or change.after is None or change.before is None:
            continue
        if _versions(change.after) != _versions(change.before):
            moving.update(_versions(change.after), _versions(change.before))
    if not moving:
        return []
    try:
        # The live objects are the plan's `before`s (every live object is in the plan): a second
        # LIST here held the whole live state twice (most of the peak memory at 5,000 endpoints).
        # An unchanged Workflow's `before` may be its metadata only (session.complete_live): of
        # those, the Workflows of the versions that move are read whole here (the records need
        # their status), the others left out (the risks look up only those versions' records).
        live = [c.before for c in plan.changes if c.before is not None and not _thin_workflow(c.before)]
        thin = [c.ref for c in plan.changes if c.before is not None and _thin_workflow(c.before)
                and (c.before["metadata"].get("labels") or {}).get(MODEL_VERSION) in moving]
        if thin:
            live += target.read_whole(thin)
        return target.model_records(live, backfill=False)  # read only: no backfill from a plan
    except Exception:  # noqa: BLE001 - the registry informs a risk flag; a plan never fails on it
        return []


def queue_workloads(plan: Plan, target: Target) -> list[AdmittedWorkload] | None:
    """Kueue's admitted Workloads in the namespaces where the plan creates a Workflow with a queued
    step (a pool's ClusterQueue admits only its environment's namespace, so those are all the
    workloads a preemption could pick); None when there is no such Workflow, no cluster, or the
    read fails (the admission lines then say what the ClusterQueue's status says, no more)."""
    namespaces = sorted({c.ref.namespace for c in plan.changes
                         if c.ref.kind == "Workflow" and c.action.value == "create" and c.after is not None
                         and queued_steps(c.after)})
    api = target.cluster_api() if namespaces else None
    if api is None:
        return None
    items: list[Mapping[str, Any]] = []
    try:
        for ns in namespaces:
            listed = api.read_path(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads", what="Kueue Workloads")
            items += (listed or {}).get("items") or []
    except Exception:  # noqa: BLE001 - the workloads inform a note; a plan never fails on them
        return None
    return admitted_workloads(items)


def reviewed_live_plan(result: LoadResult, environment: Environment, target: Target, namespace: str, revision: str | None, *,
                       rev: str | None = None, refresh: bool = False) -> Plan:
    """The plan against the target's live state, reviewed; a blocked plan (no changes) when a Model
    cannot be scheduled at all. ``refresh``: the full compare (:func:`~reconciler.plan.session.make_plan`)."""
    from reconciler.plan.session import make_plan

    sizes = measure_data(result.specs, environment, rev)
    blocked = blocked_plan(environment.name, target.name, result, environment, sizes=sizes, revision=revision)
    if blocked is not None:
        return blocked
    plan, _ = make_plan(result.specs, environment, target, namespace, revision, refresh=refresh, cache=True)
    return annotate(plan, result, environment, sizes=sizes, records=registry_records(plan, target),
                    workloads=queue_workloads(plan, target))


def reviewed_git_plan(old: LoadResult, old_env: Environment, new: LoadResult, new_env: Environment, *, base: str,
                      head: str | None, revision: str | None, cache: RenderCache | None = None) -> Plan:
    """Pull-request mode: the manifests rendered at ``base`` against those at ``head`` (the working
    tree when None), no cluster involved, reviewed against the base's specs. ``cache``: the render
    cache of the head's Environment and namespace (:mod:`reconciler.plan.rendercache`); the base
    renders through :meth:`~reconciler.plan.rendercache.RenderCache.another` of it, so a unit the
    pull request leaves alone is rendered by neither, and both are saved."""
    from reconciler.diagnostics import ForgeError
    from reconciler.plan.plan import build_plan
    from reconciler.plan.session import TargetOptions, desired_state, namespace_of
    from renderers import RenderContext, SchedulingError, render

    sizes = measure_data(new.specs, new_env, head)
    base_sizes = measure_data(old.specs, old_env, base)
    blocked = blocked_plan(new_env.name, "git", new, new_env, base=old, base_env=old_env, sizes=sizes, revision=revision,
                           base_sizes=base_sizes)
    if blocked is not None:
        return blocked
    old_context = RenderContext(old_env)
    old_cache = cache.another(old_env, old_context.namespace) if cache is not None else None
    try:
        old_rendered = render(old.specs, old_context, old_cache)
    except SchedulingError as exc:
        raise ForgeError(f"at the base revision {base}: {exc}") from exc
    # The head rendered as an apply over the base would render it: an endpoint whose model has a
    # new version keeps its stable one and gets the new one as a canary at 0 % (desired_state,
    # the apply's own render), so the plan shows the rollout that will run, not a replaced stable.
    new_rendered = desired_state(new.specs, new_env, namespace_of(new_env, TargetOptions()), None, old_rendered.manifests,
                                 memo=cache)
    for used in (old_cache, cache):
        if used is not None:
            used.save()
    plan = build_plan(new_rendered.manifests, old_rendered.manifests, environment=new_env.name, target="git",
                      revision=revision, exact=True)
    return annotate(plan, new, new_env, base=old, base_env=old_env, sizes=sizes, base_sizes=base_sizes)


def live_risks(live: Plan, head: LoadResult, base: LoadResult | None, records: Iterable[Record] | None = None) -> list[Finding]:
    """Pull-request mode with a live diff: the risks only the live state shows — a prune of a
    deployment that serves traffic now, a version about to take traffic that scored worse offline
    than the one serving (when the cluster's registry knows both) — located in the specs."""
    found = prune_risks(live.changes) + (metric_risks(live.changes, list(records)) if records else [])
    return _order(locate(found, head.raws, base.raws if base is not None else None))
