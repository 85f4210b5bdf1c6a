"""The impure edge of planning: choose the target, read the live state, render against it, build
the plan and settle it with server-side dry runs; check a saved plan is still fresh."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reconciler.applied import desired_digest, recorded_digest
from reconciler.errors import StalePlanError
from reconciler.heap import gc_paused
from reconciler.plan.experiments import experiment_notes
from reconciler.plan.plan import Action, Plan, build_plan, fingerprint, settle
from reconciler.plan.rendercache import RenderCache
from reconciler.resources import ObjectRef
from reconciler.rollout.controller import RolloutState
from reconciler.targets.base import LeaseTiming, LiveRead, Target
from reconciler.traffic.serving import desired_serving, serving_states, with_namespace
from renderers import RenderContext, render
from renderers.bundle import Rendered, RenderMemo, recalled_versions
from renderers.labels import MODEL_VERSION, NAME
from specs import Environment, SpecSet

__all__ = ["ONE_SHOT_RETRY_SECONDS", "RENDER_INPUTS", "PhaseHook", "TargetOptions", "complete_live", "desired_state", "ensure_fresh", "in_use", "make_plan", "namespace_of", "open_target",
           "serving_states"]


@dataclass(frozen=True)
class TargetOptions:
    """kubectl-style overrides from the command line."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    #: Pull-request mode: the checkout under review. Credentials are then read only from the
    #: runner (never a kubeconfig an Environment names, nor one inside this folder).
    untrusted_root: Path | None = None
    #: How the target's lock is held where it is a Lease (the in-cluster controller holds it as a
    #: leader, with client-go's timings); None: as an apply holds it.
    lease: LeaseTiming | None = None
    #: Seconds a request failing transiently is retried for; None: :data:`ONE_SHOT_RETRY_SECONDS`
    #: for a command run once (apply, plan, diff: it bridges an API server's restart), none beyond
    #: the target's few quick retries where the lock is held as a leader (``lease``: a watch or the
    #: controller, whose next pass is the retry and whose Lease must not lapse inside one request).
    retry_window: float | None = None


#: A one-shot command's retry window: an API server stopped, started again and its paths installed
#: (the apiserver-restart drill of bench/faults.py: down 3 s, then about 5 s to answer) fits in it.
ONE_SHOT_RETRY_SECONDS = 30.0


def namespace_of(env: Environment, options: TargetOptions) -> str:
    """The namespace an environment uses: `--namespace`, else its spec, else `forge-<env>`."""
    if options.namespace:
        return options.namespace
    return env.spec.kubernetes.namespace if env.spec.kubernetes else f"forge-{env.name}"


def open_target(env: Environment, options: TargetOptions = TargetOptions()) -> Target:
    """The target of an environment."""
    # Imported here: each target pulls in its own stack (the `kubernetes` client, the local
    # executor), and a command needs only one of them.
    if env.spec.target == "kubernetes":
        from reconciler.targets.kubernetes.target import KubernetesTarget

        k8s = env.spec.kubernetes
        trusted = options.untrusted_root is None
        return KubernetesTarget(
            env.name,
            namespace_of(env, options),
            kubeconfig=options.kubeconfig or (k8s.kubeconfig if k8s and trusted else None),
            context=options.context or (k8s.context if k8s else None),
            untrusted_root=options.untrusted_root,
            lease=options.lease,
            retry_window=options.retry_window if options.retry_window is not None
            else (0.0 if options.lease is not None else ONE_SHOT_RETRY_SECONDS),
        )
    from reconciler.targets.local.target import LocalTarget
    return LocalTarget(env, namespace_of(env, options))


def desired_state(specs: SpecSet, env: Environment, namespace: str, revision: str | None,
                  live: Iterable[Mapping[str, Any]], rollouts: Mapping[str, RolloutState] | None = None,
                  memo: RenderMemo | None = None) -> Rendered:
    """Render the specs against what is live: each endpoint serves what
    :func:`reconciler.traffic.serving.desired_serving` decides from its live state and rollout state
    (unchanged units looked up in ``memo``, see :func:`renderers.render`)."""
    env = with_namespace(env, namespace)
    versions = recalled_versions(specs, RenderContext(env, revision), memo)
    serving = desired_serving(specs, env, serving_states(live), rollouts or {}, versions)
    return render(specs, RenderContext(env, revision, serving), memo)


#: What :func:`make_plan` calls around each of its phases ("read live", "rollout states", "render",
#: "read changed", "diff", "dry runs", "settle"): a context manager, e.g. a benchmark's clock.
#: Nothing by default.
PhaseHook = Callable[[str], AbstractContextManager[object]]


def _no_phase(name: str) -> AbstractContextManager[object]:
    return nullcontext()


#: The kinds whose live bodies the render itself reads (what each endpoint serves, its rollout
#: state: :func:`desired_state`): read whole by every plan, and compared field by field only where
#: their recorded digest differs, like the others (:func:`complete_live`).
RENDER_INPUTS = frozenset({"SeldonDeployment"})


def make_plan(specs: SpecSet, env: Environment, target: Target, namespace: str, revision: str | None,
              *, dry_run: bool = True, refresh: bool = False, phase: PhaseHook = _no_phase,
              cache: bool = False, memo: RenderCache | None = None) -> tuple[Plan, Rendered]:
    """Read live, render, diff, and settle apparent updates by dry run (unless ``dry_run`` is
    false: pull-request mode holds a read-only credential and uses no write verb).

    The live read is metadata first (:meth:`Target.read_live_metadata`; the kinds of
    :data:`RENDER_INPUTS` whole): an object whose recorded digest (:mod:`reconciler.applied`)
    equals its desired manifest's is unchanged without reading its body; only the others — digest
    different or missing, no longer desired, or the previous versions a new Workflow's reasons
    compare with — are read whole and diffed field by field (:func:`complete_live`). With
    ``refresh`` every object is read whole and compared (the full compare: drift made outside
    Forge, which keeps the digest, shows only there; `forgectl diff` and `plan --refresh`).
    ``phase(name)`` wraps each phase (see :data:`PhaseHook`). With ``cache`` an unchanged unit's
    objects and recorded digests come from the render cache (:mod:`reconciler.plan.rendercache`,
    on disk outside the tree) instead of a render; ``memo``: such a cache opened already (a pull
    request's plan shares one pack across its renders). Runs with the cyclic garbage collector paused
    (:func:`reconciler.heap.gc_paused`: tens of thousands of objects)."""
    with gc_paused(), ThreadPoolExecutor(1, thread_name_prefix="read-live") as pool:
        # The live read waits mostly on the API server (another process, another core): it runs
        # while this thread reads the render cache's pack (tens of MB of JSON), not after it.
        reading = pool.submit(lambda: LiveRead(target.read_live()) if refresh else target.read_live_metadata(RENDER_INPUTS))
        if memo is None and cache:
            memo = RenderCache(env, namespace)
        with phase("read live"):
            read = reading.result()
        return _make_plan(specs, env, target, namespace, revision, read, dry_run=dry_run, phase=phase, cache=memo)


def _make_plan(specs: SpecSet, env: Environment, target: Target, namespace: str, revision: str | None, read: LiveRead,
               *, dry_run: bool, phase: PhaseHook, cache: RenderCache | None) -> tuple[Plan, Rendered]:
    live = read.objects
    with phase("rollout states"):
        rollouts = target.rollout_states(live)
    with phase("render"):
        rendered = desired_state(specs, env, namespace, revision, live, rollouts, cache)
        if cache is not None:
            cache.save()
    unchanged: frozenset[ObjectRef] = frozenset()
    if read.partial:
        with phase("read changed"):
            live, unchanged = complete_live(target, read, rendered.manifests, cache.digests if cache is not None else {})
    with phase("diff"):
        plan = build_plan(rendered.manifests, live, environment=env.name, target=target.name, revision=revision,
                          keep=in_use(live, {ObjectRef.of(m) for m in rendered.manifests}), unchanged=unchanged)
    # An experiment that ended serves its decision while the specs still name its arms: say so.
    plan = replace(plan, notes=(*plan.notes, *experiment_notes(specs, rollouts, rendered.versions)))
    if not dry_run:
        return plan, rendered
    with phase("dry runs"):
        # as many at once as the target applies (its `apply_parallelism`): 100 updates at 10,000
        # endpoints are 100 round trips, each mostly the API server's time
        updates = [change for change in plan.changes if change.action is Action.UPDATE and change.after is not None]
        with ThreadPoolExecutor(max(1, target.apply_parallelism), thread_name_prefix="dry-run") as pool:
            answers = list(pool.map(lambda change: target.apply(change.after, dry_run=True), updates))
        dry_runs: dict[ObjectRef, dict[str, Any]] = {change.ref: answer for change, answer in zip(updates, answers, strict=True)}
    with phase("settle"):
        settled = settle(plan, dry_runs)
    return settled, rendered


def complete_live(target: Target, read: LiveRead, desired: Iterable[Mapping[str, Any]],
                  digests: Mapping[ObjectRef, str] | None = None) -> tuple[list[dict[str, Any]], frozenset[ObjectRef]]:
    """The live objects a plan diffs, from a read with metadata-only objects (``read.partial``),
    and the refs known unchanged. A partial object — or one of :data:`RENDER_INPUTS`, read whole —
    is unchanged when its recorded digest equals its desired manifest's; every other one is read whole (:meth:`Target.read_whole`): a digest
    that differs or is missing (written before digests, or by hand), an object no longer desired
    (deleted or kept: its body is the plan's `before`), and the live Workflows of a model that gets
    a new one (its reasons compare the steps with theirs). One gone meanwhile is left out.
    ``digests``: desired digests known already (the render cache's), by ref."""
    known = digests or {}
    wanted = {ObjectRef.of(m): m for m in desired}
    by_ref = {ObjectRef.of(o): o for o in read.objects}
    new_models = {(m["metadata"].get("labels") or {}).get(NAME) for ref, m in wanted.items()
                  if ref.kind == "Workflow" and ref not in by_ref}
    unchanged: set[ObjectRef] = set()
    stale: list[ObjectRef] = []
    for ref, obj in by_ref.items():
        # A kind read whole for the render (its serving, its rollout state) is unchanged by the same
        # rule: its body is not compared field by field, and its `managedFields` (which only that
        # compare reads) are let go — a fifth of a SeldonDeployment's bytes, 10,000 of them at scale.
        if ref.kind in RENDER_INPUTS and ref not in read.partial and (want := wanted.get(ref)) is not None:
            recorded = recorded_digest(obj)
            if recorded is not None and recorded == (known.get(ref) or desired_digest(want)):
                unchanged.add(ref)
                obj["metadata"].pop("managedFields", None)
    for ref in read.partial:
        obj, want = by_ref[ref], wanted.get(ref)
        recorded = recorded_digest(obj)
        compares_with = ref.kind == "Workflow" and (obj["metadata"].get("labels") or {}).get(NAME) in new_models
        if want is not None and recorded is not None and not compares_with and recorded == (known.get(ref) or desired_digest(want)):
            unchanged.add(ref)
        else:
            stale.append(ref)
    whole = {ObjectRef.of(o): o for o in target.read_whole(stale)} if stale else {}
    live = []
    for ref, obj in by_ref.items():
        if ref in whole:
            live.append(whole[ref])
        elif ref not in read.partial or ref in unchanged:
            live.append(obj)
    return live, frozenset(unchanged)


def in_use(live: Iterable[Mapping[str, Any]], desired: Collection[ObjectRef]) -> dict[ObjectRef, str]:
    """Workflows of model versions that an endpoint still serves: kept (with the reason) until
    no endpoint serves them, so a rollback knows where its stable version came from. An endpoint
    whose SeldonDeployment is not ``desired`` any more is pruned in the same plan, and keeps
    nothing (else removing a model and its endpoint would take two applies)."""
    live = list(live)
    serving = serving_states([o for o in live if o.get("kind") != "SeldonDeployment" or ObjectRef.of(o) in desired])
    versions = {}
    for endpoint, state in serving.items():
        versions[state.stable] = endpoint
        if state.canary:
            versions[state.canary] = endpoint
        for arm in state.arms:  # an experiment's arms (a pinned older version among them) and its shadow
            versions[arm.version] = endpoint
        if state.shadow:
            versions[state.shadow] = endpoint
    kept = {}
    for obj in live:
        if obj.get("kind") == "Workflow":
            version = (obj["metadata"].get("labels") or {}).get(MODEL_VERSION)
            if version in versions:
                kept[ObjectRef.of(obj)] = f"kept: version {version} still serves endpoint `{versions[version]}`"
    return kept


def ensure_fresh(plan: Plan, target: Target) -> None:
    """Refuse a saved plan whose live state moved since it was made (identities and
    resourceVersions: the metadata is enough)."""
    live = target.read_live_metadata(frozenset()).objects
    if fingerprint(live) == plan.live_fingerprint:
        return
    planned = {c.ref: c.live_version for c in plan.changes if c.before is not None}
    now = {ObjectRef.of(o): o.get("metadata", {}).get("resourceVersion") for o in live}
    moved = sorted(str(r) for r in set(planned) | set(now) if planned.get(r) != now.get(r))
    raise StalePlanError(
        "the saved plan is stale: the live state changed since it was made ("
        + (", ".join(moved[:5]) + (" …" if len(moved) > 5 else "") if moved else "objects changed")
        + "); run `forgectl plan` again and review the new plan"
    )
