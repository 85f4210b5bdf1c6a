"""Endpoint → Gateway API `HTTPRoute` (gateway.networking.k8s.io/v1), for Endpoints whose traffic
router is `gatewayAPI` (specs/traffic.py): the route that splits requests between the predictors
Seldon Core serves, with the live weights of the rollout or the shares of an experiment.

The route's backends are the Services the Seldon Core v1.17.1 operator creates per predictor of a
`seldon.io/no-engine` predictor (`operator/controllers/seldondeployment_controller.go`,
`createPredictorService`, named by `GetPredictorKey` in `apis/.../seldondeployment_types.go`):
`<SeldonDeployment>-<predictor>`, or `seldon-<md5 of that>` when it is longer than 63
characters, port `http` = the graph's `httpPort` (9000). Rules, in the Gateway API's own order of
precedence (a match with a header beats the same path without):

* one rule per predictor matching the header ``x-forge-predictor: <predictor>``: the blue-green
  preview (the new version at 0 % is reachable before the switch) and a direct way to each arm
  (a caller, or an edge that assigned the user, sends the arm it chose: sticky by construction);
* with an experiment's `sticky` key, one rule per arm matching the key's first three hex digits
  against the arm's range of buckets (renderers/keybuckets.py; a `RegularExpression` header match,
  on the header itself or on the `Cookie` header for a cookie): one key, one arm, keys spread by
  the shares; a key without three leading hex digits falls through to the split;
* the split: ``PathPrefix /`` to every predictor with its weight (stable ``100 - w``, canary
  ``w``; or each arm's share).

A shadow predictor is not routed here: the live predictors' servers copy the requests they
answered to its Service and compare the answers (renderers/seldon.py, runtimes/serving/mirror.py),
which no gateway's mirror can (each drops the shadow's answers), and Traefik's Gateway provider
(v3.6.12 on the test node; v3.7 too) implements no `RequestMirror` filter at all.
"""

from __future__ import annotations

from typing import Any

from renderers.keybuckets import arm_buckets, prefix_pattern
from renderers.labels import ENDPOINT, owner_metadata
from renderers.seldon import SERVE_PORT, ServingState, predictor_service
from specs import Endpoint, Environment
from specs.experiment import Sticky
from specs.traffic import TrafficRouting

API_VERSION = "gateway.networking.k8s.io/v1"
GATEWAY_GROUP = "gateway.networking.k8s.io"
#: The header that picks one predictor by name (the preview of a blue-green, one arm of an experiment).
PREDICTOR_HEADER = "x-forge-predictor"


def gateway_routing(endpoint: Endpoint, env: Environment) -> TrafficRouting | None:
    """The Endpoint's routing when an HTTPRoute splits its traffic in ``env`` (its own `traffic`,
    else the Environment's), None when Seldon's `traffic` does (the default) or the target is the
    local one, which routes requests itself."""
    if env.spec.target != "kubernetes":
        return None
    routing = endpoint.spec.traffic or env.spec.traffic
    return routing if routing is not None and routing.router == "gatewayAPI" else None


def route_weights(state: ServingState) -> list[tuple[str, int]]:
    """(predictor, weight in percent) of each predictor that takes traffic, as `render_seldon`
    names them: the arms of an experiment, else the stable and (during a rollout) the canary."""
    if state.arms:
        return [(arm.name, arm.share) for arm in state.arms]
    if state.canary is None or state.canary == state.stable:
        return [("stable", 100)]
    return [("stable", 100 - state.canary_weight), ("canary", state.canary_weight)]


def parent_ref(routing: TrafficRouting, namespace: str) -> dict[str, Any]:
    """The route's `parentRefs` entry (the Gateway's namespace defaulted to the route's)."""
    ref = routing.parent_ref
    assert ref is not None  # the spec requires it with router gatewayAPI
    out: dict[str, Any] = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": ref.name,
                           "namespace": ref.namespace or namespace}
    if ref.section_name:
        out["sectionName"] = ref.section_name
    return out


def _backend(deployment: str, predictor: str, weight: int) -> dict[str, Any]:
    return {"group": "", "kind": "Service", "name": predictor_service(deployment, predictor), "port": SERVE_PORT,
            "weight": weight}


def sticky_match(sticky: Sticky, lo: int, hi: int) -> dict[str, Any]:
    """The header match of the keys in buckets ``lo … hi - 1``: the sticky header's value starts
    with them, or the `Cookie` header carries the sticky cookie with such a value."""
    keys = prefix_pattern(lo, hi)
    if sticky.header is not None:
        return {"type": "RegularExpression", "name": sticky.header, "value": "^" + keys}
    return {"type": "RegularExpression", "name": "cookie", "value": f"(?:^|;\\s*){sticky.cookie}={keys}"}


def render_route(endpoint: Endpoint, env: Environment, namespace: str, revision: str | None,
                 state: ServingState) -> dict[str, Any] | None:
    """The HTTPRoute of ``endpoint`` serving ``state``, or None when its router is not `gatewayAPI`."""
    routing = gateway_routing(endpoint, env)
    if routing is None:
        return None
    deployment = endpoint.name  # render_seldon names the SeldonDeployment after the Endpoint
    weights = route_weights(state)
    root = {"path": {"type": "PathPrefix", "value": "/"}}
    rules: list[dict[str, Any]] = [
        {"name": f"predictor-{predictor}",
         "matches": [{**root, "headers": [{"type": "Exact", "name": PREDICTOR_HEADER, "value": predictor}]}],
         "backendRefs": [_backend(deployment, predictor, 1)]}
        for predictor, _ in weights
    ]
    sticky = endpoint.spec.experiment.sticky if endpoint.spec.experiment is not None and state.arms else None
    if sticky is not None:
        rules += [{"name": f"sticky-{arm}", "matches": [{**root, "headers": [sticky_match(sticky, lo, hi)]}],
                   "backendRefs": [_backend(deployment, arm, 1)]}
                  for arm, lo, hi in arm_buckets(weights)]
    rules.append({"name": "split", "matches": [root],
                  "backendRefs": [_backend(deployment, predictor, weight) for predictor, weight in weights]})
    spec: dict[str, Any] = {"parentRefs": [parent_ref(routing, namespace)]}
    if routing.hostnames:
        spec["hostnames"] = list(routing.hostnames)
    spec["rules"] = rules
    return {
        "apiVersion": API_VERSION,
        "kind": "HTTPRoute",
        "metadata": owner_metadata(endpoint, name=endpoint.name, namespace=namespace, environment=env.name,
                                   revision=revision, labels={ENDPOINT: endpoint.name}),
        "spec": spec,
    }
