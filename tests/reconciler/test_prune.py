"""Pruning on the real API server: a model removed with its endpoint goes in one apply."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def forgectl(*args: str, kubeconfig: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": kubeconfig, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "forgectl", *args], capture_output=True, text=True, env=env, timeout=180)


def test_removing_a_model_and_its_endpoint_converges_in_one_apply(kube_cluster, namespace, tmp_path) -> None:
    specs = tmp_path / "quickstart"
    shutil.copytree(ROOT / "examples" / "quickstart", specs)
    common = ["--env", "cluster", "-n", namespace]
    first = forgectl("apply", str(specs), *common, "--auto-approve", kubeconfig=kube_cluster.kubeconfig)
    assert first.returncode == 0, first.stdout + first.stderr
    (specs / "endpoint.yaml").unlink()
    (specs / "model.yaml").unlink()
    second = forgectl("apply", str(specs), *common, "--auto-approve", kubeconfig=kube_cluster.kubeconfig)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "delete  Workflow" in second.stdout  # its Workflow went with the SeldonDeployment that served it
    after = forgectl("plan", str(specs), *common, "--detailed-exitcode", kubeconfig=kube_cluster.kubeconfig)
    assert after.returncode == 0, after.stdout + after.stderr


def test_down_in_a_cluster_deletes_what_forge_owns_and_nothing_else(kube_cluster, namespace, tmp_path) -> None:
    """`forgectl down --env cluster`: shown, confirmed, then every owned object deleted; an object
    opted out of pruning and one Forge does not own stay; a second `down` has nothing to do."""
    from kubernetes import client

    specs = tmp_path / "quickstart"
    shutil.copytree(ROOT / "examples" / "quickstart", specs)
    common = ["--env", "cluster", "-n", namespace]
    first = forgectl("apply", str(specs), *common, "--auto-approve", kubeconfig=kube_cluster.kubeconfig)
    assert first.returncode == 0, first.stdout + first.stderr
    core = client.CoreV1Api(kube_cluster.api_client())
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="not-forges")))
    kept = core.list_namespaced_config_map(namespace, label_selector="app.kubernetes.io/managed-by=forgectl").items[0]
    core.patch_namespaced_config_map(kept.metadata.name, namespace,
                                     {"metadata": {"annotations": {"forge.dev/prune": "disabled"}}})
    refused = forgectl("down", str(specs), *common, kubeconfig=kube_cluster.kubeconfig)
    assert refused.returncode != 0 and "--auto-approve" in refused.stderr, refused.stdout + refused.stderr
    assert forgectl("plan", str(specs), *common, "--detailed-exitcode",
                    kubeconfig=kube_cluster.kubeconfig).returncode == 0  # all still there: nothing was deleted
    down = forgectl("down", str(specs), *common, "--auto-approve", "-o", "json", kubeconfig=kube_cluster.kubeconfig)
    assert down.returncode == 0, down.stdout + down.stderr
    report = json.loads(down.stdout)
    deleted = {(e["ref"]["kind"], e["ref"]["name"]) for e in report["changeset"]["entries"] if e["outcome"] == "deleted"}
    assert {k for k, _ in deleted} >= {"Workflow", "SeldonDeployment", "PodMonitor", "PrometheusRule", "Role"}, deleted
    # the workspace claim (models, checkpoints) opts out of pruning, so its namespace stays with it
    assert ("ConfigMap", kept.metadata.name) not in deleted and ("PersistentVolumeClaim", "forge-workspace") not in deleted
    namespace_change = next(c for c in report["plan"]["changes"] if c["ref"]["kind"] == "Namespace")
    assert namespace_change["action"] == "no-op" and any("PersistentVolumeClaim" in r for r in namespace_change["reasons"])
    owned = forgectl("plan", str(specs), *common, "-o", "json", kubeconfig=kube_cluster.kubeconfig)
    # what is still listed is either kept or on its way out (this API server has no controller to
    # finish a namespace's or a claim's deletion: their finalizers stay)
    live = {(c["ref"]["kind"], c["ref"]["name"]) for c in json.loads(owned.stdout)["changes"]
            if c["action"] != "create" and not c["before"]["metadata"].get("deletionTimestamp")}
    assert live == {("ConfigMap", kept.metadata.name), ("PersistentVolumeClaim", "forge-workspace"),
                    ("Namespace", namespace)}, live
    again = forgectl("down", str(specs), *common, "--auto-approve", kubeconfig=kube_cluster.kubeconfig)
    assert again.returncode == 0 and "No changes" in again.stdout, again.stdout + again.stderr
    assert core.read_namespaced_config_map("not-forges", namespace).metadata.name == "not-forges"
