"""GPU pools as real Kueue queues on the node: the real Kueue v0.17.0 controller manager
(devkit.node.kueue) admits, gates, lends and reclaims what Forge renders for two teams' pools.

The node advertises ``nvidia.com/gpu: 8`` and the pools' node label (devkit.node.extended_resources),
so quota arithmetic and the scheduler's fit are real while busybox never touches a device. Two teams
deploy the same queued pool (a ``Compute`` with ``queue``: 2 GPUs of nominal quota, up to 2 borrowed,
one cohort) into namespaces of their own; its ResourceFlavor, ClusterQueues, LocalQueues and
WorkloadPriorityClasses are Forge's own rendering (renderers/queues.py ``render_queues``), and each
pod carries the labels Forge puts on a queued train pod (``queue_labels``).

1. Team A submits six 1-GPU pods while team B is idle: Kueue's pod webhook gates each one
   (``kueue.x-k8s.io/admission``) and makes a Workload of it; four are admitted (2 nominal + 2
   borrowed from B's idle quota: the borrowing limit), run, and the ClusterQueue reports 2 GPUs
   borrowed; the other two stay gated — Pending with the gate, never unschedulable — with their
   Workloads pending for quota.
2. Team B submits two: Kueue reclaims its lent quota by preempting two of A's admitted workloads
   (``Preempted``, reason ``InCohortReclamation``; their pods are stopped), and admits B's two.

Everything is read from the API server (Workloads' conditions, pods' gates and phases, the
ClusterQueues' status): the test admits, gates and preempts nothing itself. Needs root.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devkit import pools
from devkit.node import extended_resources, kueue
from devkit.node.controllers import apply_docs
from renderers.queues import ADMISSION_GATE, QUEUE_NAME, queue_labels, queue_object_name, render_queues
from specs import Compute, Environment
from tests.cluster import nodekit
from tests.polling import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TEAM_A, TEAM_B = "forge-kueue-a", "forge-kueue-b"
POOL = "gpu-pool"
GPU = "nvidia.com/gpu"
NODE_LABELS = pools.GPU_NODE_LABELS  # the pool's nodeSelector: its flavor's nodeLabels
PRIORITY = "forge-high"  # the PriorityClass a train pod of a `high` pool runs at (renderers/pods.py)
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
WAIT = 180.0  # bounds a failure only (a loaded 2-core machine); never what is measured

SPECS = pools.environment(TEAM_A) + "---\n" + pools.queued_pool(
    POOL, gpus_per_node=8, min_gpus=1, max_gpus=4, quota=2, cohort="forge-kueue-test", borrowing_limit=2)


def node_images() -> list[tuple[str, str]]:
    """No images of its own (busybox is the node's); Kueue's manager built the first time (a long
    build: docs/test-cluster.md)."""
    kueue.ensure_binary()
    return []


def _specs() -> tuple[Compute, Environment, Any]:
    return pools.load_pool(SPECS, POOL, "specs.yaml")


@pytest.fixture(scope="module")
def stack(shared_node: nodekit.SharedNode) -> Iterator[tuple[Any, Compute, Environment]]:
    shared_node.kueue()
    node = shared_node.node
    extended_resources.advertise(node, {GPU: "8"}, NODE_LABELS)
    wait_until(lambda: extended_resources.advertised(node).get(GPU) == "8", 60, f"the node advertising 8 {GPU}")
    compute, env, specs = _specs()
    objects: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        for ns in (TEAM_A, TEAM_B):
            stack.enter_context(shared_node.namespace(ns, labels=kueue.MANAGED_NAMESPACES))
            objects += render_queues(specs, env, ns, "0123456789ab", {PRIORITY})
        api = node.api()
        stack.callback(api.close)
        stack.callback(_delete_cluster_objects, api, objects)
        apply_docs(node, objects)  # server-side apply, as forgectl applies (the teams' one flavor: one object)
        yield api, compute, env


def _delete_cluster_objects(api: Any, objects: list[dict[str, Any]]) -> None:
    custom = client.CustomObjectsApi(api)
    plural = {"ClusterQueue": "clusterqueues", "ResourceFlavor": "resourceflavors",
              "WorkloadPriorityClass": "workloadpriorityclasses"}
    for obj in objects:
        if obj["kind"] in plural:
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(GROUP, VERSION, plural[obj["kind"]], obj["metadata"]["name"])


def _pod(name: str, labels: dict[str, str], image: str) -> client.V1Pod:
    gpu = {"cpu": "50m", "memory": "32Mi", GPU: "1"}
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            restart_policy="Never", termination_grace_period_seconds=1,
            containers=[client.V1Container(name="train", image=image, image_pull_policy="Never",
                                           command=["sh", "-c", "sleep 3600"],
                                           resources=client.V1ResourceRequirements(requests=gpu, limits=gpu))]))


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def _workloads(api: Any, ns: str) -> dict[str, dict[str, Any]]:
    """The namespace's Workloads by the pod that owns each."""
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, ns, "workloads")["items"]
    out = {}
    for w in items:
        owners = [o["name"] for o in w["metadata"].get("ownerReferences") or [] if o["kind"] == "Pod"]
        if owners:
            out[owners[0]] = w
    return out


def _admitted(w: dict[str, Any]) -> bool:
    return _conditions(w).get("Admitted", {}).get("status") == "True"


def _state(api: Any, ns: str, names: list[str]) -> dict[str, str]:
    """pod → 'admitted' | 'pending' | 'preempted' | 'missing', from its Workload's conditions."""
    wls = _workloads(api, ns)
    out = {}
    for n in names:
        w = wls.get(n)
        if w is None:
            out[n] = "missing"
            continue
        c = _conditions(w)
        if c.get("Preempted", {}).get("status") == "True":
            out[n] = "preempted"
        elif _admitted(w):
            out[n] = "admitted"
        else:
            out[n] = "pending"
    return out


def _gated(pod: client.V1Pod) -> bool:
    return any(g.name == ADMISSION_GATE for g in pod.spec.scheduling_gates or [])


def _cluster_queue(api: Any, ns: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, "clusterqueues",
                                                                  queue_object_name(ns, POOL))


def _gpu_usage(cq: dict[str, Any]) -> tuple[int, int]:
    """(GPUs in use, of which borrowed) as the ClusterQueue reports them."""
    for fl in (cq.get("status") or {}).get("flavorsUsage") or []:
        for r in fl["resources"]:
            if r["name"] == GPU:
                return int(r.get("total") or 0), int(r.get("borrowed") or 0)
    return 0, 0


def _in_use(cq: dict[str, Any]) -> int:
    return _gpu_usage(cq)[0]


def _borrowed(cq: dict[str, Any]) -> int:
    return _gpu_usage(cq)[1]


def _submit(api: Any, ns: str, names: list[str], compute: Compute, env: Environment, image: str) -> list[client.V1Pod]:
    """Create the pods as Argo would create a queued train step's (Forge's queue labels); returns them as
    the API server stored them, after the admission webhooks."""
    core = client.CoreV1Api(api)
    labels = queue_labels(compute, env, ns, PRIORITY)
    assert labels[QUEUE_NAME] == POOL
    return [core.create_namespaced_pod(ns, _pod(n, labels, image)) for n in names]


def _explain(api: Any, shared_node: nodekit.SharedNode) -> str:
    """What Kueue says, for a failure message: each Workload's conditions, the ClusterQueues' status,
    the end of the manager's log."""
    lines = []
    for ns in (TEAM_A, TEAM_B):
        for n, w in sorted(_workloads(api, ns).items()):
            conds = [(c["type"], c["status"], c.get("reason"), c.get("message")) for c in _conditions(w).values()]
            lines.append(f"{ns}/{n}: {conds}")
        with contextlib.suppress(ApiException):
            lines.append(f"ClusterQueue {queue_object_name(ns, POOL)}: {_cluster_queue(api, ns).get('status')}")
    log = shared_node.kueue().controller.log_tail()
    errors = [ln for ln in log.splitlines() if '"level":"error"' in ln]
    return "\n".join([*lines, "Kueue's errors:", *errors[-15:], "Kueue's log:", log[-3000:]])


def test_excess_waits_gated_borrows_then_is_reclaimed(stack, shared_node: nodekit.SharedNode) -> None:
    api, compute, env = stack
    try:
        _scenario(api, compute, env, shared_node)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{_explain(api, shared_node)}") from e


def _scenario(api: Any, compute: Compute, env: Environment, shared_node: nodekit.SharedNode) -> None:
    core = client.CoreV1Api(api)
    image = shared_node.node.images["busybox"][1]
    a_pods = [f"train-a{i}" for i in range(6)]
    b_pods = [f"train-b{i}" for i in range(2)]

    # 1. team A asks for 6 GPUs: 2 of its own + 2 borrowed from idle B are admitted, 2 wait gated
    for pod in _submit(api, TEAM_A, a_pods, compute, env, image):  # Kueue's pod webhook gated each at create
        assert _gated(pod), (pod.metadata.name, pod.spec.scheduling_gates)

    def settled_a() -> dict[str, str] | None:
        s = _state(api, TEAM_A, a_pods)
        counts = [list(s.values()).count(k) for k in ("admitted", "pending")]
        return s if counts == [4, 2] else None

    state = wait_until(settled_a, WAIT, "4 of team A's 6 workloads admitted, 2 pending", interval=1)
    admitted_a = sorted(n for n, v in state.items() if v == "admitted")
    waiting_a = sorted(n for n, v in state.items() if v == "pending")
    wait_until(lambda: _borrowed(_cluster_queue(api, TEAM_A)) == 2, WAIT,
               "team A's ClusterQueue reporting 2 GPUs borrowed", interval=1)

    def running(ns: str, names: list[str]) -> bool:
        return all(core.read_namespaced_pod(n, ns).status.phase == "Running" for n in names)

    wait_until(lambda: running(TEAM_A, admitted_a), WAIT, f"team A's admitted pods {admitted_a} running", interval=1)
    for n in waiting_a:  # the excess waits gated: Pending with the gate, never tried by the scheduler
        pod = core.read_namespaced_pod(n, TEAM_A)
        assert pod.status.phase == "Pending" and _gated(pod), (n, pod.spec.scheduling_gates, pod.status.phase)
        scheduled = {c.type: c for c in pod.status.conditions or []}.get("PodScheduled")
        assert scheduled is None or scheduled.reason == "SchedulingGated", (n, scheduled)
        wl = _workloads(api, TEAM_A)[n]
        assert _conditions(wl).get("QuotaReserved", {}).get("status") != "True", wl["status"]

    # 2. team B submits 2: its lent quota is reclaimed by preempting 2 of A's borrowed workloads. A
    # preempted pod's Workload goes with the pod (owner reference) once Kueue has stopped it, so what
    # each of A's Workloads showed is gathered while B's are admitted.
    for pod in _submit(api, TEAM_B, b_pods, compute, env, image):
        assert _gated(pod), (pod.metadata.name, pod.spec.scheduling_gates)
    preemptions: dict[str, dict[str, Any]] = {}

    def b_admitted_a_reclaimed() -> bool:
        for n, w in _workloads(api, TEAM_A).items():
            cond = _conditions(w).get("Preempted")
            if cond and cond["status"] == "True":
                preemptions.setdefault(n, cond)
        return (list(_state(api, TEAM_B, b_pods).values()) == ["admitted", "admitted"]
                and len(preemptions) >= 2)

    wait_until(b_admitted_a_reclaimed, WAIT, "team B's 2 workloads admitted and 2 of team A's preempted",
               interval=0.5)
    assert sorted(preemptions) == sorted(preemptions.keys() & set(admitted_a)) and len(preemptions) == 2, preemptions
    for n, cond in preemptions.items():
        assert cond["reason"] == "InCohortReclamation", (n, cond)
    after = _state(api, TEAM_A, a_pods)
    assert [after[n] for n in admitted_a if n not in preemptions] == ["admitted", "admitted"], after
    assert [after[n] for n in waiting_a] == ["pending", "pending"], after  # still waiting: A is at its own quota
    wait_until(lambda: _borrowed(_cluster_queue(api, TEAM_A)) == 0, WAIT,
               "team A's ClusterQueue borrowing nothing", interval=1)
    wait_until(lambda: running(TEAM_B, b_pods), WAIT, f"team B's pods {b_pods} running", interval=1)

    def stopped(n: str) -> bool:
        try:
            pod = core.read_namespaced_pod(n, TEAM_A)
        except ApiException as e:
            return e.status == 404
        return pod.metadata.deletion_timestamp is not None or pod.status.phase in ("Failed", "Succeeded")

    wait_until(lambda: all(stopped(n) for n in preemptions), WAIT, f"the preempted pods {sorted(preemptions)} stopped",
               interval=1)
    print(json.dumps({"admitted_a": admitted_a, "waiting_a": waiting_a, "b_admitted": b_pods,
                      "preempted_a": {n: c.get("message") for n, c in sorted(preemptions.items())}}))


def test_the_plan_says_what_a_new_training_waits_for(stack, shared_node: nodekit.SharedNode, tmp_path) -> None:
    """After the scenario, team A's queue is at its quota (2 of 2 GPUs in use) with 2 workloads
    pending: `forgectl plan` of a new training on that pool, against the cluster, says it waits for
    1 GPU behind them — read from the ClusterQueue's status Kueue wrote, not estimated."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    api, _, _ = stack
    cq = _cluster_queue(api, TEAM_A)
    status = cq.get("status") or {}
    # the scenario's two waiting pods, and the preempted ones until Kueue is done with them
    pending = status.get("pendingWorkloads")
    assert isinstance(pending, int) and pending >= 2, status
    assert _in_use(cq) == 2, status
    repo = Path(__file__).resolve().parents[2]
    work = tmp_path / "specs"
    shutil.copytree(repo / "examples" / "quickstart", work)
    (work / "pool.yaml").write_text(SPECS.split("---\n", 1)[1])  # the pool, as deployed
    envs = work / "environments.yaml"
    envs.write_text(envs.read_text().replace("namespace: forge-quickstart", f"namespace: {TEAM_A}"))
    model = work / "model.yaml"
    model.write_text(model.read_text().replace("computeRef: cpu", f"computeRef: {POOL}"))
    env = dict(os.environ, KUBECONFIG=shared_node.node.kubeconfig, NO_COLOR="1", COLUMNS="250")
    plan = subprocess.run([str(repo / ".venv" / "bin" / "forgectl"), "plan", "--env", "cluster", str(work)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert plan.returncode in (0, 2), plan.stdout[-3000:] + plan.stderr[-3000:]  # 2: changes to make
    text = " ".join(plan.stdout.split())
    # what Kueue reported when the plan read it (the preempted workloads may have gone since)
    counts = [f"behind {n} pending workloads" for n in range(2, pending + 1)]
    head = (f"train asks 1 nvidia.com/gpu of ClusterQueue {queue_object_name(TEAM_A, POOL)}: waits for 1 more "
            f"nvidia.com/gpu (0 of 2 free, ")
    tail = "; may borrow up to 2 in cohort forge-kueue-test)"
    assert any(head + c + tail in text for c in counts), plan.stdout[-4000:]
    print("\n" + next(line for line in plan.stdout.splitlines() if "waits for" in line).strip())
