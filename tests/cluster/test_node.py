"""The one-node cluster (devkit.node): pods really run.

The session's cluster (etcd + kube-apiserver, tests/cluster/conftest.py's ``shared_node``) plus the
node: containerd, runc and CNI from Debian, kubelet, kube-scheduler, kube-controller-manager and kube-proxy built from the pinned
k8s.io/kubernetes, images built here without a registry. Checked: a Pod runs to Succeeded and its
log comes back through the API server; a Deployment's pod serves HTTP that the host reaches at the
pod IP, the Service's ClusterIP (kube-proxy) and a NodePort on 127.0.0.1; a pod reaches the API
server at the `kubernetes` Service; stopping leaves no process, mount, cgroup, bridge, iptables
chain or changed sysctl behind. Needs root (containerd, iptables, cgroups) and a Go toolchain for
the first build. See docs/test-cluster.md, "The node".
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devkit.cluster import Cluster
from devkit.node import argo
from devkit.node import node as nodemod
from devkit.node.node import Node
from tests.cluster import nodekit
from tests.polling import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]



def _wait(what: str, fn: Callable[[], Any], timeout: float = 90.0, every: float = 0.5) -> Any:
    return wait_until(fn, timeout, what, interval=every)


def node_images() -> list[tuple[str, str]]:
    """Argo's executor image (its binaries built the first time: a few minutes)."""
    return [argo.executor_image()]


@pytest.fixture(scope="module")
def node_cluster(shared_node: nodekit.SharedNode) -> tuple[Cluster, Node]:
    # the session's node (tests/cluster/conftest.py); the CRDs (for Argo's Workflow) come from the
    # cached etcd snapshot; node=True keeps the ServiceAccount admission plugin on, so pods get a token
    return shared_node.cluster, shared_node.node


@pytest.fixture(scope="module")
def node(node_cluster: tuple[Cluster, Node]) -> Node:
    return node_cluster[1]


@pytest.fixture(scope="module")
def core(node: Node) -> Iterator[client.CoreV1Api]:
    api = node.api()
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()


def _busybox(node: Node) -> str:
    return node.images["busybox"][1]


def test_node_is_ready_with_the_pinned_versions(node: Node, core: client.CoreV1Api) -> None:
    n = core.read_node(node.name)
    ready = {c.type: c.status for c in n.status.conditions}
    assert ready["Ready"] == "True"
    assert not n.spec.taints
    assert n.status.node_info.kubelet_version == node.versions["KUBERNETES_VERSION"]
    assert n.status.node_info.container_runtime_version.startswith("containerd://")
    assert {"type": "InternalIP", "address": node.node_ip} in [a.to_dict() for a in n.status.addresses]
    # the node's images are there, imported (or kept in containerd's store), never pulled; the
    # kubelet lists them in the Node's status a few seconds after it is Ready (its image cache)
    want = {_busybox(node), node.images["pause"][1]}

    def listed() -> set[str]:
        images = core.read_node(node.name).status.images or []
        return want & {name for img in images for name in img.names or []}

    assert _wait("the kubelet to report the node's images", lambda: listed() == want, timeout=60)


def test_pod_runs_to_completion(node: Node, core: client.CoreV1Api) -> None:
    ns = "default"
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="hello"),
        spec=client.V1PodSpec(restart_policy="Never", containers=[client.V1Container(
            name="main", image=_busybox(node), image_pull_policy="Never",
            command=["sh", "-c", "echo hello from $(hostname) on the forge node; ls /proc/1/ns >/dev/null"])]))
    core.create_namespaced_pod(ns, pod)
    try:
        phase = _wait("the pod to finish",
                      lambda: (p := core.read_namespaced_pod("hello", ns).status.phase) in ("Succeeded", "Failed") and p)
        assert phase == "Succeeded", core.read_namespaced_pod("hello", ns).status
        # the log, through the API server -> kubelet (logs on loopback)
        log = core.read_namespaced_pod_log("hello", ns)
        assert "hello from hello on the forge node" in log
        st = core.read_namespaced_pod("hello", ns).status.container_statuses[0].state.terminated
        assert st.exit_code == 0 and st.reason == "Completed"
    finally:
        core.delete_namespaced_pod("hello", ns, grace_period_seconds=1)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=3) as r:
        return r.read().decode()


def test_deployment_serves_http_reachable_from_the_host(node: Node, core: client.CoreV1Api) -> None:
    ns = "default"
    apps = client.AppsV1Api(core.api_client)
    labels = {"app": "web"}
    dep = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1DeploymentSpec(
            replicas=1, selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(termination_grace_period_seconds=1, containers=[client.V1Container(
                    name="httpd", image=_busybox(node), image_pull_policy="Never",
                    command=["sh", "-c", "mkdir -p /www && echo served-by-$HOSTNAME > /www/index.html "
                                         "&& exec httpd -f -p 8080 -h /www"],
                    ports=[client.V1ContainerPort(container_port=8080, name="http")],
                    readiness_probe=client.V1Probe(http_get=client.V1HTTPGetAction(path="/index.html", port=8080),
                                                   period_seconds=1))]))))
    svc = client.V1Service(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1ServiceSpec(type="NodePort", selector=labels,
                                  ports=[client.V1ServicePort(port=80, target_port=8080)]))
    apps.create_namespaced_deployment(ns, dep)
    core.create_namespaced_service(ns, svc)
    try:
        _wait("the Deployment to be available",
              lambda: (apps.read_namespaced_deployment("web", ns).status.available_replicas or 0) >= 1)
        pod = core.list_namespaced_pod(ns, label_selector="app=web").items[0]
        want = f"served-by-{pod.metadata.name}"
        assert pod.spec.node_name == node.name
        # the pod IP through the node's bridge
        assert _get(f"http://{pod.status.pod_ip}:8080/").strip() == want
        s = core.read_namespaced_service("web", ns)
        # the ClusterIP and the NodePort (on 127.0.0.1): kube-proxy's iptables rules, once synced
        assert _wait("the ClusterIP to answer", lambda: _try(f"http://{s.spec.cluster_ip}/"), 30).strip() == want
        assert _wait("the NodePort to answer",
                     lambda: _try(f"http://127.0.0.1:{s.spec.ports[0].node_port}/"), 30).strip() == want
    finally:
        core.delete_namespaced_service("web", ns)
        apps.delete_namespaced_deployment("web", ns, propagation_policy="Foreground")


def _try(url: str) -> str | None:
    try:
        return _get(url)
    except OSError:
        return None


def test_a_pod_reaches_the_api_server(node: Node, core: client.CoreV1Api) -> None:
    """The `kubernetes` Service (10.0.0.1:443) leads to the API server on loopback. Plain HTTP to
    its TLS port gets the API server's own answer, which proves the route (the image has no TLS
    client)."""
    ns = "default"
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="api-route"),
        spec=client.V1PodSpec(restart_policy="Never", containers=[client.V1Container(
            name="main", image=_busybox(node), image_pull_policy="Never",
            command=["sh", "-c", "printf 'GET /version HTTP/1.0\\r\\n\\r\\n' | "
                                 "nc -w 5 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT"])]))
    core.create_namespaced_pod(ns, pod)
    try:
        _wait("the pod to finish",
              lambda: core.read_namespaced_pod("api-route", ns).status.phase in ("Succeeded", "Failed"))
        log = core.read_namespaced_pod_log("api-route", ns)
        assert "Client sent an HTTP request to an HTTPS server" in log, log
    finally:
        core.delete_namespaced_pod("api-route", ns, grace_period_seconds=1)


# A two-step Workflow: step 2 gets step 1's stdout (outputs.result) as a parameter and checks it.
# The output travels the real way: argoexec's wait container in step 1's pod reports it through a
# WorkflowTaskResult (an in-cluster client: the pod's service-account token, the API server's
# certificate verified at 10.0.0.1), the controller passes it into step 2's pod.
TWO_STEPS = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: two-steps}
spec:
  entrypoint: main
  templates:
  - name: main
    steps:
    - - name: say
        template: say
    - - name: check
        template: check
        arguments: {parameters: [{name: msg, value: "{{steps.say.outputs.result}}"}]}
  - name: say
    container:
      image: BUSYBOX
      imagePullPolicy: Never
      command: [sh, -c, "echo hello-from-argo"]
  - name: check
    inputs: {parameters: [{name: msg}]}
    container:
      image: BUSYBOX
      imagePullPolicy: Never
      command: [sh, -c, "test '{{inputs.parameters.msg}}' = hello-from-argo && echo got-it"]
"""


def test_argo_runs_a_two_step_workflow_passing_an_output(shared_node: nodekit.SharedNode,
                                                         core: client.CoreV1Api) -> None:
    import yaml
    from kubernetes import dynamic

    cluster, node = shared_node.cluster, shared_node.node
    assert argo.in_cluster_clients_supported(cluster) == []
    ctl = shared_node.argo()  # kept running for the modules after this one
    try:
        wfs = dynamic.DynamicClient(core.api_client).resources.get(api_version="argoproj.io/v1alpha1",
                                                                   kind="Workflow")
        wfs.create(body=yaml.safe_load(TWO_STEPS.replace("BUSYBOX", _busybox(node))), namespace="default")

        def phase() -> str | None:
            p = (wfs.get(name="two-steps", namespace="default").to_dict().get("status") or {}).get("phase")
            if not ctl.running():
                raise AssertionError(f"workflow-controller exited:\n{nodemod._tail(ctl.log_path)}")
            return p if p in ("Succeeded", "Failed", "Error") else None

        final = _wait("the Workflow to finish", phase, timeout=180, every=1)
        wf = wfs.get(name="two-steps", namespace="default").to_dict()
        nodes = {n["displayName"]: n for n in wf["status"]["nodes"].values()}
        assert final == "Succeeded", (wf["status"].get("message"), {k: (v["phase"], v.get("message"))
                                                                     for k, v in nodes.items()})
        assert nodes["say"]["outputs"]["result"] == "hello-from-argo"
        assert nodes["check"]["inputs"]["parameters"][0]["value"] == "hello-from-argo"
        pod = next(p for p in core.list_namespaced_pod("default").items
                   if p.metadata.annotations.get("workflows.argoproj.io/node-name", "").endswith(".check"))
        assert "got-it" in core.read_namespaced_pod_log(pod.metadata.name, "default", container="main")
        # the pods ran argoexec (init + wait) from the image built here, as the default ServiceAccount
        assert {c.image for c in pod.spec.init_containers} == {ctl.executor_image}
        assert pod.spec.service_account_name == "default"
    finally:
        with contextlib.suppress(Exception):
            wfs.delete(name="two-steps", namespace="default")


REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart"


def _quickstart_manifests() -> list[dict[str, Any]]:
    from reconciler.load.environments import load_environment
    from renderers import RenderContext, render

    result, env = load_environment([str(QUICKSTART)], None, "cluster")
    return render(result.specs, RenderContext(env)).manifests


def test_the_workspace_claim_binds_and_pods_share_it(node: Node, core: client.CoreV1Api) -> None:
    """Forge's rendered workspace PVC (size and ReadWriteMany as rendered) binds to one of the
    node's hostPath volumes of the default StorageClass; a file one pod writes as uid 1000 (as
    Forge's pods run), the next reads; a deleted claim leaves its volume Released (Retain)."""
    pvc = next(m for m in _quickstart_manifests() if m["kind"] == "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and "storageClassName" not in pvc["spec"]
    ns = "default"
    pvc["metadata"]["namespace"] = ns
    name = pvc["metadata"]["name"]
    core.create_namespaced_persistent_volume_claim(ns, pvc)
    pods = []
    try:
        bound = _wait("the claim to bind",
                      lambda: (c := core.read_namespaced_persistent_volume_claim(name, ns)).status.phase == "Bound" and c)
        assert bound.spec.storage_class_name == nodemod.STORAGE_CLASS
        assert "ReadWriteMany" in bound.status.access_modes
        pv = core.read_persistent_volume(bound.spec.volume_name)
        host_dir = Path(pv.spec.host_path.path)
        assert host_dir.parent == Path(node.state_dir) / "volumes" and host_dir.is_dir()
        for i, cmd in enumerate(["echo from-pod-0 > /workspace/shared.txt", "cat /workspace/shared.txt"]):
            pod = client.V1Pod(
                metadata=client.V1ObjectMeta(name=f"ws-{i}"),
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    security_context=client.V1PodSecurityContext(run_as_user=1000, run_as_group=1000, fs_group=1000),
                    containers=[client.V1Container(
                        name="main", image=_busybox(node), image_pull_policy="Never", command=["sh", "-c", cmd],
                        volume_mounts=[client.V1VolumeMount(name="ws", mount_path="/workspace")])],
                    volumes=[client.V1Volume(name="ws", persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
                        claim_name=name))]))
            core.create_namespaced_pod(ns, pod)
            pods.append(f"ws-{i}")
            phase = _wait(f"pod ws-{i} to finish",
                          lambda n=f"ws-{i}": (p := core.read_namespaced_pod(n, ns).status.phase) in ("Succeeded", "Failed") and p)
            assert phase == "Succeeded", (core.read_namespaced_pod(f"ws-{i}", ns).status,
                                          core.read_namespaced_pod_log(f"ws-{i}", ns))
        assert core.read_namespaced_pod_log("ws-1", ns).strip() == "from-pod-0"
        assert (host_dir / "shared.txt").read_text().strip() == "from-pod-0"
        assert (host_dir / "shared.txt").stat().st_uid == 1000
        for p in pods:
            core.delete_namespaced_pod(p, ns, grace_period_seconds=0)
        _wait("the pods to be gone", lambda: not [p for p in core.list_namespaced_pod(ns).items
                                                  if p.metadata.name in pods])
        core.delete_namespaced_persistent_volume_claim(name, ns)
        _wait("the volume to be Released (reclaimPolicy Retain)",
              lambda: core.read_persistent_volume(pv.metadata.name).status.phase == "Released")
    finally:
        for p in pods:
            with contextlib.suppress(Exception):
                core.delete_namespaced_pod(p, ns, grace_period_seconds=0)
        with contextlib.suppress(Exception):
            core.delete_namespaced_persistent_volume_claim(name, ns)


def test_forgectl_doctor_on_the_node_cluster(node: Node) -> None:
    """`forgectl doctor --env cluster` of the quick-start: the CRDs, the PriorityClasses and the
    default StorageClass are there. Seldon's traffic splitter (Istio or Ambassador) is not: the
    node runs neither (docs/test-cluster.md), and doctor says so."""
    import json

    proc = subprocess.run([str(REPO / ".venv" / "bin" / "forgectl"), "doctor", str(QUICKSTART), "--env", "cluster",
                           "-o", "json"], capture_output=True, text=True,
                          env=dict(os.environ, KUBECONFIG=node.kubeconfig), cwd=REPO)
    findings = {(f["kind"], f["name"]): f for f in json.loads(proc.stdout)["findings"]}
    missing = {k: f["detail"] for k, f in findings.items() if f["status"] == "missing"}
    assert set(missing) == {("TrafficSplitter", "istio-or-ambassador")}, missing
    assert proc.returncode == 1  # that one is missing
    # the rest is `ok`, except what no API shows (Argo's rights on ConfigMaps, its executor's
    # security context for a namespace enforcing Pod Security `restricted`: `manual`)
    other = {k: f["status"] for k, f in findings.items() if f["status"] not in ("ok", "missing")}
    assert other == {("ControllerRights", "configmaps"): "manual", ("PodSecurity", "argo-executor"): "manual"}, other
    for want in [("PriorityClass", "forge-high"), ("PriorityClass", "forge-medium"), ("StorageClass", "(default)"),
                 ("CustomResourceDefinition", "workflows.argoproj.io"),
                 ("CustomResourceDefinition", "seldondeployments.machinelearning.seldon.io")]:
        assert findings[want]["status"] == "ok", findings.get(want)
    assert findings[("StorageClass", "(default)")]["detail"] == f"default class {nodemod.STORAGE_CLASS!r}"


@pytest.mark.stops_shared_node
def test_stop_gives_everything_back(node: Node) -> None:
    sd = Path(node.state_dir)
    pids = dict(node.pids)
    node.stop(quiet=True)
    for name, pid in pids.items():
        assert not node.running(name), f"{name} (pid {pid}) still runs"
    shims = subprocess.run(["pgrep", "-f", f"containerd-shim-runc-v2 .*{node.containerd_sock}"],
                           capture_output=True, text=True).stdout.split()
    assert not shims
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(sd) not in mounts and str(node.containerd_root) not in mounts
    assert not sd.exists()
    assert subprocess.run(["ip", "link", "show", nodemod.BRIDGE], capture_output=True).returncode != 0
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{nodemod.CGROUP_ROOT}"))  # v1 and cgroup2's "unified"
    for table in ("filter", "nat"):
        rules = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True).stdout
        assert "KUBE-" not in rules and "FORGE-NODE-" not in rules and 'name: \\"forge\\"' not in rules, rules
    for key, val in node.sysctls_saved.items():
        assert Path("/proc/sys", key).read_text().strip() == val, key


@pytest.mark.stops_shared_node
def test_a_start_removes_what_a_node_that_vanished_left(node_cluster: tuple[Cluster, Node], tmp_path: Path) -> None:
    """A node killed with its state directory removed (a CI run stopped half-way, /tmp cleaned)
    leaves its iptables chains, bridge, cgroups and pods' processes, and /run's record of it points
    nowhere; the next start on the machine removes them instead of failing on "Chain already
    exists" (or routing Services to pods long gone)."""
    cluster, node = node_cluster
    node.stop(quiet=True)  # stopped already when it runs after test_stop_gives_everything_back
    assert not nodemod.host_leftovers()

    def nat(*args: str) -> None:
        subprocess.run(["iptables", "-t", "nat", *args], check=True, capture_output=True)

    said: list[str] = []
    again = None
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        nat("-N", nodemod.APISERVER_CHAIN)
        nat("-A", nodemod.APISERVER_CHAIN, "-d", "10.0.0.1/32", "-j", "RETURN")
        nat("-N", "KUBE-SERVICES")
        nat("-I", "PREROUTING", "1", "-j", "KUBE-SERVICES")
        subprocess.run(["ip", "link", "add", nodemod.BRIDGE, "type", "bridge"], check=True)
        pod = nodemod._cgroup_dirs()[0] / nodemod.CGROUP_ROOT / "pod-left"
        pod.mkdir(parents=True)
        (pod / "cgroup.procs").write_text(f"{sleeper.pid}\n")
        nodemod.ACTIVE.write_text(f"{tmp_path / 'gone'}\n")  # the record of a node whose state went
        planted = nodemod.host_leftovers()
        assert any(nodemod.APISERVER_CHAIN in f for f in planted) and f"link {nodemod.BRIDGE}" in planted, planted

        again = Node.start(cluster, tmp_path / "node", die_with_parent=True, log=said.append)
        assert any(m.startswith("removing what a node that vanished left") for m in said), said
        assert sleeper.wait(timeout=10) == -9  # the vanished node's pod process, SIGKILLed
        with contextlib.closing(again.api()) as api:
            conditions = client.CoreV1Api(api).read_node(again.name).status.conditions
        assert [c.status for c in conditions if c.type == "Ready"] == ["True"]
    finally:
        if again is not None:
            again.stop(quiet=True)
        else:  # nothing of this test may outlive it
            nodemod.give_back_host(lambda _: None)
            nodemod.ACTIVE.unlink(missing_ok=True)
        sleeper.kill()
        sleeper.wait()
    assert not nodemod.host_leftovers()
