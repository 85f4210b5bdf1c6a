"""The Gateway API router (`traffic.router: gatewayAPI`): the HTTPRoute per Endpoint, pinned by
golden files with the SeldonDeployment it routes to; the default (`seldon`) renders nothing new;
the spec's own checks, with file and line.

Refresh the golden files after an intended change with: `scripts/test tests/renderers --update-golden`.
"""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from forgectl.cli import app
from reconciler.load.loader import load_or_raise
from reconciler.present.manifests import to_yaml_stream
from renderers import RenderContext, ServingState, render
from renderers.gateway import PREDICTOR_HEADER, predictor_service, render_route, route_weights
from renderers.seldon import ArmServing
from specs import Endpoint
from specs.traffic import GatewayParentRef, TrafficRouting

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
ROUTING = TrafficRouting(router="gatewayAPI", parent_ref=GatewayParentRef(name="forge", namespace="gateway", section_name="http"))

STATES = {
    "canary-10": ServingState("aaaaaaaaaaaa", "bbbbbbbbbbbb", 10),
    # blue-green before the switch: the preview takes no share, only requests naming it
    "preview": ServingState("aaaaaaaaaaaa", "bbbbbbbbbbbb", 0),
    "stable": ServingState("aaaaaaaaaaaa"),
    "arms": ServingState("aaaaaaaaaaaa", arms=(ArmServing("control", "aaaaaaaaaaaa", "int8", 70),
                                               ArmServing("treatment", "bbbbbbbbbbbb", "base", 30))),
}


def quickstart(routing: TrafficRouting | None, env_name: str = "cluster", *, on_endpoint: bool = False):
    specs = load_or_raise([str(ROOT / "examples" / "quickstart")]).specs
    env = specs.environment(env_name)
    endpoint = specs.get(Endpoint, "digits")
    assert env is not None and endpoint is not None
    if on_endpoint:
        endpoint = endpoint.model_copy(update={"spec": endpoint.spec.model_copy(update={"traffic": routing})})
        specs = type(specs)(tuple(endpoint if d.kind == "Endpoint" and d.name == "digits" else d for d in specs.documents))
    else:
        env = env.model_copy(update={"spec": env.spec.model_copy(update={"traffic": routing})})
    return specs, env, endpoint


def serving_objects(state: ServingState, routing: TrafficRouting | None = ROUTING, **kw) -> list[dict]:
    specs, env, _ = quickstart(routing, **kw)
    manifests = render(specs, RenderContext(env, revision="0123456789ab", serving={"digits": state})).manifests
    return [m for m in manifests if m["kind"] in ("SeldonDeployment", "HTTPRoute")]


@pytest.mark.parametrize("case", sorted(STATES))
def test_golden(case: str, update_golden: bool) -> None:
    text = to_yaml_stream(serving_objects(STATES[case]))
    golden = GOLDEN / f"gateway.{case}.yaml"
    if update_golden:
        golden.write_text(text)
    assert golden.is_file(), f"missing {golden}; run with --update-golden"
    assert text == golden.read_text(), f"{golden} differs; if intended, refresh with --update-golden"


def test_the_route_carries_the_live_weights_to_seldons_services() -> None:
    sd, route = serving_objects(STATES["canary-10"])
    assert [sd["kind"], route["kind"]] == ["SeldonDeployment", "HTTPRoute"]  # the predictors before the route
    assert sd["metadata"]["annotations"]["forge.dev/traffic-router"] == "gatewayAPI"
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "forge",
                                            "namespace": "gateway", "sectionName": "http"}]
    split = route["spec"]["rules"][-1]
    assert split["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert [(b["name"], b["port"], b["weight"]) for b in split["backendRefs"]] == [("digits-stable", 9000, 90),
                                                                                   ("digits-canary", 9000, 10)]
    # each predictor is reachable by name, whatever its weight (the blue-green preview, one arm)
    by_header = {r["matches"][0]["headers"][0]["value"]: r["backendRefs"][0]["name"] for r in route["spec"]["rules"][:-1]}
    assert by_header == {"stable": "digits-stable", "canary": "digits-canary"}
    assert {r["matches"][0]["headers"][0]["name"] for r in route["spec"]["rules"][:-1]} == {PREDICTOR_HEADER}
    # the SeldonDeployment keeps every predictor (and records the weights Seldon's validation wants)
    assert [(p["name"], p["traffic"]) for p in sd["spec"]["predictors"]] == [("stable", 90), ("canary", 10)]


def test_the_weights_follow_each_serving_state() -> None:
    assert route_weights(STATES["stable"]) == [("stable", 100)]
    assert route_weights(STATES["preview"]) == [("stable", 100), ("canary", 0)]
    assert route_weights(ServingState("a", "b", 100)) == [("stable", 0), ("canary", 100)]  # the blue-green switch
    assert route_weights(ServingState("a", "a", 50)) == [("stable", 100)]
    assert route_weights(STATES["arms"]) == [("control", 70), ("treatment", 30)]


def test_seldon_is_the_default_router_and_renders_no_route() -> None:
    for routing in (None, TrafficRouting()):
        objects = serving_objects(STATES["canary-10"], routing)
        assert [o["kind"] for o in objects] == ["SeldonDeployment"]
        assert "forge.dev/traffic-router" not in objects[0]["metadata"]["annotations"]


def test_an_endpoint_override_replaces_the_environment_and_the_local_target_routes_itself() -> None:
    assert [o["kind"] for o in serving_objects(STATES["canary-10"], on_endpoint=True)] == ["SeldonDeployment", "HTTPRoute"]
    # the override applies in clusters only: the local target's own router splits the local environment
    assert [o["kind"] for o in serving_objects(STATES["canary-10"], env_name="local", on_endpoint=True)] == ["SeldonDeployment"]
    specs, env, endpoint = quickstart(TrafficRouting(), on_endpoint=True)
    env = env.model_copy(update={"spec": env.spec.model_copy(update={"traffic": ROUTING})})
    assert render_route(endpoint, env, "ns", None, STATES["stable"]) is None  # the Endpoint's `seldon` wins


def test_the_gateways_namespace_defaults_to_the_routes_and_hostnames_are_kept() -> None:
    routing = TrafficRouting(router="gatewayAPI", parent_ref=GatewayParentRef(name="edge"), hostnames=["digits.example.com"])
    specs, env, endpoint = quickstart(routing)
    route = render_route(endpoint, env, "forge-quickstart", None, STATES["stable"])
    assert route is not None
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge",
                                            "namespace": "forge-quickstart"}]
    assert route["spec"]["hostnames"] == ["digits.example.com"]


def test_long_names_get_seldons_hashed_service_name() -> None:
    # Seldon Core v1.17.1's getPredictorKeyAutoGenerated: "seldon-" + md5 when the name passes 63 characters
    assert predictor_service("digits", "canary") == "digits-canary"
    name = "e" * 56 + "-canary"
    assert len(name) == 63 and predictor_service("e" * 56, "canary") == name
    assert predictor_service("e" * 57, "canary") == "seldon-" + hashlib.md5(("e" * 57 + "-canary").encode()).hexdigest()


BASE = """\
apiVersion: forge.dev/v1alpha1
kind: Dataset
metadata: {name: digits}
spec:
  source: {uri: "sklearn://digits", format: sklearn}
  version: "1"
  digest: sha256:1111111111111111111111111111111111111111111111111111111111111111
---
apiVersion: forge.dev/v1alpha1
kind: Compute
metadata: {name: cpu}
spec: {accelerator: {type: cpu}}
"""


def validate(tmp_path: Path, env_spec: str) -> tuple[int, list[dict]]:
    import json

    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "env.yaml").write_text("apiVersion: forge.dev/v1alpha1\nkind: Environment\nmetadata:\n  name: c\nspec:\n"
                                       + textwrap.indent(textwrap.dedent(env_spec), "  "))
    result = CliRunner().invoke(app, ["validate", str(tmp_path), "--output", "json"])
    return result.exit_code, [d for d in json.loads(result.stdout)["diagnostics"] if d["file"].endswith("env.yaml")]


@pytest.mark.parametrize(("spec", "line", "message"), [
    ("target: kubernetes\nkubernetes: {namespace: ns}\ntraffic:\n  router: gatewayAPI\n", 9,
     "`router: gatewayAPI` needs a `parentRef`"),
    ("target: kubernetes\nkubernetes: {namespace: ns}\ntraffic:\n  parentRef: {name: forge}\n", 9,
     "parentRef apply to `router: gatewayAPI` only"),
    ("target: kubernetes\nkubernetes: {namespace: ns}\ntraffic:\n  router: istio\n", 9, "'istio' is not allowed"),
    ("target: kubernetes\nkubernetes: {namespace: ns}\ntraffic:\n  router: gatewayAPI\n  parentRef: {name: forge, sectionName: HTTP}\n", 10,
     "'HTTP' does not match"),
    ("target: local\ntraffic:\n  router: gatewayAPI\n  parentRef: {name: forge}\n", 6,
     "`traffic.router: gatewayAPI` needs `target: kubernetes`"),
], ids=["no-parent", "parent-without-gateway", "unknown-router", "bad-section-name", "local-target"])
def test_bad_routing_is_a_diagnostic_with_its_line(tmp_path: Path, spec: str, line: int, message: str) -> None:
    code, diagnostics = validate(tmp_path, spec)
    assert code == 1
    found = [d for d in diagnostics if message in d["message"]]
    assert found, diagnostics
    assert found[0]["line"] == line, found[0]


def test_good_routing_validates(tmp_path: Path) -> None:
    code, diagnostics = validate(tmp_path, "target: kubernetes\nkubernetes: {namespace: ns}\ntraffic:\n  router: gatewayAPI\n"
                                           "  parentRef: {name: forge, namespace: gateway, sectionName: http}\n"
                                           "  hostnames: [digits.example.com]\n")
    assert code == 0 and diagnostics == []
