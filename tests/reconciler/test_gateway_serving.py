"""A weight move through the Gateway API router, without a cluster: the route's status is read the
way the Gateway API defines `status.parents` (the node test reads it from the real Traefik), the
move counts only once the route is Accepted with ResolvedRefs for the generation written, and
`apply_serving` writes in the order that keeps every request on a predictor that exists.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from reconciler.errors import TargetError
from reconciler.load.loader import load_or_raise
from reconciler.resources import ObjectRef
from reconciler.traffic.gateway import RouteNotAdmitted, route_admission, wait_admitted
from reconciler.traffic.serving import apply_serving
from renderers.seldon import ServingState
from specs import Endpoint
from specs.traffic import GatewayParentRef, TrafficRouting

ROOT = Path(__file__).resolve().parents[2]
PARENT = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "forge", "namespace": "gateway",
          "sectionName": "http"}
CONTROLLER = "traefik.io/gateway-controller"


def condition(kind: str, status: str = "True", generation: int = 2, reason: str | None = None,
              message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "observedGeneration": generation,
            "reason": reason or (kind if status == "True" else "Invalid"), "message": message}


def route(*conditions: dict[str, Any], parent: Mapping[str, Any] = PARENT, generation: int = 2) -> dict[str, Any]:
    return {"kind": "HTTPRoute", "metadata": {"name": "digits", "namespace": "ns", "generation": generation},
            "spec": {"parentRefs": [dict(PARENT)]},
            "status": {"parents": [{"parentRef": dict(parent), "controllerName": CONTROLLER, "conditions": list(conditions)}]}}


def test_admitted_when_both_conditions_hold_for_this_generation() -> None:
    verdict = route_admission(route(condition("Accepted"), condition("ResolvedRefs")), PARENT)
    assert verdict.admitted and CONTROLLER in verdict.detail


@pytest.mark.parametrize(("obj", "words"), [
    (route(condition("Accepted")), "no ResolvedRefs condition"),
    (route(condition("Accepted"), condition("ResolvedRefs", "False", reason="BackendNotFound", message="digits-canary not found")),
     "ResolvedRefs False (BackendNotFound: digits-canary not found)"),
    (route(condition("Accepted", generation=1), condition("ResolvedRefs", generation=1)), "Accepted is of generation 1, the route is at 2"),
    (route(condition("Accepted", "False", reason="NotAllowedByListeners")), "Accepted False (NotAllowedByListeners)"),
    (route(condition("Accepted"), condition("ResolvedRefs"), parent={**PARENT, "sectionName": "https"}), "no status from Gateway gateway/forge listener http"),
    ({"kind": "HTTPRoute", "metadata": {"name": "digits", "namespace": "ns", "generation": 1}}, "does a controller"),
], ids=["no-resolvedrefs", "backend-not-found", "stale-generation", "not-accepted", "other-listener", "no-status"])
def test_not_admitted_says_why(obj: dict[str, Any], words: str) -> None:
    verdict = route_admission(obj, PARENT)
    assert not verdict.admitted
    assert words in verdict.detail


def test_a_parent_ref_written_without_defaults_matches_the_status_entry() -> None:
    # the API server defaults group, kind and the namespace; a controller may echo them either way
    bare = {"name": "forge", "sectionName": "http"}
    stored = route(condition("Accepted"), condition("ResolvedRefs"), parent=bare)
    stored["metadata"]["namespace"] = "gateway"
    assert route_admission(stored, PARENT).admitted


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_wait_reads_back_until_admitted() -> None:
    answers = [route(), route(condition("Accepted"), condition("ResolvedRefs", generation=1)),
               route(condition("Accepted"), condition("ResolvedRefs"))]
    reads: list[ObjectRef] = []

    def read(ref: ObjectRef) -> dict[str, Any]:
        reads.append(ref)
        return answers[min(len(reads) - 1, len(answers) - 1)]

    clock = Clock()
    stored = wait_admitted(read, answers[0], clock=clock, sleep=clock.sleep)
    assert stored is answers[2] and len(reads) == 3
    assert reads[0] == ObjectRef("HTTPRoute", "ns", "digits")


def test_wait_gives_up_with_the_status_words() -> None:
    clock = Clock()
    stuck = route(condition("Accepted"), condition("ResolvedRefs", "False", reason="BackendNotFound"))
    with pytest.raises(RouteNotAdmitted, match=r"not admitted after 5 s.*BackendNotFound"):
        wait_admitted(lambda _ref: stuck, stuck, timeout=5, clock=clock, sleep=clock.sleep)
    assert clock.now >= 5


# -- apply_serving's writes -------------------------------------------------------------------------------------


class Writer:
    """The part of a target apply_serving writes through: records each apply and plays a Gateway
    controller that admits a route (with status for the generation stored) when ``admit`` is set."""

    namespace = "forge-quickstart"

    def __init__(self, admit: bool = True) -> None:
        self.admit = admit
        self.applied: list[tuple[str, dict[str, Any]]] = []
        self.stored: dict[ObjectRef, dict[str, Any]] = {}

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        body = copy.deepcopy(dict(obj))
        ref = ObjectRef.of(body)
        generation = self.stored.get(ref, {}).get("metadata", {}).get("generation", 0) + 1
        body["metadata"]["generation"] = generation
        self.applied.append((body["kind"], body))
        self.stored[ref] = body
        return body

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        obj = copy.deepcopy(self.stored.get(ref))
        if obj is not None and self.admit:
            parent = obj["spec"]["parentRefs"][0]
            gen = obj["metadata"]["generation"]
            obj["status"] = {"parents": [{"parentRef": parent, "controllerName": CONTROLLER,
                                          "conditions": [condition("Accepted", generation=gen), condition("ResolvedRefs", generation=gen)]}]}
        return obj


@pytest.fixture(scope="module")
def gateway_quickstart():
    specs = load_or_raise([str(ROOT / "examples" / "quickstart")]).specs
    env = specs.environment("cluster")
    endpoint = specs.get(Endpoint, "digits")
    assert env is not None and endpoint is not None
    routing = TrafficRouting(router="gatewayAPI", parent_ref=GatewayParentRef(name="forge", section_name="http"))
    return specs, env.model_copy(update={"spec": env.spec.model_copy(update={"traffic": routing})}), env, endpoint


def weights(obj: dict[str, Any]) -> list[tuple[str, int]]:
    return [(b["name"], b["weight"]) for b in obj["spec"]["rules"][-1]["backendRefs"]]


def test_a_weight_move_applies_the_predictors_then_the_route_and_waits_for_it(gateway_quickstart) -> None:
    specs, env, _, endpoint = gateway_quickstart
    writer = Writer()
    stored = apply_serving(writer, specs, env, None, endpoint, ServingState("a" * 12, "b" * 12, 50),
                           current=ServingState("a" * 12, "b" * 12, 10), read_back=writer.get)
    assert [k for k, _ in writer.applied] == ["SeldonDeployment", "HTTPRoute"]
    assert stored["kind"] == "SeldonDeployment"
    assert weights(writer.applied[1][1]) == [("digits-stable", 50), ("digits-canary", 50)]


@pytest.mark.parametrize("after", [ServingState("b" * 12), ServingState("a" * 12)], ids=["promotion", "rollback"])
def test_dropping_the_canary_moves_the_route_first(gateway_quickstart, after: ServingState) -> None:
    specs, env, _, endpoint = gateway_quickstart
    writer = Writer()
    apply_serving(writer, specs, env, None, endpoint, after, current=ServingState("a" * 12, "b" * 12, 50), read_back=writer.get)
    assert [k for k, _ in writer.applied] == ["HTTPRoute", "SeldonDeployment"]
    assert weights(writer.applied[0][1]) == [("digits-stable", 100)]


def test_a_route_the_gateway_does_not_admit_fails_the_move(gateway_quickstart) -> None:
    specs, env, _, endpoint = gateway_quickstart
    writer = Writer(admit=False)
    with pytest.raises(RouteNotAdmitted, match="no status from Gateway forge-quickstart/forge listener http"):
        apply_serving(writer, specs, env, None, endpoint, ServingState("a" * 12, "b" * 12, 10),
                      current=ServingState("a" * 12, "b" * 12, 0), read_back=writer.get, admission_timeout=0.3)


def test_without_a_reader_the_move_is_refused_and_seldon_routing_writes_one_object(gateway_quickstart) -> None:
    specs, env, seldon_env, endpoint = gateway_quickstart
    with pytest.raises(TargetError, match="cannot read the route back"):
        apply_serving(Writer(), specs, env, None, endpoint, ServingState("a" * 12))
    writer = Writer()
    apply_serving(writer, specs, seldon_env, None, endpoint, ServingState("a" * 12, "b" * 12, 10))
    assert [k for k, _ in writer.applied] == ["SeldonDeployment"]
