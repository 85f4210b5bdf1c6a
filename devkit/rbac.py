"""forgectl's RBAC on the test cluster: the ClusterRoles of docs/rbac/forgectl-role.yaml and
their bindings to the ``forgectl`` user."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from devkit.apiclient import RawClient
from devkit.common import REPO_ROOT, ClusterError

if TYPE_CHECKING:
    from devkit.cluster import Cluster

RBAC_FILE = REPO_ROOT / "docs" / "rbac" / "forgectl-role.yaml"


FORGECTL_USER = "forgectl"
FORGECTL_GROUP = "forge:controllers"


def forgectl_rbac_documents() -> list[dict[str, Any]]:
    import yaml

    return [d for d in yaml.safe_load_all(RBAC_FILE.read_text()) if d]


def install_forgectl_rbac(cluster: Cluster) -> None:
    """Create the ClusterRoles from docs/rbac/forgectl-role.yaml and bind the namespace reader and
    the queue writer (Kueue's cluster-scoped objects) cluster-wide to the ``forgectl`` user (the
    workload role is bound per namespace)."""
    raw = cluster.raw_client()
    for doc in forgectl_rbac_documents():
        apply(raw, doc)
    for role in ("forgectl-namespace-reader", "forgectl-queues"):
        apply(raw, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": FORGECTL_USER}],
        })


def bind_forgectl(cluster: Cluster, namespace: str) -> None:
    """RoleBinding in ``namespace`` granting ClusterRole ``forgectl`` to the ``forgectl`` user."""
    apply(cluster.raw_client(), {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "forgectl", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "forgectl"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": FORGECTL_USER}],
    })


_PLURAL = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
           "RoleBinding": "rolebindings", "Role": "roles"}


def apply(raw: RawClient, doc: dict[str, Any]) -> None:
    """Server-side apply one RBAC object (Role, ClusterRole, RoleBinding, ClusterRoleBinding)."""
    group, version = doc["apiVersion"].split("/")
    ns = doc["metadata"].get("namespace")
    path = f"/apis/{group}/{version}/" + (f"namespaces/{ns}/" if ns else "") + \
        f"{_PLURAL[doc['kind']]}/{doc['metadata']['name']}?fieldManager=forge-test-setup&force=true"
    status, resp = raw.request("PATCH", path, json.dumps(doc).encode(), "application/apply-patch+yaml")
    if status not in (200, 201):
        raise ClusterError(f"applying {doc['kind']} {doc['metadata']['name']}: HTTP {status}: {resp}")
