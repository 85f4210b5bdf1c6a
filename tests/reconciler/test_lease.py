"""The environment Lease on the real API server: renewed while an apply holds it, so a long apply
keeps its lock and a killed one frees it within the Lease's duration; every write fenced by it
(a holder that lost it sends nothing more), and the preconditions of an apply's writes enforced by
the API server (a resourceVersion that moved, an object that appeared: 409)."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

from reconciler.errors import ApplyFailed, ConflictError, LeaseLost, LockHeldError
from reconciler.plan.apply import Outcome, apply_plan
from reconciler.plan.diff import field_diff
from reconciler.plan.plan import Action, Change, Plan
from reconciler.resources import BY_KIND, ObjectRef
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


# -- fencing: a holder that lost its Lease writes nothing more (issue 35) --------------------------------


@dataclass
class PausableClock:
    """The first holder's monotonic clock: it runs with the real one, and jumps as it does for a
    process stopped (SIGSTOP) and resumed — the pause made deterministic."""

    skipped: float = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped


def configmap(namespace: str, name: str, value: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "data": {"value": value}}


def updates(target: KubernetesTarget, namespace: str, names: list[str], value: str) -> Plan:
    """A plan that updates each ConfigMap to ``value``, made against what is live now."""
    changes = []
    for name in names:
        live = target.get(ObjectRef("ConfigMap", namespace, name))
        assert live is not None
        want = configmap(namespace, name, value)
        changes.append(Change(ObjectRef.of(want), Action.UPDATE, live, want, live_version=live["metadata"]["resourceVersion"]))
    return Plan("cluster", "kubernetes", tuple(changes), "fp", None)


def versions(target: KubernetesTarget, namespace: str, names: list[str]) -> dict[str, tuple[str, str]]:
    out = {}
    for name in names:
        live = target.get(ObjectRef("ConfigMap", namespace, name))
        assert live is not None
        out[name] = (live["metadata"]["resourceVersion"], live["data"]["value"])
    return out


def test_a_paused_holder_whose_lease_was_taken_over_writes_nothing_more(kube_cluster, namespace,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The first apply writes one object, then "pauses" past its Lease: the Lease expires on the
    server, a second target takes it over and writes. Resumed, the first apply's next write is
    refused before it is sent (LeaseLost): the objects it had not written keep their
    resourceVersions, and the second holder's write stands."""
    monkeypatch.setattr(kubernetes, "LEASE_SECONDS", 2)
    monkeypatch.setattr(kubernetes, "LEASE_RENEW_SECONDS", 3600)  # the renewer stays asleep: paused with the rest
    monkeypatch.setattr(kubernetes, "LEASE_MARGIN_SECONDS", 0.5)
    first = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    second = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    clock = first.clock = PausableClock()
    names = [f"fenced-{i}" for i in range(6)]
    for name in names:
        first.apply(configmap(namespace, name, "v1"))
    plan = updates(first, namespace, names, "v2")
    second_holds = ExitStack()

    def take(stack: ExitStack) -> bool:
        stack.enter_context(second.lock(holder="second@host:2"))  # LockHeldError until it has expired
        return True

    def pause_after_the_first(change: Change, outcome: Outcome) -> None:
        if change.ref.name != names[0]:
            return
        wait_until(lambda: take(second_holds), timeout=60, what="the second target to take the expired Lease over",
                   interval=0.2, ignore=(LockHeldError,))
        second.apply(configmap(namespace, names[-1], "second"))  # the new holder acts
        clock.skipped += 3600  # … and the first process resumes, an hour later on its monotonic clock

    before = versions(first, namespace, names)
    try:
        with first.lock(holder="first@host:1") as fence:
            with pytest.raises(LeaseLost, match="no longer held by first@host:1") as err:
                apply_plan(plan, first, progress=pause_after_the_first, parallelism=1)
            assert not fence.held
        assert "1 change(s) were applied before" in str(err.value) and "not renewed in time" in str(err.value)
        after = versions(second, namespace, names)
        assert after[names[0]][1] == "v2"  # written before the pause
        for name in names[1:-1]:
            assert after[name] == before[name], name  # never written: same resourceVersion, same data
        assert after[names[-1]][1] == "second"  # the new holder's write stands
        assert lease(second)["spec"]["holderIdentity"] == "second@host:2"  # the first did not release it
    finally:
        second_holds.close()


def test_the_renewer_notices_a_lease_taken_over_and_the_next_write_is_refused(kube_cluster, namespace,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Another holder writes the Lease (as a take-over would) while the first still holds it by
    its deadline: the first's next renewal (a PUT at the version it stored) fails, it reads the
    Lease back, sees the other holder, and the fence is lost at once — no write waits for the
    deadline."""
    monkeypatch.setattr(kubernetes, "LEASE_RENEW_SECONDS", 0.3)
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    target.apply(configmap(namespace, "probe", "x"))

    def take_over() -> bool:  # a PUT at the version just read: refused (409) when a renewal came between
        current = lease(target)
        current["spec"]["holderIdentity"] = "mallory@host:6"
        target._call("PUT", target._lease_path("forgectl-cluster"), verb="update", ref="lease", namespace=namespace, body=current)
        return True

    with target.lock(holder="alice@host:1") as fence:
        wait_until(take_over, timeout=30, what="the Lease rewritten by another holder", ignore=(ConflictError,))
        wait_until(lambda: not fence.held, timeout=30, what="the renewer to find the Lease taken over")
        assert "taken over by mallory@host:6" in (fence.lost or "")
        rv = versions(target, namespace, ["probe"])
        with pytest.raises(LeaseLost, match="taken over by mallory@host:6"):
            target.apply(configmap(namespace, "probe", "after"))
        assert versions(target, namespace, ["probe"]) == rv
    assert lease(target)["spec"]["holderIdentity"] == "mallory@host:6"  # not released: it is not ours


# -- preconditions the API server enforces ----------------------------------------------------------------


def test_an_update_planned_at_a_resource_version_that_moved_is_refused(kube_cluster, namespace) -> None:
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    target.apply(configmap(namespace, "stale", "v1"))
    plan = updates(target, namespace, ["stale"], "v2")  # read at v1's resourceVersion …
    target.merge_patch(ObjectRef("ConfigMap", namespace, "stale"), {"data": {"value": "by-hand"}}, "kubectl-edit")
    moved = versions(target, namespace, ["stale"])
    with pytest.raises(ApplyFailed) as err:  # … applied after someone else changed it
        apply_plan(plan, target)
    cause = err.value.__cause__
    assert isinstance(cause, ConflictError) and cause.status == 409
    assert "changed since the plan read it" in str(err.value)
    assert versions(target, namespace, ["stale"]) == moved  # refused by the API server: nothing written


def test_an_update_whose_object_moved_only_in_what_forge_does_not_render_is_written_as_planned(
        kube_cluster, namespace) -> None:
    """An operator writing its object's status (or anyone a label) after the plan read it moves
    the resourceVersion; read again, the plan's change is still exactly what the write makes, so
    it is written at the new version (the API server still enforces that one), the other
    writer's field kept. A change to a field Forge renders is refused (the test above)."""
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    target.apply(configmap(namespace, "moved", "v1"))
    live = target.get(ObjectRef("ConfigMap", namespace, "moved"))
    assert live is not None
    want = configmap(namespace, "moved", "v2")
    change = Change(ObjectRef.of(want), Action.UPDATE, live, want, tuple(field_diff(want, live)),
                    live_version=live["metadata"]["resourceVersion"])
    assert change.diff
    target.merge_patch(ObjectRef("ConfigMap", namespace, "moved"), {"metadata": {"labels": {"touched": "yes"}}},
                       "kubectl-label")
    assert versions(target, namespace, ["moved"])["moved"][0] != change.live_version
    changeset = apply_plan(Plan("cluster", "kubernetes", (change,), "fp", None), target)
    assert changeset.count(Outcome.CONFIGURED) == 1
    now = target.get(ObjectRef("ConfigMap", namespace, "moved"))
    assert now is not None and now["data"]["value"] == "v2" and now["metadata"]["labels"]["touched"] == "yes", now


def test_a_create_planned_for_an_absent_object_is_refused_once_it_exists(kube_cluster, namespace) -> None:
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    target.apply(configmap(namespace, "probe", "x"))
    want = configmap(namespace, "raced", "ours")
    plan = Plan("cluster", "kubernetes", (Change(ObjectRef.of(want), Action.CREATE, None, want),), "fp", None)
    target.create(BY_KIND["ConfigMap"], configmap(namespace, "raced", "theirs"))  # created after the plan read
    with pytest.raises(ApplyFailed) as err:
        apply_plan(plan, target)
    assert isinstance(err.value.__cause__, ConflictError) and "exists, though the plan saw none" in str(err.value)
    assert versions(target, namespace, ["raced"])["raced"][1] == "theirs"


def test_a_create_is_owned_as_a_server_side_apply_would_own_it(kube_cluster, namespace) -> None:
    """Created create-only (POST), the object's fields are forgectl's by `Apply` — so a later apply
    that leaves a label out removes it, as it would had the object been created by an apply."""
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    target.apply(configmap(namespace, "probe", "x"))
    want = configmap(namespace, "owned", "v1", team="a", old="yes")
    apply_plan(Plan("cluster", "kubernetes", (Change(ObjectRef.of(want), Action.CREATE, None, want),), "fp", None), target)
    live = target.get(ObjectRef("ConfigMap", namespace, "owned"))
    assert live is not None
    entries = [(f["manager"], f["operation"]) for f in live["metadata"]["managedFields"]]
    assert entries == [("forgectl", "Apply")], entries
    target.apply(configmap(namespace, "owned", "v2", team="a"))
    live = target.get(ObjectRef("ConfigMap", namespace, "owned"))
    assert live is not None and live["metadata"]["labels"] == {"team": "a"} and live["data"] == {"value": "v2"}
