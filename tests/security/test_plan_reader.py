"""The read-only credential of docs/rbac/forgectl-plan-reader.yaml, on the real test cluster: a
pull-request plan gets its live diff with it (read verbs only), and the same credential cannot
apply anything."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from devkit.cluster import Cluster
from devkit.rbac import apply as apply_rbac
from devkit.rbac import install_forgectl_rbac
from tests.polling import WaitTimeout, wait_until
from tests.security.helpers import BASE, Project, Run

ROOT = Path(__file__).resolve().parents[2]
READER_FILE = ROOT / "docs" / "rbac" / "forgectl-plan-reader.yaml"
USER = "forge-pr-plan"


def _bind_reader(cluster: Cluster, namespace: str) -> Path:
    raw = cluster.raw_client()
    install_forgectl_rbac(cluster)  # ClusterRole forgectl-namespace-reader (read-only)
    for doc in yaml.safe_load_all(READER_FILE.read_text()):
        if doc:
            apply_rbac(raw, doc)
    role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole"}
    subject = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]
    apply_rbac(raw, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                            "metadata": {"name": "forgectl-plan-reader", "namespace": namespace},
                            "roleRef": {**role, "name": "forgectl-plan-reader"}, "subjects": subject})
    apply_rbac(raw, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                            "metadata": {"name": f"forgectl-namespace-reader-{USER}"},
                            "roleRef": {**role, "name": "forgectl-namespace-reader"}, "subjects": subject})
    return cluster.user_kubeconfig(USER, [], namespace)


def test_pull_request_plan_with_the_read_only_role(kube_cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    if kube_cluster.external:
        import pytest

        pytest.skip("needs the client CA of a cluster started by the tests")
    kubeconfig = _bind_reader(kube_cluster, namespace)
    project = Project.create(tmp_path, BASE.replace("namespace: team-a", f"namespace: {namespace}"))
    project.git_init()
    project.write("base.yaml", BASE.replace("namespace: team-a", f"namespace: {namespace}").replace(
        "{type: mlp}}", "{type: mlp}, hyperparameters: {epochs: 3}}"))
    last: list[list[str]] = []

    def live_plan() -> tuple[Run, list[str]] | None:
        run = project.run("plan", "specs", "--base", "HEAD", "--env", "cluster", "-o", "json",
                          "--kubeconfig", str(kubeconfig))
        assert run.returncode == 0, run.output
        notes = json.loads(run.stdout)["notes"]
        last[:] = [notes]
        return (run, notes) if any(n.startswith("live: ") for n in notes) else None

    # RBAC is served from an informer cache, so the new bindings take a moment; each try is a whole
    # `forgectl plan` (seconds on a busy machine), so the deadline is generous: it only bounds a failure.
    try:
        run, notes = wait_until(live_plan, 120, "a pull-request plan with a live diff under the read-only role", interval=0.5)
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}; the last plan's notes: {last}") from None
    assert any(n.startswith("live: ") and "read-only" in n for n in notes), notes
    data = json.loads(run.stdout)
    assert data["live"]["summary"]["create"] >= 1

    applied = project.run("apply", "specs", "--env", "cluster", "--auto-approve", "--kubeconfig", str(kubeconfig))
    assert applied.returncode == 1
    assert "forbidden: cannot" in applied.stderr, applied.stderr
