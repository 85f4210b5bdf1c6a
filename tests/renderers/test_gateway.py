"""The Gateway API router (`traffic.router: gatewayAPI`): the HTTPRoute per Endpoint, pinned by
golden files with the SeldonDeployment it routes to; the default (`seldon`) renders nothing new;
the spec's own checks, with file and line.

Refresh the golden files after an intended change with: `scripts/test tests/renderers --update-golden`.
"""

from __future__ import annotations

import hashlib
import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from forgectl.cli import app
from reconciler.load.loader import load_or_raise
from reconciler.plan.prerequisites import check
from reconciler.present.manifests import to_yaml_stream
from renderers import RenderContext, ServingState, render
from renderers.gateway import PREDICTOR_HEADER, predictor_service, render_route, route_weights
from renderers.keybuckets import bucket_of
from renderers.prerequisites import cluster_requirements
from renderers.seldon import ArmServing
from renderers.stepargs import decode_step_config
from specs import Endpoint
from specs.experiment import Experiment, Shadow
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


def with_sticky(specs, endpoint: Endpoint, sticky: dict[str, str]):
    """``specs`` whose `digits` Endpoint runs STATES["arms"]' experiment, sticky by ``sticky``."""
    experiment = Experiment.model_validate({"arms": [{"name": "control", "share": 70}, {"name": "treatment", "share": 30}],
                                            "sticky": sticky, "primary": {"kind": "success-rate"}})
    endpoint = endpoint.model_copy(update={"spec": endpoint.spec.model_copy(update={"experiment": experiment})})
    return type(specs)(tuple(endpoint if d.kind == "Endpoint" and d.name == "digits" else d for d in specs.documents))


def serving_objects(state: ServingState, routing: TrafficRouting | None = ROUTING, *, sticky: dict[str, str] | None = None,
                    **kw) -> list[dict]:
    specs, env, endpoint = quickstart(routing, **kw)
    if sticky is not None:
        specs = with_sticky(specs, endpoint, sticky)
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


def _sticky_rules(route: dict) -> dict[str, dict]:
    return {r["name"].removeprefix("sticky-"): r for r in route["spec"]["rules"] if r["name"].startswith("sticky-")}


def test_a_sticky_experiment_routes_each_key_by_its_prefix_before_the_split() -> None:
    _, route = serving_objects(STATES["arms"], sticky={"header": "x-user-id"})
    names = [r["name"] for r in route["spec"]["rules"]]
    # by name first (a caller naming its arm wins), then by key, then the split for callers without one
    assert names == ["predictor-control", "predictor-treatment", "sticky-control", "sticky-treatment", "split"]
    rules = _sticky_rules(route)
    assert {arm: r["backendRefs"][0]["name"] for arm, r in rules.items()} == {"control": "digits-control",
                                                                             "treatment": "digits-treatment"}
    patterns = {arm: re.compile(r["matches"][0]["headers"][0]["value"]) for arm, r in rules.items()}
    assert {r["matches"][0]["headers"][0]["name"] for r in rules.values()} == {"x-user-id"}
    # 70 / 30 of the key space, each key in one arm
    counts = {"control": 0, "treatment": 0}
    for bucket in range(4096):
        key = f"{bucket:03x}e4c1-9b2f-4c1d"
        (arm,) = [a for a, p in patterns.items() if p.search(key)]
        counts[arm] += 1
    assert counts == {"control": 2867, "treatment": 1229}
    # a key with no hex prefix reaches no sticky rule: the split decides
    assert not any(p.search("user-42") for p in patterns.values())
    assert bucket_of("user-42") is None


def test_a_sticky_cookie_is_matched_inside_the_cookie_header() -> None:
    _, route = serving_objects(STATES["arms"], sticky={"cookie": "uid"})
    rules = _sticky_rules(route)
    patterns = {arm: re.compile(r["matches"][0]["headers"][0]["value"]) for arm, r in rules.items()}
    assert {r["matches"][0]["headers"][0]["name"] for r in rules.values()} == {"cookie"}

    def arm(cookie: str) -> list[str]:
        return [a for a, p in patterns.items() if p.search(cookie)]

    assert arm("uid=0a1b2c") == ["control"] and arm("theme=dark; uid=ffe0") == ["treatment"]
    assert arm("xuid=0a1b2c") == [] and arm("theme=uid") == []  # another cookie's name or value is no key


def test_without_arms_or_sticky_there_are_no_sticky_rules() -> None:
    _, route = serving_objects(STATES["arms"])  # an experiment without `sticky`
    assert not _sticky_rules(route)
    _, route = serving_objects(STATES["canary-10"], sticky={"header": "x-user-id"})  # no experiment running
    assert not _sticky_rules(route)


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


def with_shadow(specs, endpoint: Endpoint, percent: int = 25, protocol: str = "v2"):
    """``specs`` whose `digits` Endpoint has a shadow getting ``percent`` of the requests."""
    spec = endpoint.spec.model_copy(update={"shadow": Shadow(percent=percent), "protocol": protocol})
    endpoint = endpoint.model_copy(update={"spec": spec})
    return type(specs)(tuple(endpoint if d.kind == "Endpoint" and d.name == "digits" else d for d in specs.documents))


def _shadow_render(routing: TrafficRouting | None, protocol: str = "v2") -> tuple[dict, dict[str, dict]]:
    """The SeldonDeployment of the quick-start at canary 10 % with a shadow, and each predictor's serve config."""
    specs, env, endpoint = quickstart(routing)
    specs = with_shadow(specs, endpoint, protocol=protocol)
    manifests = render(specs, RenderContext(env, revision="0123456789ab", serving={"digits": STATES["canary-10"]})).manifests
    sdep = next(m for m in manifests if m["kind"] == "SeldonDeployment")
    return sdep, {p["name"]: decode_step_config(p["componentSpecs"][0]["spec"]["containers"][0]) for p in sdep["spec"]["predictors"]}


def test_under_a_route_the_live_servers_copy_requests_to_the_shadows_service() -> None:
    sdep, configs = _shadow_render(ROUTING)
    namespace = sdep["metadata"]["namespace"]
    mirror = {"url": f"http://{predictor_service('digits', 'shadow')}.{namespace}.svc:9000", "percent": 25,
              "maxInFlight": 16, "timeoutMs": 2000}
    assert configs["stable"]["mirror"] == mirror and configs["canary"]["mirror"] == mirror
    assert "mirror" not in configs["shadow"]  # the shadow copies nothing on
    route = next(m for m in serving_objects(STATES["canary-10"]) if m["kind"] == "HTTPRoute")
    assert "digits-shadow" not in str(route)  # the gateway never sends callers to it
    # no mirror needed of the cluster: the servers copy, and doctor says so
    requirements = cluster_requirements([sdep])
    found = {(r.kind, r.name) for r in requirements}
    assert ("TrafficMirror", "digits") not in found and ("ShadowCopies", "digits") in found
    [copies] = check(None, [r for r in requirements if r.kind == "ShadowCopies"])  # type: ignore[arg-type]  # asks no API
    assert copies.status == "ok" and "live predictors copy" in copies.detail


def test_seldons_own_router_and_the_seldon_protocol_copy_nothing() -> None:
    _, configs = _shadow_render(None)  # Istio mirrors (Seldon's `shadow: true`)
    assert not any("mirror" in c for c in configs.values())
    sdep, configs = _shadow_render(ROUTING, protocol="seldon")  # the v1 wrapper does not copy
    assert not any("mirror" in c for c in configs.values())
    assert [r.name for r in cluster_requirements([sdep]) if r.kind == "TrafficMirror"] == ["digits"]


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
