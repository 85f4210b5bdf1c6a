"""Forge's controller running in the cluster, as pods (issue 33, steps 1, 2 and 7 of its end-to-end
test, and an idle failover): the controller image built here (devkit.node.controller_image), imported into the node's
containerd under the name `forgectl install` renders, and installed through the CLI with the node
cluster's admin kubeconfig, as a platform engineer would.

1. `forgectl install --manage NS --config FILE` → the Deployment's two pods Running and Ready
   (their readiness probe is `/readyz`, also read here over the pods' bridge), exactly one holder
   of the environment's Lease (`forgectl-cluster` in NS: leadership is per source environment,
   so the configuration has one source) and it is one of the two pods; each replica's own
   `forge_controller_leader` agrees.
2. The quick-start pushed to a git server that runs in the cluster (Debian's `git daemon` in a pod,
   from the controller image, which holds Debian's git; the controller reaches it by its Service's
   ClusterIP, the host pushes to the pod's IP) → the controller applies it: `kubectl wait
   --for=condition=Ready sync/quickstart` returns, the applied revision is the pushed commit, the
   Sync names the Lease holder as leader, the quick-start's objects are in NS.
3. The leader's pod deleted → the other replica holds the Lease within seconds (the deleted one gave
   it back on SIGTERM), the Sync names it, nothing is applied again, and the Deployment's new pod
   follows.
4. `forgectl uninstall` → the controller's pods are gone, the leader gave the Lease back on SIGTERM,
   and what it applied stays (every object's resourceVersion as it was).

No forgectl process runs on the host between the install and the uninstall; everything asserted
is read from the cluster (and the pods' HTTP endpoints). Needs root; never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from devkit.gitserver import git
from devkit.node import controller_image, gitdaemon
from reconciler.controller.install import NAME, PORT
from tests.cluster import nodekit
from tests.polling import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
#: forgectl of this checkout (cwd REPO), as the tests of tests/controller run it
FORGECTL = [sys.executable, "-m", "forgectl"]
CONTROLLER_NS = "forge-ctl-node-system"
APPS_NS = "forge-ctl-node-apps"
GIT_NS = "forge-ctl-node-git"
SOURCE = "quickstart"
LEASE = "forgectl-cluster"  # the `cluster` environment's Lease: the source's leader election

#: What :func:`node_images` built: the controller image's archive and ref.
_BUILT: dict[str, Any] = {}


def node_images() -> list[tuple[str, str]]:
    """The controller image (built the first time, a few minutes; then cached)."""
    archive, ref, times = controller_image.build()
    _BUILT.update(archive=archive, ref=ref, times=times)
    print("\ncontroller image:", json.dumps({"ref": ref, **times}))
    return [(str(archive), ref)]


def _kubectl() -> str:
    venv = REPO / ".venv" / "bin" / "kubectl"
    return str(venv) if venv.exists() else (shutil.which("kubectl") or "kubectl")


def _get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@dataclass
class Stack:
    kubeconfig: str
    core: client.CoreV1Api
    apps: client.AppsV1Api
    coordination: client.CoordinationV1Api
    custom: client.CustomObjectsApi
    work: Path
    git_url: str  # what the controller fetches (the git Service's ClusterIP)
    push_url: str  # what the host pushes to (the git pod's IP)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, cwd=REPO,
                              env={**os.environ, "KUBECONFIG": self.kubeconfig, "NO_COLOR": "1", "COLUMNS": "200"})

    def kubectl(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.run(_kubectl(), *args, timeout=timeout)

    def forgectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = self.run(*FORGECTL, *args)
        assert done.returncode == 0, f"forgectl {' '.join(args)} → {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    def push(self, message: str) -> str:
        git("add", "-A", ".", cwd=self.work)
        git("commit", "--quiet", "--allow-empty", "-m", message, cwd=self.work)
        git("push", "--quiet", self.push_url, "HEAD:main", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work)

    def pods(self) -> list[client.V1Pod]:
        return list(self.core.list_namespaced_pod(CONTROLLER_NS, label_selector=f"app.kubernetes.io/name={NAME}").items)

    def holder(self) -> str | None:
        try:
            lease = self.coordination.read_namespaced_lease(LEASE, APPS_NS)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return lease.spec.holder_identity or None

    def sync(self) -> dict[str, Any]:
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object("forge.dev", "v1alpha1", CONTROLLER_NS,
                                                                           "syncs", SOURCE)
        except client.ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return obj

    def logs(self) -> str:
        out = []
        for pod in self.pods():
            try:
                out.append(f"--- {pod.metadata.name}\n" + self.core.read_namespaced_pod_log(
                    pod.metadata.name, CONTROLLER_NS, tail_lines=40))
            except client.ApiException as exc:
                out.append(f"--- {pod.metadata.name}: no log ({exc.status})")
        return "\n".join(out)

    def live_versions(self) -> dict[str, str]:
        done = self.kubectl("-n", APPS_NS, "get", "workflows,seldondeployments,prometheusrules,podmonitors,configmaps",
                            "-l", "app.kubernetes.io/managed-by=forgectl", "-o", "json")
        assert done.returncode == 0, done.stderr
        return {f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
                for o in json.loads(done.stdout)["items"]}


@pytest.fixture(scope="module")
def stack(shared_node: nodekit.SharedNode) -> Iterator[Stack]:
    node = shared_node.node
    api = node.api()
    core = client.CoreV1Api(api)
    work = Path(tempfile.mkdtemp(prefix="forge-ctl-node-"))
    try:
        with shared_node.namespace(APPS_NS), shared_node.namespace(GIT_NS), \
                shared_node.namespace(CONTROLLER_NS, create=False):
            server = gitdaemon.start(core, GIT_NS, _BUILT["ref"])
            shutil.copytree(REPO / "examples" / "quickstart", work / "specs")
            git("init", "--quiet", "--initial-branch=main", cwd=work / "specs")
            yield Stack(node.kubeconfig, core, client.AppsV1Api(api), client.CoordinationV1Api(api),
                        client.CustomObjectsApi(api), work / "specs",
                        git_url=server.url, push_url=server.push_url)
    finally:
        # uninstall deletes the Sync CRD; the session's API server keeps it for the modules after this one
        done = subprocess.run([_kubectl(), "--kubeconfig", node.kubeconfig, "apply", "--server-side", "--force-conflicts",
                               "-f", str(REPO / "deploy" / "crds" / "syncs.forge.dev.yaml")],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        shutil.rmtree(work, ignore_errors=True)
        api.close()


#: What the tests below pass on: the pushed commit and the live objects it applied.
_STATE: dict[str, Any] = {}


def test_install_runs_two_ready_replicas_with_one_leader(stack: Stack) -> None:
    _STATE["revision"] = stack.push("quick-start")
    config = stack.work.parent / "controller.yaml"
    # the minimal configuration a user writes: cacheDir left at its relative default (the image's
    # working directory is the writable cache volume), HTTP on the pod's address for the probes
    config.write_text(yaml.safe_dump({
        "apiVersion": "forge.dev/v1alpha1", "kind": "ControllerConfig", "namespace": CONTROLLER_NS,
        "http": {"address": "0.0.0.0", "port": PORT},
        "sources": [{"name": SOURCE, "url": stack.git_url, "branch": "main", "path": ".", "environment": "cluster",
                     "namespace": APPS_NS, "interval": "10s"}]}))
    # the ClusterRoles install binds to, applied by the cluster's admin first (docs/controller.md)
    roles = stack.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "docs" / "rbac" / "forgectl-role.yaml"))
    assert roles.returncode == 0, roles.stderr
    t = time.monotonic()
    stack.forgectl("install", "-n", CONTROLLER_NS, "--manage", APPS_NS, "--config", str(config))

    def two_ready() -> list[client.V1Pod] | None:
        pods = [p for p in stack.pods() if p.metadata.deletion_timestamp is None]
        ok = [p for p in pods if p.status.phase == "Running"
              and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())]
        return ok if len(ok) == 2 == len(pods) else None

    try:
        pods = wait_until(two_ready, 300, "two controller pods Running and Ready", interval=1)
    except AssertionError:
        print(stack.logs())
        raise
    print(f"\ninstall → two pods Ready: {time.monotonic() - t:.1f} s")
    names = {p.metadata.name for p in pods}
    assert all(p.spec.containers[0].image == "forge-controller:0.1.0" for p in pods)
    for pod in pods:
        assert (pod.status.container_statuses[0].restart_count or 0) == 0, stack.logs()
        # the readiness probe's own endpoint, over the pods' bridge
        assert _get(f"http://{pod.status.pod_ip}:{PORT}/readyz") [0] == 200
        assert _get(f"http://{pod.status.pod_ip}:{PORT}/healthz")[0] == 200

    holder = wait_until(stack.holder, 60, "the environment's Lease held", interval=1)
    # the holder identity is forge-controller/<pod name>:<pid> (the pod's host name)
    leader = _pod_of(holder)
    assert leader in names, (holder, names)

    def leader_gauges() -> dict[str, str] | None:
        # each replica's own forge_controller_leader (a follower says 0: the "no leader" alert sums them)
        gauges = {}
        for pod in pods:
            _, metrics = _get(f"http://{pod.status.pod_ip}:{PORT}/metrics")
            gauges[pod.metadata.name] = next((ln.rsplit(" ", 1)[1] for ln in metrics.splitlines()
                                              if ln.startswith(f'forge_controller_leader{{source="{SOURCE}"}}')), "none")
        return gauges if list(gauges.values()).count("1.0") == 1 else None

    gauges = wait_until(leader_gauges, 60, "exactly one replica leading", interval=1)
    assert gauges[leader] == "1.0", (gauges, holder)
    assert sorted(gauges.values()) == ["0.0", "1.0"], gauges
    assert stack.holder() == holder  # one holder throughout
    _STATE["holder"] = holder


def test_the_controller_applies_the_specs_pushed_to_the_git_server(stack: Stack) -> None:
    if "holder" not in _STATE:
        pytest.fail("the install test did not pass")
    waited = stack.kubectl("-n", CONTROLLER_NS, "wait", "--for=condition=Ready", f"sync/{SOURCE}", "--timeout=300s",
                           timeout=330)
    assert waited.returncode == 0, (waited.stdout, waited.stderr, stack.sync(), stack.logs())
    status = stack.sync()["status"]
    assert status["lastAppliedRevision"] == _STATE["revision"], status
    assert status["leader"] == _STATE["holder"] == stack.holder()
    assert status["plan"]["created"] > 0
    live = stack.live_versions()
    assert "SeldonDeployment/digits" in live and any(k.startswith("Workflow/") for k in live), live
    _STATE["live"] = live


def _pod_of(holder: str) -> str:
    """The pod a holder identity names (forge-controller/<pod name>:<pid>: the pod's host name)."""
    return holder.removeprefix("forge-controller/").rsplit(":", 1)[0]


def test_the_other_replica_takes_over_when_the_leader_pod_is_deleted(stack: Stack) -> None:
    if "live" not in _STATE:
        pytest.fail("the apply test did not pass")
    holder = _STATE["holder"]
    leader = _pod_of(holder)
    t = time.monotonic()
    # a delete as a drained node or `kubectl delete pod` makes it: SIGTERM, and the Lease given back
    stack.core.delete_namespaced_pod(leader, CONTROLLER_NS)
    new = wait_until(lambda: (h := stack.holder()) is not None and h != holder and h, 30, "another holder", interval=0.2)
    took = time.monotonic() - t
    print(f"\nleader pod deleted → another replica holds the Lease: {took:.1f} s")
    # the deleted pod gave the Lease back, so whichever replica asks first takes it: the one that
    # followed, or the Deployment's replacement pod if it starts before the follower's next retry
    assert _pod_of(new) != leader and _pod_of(new) in {p.metadata.name for p in stack.pods()}, (new, leader)
    # the new leader syncs at once, resuming from the Sync's status: the revision is not applied again
    status = wait_until(lambda: (st := stack.sync().get("status", {})).get("leader") == new and st, 60,
                        "the Sync naming the new leader", interval=1)
    assert status["lastAppliedRevision"] == _STATE["revision"]
    assert next(c for c in status["conditions"] if c["type"] == "Ready")["status"] == "True", status
    assert stack.live_versions() == _STATE["live"]
    # the Deployment replaces the deleted pod; it follows
    wait_until(lambda: len([p for p in stack.pods() if p.metadata.deletion_timestamp is None and any(
        c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())]) == 2, 120,
               "two replicas Ready again", interval=1)
    assert stack.holder() == new
    _STATE["holder"] = new


def test_uninstall_removes_the_controller_and_keeps_what_it_applied(stack: Stack) -> None:
    if "live" not in _STATE:
        pytest.fail("the apply test did not pass")
    done = stack.forgectl("uninstall", "-n", CONTROLLER_NS, "--manage", APPS_NS, "--auto-approve")
    assert "Uninstalled:" in done.stdout, done.stdout
    wait_until(lambda: not stack.pods(), 120, "the controller's pods gone", interval=1)
    with pytest.raises(client.ApiException) as gone:
        stack.apps.read_namespaced_deployment(NAME, CONTROLLER_NS)
    assert gone.value.status == 404
    # the leader gave the Lease back on SIGTERM (a killed one would have left it to expire)
    assert stack.holder() is None
    assert stack.live_versions() == _STATE["live"]
