"""The environment Lease on the real API server: renewed while an apply holds it, so a long apply
keeps its lock and a killed one frees it within the Lease's duration."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from reconciler.errors import LockHeldError
from reconciler.targets.kubernetes import target as kubernetes
from reconciler.targets.kubernetes.target import KubernetesTarget
from tests.polling import wait_until


def lease(target: KubernetesTarget) -> dict[str, Any]:
    return target._call("GET", target._lease_path("forgectl-cluster"), verb="get", ref="lease",
                        namespace=target.namespace)


def renewed(target: KubernetesTarget) -> datetime:
    return datetime.strptime(lease(target)["spec"]["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ")


def test_a_held_lease_is_renewed_until_released(kube_cluster, namespace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubernetes, "LEASE_RENEW_SECONDS", 0.3)
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    other = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    with target.lock(holder="alice@host:1"):
        first = renewed(target)
        wait_until(lambda: renewed(target) > first, timeout=10, what="the held Lease's renewTime to move forward")
        assert lease(target)["spec"]["leaseDurationSeconds"] == kubernetes.LEASE_SECONDS
        with pytest.raises(LockHeldError, match="locked by alice@host:1"):
            with other.lock(holder="bob@host:2"):
                pass
    with other.lock(holder="bob@host:2"):  # released on exit: the next apply takes it at once
        assert lease(other)["spec"]["holderIdentity"] == "bob@host:2"
