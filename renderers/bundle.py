"""Render a whole SpecSet for one Environment: every manifest, in a stable order."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

from renderers.dashboards import render_dashboard
from renderers.gateway import render_route
from renderers.labels import ENVIRONMENT, GIT_REVISION, MANAGED_BY, MANAGER, PRUNE, TRAINING_STAGE
from renderers.monitoring import render_podmonitor, render_rules
from renderers.pods import training_priority
from renderers.prerequisites import workflow_rbac, workspace_claim
from renderers.queues import queued, render_queues
from renderers.seldon import ServingState, experiment_serving, render_seldon
from renderers.versions import model_version
from renderers.workflow import RenderedWorkflow, render_workflow
from specs import Document, Endpoint, Environment, Model, SpecSet

D = TypeVar("D", bound=Document)

#: Apply order: prerequisites first, endpoints last (a sort key, not control flow).
KIND_ORDER = {
    "Namespace": 0,
    "PersistentVolumeClaim": 1,
    "ServiceAccount": 2,
    "Role": 3,
    "RoleBinding": 4,
    # Kueue (renderers/queues.py): the queues exist before a Workflow submits to them.
    "ResourceFlavor": 5,
    "WorkloadPriorityClass": 6,
    "ClusterQueue": 7,
    "LocalQueue": 8,
    "Workflow": 9,
    "PodMonitor": 10,
    "PrometheusRule": 11,
    "SeldonDeployment": 12,
    "HTTPRoute": 13,  # after the predictors whose Services it routes to
    "ConfigMap": 14,
}
TOP_KEYS = ("apiVersion", "kind", "metadata", "spec")


@dataclass(frozen=True)
class RenderContext:
    """What rendering needs besides the specs: the environment, the git revision to stamp, and
    the live serving state of each endpoint (from the rollout controller)."""

    environment: Environment
    revision: str | None = None
    serving: Mapping[str, ServingState] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        """Namespace of every namespaced object of this environment."""
        k8s = self.environment.spec.kubernetes
        return k8s.namespace if k8s else f"forge-{self.environment.name}"


@dataclass
class Rendered:
    """The manifests of a SpecSet, plus what plans and targets want to know about them."""

    manifests: list[dict[str, Any]]
    workflows: Mapping[str, RenderedWorkflow]
    versions: dict[str, str]


#: The documents one render unit read from the SpecSet: (kind, name) of each `get`, in order.
Used = tuple[tuple[str, str], ...]


class RenderMemo(Protocol):
    """Remembers what a *render unit* rendered — one Model's Workflow, one Endpoint's objects — so
    an unchanged unit is looked up instead of rendered (``render(..., memo=)``; the plan's render
    cache, :mod:`reconciler.plan.rendercache`, is one).

    :meth:`recall` is asked first with the unit's document, the facts of the render that are not in
    the specs (``facts``: the namespace, the revision, the serving state…) and the SpecSet; it
    answers the objects stored for them, or None. On None the unit is rendered and :meth:`keep`
    gets, besides, the documents the render read (``used``): an implementation keys its entry by
    all of that — a document the unit read that changed since must not be answered. A unit that
    read more than single documents (every Model, say) is rendered and not kept."""

    def recall(self, unit: Document, facts: Mapping[str, Any], specs: SpecSet) -> tuple[list[dict[str, Any]], Any] | None:
        """The objects and the note kept for this unit with these facts, if still valid."""

    def keep(self, unit: Document, facts: Mapping[str, Any], used: Used, objects: list[dict[str, Any]], note: Any,
             specs: SpecSet) -> None:
        """Remember what the unit rendered from ``specs`` (``note``: a JSON value the caller wants
        back with it)."""


@dataclass(frozen=True)
class _Recording(SpecSet):
    """A SpecSet that writes down which documents are read, for :class:`RenderMemo` (one per
    render; :meth:`reading` starts a unit). Reading every document of a kind (`of`, iteration)
    makes the unit's dependencies unbounded: it is then not kept."""

    log: list[tuple[str, str]] = field(default_factory=list, compare=False, repr=False)
    wide: list[bool] = field(default_factory=lambda: [False], compare=False, repr=False)

    def get(self, kind: type[D], name: str | None) -> D | None:
        if name is not None:
            self.log.append((kind.__name__, name))
        return super().get(kind, name)

    def of(self, kind: type[D]) -> list[D]:
        self.wide[0] = True
        return super().of(kind)

    def __iter__(self) -> Iterator[Document]:
        self.wide[0] = True
        return super().__iter__()

    def reading(self) -> None:
        """Start a new unit: forget what the last one read."""
        self.log.clear()
        self.wide[0] = False

    def used(self) -> Used | None:
        """What the unit read since :meth:`reading`; None when it read a whole kind."""
        return None if self.wide[0] else tuple(dict.fromkeys(self.log))


def sort_key(obj: Mapping[str, Any]) -> tuple[int, int, str, str, str]:
    """Order of objects in a render and in an apply (a distillation teacher's Workflow before its
    students')."""
    meta = obj.get("metadata", {})
    stage = (meta.get("annotations") or {}).get(TRAINING_STAGE, "0")
    return (KIND_ORDER.get(obj.get("kind", ""), 99), int(stage) if stage.isdigit() else 0, obj.get("kind", ""),
            meta.get("namespace", ""), meta.get("name", ""))


def _ordered(obj: dict[str, Any]) -> dict[str, Any]:
    return {**{k: obj[k] for k in TOP_KEYS if k in obj}, **{k: v for k, v in sorted(obj.items()) if k not in TOP_KEYS}}


def _workflow_facts(namespace: str) -> dict[str, Any]:
    """The facts a Model's Workflow unit is kept and recalled with (its render reads no live state)."""
    return {"namespace": namespace, "unit": "Workflow"}


def recalled_versions(specs: SpecSet, ctx: RenderContext, memo: RenderMemo | None) -> dict[str, str]:
    """Each Model's version as ``memo`` recalls it with the Model's Workflow (the note a Workflow
    unit keeps is the version: a digest of the same documents the entry is checked against), for
    what must know every Model's version before the render — what each Endpoint serves
    (:func:`reconciler.traffic.serving.desired_serving`) — and would otherwise digest every Model
    (10,000 Models: 2 s). Models the memo has no entry for are left out."""
    if memo is None:
        return {}
    versions: dict[str, str] = {}
    for model in specs.of(Model):
        recalled = memo.recall(model, _workflow_facts(ctx.namespace), specs)
        if recalled is not None and isinstance(recalled[1], str):
            versions[model.name] = recalled[1]
    return versions


def render(specs: SpecSet, ctx: RenderContext, memo: RenderMemo | None = None) -> Rendered:
    """Every manifest for ``ctx.environment``: the namespace and workspace volume, one Workflow per
    Model version, and per Endpoint a SeldonDeployment (and its HTTPRoute, when the Gateway API
    splits its traffic), a PodMonitor, a PrometheusRule and a Grafana dashboard ConfigMap.

    Runs with the cyclic garbage collector paused (restored after): the manifests are acyclic and
    all stay alive, and with thousands of endpoints the collector's repeated rescans of the heap
    cost more than the render itself (10,000 endpoints: 16.9 s of CPU with it, 7.3 s without).

    With a ``memo`` (:class:`RenderMemo`) each Model's Workflow and each Endpoint's objects are
    looked up there first and rendered only when it has none for the same documents and facts; the
    manifests are the same either way (`Rendered.workflows` renders a recalled Workflow's steps
    again when asked)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _render(specs, ctx, memo)
    finally:
        if enabled:
            gc.enable()


def _render(specs: SpecSet, ctx: RenderContext, memo: RenderMemo | None) -> Rendered:
    env = ctx.environment
    ns = ctx.namespace
    base_labels = {MANAGED_BY: MANAGER, ENVIRONMENT: env.name}
    annotations = {PRUNE: "disabled", **({GIT_REVISION: ctx.revision} if ctx.revision else {})}
    manifests: list[dict[str, Any]] = [
        # The namespace is only ensured to exist: it carries no ownership labels, so Forge never
        # prunes it and never needs cluster-wide rights to patch one a platform team created.
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        workspace_claim(specs, env, ns, {"labels": dict(sorted(base_labels.items())),
                                         "annotations": dict(sorted(annotations.items()))}),
    ]
    if env.spec.target == "kubernetes":
        # The local target runs steps as processes of this machine: no pods, no service account.
        owned = {"labels": dict(sorted(base_labels.items())),
                 **({"annotations": {GIT_REVISION: ctx.revision}} if ctx.revision else {})}
        manifests.extend(workflow_rbac(env, ns, owned))
    # The queued pools' Kueue objects, and the workload priorities their training runs at.
    priorities = {training_priority(m, c) for m in specs.of(Model) if queued(c := specs.compute_of(m, env), env)}
    manifests.extend(render_queues(specs, env, ns, ctx.revision, priorities))
    recording = _Recording(specs.documents, specs._index) if memo is not None else None

    Make = Callable[[SpecSet, str | None], tuple[list[dict[str, Any]], Any]]

    def unit(doc: Document, facts: Mapping[str, Any], make: Make) -> tuple[list[dict[str, Any]], Any]:
        """The objects (and note) of one render unit: recalled from the memo, else rendered. Through
        a memo a unit is rendered without the git revision, which is stamped on after
        (:func:`_stamped`): a new commit re-renders nothing."""
        if memo is None or recording is None:
            return make(specs, ctx.revision)
        recalled = memo.recall(doc, facts, specs)
        if recalled is None:
            recording.reading()
            objects, note = make(recording, None)
            used = recording.used()
            if used is not None:
                memo.keep(doc, facts, used, objects, note, specs)
            recalled = objects, note
        objects, note = recalled
        return [_stamped(o, ctx.revision) for o in objects] if ctx.revision else objects, note

    fresh: dict[str, RenderedWorkflow] = {}
    versions: dict[str, str] = {}
    for model in specs.of(Model):

        def workflow(s: SpecSet, revision: str | None, model: Model = model) -> tuple[list[dict[str, Any]], Any]:
            wf = render_workflow(s, model, env, ns, revision)
            if revision == ctx.revision:
                fresh[model.name] = wf
            return [wf.manifest], wf.version

        objects, versions[model.name] = unit(model, _workflow_facts(ns), workflow)
        manifests.extend(objects)
    for endpoint in specs.of(Endpoint):
        model = specs.model_of(endpoint)
        desired = versions.get(model.name) or model_version(specs, model, env)
        state = ctx.serving.get(endpoint.name) or (
            experiment_serving(endpoint, desired) if endpoint.spec.experiment else ServingState(stable=desired))

        def serving(s: SpecSet, revision: str | None, endpoint: Endpoint = endpoint,
                    state: ServingState = state) -> tuple[list[dict[str, Any]], Any]:
            return _endpoint_objects(s, endpoint, env, ns, revision, state), None

        manifests.extend(unit(endpoint, {"namespace": ns, "unit": "Endpoint", "serving": asdict(state)}, serving)[0])
    workflows = _Workflows(fresh, {m.name: m for m in specs.of(Model)}, specs, env, ns, ctx.revision)
    return Rendered(sorted((_ordered(m) for m in manifests), key=sort_key), workflows, versions)


def _endpoint_objects(specs: SpecSet, endpoint: Endpoint, env: Environment, ns: str, revision: str | None,
                      state: ServingState) -> list[dict[str, Any]]:
    """An Endpoint's objects: its SeldonDeployment (and HTTPRoute, when the Gateway API splits its
    traffic), PodMonitor, PrometheusRule (when its policy has metrics) and dashboard ConfigMap."""
    route = render_route(endpoint, env, ns, revision, state)  # None unless its router is gatewayAPI
    out = [render_seldon(specs, endpoint, env, ns, revision, state, router="gatewayAPI" if route is not None else None)]
    if route is not None:
        out.append(route)
    policy = specs.policy_of(endpoint, env)
    out.append(render_podmonitor(endpoint, env, ns, revision, policy))
    if policy is not None and policy.spec.metrics:
        out.append(render_rules(endpoint, policy, env, ns, revision))
    out.append(render_dashboard(endpoint, policy, env, ns, revision))  # Grafana, via its sidecar
    return out


def _stamped(obj: dict[str, Any], revision: str) -> dict[str, Any]:
    """``obj`` (a copy: the memo's stays as it is) with the git revision annotation a render with
    ``revision`` gives it: a unit's objects carry the revision only there (`labels.owner_metadata`,
    annotations sorted), so this is that render's object."""
    meta = obj["metadata"]
    annotations = {**(meta.get("annotations") or {}), GIT_REVISION: revision}
    return {**obj, "metadata": {**meta, "annotations": dict(sorted(annotations.items()))}}


class _Workflows(Mapping[str, RenderedWorkflow]):
    """`Rendered.workflows`: each Model's RenderedWorkflow — the one rendered in this render, or,
    for a Workflow a memo recalled, rendered again (pure: the same manifest, version and steps) when
    a caller asks for it; the plan never does."""

    def __init__(self, fresh: dict[str, RenderedWorkflow], models: dict[str, Model], specs: SpecSet, env: Environment,
                 ns: str, revision: str | None) -> None:
        self._fresh, self._models, self._args = fresh, models, (specs, env, ns, revision)

    def __getitem__(self, name: str) -> RenderedWorkflow:
        if name not in self._fresh:
            specs, env, ns, revision = self._args
            self._fresh[name] = render_workflow(specs, self._models[name], env, ns, revision)
        return self._fresh[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)
