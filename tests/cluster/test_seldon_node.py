"""Seldon Core v1.17.1's real operator on the one-node cluster (devkit.node.seldon).

A cluster of its own (with the CRDs, so SeldonDeployment is served) plus the node, and the
operator on the host as ``system:serviceaccount:seldon-system:seldon-manager`` with upstream's
RBAC. A SeldonDeployment shaped like the ones Forge renders (protocol v2, ``seldon.io/no-engine`` on each predictor,
one model container on 9000 named ``http``) whose model is busybox's httpd: the operator makes the
Deployment and Services, the pod becomes Ready, the predictor Service's ClusterIP answers from the
host (kube-proxy), the state becomes ``Available``; a canary predictor (80/20) gets a Deployment
and Service of its own; deleting the SeldonDeployment removes the Deployments (the
controller-manager's garbage collector, through the operator's ownerReferences). Needs root.
See docs/test-cluster.md, "Seldon Core on the node".
"""

from __future__ import annotations

import copy
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from devkit.cluster import Cluster
from devkit.node import seldon
from devkit.node.controllers import HostController
from devkit.node.node import Node
from tests.cluster import nodekit
from tests.polling import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NS = "default"
NAME = "iris"
GROUP, VERSION, PLURAL = "machinelearning.seldon.io", "v1", "seldondeployments"


def node_images() -> list[tuple[str, str]]:
    """No images of its own; Seldon's operator built the first time (see the docs for how long)."""
    seldon.ensure_binary()
    return []


@pytest.fixture(scope="module")
def env(shared_node: nodekit.SharedNode) -> tuple[Cluster, Node, HostController]:
    # the CRDs (SeldonDeployment among them) come from the cached etcd snapshot
    return shared_node.cluster, shared_node.node, shared_node.seldon()


@pytest.fixture(scope="module")
def api(env: tuple[Cluster, Node, HostController]) -> Iterator[client.ApiClient]:
    a = env[1].api()
    try:
        yield a
    finally:
        a.close()


def _model(image: str, body: str) -> dict[str, Any]:
    """The model container as Forge renders it (name ``model``, port 9000 named ``http``, a
    readiness probe), running busybox's httpd serving ``body``."""
    return {
        "name": "model", "image": image, "imagePullPolicy": "Never",
        "command": ["sh", "-c", f"mkdir -p /www && echo {body} > /www/index.html && exec httpd -f -p 9000 -h /www"],
        "ports": [{"name": "http", "containerPort": 9000, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/index.html", "port": 9000}, "periodSeconds": 1},
    }


def _predictor(name: str, image: str, traffic: int) -> dict[str, Any]:
    return {
        "name": name, "replicas": 1, "traffic": traffic,
        # where Forge puts it (renderers/seldon.py) and the controller reads it: on the predictor
        "annotations": {"seldon.io/no-engine": "true"},
        "componentSpecs": [{"spec": {"terminationGracePeriodSeconds": 1, "containers": [_model(image, f"served-by-{name}")]}}],
        "graph": {"name": "model", "type": "MODEL", "endpoint": {"type": "REST", "httpPort": 9000}, "children": []},
    }


def _sdep(image: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "SeldonDeployment",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"protocol": "v2", "predictors": [_predictor("stable", image, 100)]},
    }


def _owned(items: list[Any], uid: str) -> list[Any]:
    """Objects whose controller owner is the SeldonDeployment ``uid``."""
    return [o for o in items
            if any(r.controller and r.uid == uid and r.kind == "SeldonDeployment"
                   for r in o.metadata.owner_references or [])]


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.read().decode()
    except OSError:
        return None


def _predictor_service(core: client.CoreV1Api, uid: str, predictor: str) -> client.V1Service | None:
    """The Service the operator makes for ``predictor`` (selector on its Deployment's pods)."""
    svcs = [s for s in _owned(core.list_namespaced_service(NS).items, uid)
            if s.metadata.name == f"{NAME}-{predictor}"]
    return svcs[0] if svcs else None


def test_the_operator_reconciles_a_seldon_deployment(env: tuple[Cluster, Node, HostController],
                                                      api: client.ApiClient) -> None:
    _, node, ctl = env
    assert ctl.running()
    core, apps, crd = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    image = node.images["busybox"][1]
    sdep = _sdep(image)
    crd.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, sdep)
    try:
        uid = crd.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME)["metadata"]["uid"]

        # stable: the operator's Deployment, its pod Ready, its Service answering at the ClusterIP
        deps = wait_until(lambda: _owned(apps.list_namespaced_deployment(NS).items, uid), 60,
                          "the operator to create the stable predictor's Deployment", interval=0.5)
        assert len(deps) == 1, [d.metadata.name for d in deps]
        containers = deps[0].spec.template.spec.containers
        # no-engine: our model container only, no executor (whose port 8000 would also be `http`)
        assert [c.name for c in containers] == ["model"]
        assert [(p.name, p.container_port) for p in containers[0].ports if p.name == "http"] == [("http", 9000)]
        wait_until(lambda: (apps.read_namespaced_deployment(deps[0].metadata.name, NS).status.ready_replicas or 0) >= 1,
                   120, "the stable pod to be Ready", interval=0.5)
        svc = wait_until(lambda: _predictor_service(core, uid, "stable"), 60, "the stable predictor's Service",
                         interval=0.5)
        assert [p.port for p in svc.spec.ports if p.name == "http"] == [9000]
        body = wait_until(lambda: _get(f"http://{svc.spec.cluster_ip}:9000/"), 30,
                          "the stable Service's ClusterIP to answer", interval=0.5)
        assert body.strip() == "served-by-stable"
        wait_until(lambda: (crd.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME)
                            .get("status") or {}).get("state") == "Available", 120,
                   "the SeldonDeployment to be Available", interval=0.5)

        # canary: a second predictor, traffic 80/20; its own Deployment and Service
        cur = crd.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME)
        spec = copy.deepcopy(cur["spec"])
        spec["predictors"] = [p for p in spec["predictors"] if p["name"] == "stable"]
        spec["predictors"][0]["traffic"] = 80
        spec["predictors"].append(_predictor("canary", image, 20))
        crd.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME, {"spec": spec})
        deps = wait_until(lambda: (lambda d: d if len(d) == 2 else None)(
            _owned(apps.list_namespaced_deployment(NS).items, uid)), 60,
            "the operator to create the canary's Deployment", interval=0.5)
        assert sum("canary" in d.metadata.name for d in deps) == 1, [d.metadata.name for d in deps]
        csvc = wait_until(lambda: _predictor_service(core, uid, "canary"), 60, "the canary predictor's Service",
                          interval=0.5)
        assert csvc.spec.cluster_ip != svc.spec.cluster_ip
        body = wait_until(lambda: _get(f"http://{csvc.spec.cluster_ip}:9000/"), 120,
                          "the canary Service's ClusterIP to answer", interval=0.5)
        assert body.strip() == "served-by-canary"
        assert (_get(f"http://{svc.spec.cluster_ip}:9000/") or "").strip() == "served-by-stable"
        # the weights live in the spec only: without Istio or Ambassador nothing applies them, so a
        # test splits traffic itself by these (docs/test-cluster.md)
        live = crd.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME)
        assert {p["name"]: p["traffic"] for p in live["spec"]["predictors"]} == {"stable": 80, "canary": 20}
        wait_until(lambda: (crd.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME)
                            .get("status") or {}).get("state") == "Available", 120,
                   "the SeldonDeployment with its canary to be Available", interval=0.5)
    finally:
        crd.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME)

    # deleted: the garbage collector removes what the operator owned
    wait_until(lambda: not _owned(apps.list_namespaced_deployment(NS).items, uid), 90,
               "the Deployments to be garbage-collected", interval=0.5)
    wait_until(lambda: not _owned(core.list_namespaced_service(NS).items, uid), 90,
               "the Services to be garbage-collected", interval=0.5)
    assert ctl.running(), ctl.log_tail()[-3000:]
