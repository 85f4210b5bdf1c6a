"""Pruning on the real API server: a model removed with its endpoint goes in one apply."""

from __future__ import annotations

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
