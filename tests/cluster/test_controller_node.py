"""Forge's controller running in the cluster, as pods (issue 33, steps 1–7 of its end-to-end test,
and an idle failover): the controller image built here (devkit.node.controller_image), imported into the node's
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
4. Argo, Seldon's operator and the Prometheus Operator's Prometheus join (what runs the applied
   objects), with Forge's runtime image (devkit.node.runtime_image, as tests/cluster/test_runtime_node.py):
   the first version trains and its stable predictor serves through the gateway (Traefik; the copy
   routes by the Gateway API, as test_runtime_node's does). A `learningRate` change is pushed → the
   controller fetches and applies it (the Sync's lastAppliedRevision), Argo trains the new version
   with prepare-data a memoization hit, and the controller alone walks the canary 10 → 50 → 100 %
   and promotes it — its leader's pod deleted while the canary is at 50 %, so another replica takes
   the Lease and goes on from that step, each step entered once (issue 33's step 5) — on
   Prometheus's figures, which it reads at the Environment's own in-cluster name
   (`prometheus-operated.monitoring.svc`, the operator's headless Service, through the cluster's
   CoreDNS; the policy holds when Prometheus does not answer). Read from the cluster: the Sync's
   rollout line at each pass, the HTTPRoute's weights, the SeldonDeployment's predictors, the
   rollout's Events (their reporting instance is the Lease holder, a controller pod), and who
   answered the gateway's requests from the predictors' own counters in Prometheus.
5. Then the first version again with a canary failing half its requests (the Endpoint's `faultInjection`) → every step of it from
   Argo's cache, and the controller alone rolls it back at 10 %: the reason in the Sync's rollout
   line and a `RolledBack` Event by the Lease holder, the gateway's split back to the stable.
6. A pushed typo → not applied: `Ready=False`, `ValidationFailed` with the file:line, Forge's
   writes unchanged and the stable answering; the fix pushed and announced by a signed push webhook
   sent to the follower's pod (the Service would pick either replica; the secret from the Secret
   `webhook.secretRef` names, made after the install) → the follower passes it on through the
   Sync's annotation and the leader applies it at once (commit → applied, the figure issue 33 asks
   for), Ready again.
   Then the controller's own PodMonitor and PrometheusRule as the in-cluster Prometheus sees them:
   both replicas scraped, one leading, the controller's alerts loaded and none firing.
7. `forgectl uninstall` → the controller's pods are gone, the leader gave the Lease back on SIGTERM,
   and what it applied stays (Forge's field managers' entries on every object as they were).

No forgectl process runs on the host between the install and the uninstall; everything asserted
is read from the cluster (and the pods' HTTP endpoints, and Prometheus). Needs root; never skips.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from devkit.gitserver import git
from devkit.node import argo, controller_image, dnswire, gitdaemon, promop, runtime_image, traefik
from devkit.rollout import BODY
from reconciler.controller.install import NAME, PORT
from reconciler.targets.kubernetes.rollout import ROLLOUT_MANAGER, rollout_state_of
from reconciler.targets.kubernetes.workflow_status import task_nodes
from renderers.labels import MANAGER
from tests.cluster import nodekit
from tests.polling import wait_until
from tests.specedits import route_by_gateway

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
#: forgectl of this checkout (cwd REPO), as the tests of tests/controller run it
FORGECTL = [sys.executable, "-m", "forgectl"]
CONTROLLER_NS = "forge-ctl-node-system"
APPS_NS = "forge-ctl-node-apps"
#: The model servers' request counters of the Endpoint, as the in-cluster Prometheus scrapes them.
SERVED = f'forge_requests_total{{forge_endpoint="digits",forge_namespace="{APPS_NS}"}}'
GIT_NS = "forge-ctl-node-git"
SOURCE = "quickstart"
#: The webhook's Secret (`webhook.secretRef`) and the secret it holds.
WEBHOOK_SECRET, WEBHOOK_KEY = "forge-webhook", "webhook-secret-for-the-node-test"
LEASE = "forgectl-cluster"  # the `cluster` environment's Lease: the source's leader election
MODEL_VERSION = "forge.dev/model-version"
#: The `cluster` Environment's Prometheus: the Prometheus Operator's governing Service, in-cluster.
PROMETHEUS_URL = f"http://prometheus-operated.{promop.NAMESPACE}.svc:9090"

#: What :func:`node_images` built: the controller image's archive and ref.
_BUILT: dict[str, Any] = {}


def node_images() -> list[tuple[str, str]]:
    """The controller image, and what the quick-start's Workflow and serving need: Forge's runtime
    images, Argo's executor, the Prometheus Operator's images (each built the first time, minutes;
    then cached; Traefik too, as tests/cluster/test_runtime_node.py's node_images)."""
    archive, ref, times = controller_image.build()
    _BUILT.update(archive=archive, ref=ref, times=times)
    print("\ncontroller image:", json.dumps({"ref": ref, **times}))
    runtime, refs, _ = runtime_image.build()
    traefik.ensure_binary()
    return [(str(archive), ref), argo.executor_image(), *promop.images(), *((str(runtime), r) for r in refs)]


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
    gateway_url: str  # Traefik's listener for the Gateway the copy's HTTPRoutes attach to

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

    def wait_applied(self, revision: str, timeout: float = 180) -> None:
        """Until the controller has applied ``revision`` (the Sync's lastAppliedRevision)."""
        wait_until(lambda: self.sync().get("status", {}).get("lastAppliedRevision") == revision, timeout,
                   f"the controller to apply revision {revision[:12]}", interval=1)

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

    def applied(self) -> dict[str, list[tuple[str, str, str]]]:
        """Each object Forge manages in APPS_NS with the entries of Forge's own field managers (the
        apply's and the rollout's: manager, operation, time): what changes when Forge writes it,
        and only then (Argo and Seldon's operator write their status under their own names)."""
        done = self.kubectl("-n", APPS_NS, "get", "workflows,seldondeployments,httproutes,prometheusrules,podmonitors,"
                            "configmaps", "-l", "app.kubernetes.io/managed-by=forgectl", "--show-managed-fields", "-o", "json")
        assert done.returncode == 0, done.stderr
        return {f"{o['kind']}/{o['metadata']['name']}": sorted(
            (f["manager"], f.get("operation", ""), f.get("time", "")) for f in o["metadata"].get("managedFields") or []
            if f.get("manager") in (MANAGER, ROLLOUT_MANAGER)) for o in json.loads(done.stdout)["items"]}

    def custom_get(self, group: str, version: str, plural: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(group, version, APPS_NS, plural, name)
        return obj

    def workflows(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.custom.list_namespaced_custom_object(
            "argoproj.io", "v1alpha1", APPS_NS, "workflows")["items"]
        return items


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
            gateway = shared_node.gateway()
            shutil.copytree(REPO / "examples" / "quickstart", work / "specs")
            _as_the_platform_team_would(work / "specs", gateway.parent_ref())
            git("init", "--quiet", "--initial-branch=main", cwd=work / "specs")
            yield Stack(node.kubeconfig, core, client.AppsV1Api(api), client.CoordinationV1Api(api),
                        client.CustomObjectsApi(api), work / "specs",
                        git_url=server.url, push_url=server.push_url, gateway_url=gateway.url)
    finally:
        # uninstall deletes the Sync CRD; the session's API server keeps it for the modules after this one
        done = subprocess.run([_kubectl(), "--kubeconfig", node.kubeconfig, "apply", "--server-side", "--force-conflicts",
                               "-f", str(REPO / "deploy" / "crds" / "syncs.forge.dev.yaml")],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        shutil.rmtree(work, ignore_errors=True)
        api.close()


def _as_the_platform_team_would(specs: Path, parent_ref: dict[str, str]) -> None:
    """The copy's `cluster` Environment routes by the Gateway API through the node's gateway (as
    test_runtime_node's copy does), and measures with the Prometheus the cluster runs, by its
    in-cluster name (the quick-start's own value, checked here); its policy asks for a rollback's
    revert on a branch (`gitWriteback`, which the controller pushes: the source's
    `pushWritebacks`); its Compute asks for 1.2 of the
    node's two cores: while the next version trains, the controller's two replicas hold 100m and
    the stable and canary predictors (the canary at 0 % is there from the apply) 300m each, so with
    the quick-start's 2 the training pod would stay Pending."""
    assert f"url: {PROMETHEUS_URL}\n" in (specs / "environments.yaml").read_text()
    route_by_gateway(specs, parent_ref)
    policy = specs / "rollout.yaml"
    text = policy.read_text()
    assert "  onPrometheusUnreachable: hold\n" in text, text
    policy.write_text(text.replace("  onPrometheusUnreachable: hold\n",
                                   f"  onPrometheusUnreachable: hold\n  gitWriteback:\n    enabled: true\n    branch: {REVERT_BRANCH}\n", 1))
    compute = specs / "compute.yaml"
    text = compute.read_text()
    assert '    cpu: "2"\n' in text, text
    compute.write_text(text.replace('    cpu: "2"\n', '    cpu: 1200m\n', 1))


#: The branch the controller pushes a rollback's revert to.
REVERT_BRANCH = "forge/revert-{endpoint}"
#: What the tests below pass on: the pushed commit and the live objects it applied.
_STATE: dict[str, Any] = {}


def test_install_runs_two_ready_replicas_with_one_leader(stack: Stack) -> None:
    _STATE["revision"] = stack.push("quick-start")
    config = stack.work.parent / "controller.yaml"
    # the minimal configuration a user writes: cacheDir left at its relative default (the image's
    # working directory is the writable cache volume), HTTP on the pod's address for the probes
    config.write_text(yaml.safe_dump({
        "apiVersion": "forge.dev/v1alpha1", "kind": "ControllerConfig", "namespace": CONTROLLER_NS,
        "http": {"address": "0.0.0.0", "port": PORT}, "webhook": {"secretRef": WEBHOOK_SECRET},
        "sources": [{"name": SOURCE, "url": stack.git_url, "branch": "main", "path": ".", "environment": "cluster",
                     "namespace": APPS_NS, "interval": "10s", "pushWritebacks": True}]}))
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
    # the webhook's Secret, made after the install as docs/controller.md says (its namespace is install's)
    stack.core.create_namespaced_secret(CONTROLLER_NS, client.V1Secret(
        metadata=client.V1ObjectMeta(name=WEBHOOK_SECRET), string_data={"secret": WEBHOOK_KEY}))
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
    # the new leader syncs at once, resuming from the Sync's status (Ready=Unknown, Reconciling,
    # while it does): once it is done, the revision was not applied again
    def synced_by_the_new_leader() -> dict[str, Any] | None:
        st: dict[str, Any] = stack.sync().get("status", {})
        ready = next((c for c in st.get("conditions") or [] if c["type"] == "Ready"), {})
        return st if st.get("leader") == new and ready.get("status") in ("True", "False") else None
    status = wait_until(synced_by_the_new_leader, 60, "the new leader's sync to end", interval=1)
    assert status["lastAppliedRevision"] == _STATE["revision"]
    assert next(c for c in status["conditions"] if c["type"] == "Ready")["status"] == "True", status
    assert stack.live_versions() == _STATE["live"]
    # the Deployment replaces the deleted pod; it follows
    wait_until(lambda: len([p for p in stack.pods() if p.metadata.deletion_timestamp is None and any(
        c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())]) == 2, 120,
               "two replicas Ready again", interval=1)
    assert stack.holder() == new
    _STATE["holder"] = new


def _infer_at(url: str) -> int:
    """One inference request's HTTP status (0: no answer)."""
    req = urllib.request.Request(url + "/v2/models/digits-mlp/infer", data=BODY,
                                 headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


class _Traffic:
    """Requests to the Endpoint through the gateway, 20 a second, each status kept (the gateway
    chooses the predictor; this client never does)."""

    def __init__(self, url: str) -> None:
        self.url, self.stop = url, threading.Event()
        self.codes: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.codes.append(_infer_at(self.url))
            time.sleep(0.05)

    def __enter__(self) -> _Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def _query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql}),
                                timeout=10) as resp:
        rows: list[dict[str, Any]] = json.loads(resp.read())["data"]["result"]
        return rows


def _finished(stack: Stack, version: str, timeout: float = 900) -> dict[str, Any]:
    """The version's Workflow once Argo has finished it."""
    def done() -> dict[str, Any] | None:
        wf = next((w for w in stack.workflows() if (w["metadata"].get("labels") or {}).get(MODEL_VERSION) == version), None)
        return wf if ((wf or {}).get("status") or {}).get("phase") in ("Succeeded", "Failed", "Error") else None
    wf: dict[str, Any] = wait_until(done, timeout, f"the Workflow of version {version} to finish", interval=3)
    return wf


def _split(route: dict[str, Any]) -> dict[str, int]:
    """The HTTPRoute's traffic split: backend → weight."""
    return {b["name"]: int(b.get("weight", 1)) for r in route["spec"]["rules"] if r.get("name") == "split"
            for b in r["backendRefs"]}


def _rollout_events(stack: Stack) -> list[tuple[str, str, str]]:
    """The rollout's Events on the `digits` SeldonDeployment: (reason, reporting instance, message)."""
    return [(e.reason, e.reporting_instance, e.message) for e in stack.core.list_namespaced_event(APPS_NS).items
            if e.involved_object.kind == "SeldonDeployment" and e.involved_object.name == "digits"
            and e.source and e.source.component == "forgectl-rollout"]


def _moves(seen: list[int]) -> list[int]:
    """The non-zero values of ``seen`` with repeats folded: the steps a weight went through."""
    out: list[int] = []
    for w in seen:
        if w and (not out or out[-1] != w):
            out.append(w)
    return out


class _Walk:
    """The controller's walk of the `digits` rollout as the cluster shows it, read every half
    second: the Sync's rollout line at each change (what each of the controller's passes wrote)
    and the canary's weight on the HTTPRoute (what the gateway was told), with their times."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.lines: list[dict[str, Any]] = []
        #: (time.monotonic(), the canary backend's weight on the route)
        self.route: list[tuple[float, int]] = []
        #: the line the last rollout left (its end): not this walk's
        self.before = self.read()

    def read(self) -> dict[str, Any] | None:
        line = next((r for r in self.stack.sync().get("status", {}).get("rollouts") or []
                     if r.get("endpoint") == "digits"), None)
        if line and (not self.lines or self.lines[-1] != line):
            self.lines.append(line)
        route = self.stack.custom_get("gateway.networking.k8s.io", "v1", "httproutes", "digits")
        self.route.append((time.monotonic(), _split(route).get("digits-canary", 0)))
        return line

    def until(self, phase: str, timeout: float, step: int | None = None) -> dict[str, Any]:
        """Read until the rollout line reaches ``phase`` (at ``step``, 0-based, when given); an
        assertion (with the controller's log) when it ends in another terminal phase or not in
        ``timeout`` seconds."""
        def reached() -> dict[str, Any] | None:
            line = self.read()
            if line == self.before:
                return None
            if line and line.get("phase") in {"Promoted", "RolledBack", "Failed"} - {phase}:
                raise AssertionError(f"the rollout ended {line}")
            return line if line and line.get("phase") == phase and step in (None, line.get("step")) else None
        try:
            found: dict[str, Any] = wait_until(reached, timeout, f"the controller's rollout to reach {phase}"
                                               + (f" at step {step + 1}" if step is not None else ""), interval=0.5)
        except AssertionError:
            print(json.dumps(self.lines, indent=1), self.stack.logs())
            raise
        return found


def test_a_pushed_learning_rate_change_trains_and_the_controller_alone_promotes_the_canary(
        stack: Stack, shared_node: nodekit.SharedNode) -> None:
    if "live" not in _STATE:
        pytest.fail("the apply test did not pass")
    # what runs the objects the controller applied: Argo, Seldon's operator, the Prometheus Operator's Prometheus
    shared_node.argo()
    shared_node.seldon()
    _, prometheus = shared_node.prometheus()
    # the Environment's Prometheus is the operator's governing Service, which cluster DNS answers
    # with the Prometheus pod (the controller's pods resolve it so; the host asks the same server)
    service = stack.core.read_namespaced_service("prometheus-operated", promop.NAMESPACE)
    assert service.spec.cluster_ip == "None", service.spec
    dns = shared_node.dns()

    def resolved() -> tuple[str, ...] | None:
        # the operator may roll the pod (a rule-file volume added): the name follows the pod's IP
        pod_ip = stack.core.read_namespaced_pod(f"prometheus-{promop.PROMETHEUS_NAME}-0",
                                                promop.NAMESPACE).status.pod_ip
        answer = dnswire.resolve(dns.service_ip, f"prometheus-operated.{promop.NAMESPACE}.svc.{dns.domain}")
        return answer.addresses if pod_ip and answer.addresses == (pod_ip,) else None
    wait_until(resolved, 60, "cluster DNS to answer the Environment's Prometheus name with its pod", interval=1,
               ignore=(client.ApiException, OSError))

    # the first version: its Workflow (applied by the controller in the apply test) runs now, and the stable serves
    [first] = wait_until(lambda: stack.workflows() or None, 60, "the first version's Workflow", interval=1)
    v1 = first["metadata"]["labels"][MODEL_VERSION]
    wf = _finished(stack, v1)
    assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
    wait_until(lambda: (stack.custom_get("machinelearning.seldon.io", "v1", "seldondeployments", "digits").get(
        "status") or {}).get("state") == "Available", 300, "the SeldonDeployment Available", interval=2)
    wait_until(lambda: _infer_at(stack.gateway_url) == 200, 120, "the gateway to route to the stable", interval=1)

    with _Traffic(stack.gateway_url) as traffic:
        t0 = time.monotonic()
        model = stack.work / "model.yaml"
        text = model.read_text()
        assert "learningRate: 0.002" in text, text
        model.write_text(text.replace("learningRate: 0.002", "learningRate: 0.003", 1))
        revision = stack.push("learning rate 0.003")
        # no forgectl from here to the promotion: the controller fetches, applies and walks
        stack.wait_applied(revision)
        applied_s = time.monotonic() - t0
        v2 = wait_until(lambda: next((v for w in stack.workflows()
                                      if (v := (w["metadata"].get("labels") or {}).get(MODEL_VERSION)) not in (v1, None)),
                                     None),
                        60, "the new version's Workflow", interval=1)
        wf = _finished(stack, v2)
        assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
        nodes = {name: dict(task.node) for name, task in task_nodes(wf).items()}
        # Argo's memoization: the unchanged data step came from the cache, with no pod
        assert (nodes["prepare-data"].get("memoizationStatus") or {}).get("hit") is True, nodes["prepare-data"]
        trained_s = time.monotonic() - t0

        # the controller walks the canary: each of its passes writes the Sync's rollout line, and
        # the rollout's weights go to the HTTPRoute; both read here every half second
        walk = _Walk(stack)
        walk.until("Progressing", 420, step=1)
        # step 5 of the issue: the leader's pod deleted while the canary is at 50 %: another
        # replica takes the Lease and goes on from the same step, no step taken twice
        deposed = stack.holder()
        assert deposed is not None
        stack.core.delete_namespaced_pod(_pod_of(deposed), CONTROLLER_NS)
        took_over = wait_until(lambda: (h := stack.holder()) not in (None, deposed) and h, 60, "another holder", interval=0.2)
        walk.until("Promoted", 420)
        promoted_s = time.monotonic() - t0
    nodekit.scraped_since(lambda q: _query(prometheus, q), SERVED, time.time())
    print(f"\npush → applied {applied_s:.1f} s, → trained {trained_s:.1f} s, → promoted {promoted_s:.1f} s "
          f"(the leader's pod deleted at 50 %: {deposed} → {took_over}); "
          f"rollout lines {json.dumps(walk.lines)}")

    # every step, in order, as the controller's passes reported it and as the gateway was told
    assert _moves([int(r["weight"]) for r in walk.lines if r.get("phase") == "Progressing"]) == [10, 50, 100], walk.lines
    assert _moves([w for _, w in walk.route]) == [10, 50, 100], walk.route
    status = stack.sync()["status"]
    assert status["lastAppliedRevision"] == revision
    assert next(c for c in status["conditions"] if c["type"] == "Ready")["status"] == "True", status
    # the Events are the controller's: their reporting instance is a Lease holder, one of its pods:
    # the deposed one up to step 2, the one that took over from there (the other replicas followed
    # and wrote none); each step entered once, across the hand-over
    holder = stack.holder()
    assert holder == took_over, (holder, took_over)
    events = _rollout_events(stack)
    reasons = [(reason, instance) for reason, instance, _ in events]
    assert ("RolloutStep", deposed) in reasons and ("Promoted", took_over) in reasons, (reasons, deposed, took_over)
    assert {instance for _, instance in reasons} == {deposed, took_over}, (reasons, deposed, took_over)
    for n in (1, 2, 3):
        assert len([m for reason, _, m in events if reason == "RolloutStep" and f"step {n}/3:" in m]) == 1, events
    assert _pod_of(holder or "") in {p.metadata.name for p in stack.pods()}, holder
    # the promoted version is the stable, alone, and the gateway sends it everything
    assert [b for b in _split(stack.custom_get("gateway.networking.k8s.io", "v1", "httproutes", "digits"))] == \
        ["digits-stable"]

    def predictors() -> dict[str, Any]:
        sdep = stack.custom_get("machinelearning.seldon.io", "v1", "seldondeployments", "digits")
        return {p["name"]: p for p in sdep["spec"]["predictors"]}
    wait_until(lambda: set(predictors()) == {"stable"}, 60, "the operator to drop the old predictor", interval=1)
    assert predictors()["stable"]["labels"][MODEL_VERSION] == v2
    # who answered, from the predictors' own counters: the canary its share, and no predictor failed
    window = time.monotonic() - t0 + 5  # the traffic's whole span, from 5 s before it began
    rows = _query(prometheus, f'sum by (forge_role, code) (increase({SERVED}[{int(window)}s]))')
    served = {(r["metric"].get("forge_role", ""), r["metric"].get("code", "")): float(r["value"][1]) for r in rows}
    assert sum(n for (role, code), n in served.items() if role == "canary" and code.startswith("2")) > 0, served
    assert not [k for k, n in served.items() if not k[1].startswith("2") and n > 0], served
    assert traffic.codes.count(200) >= 0.99 * len(traffic.codes), {c: traffic.codes.count(c) for c in set(traffic.codes)}
    _STATE.update(v1=v1, v2=v2, v1_uid=first["metadata"]["uid"])


def test_a_pushed_faulty_canary_is_rolled_back_by_the_controller_alone(
        stack: Stack, shared_node: nodekit.SharedNode) -> None:
    if "v2" not in _STATE:
        pytest.fail("the promotion test did not pass")
    v1, v2 = _STATE["v1"], _STATE["v2"]
    _, prometheus = shared_node.prometheus()
    with _Traffic(stack.gateway_url) as traffic:
        t0 = time.monotonic()
        # the first version again, its canary failing half its requests (a drill of the Endpoint's)
        model, endpoint = stack.work / "model.yaml", stack.work / "endpoint.yaml"
        model.write_text(model.read_text().replace("learningRate: 0.003", "learningRate: 0.002", 1))
        text = endpoint.read_text()
        assert "  protocol: v2\n" in text, text
        endpoint.write_text(text.replace("  protocol: v2\n", "  protocol: v2\n  faultInjection:\n    errorRate: 0.5\n", 1))
        revision = stack.push("learning rate back, a canary that fails half its requests")
        stack.wait_applied(revision)
        walk = _Walk(stack)  # from here on the route is read every half second, through the rollback
        line = walk.until("RolledBack", 400)
        rolled_back_s = time.monotonic() - t0
        # the gateway's split after the rollback: everything to the stable, every answer a 200
        assert _split(stack.custom_get("gateway.networking.k8s.io", "v1", "httproutes", "digits")).get("digits-canary", 0) == 0
    assert all(_infer_at(stack.gateway_url) == 200 for _ in range(50))
    traffic_ended = time.time()
    wf = _finished(stack, v1, timeout=30)
    assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
    if wf["metadata"]["uid"] != _STATE["v1_uid"]:
        # pruned after the promotion and applied again: trained before in this namespace, so every
        # step of the model came from Argo's cache, with no pod
        nodes = {name: dict(task.node) for name, task in task_nodes(wf).items()}
        assert all((nodes[s].get("memoizationStatus") or {}).get("hit") for s in ("prepare-data", "train", "evaluate")), nodes
    # breach → 0 %: from the first moment the route gave the failing canary traffic to the moment it gave it none
    first = next(t for t, w in walk.route if w > 0)
    zero = next(t for t, w in walk.route if t > first and w == 0)
    print(f"\npush → rolled back {rolled_back_s:.1f} s; canary traffic → 0 % {zero - first:.1f} s after it began; "
          f"rollout lines {json.dumps(walk.lines)}")
    assert "success-rate" in line.get("reason", "") + line.get("message", ""), line
    # the policy's first step (10 %) measured the failures (failureLimit 1): never a weight above it
    assert max(w for _, w in walk.route) == 10, walk.route
    holder = stack.holder()
    # this rollout's Events (its canary is the first version): the holder's alone
    reasons = [(reason, instance) for reason, instance, message in _rollout_events(stack) if f"canary {v1[:12]}" in message]
    assert ("RolledBack", holder) in reasons, (reasons, holder)
    assert {instance for _, instance in reasons} == {holder}, (reasons, holder)  # one replica acted

    def predictors() -> dict[str, Any]:
        sdep = stack.custom_get("machinelearning.seldon.io", "v1", "seldondeployments", "digits")
        return {p["name"]: p for p in sdep["spec"]["predictors"]}
    wait_until(lambda: set(predictors()) == {"stable"}, 60, "the operator to drop the canary", interval=1)
    assert predictors()["stable"]["labels"][MODEL_VERSION] == v2
    nodekit.scraped_since(lambda q: _query(prometheus, q), SERVED, traffic_ended)
    window = time.monotonic() - t0 + 5  # the traffic's whole span, from 5 s before it began
    rows = _query(prometheus, f'sum by (forge_role, code) (increase({SERVED}[{int(window)}s]))')
    served = {(r["metric"].get("forge_role", ""), r["metric"].get("code", "")): float(r["value"][1]) for r in rows}
    # the gateway sent the canary its share, which it half failed; the stable failed none of its own
    assert sum(n for (role, code), n in served.items() if role == "canary" and not code.startswith("2")) > 0, served
    assert not [k for k, n in served.items() if k[0] == "stable" and not k[1].startswith("2") and n > 0], served
    assert traffic.codes.count(200) > 0, traffic.codes
    # the revert the policy asks for, pushed by the controller to the git server: the Model's spec
    # as the stable version's revision had it, on top of the faulty revision, the Endpoint's kept
    branch = REVERT_BRANCH.format(endpoint="digits")
    state = rollout_state_of(stack.custom_get("machinelearning.seldon.io", "v1", "seldondeployments", "digits"))
    said = state.writeback if state is not None else ""  # the rollout's state, as `rollout status` reads it
    assert said.startswith("pushed ") and f" to branch {branch} of {stack.git_url}" in said, said
    git("fetch", "--quiet", stack.push_url, f"+refs/heads/{branch}:refs/remotes/server/revert", cwd=stack.work)
    tip = "refs/remotes/server/revert"
    assert git("rev-parse", f"{tip}^", cwd=stack.work) == revision
    assert git("diff", "--name-only", revision, tip, cwd=stack.work) == "model.yaml"
    assert "learningRate: 0.003" in git("show", f"{tip}:model.yaml", cwd=stack.work)
    assert "errorRate: 0.5" in git("show", f"{tip}:endpoint.yaml", cwd=stack.work)
    assert git("log", "-1", "--format=%an %s", tip, cwd=stack.work) == f"forgectl Revert model digits-mlp to {v2}: canary {v1} rolled back"


def test_a_pushed_spec_with_an_error_is_refused_and_a_fix_is_applied(stack: Stack) -> None:
    if "v2" not in _STATE:
        pytest.fail("the promotion test did not pass")
    status = stack.sync()["status"]
    applied_revision, before = status["lastAppliedRevision"], stack.applied()
    model = stack.work / "model.yaml"
    text = model.read_text()
    assert "learningRate: 0.002" in text, text
    model.write_text(text.replace("learningRate: 0.002", "learningRate: fast", 1))
    bad = stack.push("a typo")

    def refused() -> dict[str, Any] | None:
        st = stack.sync().get("status", {})
        ready = next((c for c in st.get("conditions") or [] if c["type"] == "Ready"), {})
        return st if st.get("lastAttemptedRevision") == bad and ready.get("status") == "False" else None
    status = wait_until(refused, 120, "the controller to refuse the revision with the typo", interval=1)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ValidationFailed", ready
    line = next(n for n, ln in enumerate(model.read_text().splitlines(), 1) if "learningRate: fast" in ln)
    assert f"model.yaml:{line}:" in ready["message"] and "learningRate" in ready["message"], ready["message"]
    assert status["lastAppliedRevision"] == applied_revision  # the running version is untouched
    assert stack.applied() == before  # nothing written
    assert all(_infer_at(stack.gateway_url) == 200 for _ in range(20))  # and the stable still answers

    model.write_text(model.read_text().replace("learningRate: fast", "learningRate: 0.002", 1))
    # the fix, announced as a forge would: a signed push webhook, sent to the replica that does not
    # lead (the harder of the two a Service may pick), just after a poll so the poll does not take it
    holder = stack.holder() or ""
    [follower] = [p for p in stack.pods() if p.metadata.deletion_timestamp is None and p.metadata.name != _pod_of(holder)]
    leader_ip = next(p.status.pod_ip for p in stack.pods() if p.metadata.name == _pod_of(holder))
    polled = _fetches(leader_ip)
    wait_until(lambda: _fetches(leader_ip) != polled, 30, "the leader's next poll", interval=0.25)
    fixed = stack.push("the fix")
    body = json.dumps({"ref": "refs/heads/main", "after": fixed}).encode()
    signature = "sha256=" + hmac.new(WEBHOOK_KEY.encode(), body, hashlib.sha256).hexdigest()
    pushed = time.monotonic()
    request = urllib.request.Request(f"http://{follower.status.pod_ip}:{PORT}/hooks/git", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "X-Hub-Signature-256": signature})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 202, answer.read()
    wait_until(lambda: (st := stack.sync().get("status", {})).get("lastAppliedRevision") == fixed and next(
        (c for c in st.get("conditions") or [] if c["type"] == "Ready"), {}).get("status") == "True", 120,
               "the fixed revision applied and Ready", interval=0.25)
    took = time.monotonic() - pushed
    print(f"\nwebhook to the follower → the fix applied: {took:.1f} s")
    assert "forge.dev/requested-at" in (stack.sync()["metadata"].get("annotations") or {})
    assert "a push, passed on to the leader" in _pod_log(stack, follower.metadata.name)
    assert "a sync requested" in _pod_log(stack, _pod_of(holder))
    assert took < 10, took  # sooner than the 10 s poll: the webhook moved it (issue 33's goal: ≤ 5 s)


def _pod_log(stack: Stack, pod: str) -> str:
    return str(stack.core.read_namespaced_pod_log(pod, CONTROLLER_NS))


def _fetches(pod_ip: str) -> float:
    """How many fetches a replica has made (its own forge_controller_git_fetch_duration_seconds_count)."""
    _, text = _get(f"http://{pod_ip}:{PORT}/metrics")
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith("forge_controller_git_fetch_duration_seconds_count"))


def _process_figures(pod_ip: str) -> tuple[float, float]:
    """(CPU seconds, resident bytes) of a controller pod's process, from its own /metrics."""
    status, text = _get(f"http://{pod_ip}:{PORT}/metrics")
    assert status == 200, text
    values = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines()
              if ln.startswith(("process_cpu_seconds_total ", "process_resident_memory_bytes "))}
    return values["process_cpu_seconds_total"], values["process_resident_memory_bytes"]


def test_the_idle_controller_footprint(stack: Stack) -> None:
    """Issue 33's figure: each replica's CPU and RSS over 30 s with nothing to do but poll its
    source every 10 s (the leader) or wait for the Lease (the follower), from the processes' own
    counters (prometheus_client's process collector)."""
    if "live" not in _STATE:
        pytest.fail("the apply test did not pass")
    holder = stack.holder()
    pods = {p.metadata.name: p.status.pod_ip for p in stack.pods() if p.metadata.deletion_timestamp is None}
    first = {name: _process_figures(ip) for name, ip in pods.items()}
    t0 = time.monotonic()
    time.sleep(30)
    last = {name: _process_figures(ip) for name, ip in pods.items()}
    span = time.monotonic() - t0
    figures = {("leader" if name == _pod_of(holder or "") else "follower"): {
        "cpu_millicores": round(1000 * (last[name][0] - first[name][0]) / span, 1),
        "rss_mib": round(last[name][1] / 2**20, 1)} for name in pods}
    print("\ncontroller idle:", json.dumps(figures))
    assert set(figures) == {"leader", "follower"}, figures
    # the install's Deployment asks 50m and 128Mi (limit 1Gi): idle, it stays near what it asks
    assert all(f["cpu_millicores"] < 100 and f["rss_mib"] < 400 for f in figures.values()), figures


def test_prometheus_scrapes_the_controller_and_loads_its_alerts(stack: Stack, shared_node: nodekit.SharedNode) -> None:
    """The PodMonitor and PrometheusRule `forgectl install` applied, as the in-cluster Prometheus
    (the Prometheus Operator's, selecting every namespace's) uses them: both replicas' /metrics
    scraped, exactly one leading, and the three alerts loaded, none firing."""
    if "live" not in _STATE:
        pytest.fail("the apply test did not pass")
    _, prometheus = shared_node.prometheus()

    def scraped() -> list[dict[str, Any]] | None:
        rows = _query(prometheus, f'up{{namespace="{CONTROLLER_NS}"}} == 1')
        return rows if len(rows) == 2 else None
    rows = wait_until(scraped, 120, "both controller replicas scraped through their PodMonitor", interval=2)
    assert all(NAME in r["metric"].get("job", "") for r in rows), rows
    leading = _query(prometheus, f'sum(forge_controller_leader{{namespace="{CONTROLLER_NS}",source="{SOURCE}"}})')
    assert [float(r["value"][1]) for r in leading] == [1.0], leading
    with urllib.request.urlopen(f"{prometheus}/api/v1/rules", timeout=10) as resp:
        groups = json.loads(resp.read())["data"]["groups"]
    rules = {r["name"]: r for g in groups if g["name"] == "forge-controller" for r in g["rules"]}
    assert set(rules) == {"ForgeSyncFailing", "ForgeRolloutStuck", "ForgeControllerNoLeader"}, sorted(rules)
    assert all(r["health"] == "ok" and r["state"] == "inactive" for r in rules.values()), rules


def test_uninstall_removes_the_controller_and_keeps_what_it_applied(stack: Stack) -> None:
    if "live" not in _STATE:
        pytest.fail("the apply test did not pass")
    # Argo and Seldon's operator keep writing their objects' status: what must not change is Forge's own writes
    applied = stack.applied()
    assert applied and all(applied.values()), applied  # each object has Forge's entry to compare
    done = stack.forgectl("uninstall", "-n", CONTROLLER_NS, "--manage", APPS_NS, "--auto-approve")
    assert "Uninstalled:" in done.stdout, done.stdout
    wait_until(lambda: not stack.pods(), 120, "the controller's pods gone", interval=1)
    with pytest.raises(client.ApiException) as gone:
        stack.apps.read_namespaced_deployment(NAME, CONTROLLER_NS)
    assert gone.value.status == 404
    # the leader gave the Lease back on SIGTERM (a killed one would have left it to expire)
    assert stack.holder() is None
    assert stack.applied() == applied
