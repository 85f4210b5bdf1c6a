"""In a pod, nothing names a kubeconfig: the controller uses the pod's ServiceAccount token and the
cluster's CA (client-go's InClusterConfig). Here the pod's mounted files are a real token of a real
ServiceAccount (`kubectl create token`) and the API server's real CA, and the service address is
the test API server's."""

from __future__ import annotations

import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from reconciler.errors import ForbiddenError
from reconciler.resources import SYNC, ObjectRef
from reconciler.targets.kubernetes import kubeconfig
from reconciler.targets.kubernetes.target import KubernetesTarget


def test_in_a_pod_the_service_account_is_used(kube_cluster, namespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    admin = kube_cluster.kubeconfig
    run = ["kubectl", "--kubeconfig", admin, "-n", namespace]
    subprocess.run([*run, "create", "serviceaccount", "forge-controller"], check=True, capture_output=True)
    subprocess.run([*run, "create", "role", "sync-reader", "--verb=get", "--resource=syncs.forge.dev"], check=True, capture_output=True)
    subprocess.run([*run, "create", "rolebinding", "sync-reader", "--role=sync-reader",
                    f"--serviceaccount={namespace}:forge-controller"], check=True, capture_output=True)
    token = subprocess.run([*run, "create", "token", "forge-controller"], check=True, capture_output=True, text=True).stdout.strip()
    config = yaml.safe_load(Path(admin).read_text())
    server = urlsplit(config["clusters"][0]["cluster"]["server"])
    (tmp_path / "token").write_text(token)
    (tmp_path / "ca.crt").write_bytes(Path(config["clusters"][0]["cluster"]["certificate-authority"]).read_bytes())
    monkeypatch.setattr(kubeconfig, "IN_CLUSTER_TOKEN", tmp_path / "token")
    monkeypatch.setattr(kubeconfig, "IN_CLUSTER_CA", tmp_path / "ca.crt")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", server.hostname or "")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
    assert kubeconfig.in_cluster()

    target = KubernetesTarget("cluster", namespace)
    assert target.get_object(SYNC, namespace, "absent") is None  # allowed by the Role: a 404, not a 403
    with pytest.raises(ForbiddenError, match=f"system:serviceaccount:{namespace}:forge-controller"):
        target.get(ObjectRef("ConfigMap", namespace, "anything"))  # not granted: the token is the identity

    # a kubeconfig named anywhere wins over the pod's identity, as with client-go
    monkeypatch.setenv("KUBECONFIG", admin)
    assert not kubeconfig.in_cluster()
    assert KubernetesTarget("cluster", namespace).get(ObjectRef("ConfigMap", namespace, "anything")) is None
