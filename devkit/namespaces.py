"""Removing a namespace of the dev cluster (:class:`devkit.cluster.Cluster`) with what is in it: no
kube-controller-manager runs there, so nothing else empties it or removes its finalizer. Used by
the ``namespace`` fixture (tests/cluster_fixtures.py) and the rollout benches."""

from __future__ import annotations

import json
import time

from devkit.cluster import Cluster

#: Namespaced kinds emptied before the namespace itself is removed (without a namespace controller
#: the namespace would stay Terminating).
NAMESPACED = (
    ("argoproj.io/v1alpha1", "workflows"), ("argoproj.io/v1alpha1", "workflowtemplates"),
    ("argoproj.io/v1alpha1", "cronworkflows"),
    ("machinelearning.seldon.io/v1", "seldondeployments"),
    ("monitoring.coreos.com/v1", "servicemonitors"), ("monitoring.coreos.com/v1", "podmonitors"),
    ("monitoring.coreos.com/v1", "prometheusrules"),
    ("kubeflow.org/v1", "pytorchjobs"),
    ("coordination.k8s.io/v1", "leases"), ("events.k8s.io/v1", "events"),
    ("rbac.authorization.k8s.io/v1", "rolebindings"), ("rbac.authorization.k8s.io/v1", "roles"),
    ("v1", "configmaps"), ("v1", "secrets"), ("v1", "services"), ("v1", "serviceaccounts"),
    ("v1", "pods"), ("apps/v1", "deployments"),
)


def delete_namespace(cluster: Cluster, name: str) -> None:
    """Delete every object of the known kinds in ``name``, then the namespace itself."""
    raw = cluster.raw_client()
    for gv, plural in NAMESPACED:
        prefix = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        raw.request("DELETE", f"{prefix}/namespaces/{name}/{plural}")  # 404 when a CRD is absent
    status, _ = raw.request("DELETE", f"/api/v1/namespaces/{name}")
    if status == 404:
        return
    # without a namespace controller the "kubernetes" finalizer is never removed: do it here
    for _ in range(50):
        status, ns = raw.request("GET", f"/api/v1/namespaces/{name}")
        if status == 404:
            return
        ns["spec"]["finalizers"] = []
        status, _ = raw.request("PUT", f"/api/v1/namespaces/{name}/finalize", json.dumps(ns).encode())
        if status in (200, 404):
            return
        time.sleep(0.1)
