"""The HTTPRoutes Forge renders are accepted by the real kube-apiserver with the Gateway API's own
standard-channel CRDs (schema and CEL validation, server-side dry-run create), and a route that
breaks one of the CRD's CEL rules is refused with that rule's message: the judge bites."""

from __future__ import annotations

import copy

import pytest

from reconciler.errors import InvalidObjectError
from reconciler.targets.kubernetes.target import KubernetesTarget
from tests.renderers.test_gateway import STATES, serving_objects


def objects_in(namespace: str, case: str, sticky: dict[str, str] | None = None) -> list[dict]:
    objects = serving_objects(STATES[case], sticky=sticky)
    for obj in objects:
        obj["metadata"]["namespace"] = namespace
    return objects


@pytest.mark.parametrize("case", sorted(STATES))
def test_rendered_routes_pass_server_dry_run(kube_cluster, namespace, case: str) -> None:
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    for obj in objects_in(namespace, case):
        stored = target.apply(obj, dry_run=True)
        assert stored["metadata"]["name"] == "digits"
        if obj["kind"] == "HTTPRoute":
            # what the API server stored is what was rendered (nothing pruned by the schema)
            assert stored["spec"]["rules"] == obj["spec"]["rules"]
            assert stored["spec"]["parentRefs"] == obj["spec"]["parentRefs"]


@pytest.mark.parametrize("sticky", [{"header": "x-user-id"}, {"cookie": "uid"}], ids=["header", "cookie"])
def test_sticky_key_matches_pass_server_dry_run(kube_cluster, namespace, sticky: dict[str, str]) -> None:
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    route = next(o for o in objects_in(namespace, "arms", sticky) if o["kind"] == "HTTPRoute")
    assert any(r["name"].startswith("sticky-") for r in route["spec"]["rules"])
    stored = target.apply(route, dry_run=True)
    assert stored["spec"]["rules"] == route["spec"]["rules"]


def test_the_crds_cel_rules_judge_the_route(kube_cluster, namespace) -> None:
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    route = next(o for o in objects_in(namespace, "canary-10") if o["kind"] == "HTTPRoute")
    # a CEL rule of the rule schema (x-kubernetes-validations), not a plain type check
    redirect = copy.deepcopy(route)
    redirect["spec"]["rules"][-1]["filters"] = [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 302}}]
    with pytest.raises(InvalidObjectError, match="RequestRedirect filter must not be used together with backendRefs"):
        target.apply(redirect, dry_run=True)
    # a CEL rule over the parentRefs list
    twice = copy.deepcopy(route)
    twice["spec"]["parentRefs"].append(dict(twice["spec"]["parentRefs"][0]))
    with pytest.raises(InvalidObjectError, match="sectionName must be unique when parentRefs includes 2 or more references to the same parent"):
        target.apply(twice, dry_run=True)
    # and the OpenAPI bounds: a weight above 1,000,000
    heavy = copy.deepcopy(route)
    heavy["spec"]["rules"][-1]["backendRefs"][0]["weight"] = 1_000_001
    with pytest.raises(InvalidObjectError, match=r"weight"):
        target.apply(heavy, dry_run=True)
