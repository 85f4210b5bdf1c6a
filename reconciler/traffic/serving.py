"""What each endpoint serves: read from the live SeldonDeployments, decided from the specs and the
rollout states, and written through one function.

Everything here is pure except :func:`apply_serving`, which writes only through the
:class:`ServingWriter` it is given (a target: the targets' rollout backends pass their own). The
plan path (``session.desired_state``) and the rollout backends both come here: the plan asks
:func:`desired_serving` what each endpoint should serve, the controllers decide a new
:class:`ServingState` and hand it to :func:`apply_serving`, and both render the object with
:func:`render_serving` — so a SeldonDeployment has one renderer and one way to the target.

The targets import this room (their rollout backends move traffic through it), so it imports no
target: :class:`ServingWriter` is the part of the Target protocol it needs, declared here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from reconciler.errors import TargetError
from reconciler.experiment.controller import serving_for
from reconciler.resources import ObjectRef
from reconciler.rollout.controller import Phase, RolloutState
from reconciler.traffic.gateway import ADMISSION_TIMEOUT, wait_admitted
from renderers.gateway import gateway_routing, render_route, route_weights
from renderers.labels import ENDPOINT, MODEL_VERSION, ROLE, VARIANT
from renderers.seldon import ArmServing, ServingState, render_seldon
from renderers.versions import model_version
from specs import Endpoint, Environment, SpecSet


def serving_states(live: Iterable[Mapping[str, Any]]) -> dict[str, ServingState]:
    """What each endpoint serves now, read from its live SeldonDeployment's predictors."""
    states: dict[str, ServingState] = {}
    for obj in live:
        if obj.get("kind") != "SeldonDeployment":
            continue
        endpoint = (obj.get("metadata", {}).get("labels") or {}).get(ENDPOINT)
        roles = {}
        arms = []
        for predictor in obj.get("spec", {}).get("predictors", []):
            labels = predictor.get("labels") or {}
            role = labels.get(ROLE, predictor.get("name"))
            roles[role] = (labels.get(MODEL_VERSION), int(predictor.get("traffic", 0)), labels.get(VARIANT))
            if role not in ("stable", "canary", "shadow"):
                arms.append(ArmServing(role, labels.get(MODEL_VERSION) or "", labels.get(VARIANT) or "", int(predictor.get("traffic", 0))))
        shadow = roles.get("shadow", (None,))[0]
        if endpoint and "stable" in roles and roles["stable"][0]:
            canary = roles.get("canary")
            states[endpoint] = ServingState(roles["stable"][0], canary[0] if canary else None, canary[1] if canary else 0,
                                            shadow=shadow, stable_variant=roles["stable"][2])
        elif endpoint and arms:
            # an experiment: the first arm's version stands for "stable" (nothing reads it as such)
            states[endpoint] = ServingState(arms[0].version, arms=tuple(arms), shadow=shadow)
    return states


def desired_serving(specs: SpecSet, env: Environment, current: Mapping[str, ServingState],
                    rollouts: Mapping[str, RolloutState], versions: Mapping[str, str] | None = None) -> dict[str, ServingState]:
    """What each Endpoint should serve, given what it serves now (``current``) and its saved
    rollout state: an endpoint whose model has a new version keeps its stable version and gets the
    new one as a canary, at the weight the rollout controller set; a rolled-back or aborted canary
    stays out until `rollout retry`; an experiment serves what its controller decided.
    ``versions``: Models' versions known already (the render cache's), the others computed."""
    known = versions or {}
    serving: dict[str, ServingState] = {}
    for endpoint in specs.of(Endpoint):
        model = specs.model_of(endpoint)
        want = known.get(model.name) or model_version(specs, model, env)
        state = current.get(endpoint.name)
        rollout = rollouts.get(endpoint.name)
        experiment = serving_for(endpoint, want, rollout.experiment if rollout is not None else None)
        if experiment is not None:
            serving[endpoint.name] = experiment  # the experiment controller decides what serves
        elif state is None or state.stable == want:
            serving[endpoint.name] = ServingState(want)
        elif rollout is not None and rollout.canary == want and rollout.phase in (Phase.ROLLED_BACK, Phase.ABORTED):
            serving[endpoint.name] = ServingState(state.stable)  # rolled back: `rollout retry` to try again
        else:
            weight = state.canary_weight if state.canary == want else 0
            serving[endpoint.name] = ServingState(state.stable, want, weight)
    return serving


def with_namespace(env: Environment, namespace: str) -> Environment:
    """``env`` with its cluster namespace set to ``namespace`` (`--namespace` overrides the spec),
    so what is rendered names the namespace the target writes to."""
    if env.spec.kubernetes is None or env.spec.kubernetes.namespace == namespace:
        return env
    k8s = env.spec.kubernetes.model_copy(update={"namespace": namespace})
    return env.model_copy(update={"spec": env.spec.model_copy(update={"kubernetes": k8s})})


def render_serving(specs: SpecSet, env: Environment, namespace: str, revision: str | None, endpoint: Endpoint,
                   state: ServingState) -> dict[str, Any]:
    """The SeldonDeployment of ``endpoint`` serving ``state`` in ``namespace``."""
    env = with_namespace(env, namespace)
    router = "gatewayAPI" if gateway_routing(endpoint, env) is not None else None
    return render_seldon(specs, endpoint, env, namespace, revision, state, router=router)


def render_serving_route(env: Environment, namespace: str, revision: str | None, endpoint: Endpoint,
                         state: ServingState) -> dict[str, Any] | None:
    """The HTTPRoute that splits ``endpoint``'s traffic in ``namespace``, or None when Seldon's
    `traffic` does (router `seldon`, or the local target)."""
    return render_route(endpoint, with_namespace(env, namespace), namespace, revision, state)


class ServingWriter(Protocol):
    """What :func:`apply_serving` needs of a target (every Target is one): the namespace it writes
    to and its server-side apply."""

    @property
    def namespace(self) -> str:
        """The namespace the target's objects live in."""
        ...

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply ``obj``; the object as stored."""
        ...


def apply_serving(target: ServingWriter, specs: SpecSet, env: Environment, revision: str | None, endpoint: Endpoint,
                  state: ServingState, *, current: ServingState | None = None,
                  read_back: Callable[[ObjectRef], dict[str, Any] | None] | None = None,
                  admission_timeout: float = ADMISSION_TIMEOUT) -> dict[str, Any]:
    """Make ``endpoint`` serve ``state``: render its SeldonDeployment and apply it through
    ``target`` (the rollout and experiment controllers' one way to move traffic); the object as
    stored.

    When an HTTPRoute splits the endpoint's traffic (router `gatewayAPI`), it is applied too, and
    the move counts only once ``read_back`` (the target's GET) shows the route `Accepted` with
    `ResolvedRefs` for its Gateway at the generation written; otherwise
    :class:`~reconciler.traffic.gateway.RouteNotAdmitted` is raised (nothing saved: the step is
    taken again on the next pass). Order: a move that only drops predictors (promotion, rollback;
    ``current`` is what is served now) moves the route first, so no request reaches a predictor
    whose Service Seldon is about to delete; any other move applies the SeldonDeployment first, so
    the Services the route names exist."""
    deployment = render_serving(specs, env, target.namespace, revision, endpoint, state)
    route = render_serving_route(env, target.namespace, revision, endpoint, state)
    if route is None:
        return target.apply(deployment)
    if read_back is None:
        raise TargetError(f"HTTPRoute {target.namespace}/{endpoint.name}: this target cannot read the route back, so "
                          "a weight move could not be confirmed")
    new = {p for p, _ in route_weights(state)}
    old = {p for p, _ in route_weights(current)} if current is not None else None
    if old is not None and new < old:
        apply_route(target, read_back, route, timeout=admission_timeout)
        return target.apply(deployment)
    stored = target.apply(deployment)
    apply_route(target, read_back, route, timeout=admission_timeout)
    return stored


def apply_route(target: ServingWriter, read_back: Callable[[ObjectRef], dict[str, Any] | None], route: Mapping[str, Any],
                *, timeout: float = ADMISSION_TIMEOUT) -> dict[str, Any]:
    """Apply an HTTPRoute :func:`render_serving_route` made and wait until its Gateway admits it
    (:func:`~reconciler.traffic.gateway.wait_admitted`); the route as read back. The route half of
    :func:`apply_serving`, which every weight move takes."""
    return wait_admitted(read_back, target.apply(route), timeout=timeout)
