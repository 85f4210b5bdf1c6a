"""The quick-start end to end on the one-node cluster, under the real controllers (issue 14).

Its own cluster (node=True, CRDs) + node, with Forge's runtime image (devkit.node.runtime_image:
Debian + Python + the pinned requirements; the first build takes a few minutes and ~7 GB) imported
into containerd under the names the `cluster` Environment renders, and on it the real controllers:
Argo Workflows' (devkit.node.argo), Seldon Core v1's operator (devkit.node.seldon) and the
Prometheus Operator (devkit.node.promop) with the Prometheus it manages as a pod. `forgectl` runs
on the host with the cluster's admin kubeconfig, as a platform engineer's laptop or CI would; the
rendered objects are never changed. The stages run in order and share the cluster:

1. `apply` → Argo runs prepare → train → evaluate → compress → register as pods (one variant,
   beyond its accuracy bound, rejected by its step's verdict: the version registers the others and
   `models show` lists it with the reason, from the register node's output); `status` shows
   the Workflow and its steps from the cluster; the Seldon operator makes the stable predictor,
   which serves; Prometheus, configured by the operator from the PodMonitor, scrapes it, and the
   rule group is loaded.
2. a `learningRate` change → `plan` names the cache hit and Argo's memoization hits (the memoized
   task's `memoizationStatus.hit`, no pod); `reconcile --watch` promotes the healthy canary through
   every step on Prometheus's figures.
3. an evaluation threshold no model meets, and the training's first attempt killed → Argo
   retries the training (its exit 137, a killed process) and does not retry the evaluation (its
   permanent exit code); the rollout is refused on the offline gate, and `status` shows both. The
   kill is the step's own (`faultInjection.killFirstAttempt`, a drill): deterministic, where
   deleting a running pod raced Argo, which re-created the pod instead of recording an attempt.
4. back to the first version with an injected fault → every step a cache hit; the canary fails
   its analysis and `reconcile --watch` rolls it back, the reason in `rollout status`.
   Then a shadow of the first version (`percent: 50`) under the gateway: callers get only the
   stable's answers; the stable's server copies half of what it answered to the shadow's Service
   and compares (issue 29), counted from both servers' own metrics, the gate template
   `shadow-agreement` in the in-cluster Prometheus and `rollout status`. Then a shadow of the
   rejected variant: its pod stops in its init container with the step's reason (the kubelet's
   termination message), which `rollout status` shows; callers are answered throughout.
5. `down` deletes what Forge owns: the controllers remove the pods they made.
6. examples/search in a namespace of its own: Argo runs the rendered TPE + ASHA search — its trial
   pods two at a time, one Optuna study in the cluster's PostgreSQL (Debian's, a pod the harness
   starts: devkit.node.postgres; its URL in the Secret the Environment's `studyDatabase` names) —
   then pick-best, evaluate and register; the registry's record of the search agrees with what
   Optuna reads back from that database (issue 31: the search on the node cluster's Argo).
7. the quick-start's model on a queued pool of one fake GPU per node, trained with DDP on
   two nodes: the PyTorchJob Argo's train step creates waits suspended by Kueue while one of its
   two GPUs is held by another workload (neither replica has a pod), starts both replicas at once
   when it is freed, and the real Training Operator runs it to Succeeded (issue 30).
8. two Models on a queued pool of one fake GPU: `forgectl plan` names the running `low` training's
   Workload as the one a new `high` training will preempt; applied, Kueue preempts it, Argo
   retries the step, whose pod waits gated until the urgent training is done and then resumes
   from the last checkpoint, counting on to the end (issue 30).
9. examples/sharded with its shards on a claim: Argo runs the fan-out of one memoized pod per
   group, the join, the training on the streamed shards (issue 31).
10. examples/sharded-labelled with its data on a claim: the fan-out, a TPE + ASHA search whose
   Workflow waits for the labelling model's registration, pre-labels the claim's unlabelled rows,
   gates the agreement and registers with the labeller as its parent; the review file pulled and
   the reviewed labels merged into the claim as a new shard by `forgectl labels` (issue 31);
   10b: reviewed labels merged into a single CSV file on a claim by a pod.

The quick-start's namespace enforces Pod Security `restricted` (labelled as a platform team would
before Forge applies anything): the API server's own PodSecurity admission refuses any pod below
it, the pods Argo and the Seldon operator make from Forge's objects included, so every stage runs
under it (issue 32).

Traffic goes through a real gateway: Traefik v3 with its Kubernetes Gateway provider
(devkit.node.traefik) runs on the node, and the `cluster` Environment routes by the Gateway API
(`traffic.router: gatewayAPI`, its Gateway as `parentRef`: what the test commits to the
quick-start's copy, as the cluster's platform team would). Forge renders an HTTPRoute per Endpoint
and the rollout controller moves its weights; the test only sends requests to the gateway and
reads who answered them from the predictors' own metrics in Prometheus, never splitting traffic
itself (issue 29).
Needs root; never skips.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, dynamic

from devkit import pools
from devkit.cluster import Cluster
from devkit.node import argo, postgres, promop, runtime_image, traefik
from devkit.node.controllers import HostController
from devkit.node.node import Node
from devkit.rollout import BODY
from reconciler.targets.kubernetes.workflow_status import task_nodes
from renderers.labels import STEP
from specs.rollout import BUILTIN_TEMPLATES, fill_placeholders
from tests.bytecode import import_script
from tests.cluster import nodekit
from tests.polling import wait_until
from tests.runtimes.helpers import series_value
from tests.specedits import REJECTED_VARIANT, add_rejected_variant, route_by_gateway

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart"
FORGECTL = REPO / ".venv" / "bin" / "forgectl"
NS = "forge-quickstart"  # the `cluster` Environment's namespace
MODEL_VERSION = "forge.dev/model-version"
#: The Pod Security admission labels of a namespace that enforces `restricted` (and warns and audits at it).
PSA_RESTRICTED = {f"pod-security.kubernetes.io/{mode}{suffix}": value
                  for mode in ("enforce", "warn", "audit") for suffix, value in (("", "restricted"), ("-version", "latest"))}


def _wait(what: str, fn: Callable[[], Any], timeout: float = 120.0, every: float = 1.0) -> Any:
    return wait_until(fn, timeout, what, interval=every)


class _Stack:
    def __init__(self, cluster: Cluster, node: Node, archive: Path, refs: list[str], prometheus_url: str,
                 gateway: traefik.TraefikGateway, times: dict[str, float]) -> None:
        self.cluster, self.node, self.archive, self.refs = cluster, node, archive, refs
        self.prometheus_url, self.gateway, self.times = prometheus_url, gateway, times


#: What :func:`node_images` built: the runtime images' archive and refs.
_BUILT: dict[str, Any] = {}


def node_images() -> list[tuple[str, str]]:
    """The runtime images, Argo's executor and the Prometheus Operator's images (each built the
    first time; Traefik, Kueue and the Training Operator too, long builds: docs/test-cluster.md)."""
    from devkit.node import kueue, training_operator

    _BUILT["archive"], _BUILT["refs"], _ = runtime_image.build()
    traefik.ensure_binary()
    kueue.ensure_binary()
    training_operator.ensure_binary()
    return [argo.executor_image(), *promop.images(), postgres.image()] + [(str(_BUILT["archive"]), r) for r in _BUILT["refs"]]


@pytest.fixture(scope="module")
def stack(shared_node: nodekit.SharedNode) -> _Stack:
    t = time.monotonic()
    # the controllers the modules before this one started are kept; the others start now
    shared_node.argo()
    shared_node.seldon()
    gateway = shared_node.gateway()
    _, url = shared_node.prometheus()
    times = {"controllers": time.monotonic() - t}
    print("\nstack up:", json.dumps({k: round(v, 1) for k, v in times.items()}))
    return _Stack(shared_node.cluster, shared_node.node, _BUILT["archive"], _BUILT["refs"], url, gateway, times)


class Quickstart:
    """A copy of examples/quickstart in a git repository of its own, and what the stages need to
    read back from the cluster."""

    def __init__(self, stack: _Stack, work: Path) -> None:
        self.stack, self.work = stack, work
        self.api = stack.node.api()
        self.core = client.CoreV1Api(self.api)
        dyn = dynamic.DynamicClient(self.api)
        self.workflows = dyn.resources.get(api_version="argoproj.io/v1alpha1", kind="Workflow")
        self.sdeps = dyn.resources.get(api_version="machinelearning.seldon.io/v1", kind="SeldonDeployment")
        self.routes = dyn.resources.get(api_version="gateway.networking.k8s.io/v1", kind="HTTPRoute")
        self.versions: dict[str, str] = {}

    def git(self, *args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=self.work,
                       check=True, capture_output=True)

    @classmethod
    def committed(cls, stack: _Stack, work: Path, message: str) -> Quickstart:
        """``work`` as a git repository with everything in it committed (what a stage applies)."""
        q = cls(stack, work)
        q.git("init", "-q")
        q.git("add", ".")
        q.git("commit", "-qm", message)
        return q

    def edit(self, file: str, old: str, new: str, message: str) -> None:
        path = self.work / file
        text = path.read_text()
        assert old in text, (file, old)
        path.write_text(text.replace(old, new, 1))
        self.git("commit", "-qam", message)

    def forgectl(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, KUBECONFIG=self.stack.node.kubeconfig, NO_COLOR="1", COLUMNS="200")
        proc = subprocess.run([str(FORGECTL), *args], cwd=self.work, env=env, capture_output=True, text=True,
                              timeout=timeout)
        if check:
            assert proc.returncode == 0, f"forgectl {' '.join(args)} → {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self.forgectl(*args, "--env", "cluster", "-o", "json").stdout)

    def version(self, model: str = "digits-mlp") -> str:
        """The version of ``model`` the specs in the working tree want."""
        from reconciler.load.environments import load_environment
        from renderers.versions import model_version
        from specs import Model

        result, environment = load_environment([str(self.work)], None, "cluster")
        return model_version(result.specs, result.specs.get(Model, model), environment)

    def workflow(self, version: str) -> dict[str, Any] | None:
        items = self.workflows.get(namespace=NS, label_selector=f"{MODEL_VERSION}={version}").to_dict()["items"]
        return items[0] if items else None

    def finished(self, version: str, timeout: float = 900) -> dict[str, Any]:
        """The version's Workflow once Argo has finished it (also kept beside the work folder, as
        the controller wrote it)."""
        def done() -> dict[str, Any] | None:
            wf = self.workflow(version)
            phase = ((wf or {}).get("status") or {}).get("phase")
            return wf if phase in ("Succeeded", "Failed", "Error") else None
        wf: dict[str, Any] = _wait(f"the Workflow of version {version} to finish", done, timeout=timeout, every=3)
        (self.work.parent / f"workflow-{version}-{wf['status']['phase']}.json").write_text(json.dumps(wf, indent=1))
        return wf

    def route(self) -> dict[str, Any]:
        """The Endpoint's HTTPRoute, as Forge rendered it and the gateway reported on it."""
        return self.routes.get(namespace=NS, name="digits").to_dict()

    def sdep(self) -> dict[str, Any]:
        return self.sdeps.get(namespace=NS, name="digits").to_dict()

    def predictors(self) -> dict[str, dict[str, Any]]:
        return {p["name"]: p for p in self.sdep()["spec"]["predictors"]}

    def service_url(self, predictor: str) -> str:
        """The predictor's Service (the operator names it `<deployment>-<predictor>`) at its ClusterIP."""
        svc = _wait(f"the {predictor} predictor's Service", lambda: next(
            (s for s in self.core.list_namespaced_service(NS).items if s.metadata.name == f"digits-{predictor}"), None))
        return f"http://{svc.spec.cluster_ip}:9000"

    def served(self, window_s: float) -> dict[tuple[str, str], float]:
        """Requests the predictors answered in the last ``window_s`` seconds, by (role, HTTP code),
        from their own counters (`forge_requests_total`, scraped by Prometheus through the rendered
        PodMonitor): who answered what, never the client's guess."""
        rows = self.query(f'sum by (forge_role, code) (increase(forge_requests_total{{forge_endpoint="digits",'
                          f'forge_namespace="{NS}"}}[{max(int(window_s), 30)}s]))')
        return {(r["metric"].get("forge_role", ""), r["metric"].get("code", "")): float(r["value"][1]) for r in rows}

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.stack.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())["data"]["result"]

    def prometheus(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.stack.prometheus_url}{path}", timeout=10) as resp:
            return json.loads(resp.read())["data"]


def _infer(url: str) -> int:
    return _infer_at(url + "/v2/models/digits-mlp/infer")


def _infer_at(url: str) -> int:
    req = urllib.request.Request(url, data=BODY,
                                 headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


def _nodes(wf: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each task's node by its name, as `forgectl status` finds it (workflow_status.task_nodes):
    the one-task DAG of its memoized template, and the exit handler's pod by its template's name."""
    return {name: dict(task.node) for name, task in task_nodes(wf).items()}


def _attempts(wf: dict[str, Any], task: str) -> list[dict[str, Any]]:
    """The pods that ran a task: the children of the Retry node inside its memoized DAG."""
    return [dict(a) for a in task_nodes(wf)[task].attempts]


class GatewayTraffic:
    """Requests to the Endpoint through the gateway, each logged with its time and HTTP status (0:
    no answer). The gateway chooses the predictor; this client never does."""

    def __init__(self, url: str) -> None:
        self.url = url + "/v2/models/digits-mlp/infer"
        self.log: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self, rate: float = 20.0) -> None:
        while not self.stop.is_set():
            self.log.append((time.monotonic(), _infer_at(self.url)))
            time.sleep(1.0 / rate)

    def codes(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for _, code in list(self.log):
            out[code] = out.get(code, 0) + 1
        return out


def _rollout(q: Quickstart, reason: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], GatewayTraffic,
                                                  dict[tuple[str, str], float]]:
    """Traffic to the Endpoint through the gateway, and `forgectl reconcile --watch` until the
    rollout settles; its output, `rollout status`, the client's log and who answered (by role and
    code, from the predictors' own counters)."""
    assert _wait("the canary predictor", lambda: "canary" in q.predictors(), timeout=120)
    _wait("the canary's server to answer", lambda: _infer(q.service_url("canary")) in (200, 500), timeout=300, every=2)
    traffic = GatewayTraffic(q.stack.gateway.url)
    _wait("the gateway to route the Endpoint", lambda: _infer_at(traffic.url) in (200, 500), timeout=60)
    thread = threading.Thread(target=traffic.run, daemon=True)
    t0 = time.monotonic()
    thread.start()
    try:
        watch = q.forgectl("reconcile", "--env", "cluster", "--watch", "--until-settled", "--timeout", "420",
                           "--prometheus-url", q.stack.prometheus_url, timeout=480, check=False)
    finally:
        traffic.stop.set()
        thread.join(timeout=10)
    nodekit.scraped_since(q.query, f'forge_requests_total{{forge_endpoint="digits",forge_namespace="{NS}"}}', time.time())
    served = q.served(time.monotonic() - t0 + 5)  # the traffic's whole span, from 5 s before it began
    status = q.json("rollout", "status", "digits", "--prometheus-url", q.stack.prometheus_url)
    print(f"\n{reason}: reconcile → {watch.returncode}\n{watch.stdout[-3000:]}\n"
          f"{json.dumps(status['rollout'], indent=1)[:3000]}\nclient codes {traffic.codes()}; served {served}")
    return watch, status, traffic, served


def _answered(served: dict[tuple[str, str], float], role: str, ok: bool) -> float:
    """Requests ``role`` answered with a 2xx (``ok``) or anything else."""
    return sum(n for (r, code), n in served.items() if r == role and code.startswith("2") is ok)


@pytest.fixture(scope="module")
def qs(stack: _Stack, shared_node: nodekit.SharedNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quickstart]:
    work = tmp_path_factory.mktemp("e2e") / "quickstart"
    shutil.copytree(QUICKSTART, work)
    q = Quickstart(stack, work)
    q.git("init", "-q")
    # the cluster's platform team routes by the Gateway API, through the gateway running on it
    route_by_gateway(work, stack.gateway.parent_ref())
    # and its Compression has a variant beyond its bound: Argo runs its step, the version registers the others
    add_rejected_variant(work)
    q.git("add", ".")
    q.git("commit", "-qm", "quick-start")
    # the platform team's namespace, enforcing `restricted` before Forge applies into it (Forge only
    # ensures a namespace exists: its apply leaves these labels, which are not its own, alone)
    try:
        with shared_node.namespace(NS, PSA_RESTRICTED):
            yield q
    finally:
        q.api.close()


def test_runtime_images_are_in_containerd_under_the_rendered_names(stack: _Stack) -> None:
    from reconciler.load.environments import load_environment
    from renderers import RenderContext, render

    result, environment = load_environment([str(QUICKSTART)], None, "cluster")
    wf = next(m for m in render(result.specs, RenderContext(environment)).manifests if m["kind"] == "Workflow")
    rendered = {t["container"]["image"] for t in wf["spec"]["templates"] if "container" in t}
    assert rendered and rendered <= set(stack.refs), (rendered, stack.refs)
    listed = {ln.split()[0]: ln.split()[2] for ln in stack.node.ctr("images", "ls").stdout.splitlines()[1:]}
    for ref, digest in runtime_image.archive_refs(stack.archive).items():
        assert listed.get(ref) == digest, (ref, listed.get(ref), digest)
    # the archive is keyed and cached; building again finds it
    again, refs, info = runtime_image.build()
    assert again == stack.archive and refs == stack.refs and "pack_s" not in info


def test_the_runtime_image_imports_from_its_byte_code(stack: _Stack) -> None:
    """Every file of a layer has mtime 0, so pip's timestamp-based byte-code never matched there and
    each step's pod compiled torch, numpy, pandas and Forge's modules again (read-only root, no
    byte-code written): about 3 s of CPU a pod. The image's byte-code is hash-based; a pod run as
    the rendered steps are (uid 1000, read-only root filesystem) imports without compiling."""
    [image] = [r for r in stack.refs if "/forge-train:" in r]
    core = client.CoreV1Api(stack.node.api())
    name = "byte-code"
    volumes = {"tmp": "/tmp", "home": "/home/forge"}
    script = import_script("import numpy, pandas, torch, runtimes.train")
    core.create_namespaced_pod("default", client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(restart_policy="Never", termination_grace_period_seconds=1,
                              volumes=[client.V1Volume(name=v, empty_dir=client.V1EmptyDirVolumeSource()) for v in volumes],
                              containers=[client.V1Container(
                                  name="main", image=image, image_pull_policy="Never", command=["python", "-c", script],
                                  security_context=client.V1SecurityContext(run_as_user=1000, read_only_root_filesystem=True,
                                                                            allow_privilege_escalation=False),
                                  volume_mounts=[client.V1VolumeMount(name=v, mount_path=p) for v, p in volumes.items()])])))
    try:
        phase = _wait("the import pod to finish", lambda: (p := core.read_namespaced_pod(name, "default").status.phase)
                      in ("Succeeded", "Failed") and p, timeout=180)
        log = core.read_namespaced_pod_log(name, "default", container="main")
        assert phase == "Succeeded", log[-3000:]
        result = json.loads(log.strip().splitlines()[-1])
        print(f"\nimports in a pod of {image}: {result['cpu_s']:.1f} s of CPU, {len(result['compiled'])} modules compiled")
        assert result["compiled"] == [], result["compiled"][:20]
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        core.api_client.close()


def test_1_apply_trains_serves_and_is_scraped(qs: Quickstart) -> None:
    t0 = time.monotonic()
    qs.forgectl("apply", "--env", "cluster", "--auto-approve")
    v1 = qs.versions["v1"] = qs.version()
    wf = qs.finished(v1)
    steps = {name: n["phase"] for name, n in _nodes(wf).items()}
    print(f"\nversion {v1}: Workflow {wf['status']['phase']} in {time.monotonic() - t0:.0f} s: {steps}")
    assert wf["status"]["phase"] == "Succeeded", (wf["status"].get("message"), steps)
    assert {"prepare-data", "train", "evaluate", f"compress-{REJECTED_VARIANT}", "register"} <= set(steps)
    assert set(steps.values()) == {"Succeeded"}
    # the rejected variant: a verdict of its step (Succeeded), read back from the register node's
    # output parameter Argo keeps in the Workflow's status
    record = qs.json("models", "show", f"digits-mlp@{v1}")
    assert REJECTED_VARIANT not in record["variants"] and {"base", "int8"} <= set(record["variants"]), record["variants"]
    assert "more than the allowed 0.5" in record["rejected"][REJECTED_VARIANT], record.get("rejected")

    # `forgectl status` shows the Workflow and its steps, read from the cluster
    status = qs.json("status")
    [shown] = [w for w in status["workflows"] if w["version"] == v1]
    assert shown["phase"] == "Succeeded"
    shown_steps = {s["step"]: s for s in shown["steps"]}
    assert set(shown_steps) == set(steps) and "record-outcome" in steps, shown_steps
    assert all(s["status"] == "succeeded" and s["attempts"] == 1 for s in shown_steps.values()), shown_steps
    text = qs.forgectl("status", "--env", "cluster").stdout
    assert wf["metadata"]["name"] in text and "train" in text, text

    # the Seldon operator's stable predictor serves the registered model
    _wait("the SeldonDeployment to be Available", lambda: (qs.sdep().get("status") or {}).get("state") == "Available",
          timeout=300, every=2)
    stable = qs.service_url("stable")
    _wait("the stable predictor to answer", lambda: _infer(stable) == 200, timeout=60)
    assert all(_infer(stable) == 200 for _ in range(30))
    # ... and through the gateway, by the HTTPRoute Forge rendered, which the gateway admitted
    route = qs.route()
    parents = route.get("status", {}).get("parents") or []
    conditions = {c["type"]: c["status"] for p in parents for c in p.get("conditions") or []}
    assert conditions.get("Accepted") == "True" and conditions.get("ResolvedRefs") == "True", parents
    gateway = qs.stack.gateway.url
    _wait("the gateway to route to the stable predictor", lambda: _infer(gateway) == 200, timeout=60)

    # Prometheus, configured by the operator from the rendered PodMonitor, scrapes that pod
    def scraped() -> float:
        rows = qs.query('sum(forge_requests_total{forge_endpoint="digits",forge_namespace="forge-quickstart",'
                        'forge_role="stable"})')
        return float(rows[0]["value"][1]) if rows else 0.0
    assert _wait("Prometheus to count the stable's requests", lambda: scraped() >= 31, timeout=120, every=2)
    targets = qs.prometheus("/api/v1/targets")["activeTargets"]
    pool = [t for t in targets if "podMonitor/forge-quickstart/digits" in t["scrapePool"]]
    assert pool and all(t["health"] == "up" for t in pool), [(t["scrapePool"], t["health"]) for t in targets]
    groups = {g["name"] for g in qs.prometheus("/api/v1/rules")["groups"]}
    assert "forge-digits" in groups, groups  # the rendered PrometheusRule, loaded by the operator's reloader

    # all of it ran in a namespace that enforces `restricted`: the labels are still there, and every
    # pod the controllers made from Forge's objects is one the API server admitted under them
    labels = qs.core.read_namespace(NS).metadata.labels or {}
    assert {k: labels.get(k) for k in PSA_RESTRICTED} == PSA_RESTRICTED, labels
    pods = qs.core.list_namespaced_pod(NS).items
    assert pods and all(p.spec.security_context.run_as_non_root for p in pods), [p.metadata.name for p in pods]


def test_2_a_learning_rate_change_hits_the_cache_and_promotes(qs: Quickstart) -> None:
    v1 = qs.versions["v1"]
    qs.edit("model.yaml", "learningRate: 0.002", "learningRate: 0.003", "learning rate 0.003")
    plan = qs.forgectl("plan", "--env", "cluster").stdout
    hits = [line for line in plan.splitlines() if "cache hit" in line]
    assert hits and "prepare-data" in hits[0], plan
    t0 = time.monotonic()
    qs.forgectl("apply", "--env", "cluster", "--auto-approve")
    v2 = qs.versions["v2"] = qs.version()
    assert v2 != v1
    _wait("the new Workflow", lambda: (qs.workflow(v2) or {}).get("metadata", {}).get("name"))

    wf = qs.finished(v2)
    print(f"\nversion {v2}: Workflow {wf['status']['phase']} in {time.monotonic() - t0:.0f} s")
    assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
    nodes = _nodes(wf)
    # Argo's memoization: the unchanged data step came from the cache, with no pod
    assert (nodes["prepare-data"].get("memoizationStatus") or {}).get("hit") is True, nodes["prepare-data"]
    shown = {s["step"]: s for w in qs.json("status")["workflows"] if w["version"] == v2 for s in w["steps"]}
    assert shown["prepare-data"]["status"] == "cached" and shown["train"]["attempts"] == 1, shown

    # the healthy canary is promoted through every step on Prometheus's figures
    watch, status, traffic, served = _rollout(qs, "healthy canary")
    assert watch.returncode == 0, watch.stdout[-3000:] + watch.stderr[-3000:]
    assert status["rollout"]["phase"] == "Promoted", status["rollout"]["reason"]
    assert [h["weight"] for h in status["rollout"]["history"] if "/3: canary" in h["reason"]] == [10, 50, 100]
    assert status["serving"]["stable"] == v2 and status["serving"]["canary"] is None
    # the gateway sent the canary its share, and neither predictor failed a request
    assert _answered(served, "canary", ok=True) > 0, served
    assert _answered(served, "canary", ok=False) == 0 and _answered(served, "stable", ok=False) == 0, served
    codes = traffic.codes()
    assert codes.get(200, 0) >= 0.99 * len(traffic.log), codes
    route = qs.route()
    assert [b["name"] for r in route["spec"]["rules"] if r.get("name") == "split" for b in r["backendRefs"]] == \
        ["digits-stable"], route["spec"]["rules"]
    _wait("the operator to drop the old predictor", lambda: set(qs.predictors()) == {"stable"}, timeout=60)
    labels = qs.predictors()["stable"]["labels"]
    assert labels[MODEL_VERSION] == v2, labels


def test_3_a_failed_evaluation_is_not_retried(qs: Quickstart) -> None:
    qs.edit("model.yaml", "min: 0.95", "min: 0.9999", "a threshold no model meets")
    qs.edit("model.yaml", "  datasetRef: digits\n", "  datasetRef: digits\n  faultInjection: {killFirstAttempt: true}\n",
            "a drill: the training's first attempt is killed")
    qs.forgectl("apply", "--env", "cluster", "--auto-approve")
    v3 = qs.versions["v3"] = qs.version()

    wf = qs.finished(v3)
    assert wf["status"]["phase"] == "Failed", wf["status"]
    nodes = _nodes(wf)
    train = _attempts(wf, "train")
    # the first attempt was killed (SIGKILL: exit 137, not a permanent code): Argo retried it
    assert [a["phase"] for a in train] == ["Failed", "Succeeded"], train
    assert train[0]["outputs"]["exitCode"] == "137", train[0]
    # the data did not change: a cache hit (a new version trains again: its outputs are its own);
    # the evaluation failed once, permanently (exit 2-5), and nothing after it ran
    assert (nodes["prepare-data"].get("memoizationStatus") or {}).get("hit") is True, nodes["prepare-data"]
    assert nodes["train"]["phase"] == "Succeeded", nodes["train"]
    assert nodes.get("register", {}).get("phase") != "Succeeded", nodes.get("register")
    attempts = _attempts(wf, "evaluate")
    assert len(attempts) == 1 and attempts[0]["phase"] == "Failed", attempts
    assert attempts[0]["outputs"]["exitCode"] in ("2", "3", "4", "5"), attempts[0]
    print(f"\nversion {v3}: evaluate failed once: {attempts[0].get('message')}")
    one = qs.forgectl("reconcile", "--env", "cluster", "--prometheus-url", qs.stack.prometheus_url, check=False)
    status = qs.json("rollout", "status", "digits", "--prometheus-url", qs.stack.prometheus_url)
    assert status["rollout"]["phase"] == "RolledBack", (one.stdout, status["rollout"])
    assert "offline evaluation failed" in status["rollout"]["reason"], status["rollout"]["reason"]
    assert status["serving"]["stable"] == qs.versions["v2"]
    shown = {s["step"]: s for w in qs.json("status")["workflows"] if w["version"] == v3 for s in w["steps"]}
    assert shown["train"]["attempts"] == 2 and shown["train"]["status"] == "succeeded", shown["train"]
    assert shown["evaluate"]["attempts"] == 1 and shown["evaluate"]["status"] == "failed", shown["evaluate"]


def test_4_a_faulty_canary_is_rolled_back(qs: Quickstart) -> None:
    qs.edit("model.yaml", "min: 0.9999", "min: 0.95", "threshold back")
    qs.edit("model.yaml", "  faultInjection: {killFirstAttempt: true}\n", "", "no more killed attempts")
    qs.edit("model.yaml", "learningRate: 0.003", "learningRate: 0.002", "learning rate back")
    qs.edit("endpoint.yaml", "  protocol: v2\n", "  protocol: v2\n  faultInjection:\n    errorRate: 0.5\n",
            "a drill: the canary fails half its requests")
    assert qs.version() == qs.versions["v1"]
    qs.forgectl("apply", "--env", "cluster", "--auto-approve")
    wf = qs.finished(qs.versions["v1"], timeout=300)
    assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
    nodes = _nodes(wf)
    # everything this version ran before is in Argo's cache (its Workflow was pruned after stage 2)
    assert all((nodes[s].get("memoizationStatus") or {}).get("hit") for s in ("prepare-data", "train", "evaluate")), nodes

    watch, status, traffic, served = _rollout(qs, "faulty canary")
    assert watch.returncode != 0 or status["rollout"]["phase"] == "RolledBack", watch.stdout[-3000:]
    assert status["rollout"]["phase"] == "RolledBack", status["rollout"]
    assert "success-rate" in status["rollout"]["reason"], status["rollout"]["reason"]
    assert status["serving"]["stable"] == qs.versions["v2"] and status["serving"]["weights"]["canary"] == 0
    # the gateway sent the faulty canary requests, which it failed; the stable answered every one of its own
    assert _answered(served, "canary", ok=False) > 0 and _answered(served, "stable", ok=False) == 0, served
    assert _answered(served, "stable", ok=True) > 0, served
    # after the rollback the gateway sends the canary nothing: every request answered by the stable
    weights = {b["name"]: b["weight"] for r in qs.route()["spec"]["rules"] if r.get("name") == "split"
               for b in r["backendRefs"]}
    assert weights.get("digits-canary", 0) == 0 and weights["digits-stable"] == 100, weights
    assert all(_infer(qs.stack.gateway.url) == 200 for _ in range(50))
    _wait("the operator to drop the canary", lambda: set(qs.predictors()) == {"stable"}, timeout=60)


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return resp.read().decode()


def _answer_version(url: str) -> tuple[int, str]:
    """POST the test's request: the HTTP status and the `model_version` of the answer."""
    req = urllib.request.Request(url + "/v2/models/digits-mlp/infer", data=BODY,
                                 headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read()).get("model_version", "")
    except urllib.error.HTTPError as exc:
        return exc.code, ""


SHADOWED = 400  # requests through the gateway while the shadow gets half of them


def test_4b_a_shadow_gets_copies_from_the_live_server_and_its_agreement_is_in_prometheus(qs: Quickstart) -> None:
    """A shadow pinned to the first version, `percent: 50`, under the gateway: the gateway sends
    callers only to the stable; the stable's server copies half of what it answered to the
    shadow's Service and compares (runtimes/serving/mirror.py). Counted from both servers' own
    metrics and from the in-cluster Prometheus (the gate template, `rollout status`)."""
    v1, v2 = qs.versions["v1"], qs.versions["v2"]
    qs.edit("endpoint.yaml", "  faultInjection:\n    errorRate: 0.5\n", f"  shadow: {{version: '{v1}', percent: 50}}\n",
            "a shadow of the first version, half the requests")
    qs.forgectl("apply", "--env", "cluster", "--auto-approve")
    assert _wait("the shadow predictor", lambda: "shadow" in qs.predictors(), timeout=120)
    shadow_url, stable_url = qs.service_url("shadow"), qs.service_url("stable")
    _wait("the shadow's server to answer", lambda: _infer(shadow_url) == 200, timeout=300, every=2)

    def stable_copies() -> bool:  # the stable's pod restarted with its mirror: one pod, and it counts copies
        pods = [p for p in qs.core.list_namespaced_pod(NS, label_selector="seldon-app=digits-stable").items
                if not p.metadata.deletion_timestamp]
        return len(pods) == 1 and all("forge_shadow_requests_total" in _metrics(stable_url) for _ in range(5))

    _wait("the stable's server to copy to the shadow", stable_copies, timeout=300, every=2)
    gateway = qs.stack.gateway.url
    _wait("the gateway to route to the new stable pod", lambda: _infer(gateway) == 200, timeout=60)
    time.sleep(2)  # the copies of those requests answered before the counts are taken
    shadow_before = _metrics(shadow_url)
    before = series_value(shadow_before, "forge_requests_total", code="200", forge_role="shadow")
    stable_before = _metrics(stable_url)
    copied_before = series_value(stable_before, "forge_shadow_requests_total", outcome="compared")
    dropped_before = series_value(stable_before, "forge_shadow_requests_total", outcome="dropped")
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: _answer_version(gateway), range(SHADOWED)))
    # callers only ever got the live answer: every one the stable version's, none the shadow's
    assert {a for a in answers} == {(200, v2)}, {a: answers.count(a) for a in set(answers)}

    seen: list[tuple[float, float]] = []

    def settled() -> tuple[float, str] | None:
        stable = _metrics(stable_url)
        now = (series_value(_metrics(shadow_url), "forge_requests_total", code="200", forge_role="shadow") - before,
               series_value(stable, "forge_shadow_requests_total", outcome="compared") - copied_before)
        seen.append(now)
        return (now[0], stable) if len(seen) > 1 and seen[-1] == seen[-2] and now[0] == now[1] else None

    shadowed, stable_metrics = _wait("the copies to be answered and compared", settled, timeout=60, every=1)
    lo, hi = SHADOWED * 0.5 - 3.2905 * (SHADOWED * 0.25) ** 0.5, SHADOWED * 0.5 + 3.2905 * (SHADOWED * 0.25) ** 0.5
    for outcome in ("failed", "unreadable"):
        assert series_value(stable_metrics, "forge_shadow_requests_total", outcome=outcome) == 0, outcome
    # a copy drawn while 16 are outstanding is dropped, never queued: the shadow (one pod at 250m)
    # answers more slowly than four callers send, and the callers must not wait for it
    dropped = series_value(stable_metrics, "forge_shadow_requests_total", outcome="dropped") - dropped_before
    agreed = series_value(stable_metrics, "forge_shadow_rows_total", agreement="agreed")
    disagreed = series_value(stable_metrics, "forge_shadow_rows_total", agreement="disagreed")
    print(f"\nshadow {v1} behind stable {v2}: of {SHADOWED} requests {shadowed + dropped:.0f} drawn for a copy "
          f"(99.9 % interval {lo:.0f}..{hi:.0f}), {shadowed:.0f} answered by the shadow and compared, {dropped:.0f} "
          f"dropped (16 outstanding), in {time.monotonic() - t0:.1f} s; rows agreed {agreed:.0f}, disagreed {disagreed:.0f}")
    assert lo <= shadowed + dropped <= hi, (shadowed, dropped)
    assert shadowed >= 16, shadowed  # the shadow did answer copies
    # the in-cluster Prometheus scraped the stable's copies through its PodMonitor: the gate's template
    query = fill_placeholders(BUILTIN_TEMPLATES["shadow-agreement"],
                              {"endpoint": "digits", "namespace": NS, "version": v2, "role": "canary", "window": "2m"})
    rows = _wait("the shadow-agreement template to have a value", lambda: qs.query(query), timeout=90, every=3)
    assert float(rows[0]["value"][1]) == pytest.approx(agreed / (agreed + disagreed)), (rows, agreed, disagreed)
    # `rollout status` reads the same counters (once Prometheus has scraped the last copies)
    figures = _wait("rollout status to show the shadow's copies", lambda: (f := qs.json(
        "rollout", "status", "digits", "--prometheus-url", qs.stack.prometheus_url)["shadow"]) and f["compared"] >= shadowed and f,
        timeout=90, every=3)
    assert figures["failed"] == 0 and figures["mirrored"] == figures["compared"] and figures["skipped"] >= dropped, figures
    assert figures["agreement"] == pytest.approx(agreed / (agreed + disagreed)), figures
    # the shadow is never a route's backend
    assert "digits-shadow" not in json.dumps(qs.route()["spec"]), qs.route()["spec"]


def test_4c_a_shadow_of_a_rejected_variant_stops_in_its_init_container_saying_why(qs: Quickstart) -> None:
    """The shadow serves the variant the compress step rejected (no `select: fastest`, which
    picks among the registered ones): its pod's init container ends with the step's reason as the
    kubelet's termination message, `rollout status` shows it, and callers are answered throughout."""
    v1, v2 = qs.versions["v1"], qs.versions["v2"]
    qs.edit("endpoint.yaml", f"  shadow: {{version: '{v1}', percent: 50}}\n", f"  shadow: {{variant: {REJECTED_VARIANT}}}\n",
            "a shadow of the rejected variant")
    qs.edit("endpoint.yaml", "  backend:\n    select: fastest\n    maxAccuracyDrop: 1.0\n", "", "serve the variant named")
    qs.forgectl("apply", "--env", "cluster", "--auto-approve")

    def held() -> str | None:
        shadow = qs.json("rollout", "status", "digits", "--prometheus-url", qs.stack.prometheus_url).get("shadow") or {}
        return shadow.get("held")

    why = _wait("rollout status to say why the shadow is held", held, timeout=300, every=3)
    print(f"\nshadow held: {why}")
    assert "stops in its await-model container: model digits-mlp" in why, why
    assert re.search(rf"variant {REJECTED_VARIANT} of version ({v1}|{v2}) was rejected: .*more than the allowed 0.5", why), why
    assert "shadow: not started — " in qs.forgectl("rollout", "status", "digits", "--env", "cluster",
                                                   "--prometheus-url", qs.stack.prometheus_url).stdout
    gateway = qs.stack.gateway.url
    _wait("the gateway to answer from the stable", lambda: _infer(gateway) == 200, timeout=180, every=2)


def test_5_down_removes_what_forge_owns(qs: Quickstart) -> None:
    qs.forgectl("down", "--env", "cluster", "--auto-approve")
    assert not qs.workflows.get(namespace=NS).to_dict()["items"]
    assert not qs.sdeps.get(namespace=NS).to_dict()["items"]
    # the controllers remove what they made: the operator's Deployments (their pods) and Argo's pods
    _wait("the namespace's pods to go", lambda: not qs.core.list_namespaced_pod(NS).items, timeout=120, every=2)
    # the workspace claim (the registered models) opts out of pruning, and its namespace stays with it
    assert [c.metadata.name for c in qs.core.list_namespaced_persistent_volume_claim(NS).items] == ["forge-workspace"]
    _wait("Prometheus to drop the endpoint's scrape pool", lambda: not [
        t for t in qs.prometheus("/api/v1/targets")["activeTargets"] if "forge-quickstart/digits" in t["scrapePool"]],
        timeout=120, every=2)


SEARCH = REPO / "examples" / "search"
SEARCH_NS = "forge-search"  # the search example's `cluster` Environment's namespace
STUDY_SECRET = "forge-studies"  # the Secret holding the study database's URL


def test_6_a_search_runs_its_trials_on_argo_and_registers_the_best(stack: _Stack, shared_node: nodekit.SharedNode,
                                                                    tmp_path: Path, runtime_python: str) -> None:
    from tests.local.test_search_workflow import _most_at_once, _optuna_trials

    work = tmp_path / "search"
    shutil.copytree(SEARCH, work)
    # the node's two cores hold two trials at once, as the search's `parallelism` asks
    compute = work / "compute.yaml"
    assert 'cpu: "2"' in compute.read_text()
    compute.write_text(compute.read_text().replace('cpu: "2"', "cpu: 800m", 1))
    # on a cluster the study is kept in PostgreSQL (the harness's server, its URL in a Secret)
    envs = work / "environments.yaml"
    envs.write_text(envs.read_text().replace(f"    namespace: {SEARCH_NS}\n",
                                             f"    namespace: {SEARCH_NS}\n    studyDatabase: {{secret: {STUDY_SECRET}}}\n", 1))
    assert STUDY_SECRET in envs.read_text()
    model = yaml.safe_load((work / "model.yaml").read_text())["spec"]
    search, epochs = model["search"], model["hyperparameters"]["epochs"]
    trials = [f"train-trial-{i}" for i in range(search["trials"])]
    q = Quickstart.committed(stack, work, "the search example")
    t0 = time.monotonic()
    try:
        with shared_node.namespace(SEARCH_NS, PSA_RESTRICTED):
            def secret_finding() -> dict[str, Any]:
                doctor = q.forgectl("doctor", "--env", "cluster", "-o", "json", check=False)
                return next(f for f in json.loads(doctor.stdout)["findings"]
                            if (f["kind"], f["name"]) == ("Secret", f"{SEARCH_NS}/{STUDY_SECRET}"))

            # `doctor` names the Secret the trials will read until the harness's database provides it
            assert secret_finding()["status"] == "missing"
            database = postgres.start(q.core, SEARCH_NS, STUDY_SECRET)
            assert secret_finding()["status"] == "ok"
            print(f"\nPostgreSQL ready in {time.monotonic() - t0:.0f} s")
            applied = q.forgectl("apply", "--env", "cluster", "--auto-approve").stdout
            assert f"search: tpe, early stopping asha — {search['trials']} trials, {search['parallelism']} at a time" \
                in applied, applied
            from reconciler.load.environments import load_environment
            from renderers.versions import model_version
            from specs import Model

            result, environment = load_environment([str(work)], None, "cluster")
            version = model_version(result.specs, result.specs.get(Model, "digits-search"), environment)

            def finished() -> dict[str, Any] | None:
                items = q.workflows.get(namespace=SEARCH_NS, label_selector=f"{MODEL_VERSION}={version}").to_dict()["items"]
                phase = ((items[0] if items else {}).get("status") or {}).get("phase")
                return items[0] if phase in ("Succeeded", "Failed", "Error") else None

            wf = _wait("the search's Workflow to finish", finished, timeout=900, every=3)
            (tmp_path / f"workflow-{version}.json").write_text(json.dumps(wf, indent=1))
            nodes = _nodes(wf)
            steps = {name: n["phase"] for name, n in nodes.items()}
            print(f"\nsearch {version}: Workflow {wf['status']['phase']} in {time.monotonic() - t0:.0f} s: {steps}")
            assert wf["status"]["phase"] == "Succeeded", (wf["status"].get("message"), steps)
            assert {*trials, "prepare-data", "pick-best", "evaluate", "register"} <= set(steps), steps
            # each trial a pod of its own, side by side but never more at once than the search allows
            # (Argo's `parallelism`): the trial containers' own run times, as the kubelet reported them
            runs, failed = {}, []
            for pod in q.core.list_namespaced_pod(SEARCH_NS).items:
                node = (pod.metadata.annotations or {}).get("workflows.argoproj.io/node-name", "")
                main = next((c for c in pod.status.container_statuses or [] if c.name == "main"), None)
                if "train-trial-" in node and main is not None and main.state.terminated is not None:
                    runs[node] = (main.state.terminated.started_at.timestamp(), main.state.terminated.finished_at.timestamp())
                    if main.state.terminated.exit_code:
                        log = q.core.read_namespaced_pod_log(pod.metadata.name, SEARCH_NS, container="main", tail_lines=40)
                        failed.append(f"{node}: exit {main.state.terminated.exit_code}\n{log}")
            assert len(runs) == len(trials) and not failed, (sorted(runs), failed)
            assert _most_at_once(list(runs.values())) == search["parallelism"], runs

            # the registry's record of the search, on the workspace volume the steps wrote
            claim = q.core.read_namespaced_persistent_volume_claim("forge-workspace", SEARCH_NS)
            workspace = Path(q.core.read_persistent_volume(claim.spec.volume_name).spec.host_path.path)
            record = json.loads((workspace / "registry" / "digits-search" / version / "registry.json").read_text())
            study = record["search"]["study"]
            assert (study["algorithm"], study["earlyStopping"]) == ("tpe", "asha")
            rows = study["trials"]
            assert sorted(r["index"] for r in rows) == list(range(search["trials"]))  # one study trial per task
            assert set(study["states"]) <= {"complete", "pruned"} and sum(study["states"].values()) == len(rows)
            complete = [r for r in rows if r["state"] == "complete"]
            [best] = [r for r in rows if r["number"] == study["bestTrial"]]
            assert best["state"] == "complete" and best["value"] == max(r["value"] for r in complete)
            rungs = {3**k for k in range(epochs) if 3**k <= epochs}
            for r in rows:  # ASHA stopped a pruned trial at a rung; a complete one trained every epoch
                assert (r["epochsTrained"] == epochs) if r["state"] == "complete" else (r["prunedAtEpoch"] in rungs), r
            # ... and it is what Optuna reads back from the database the trial pods shared, as this
            # Workflow's run of the version (its uid in the study's name)
            assert study["storage"] == f"the PostgreSQL database of Secret {STUDY_SECRET}"
            assert study["name"] == f"digits-search-{version}-{wf['metadata']['uid']}"
            assert not list(workspace.glob("models/**/study.db"))
            seen = {t["number"]: t for t in _optuna_trials(runtime_python, database.host_url, study["name"])}
            assert {n: t["state"] for n, t in seen.items()} == {r["number"]: r["state"] for r in rows}
            for r in complete:
                assert seen[r["number"]]["value"] == pytest.approx(r["value"])
                assert seen[r["number"]]["params"] == pytest.approx(r["params"])

            # `forgectl status` shows the fan-out from the cluster
            [shown] = [w for w in json.loads(q.forgectl("status", "--env", "cluster", "-o", "json").stdout)["workflows"]
                       if w["version"] == version]
            assert {s["step"] for s in shown["steps"]} >= set(trials) and shown["phase"] == "Succeeded", shown
            q.forgectl("down", "--env", "cluster", "--auto-approve")
    finally:
        q.api.close()


TRAINING_NS = "forge-training"  # a namespace of its own, managed by Kueue
GPU = "nvidia.com/gpu"
GPU_NODE_LABELS = pools.GPU_NODE_LABELS  # the pools' nodeSelector: their flavor's nodeLabels


def gpu_pool(name: str, gpus: int, cohort: str | None = None) -> str:
    """A queued pool of one fake GPU per node whose jobs take ``gpus`` of them, with ``gpus`` of
    quota (in ``cohort``, if any)."""
    return pools.queued_pool(name, gpus_per_node=1, min_gpus=gpus, max_gpus=gpus, quota=gpus,
                             node=("400m", "1536Mi"), cohort=cohort)


#: Jobs that take two nodes: the quick-start's model trained with DDP on two nodes — a PyTorchJob
#: (Master + 1 Worker), gloo on the CPU.
GPU_POOL = gpu_pool("gpu-pool", 2, cohort="forge-training-test")
JOB_NAME = "training.kubeflow.org/job-name"  # the Training Operator's label on a job's pods


def _explain_training(q: Quickstart, custom: client.CustomObjectsApi, job: str, workload: dict[str, Any] | None,
                      shared_node: nodekit.SharedNode, operator: HostController) -> str:
    """What the controllers say of a training that did not go on, for a failure message: the job's
    status, its Workload's conditions, the namespace's pods and events, the ends of the Training
    Operator's and Kueue's logs."""
    lines = []
    try:
        pj = custom.get_namespaced_custom_object("kubeflow.org", "v1", TRAINING_NS, "pytorchjobs", job)
        lines.append(f"PyTorchJob {job}: runPolicy {pj['spec'].get('runPolicy')}; status {json.dumps(pj.get('status'))[:1500]}")
    except client.ApiException as exc:
        lines.append(f"PyTorchJob {job}: {exc.status}")
    lines.append(f"Workload: {json.dumps((workload or {}).get('status'))[:2000]}")
    for pod in q.core.list_namespaced_pod(TRAINING_NS).items:
        lines.append(f"pod {pod.metadata.name}: {pod.status.phase} {[(c.type, c.status, c.reason) for c in pod.status.conditions or []]}"
                     f" {[(c.name, c.state.to_dict()) for c in pod.status.container_statuses or []]}"[:800])
    for pod in q.core.list_namespaced_pod(TRAINING_NS, label_selector=f"{JOB_NAME}={job}").items:
        for c in pod.spec.init_containers or []:
            try:
                tail = q.core.read_namespaced_pod_log(pod.metadata.name, TRAINING_NS, container=c.name, tail_lines=8)
            except client.ApiException as exc:
                tail = f"({exc.status})"
            lines.append(f"{pod.metadata.name} init {c.name} ({c.image}): {tail.strip()}"[:1200])
    for svc in q.core.list_namespaced_service(TRAINING_NS).items:
        lines.append(f"service {svc.metadata.name}: clusterIP {svc.spec.cluster_ip}, ports "
                     f"{[(p.name, p.port, str(p.target_port)) for p in svc.spec.ports or []]}, selector {svc.spec.selector}")
    for sl in client.DiscoveryV1Api(q.api).list_namespaced_endpoint_slice(TRAINING_NS).items:
        lines.append(f"endpointslice {sl.metadata.name}: {[(e.addresses, e.conditions.ready) for e in sl.endpoints or []]}")
    for ev in q.core.list_namespaced_event(TRAINING_NS).items[-25:]:
        lines.append(f"event {ev.involved_object.kind}/{ev.involved_object.name}: {ev.reason}: {ev.message}"[:400])
    lines.append("training-operator: " + "\n".join(operator.log_tail().splitlines()[-15:]))
    lines.append("kueue: " + "\n".join(shared_node.kueue().controller.log_tail().splitlines()[-15:]))
    return "\n".join(lines)


def _on_gpu_pool(stack: _Stack, work: Path, pool: str, namespace: str, edits: tuple[tuple[str, str], ...],
                 message: str) -> Quickstart:
    """The quick-start's training (no Endpoint) in ``namespace`` on the queued GPU ``pool``, its
    model's text edited (each (old, new) must be there), committed; the node advertising the fake
    GPUs the pools' flavor selects."""
    from devkit.node import extended_resources

    node = stack.node
    extended_resources.advertise(node, {GPU: "8"}, GPU_NODE_LABELS)
    _wait(f"the node advertising {GPU}", lambda: extended_resources.advertised(node).get(GPU) == "8", timeout=60)
    shutil.copytree(QUICKSTART, work)
    (work / "endpoint.yaml").unlink()  # the training only
    (work / "gpu.yaml").write_text(pool)
    envs = work / "environments.yaml"
    envs.write_text(envs.read_text().replace(f"namespace: {NS}", f"namespace: {namespace}"))
    model = work / "model.yaml"
    text = model.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    model.write_text(text)
    q = Quickstart.committed(stack, work, message)
    return q


def test_7_a_two_node_training_is_gang_admitted_by_kueue_and_run_by_the_training_operator(
        stack: _Stack, shared_node: nodekit.SharedNode, tmp_path: Path) -> None:
    """Issue 30: the quick-start's model on a queued pool of one GPU per node (the node advertises
    fake ones), trained with DDP on two nodes, in a namespace enforcing Pod Security `restricted`: Argo's train step creates the PyTorchJob Forge
    renders; Kueue's Kubeflow integration suspends it until both replicas fit the quota at once —
    with one of the two GPUs held by another workload, neither replica has a pod; freed, both start
    together — and the real Training Operator runs it (torchrun, gloo, world size 2) to Succeeded,
    which Argo's train step and `forgectl status` report."""
    from devkit.node import kueue
    from renderers.queues import queue_labels
    from specs import Compute

    shared_node.dns()  # the Worker finds the Master by its Service's name
    frameworks = shared_node.kueue().frameworks
    assert "kubeflow.org/pytorchjob" in frameworks, frameworks
    # the Workers' init container in the training image (sh, seq, getent), as docs/cluster-prerequisites.md says
    [train_image] = [r for r in stack.refs if "forge-train" in r]
    operator = shared_node.training_operator(train_image)
    q = _on_gpu_pool(stack, tmp_path / "training", GPU_POOL, TRAINING_NS, (
        ("computeRef: cpu", "computeRef: gpu-pool"),
        ("  precision: fp32\n", "  precision: fp32\n  distributed: {strategy: ddp}\n")),
        "the quick-start on two nodes of a queued GPU pool")
    work = q.work
    jobs = dynamic.DynamicClient(q.api).resources.get(api_version="kubeflow.org/v1", kind="PyTorchJob")
    custom = client.CustomObjectsApi(q.api)
    try:
        # Kueue manages the namespace, and it enforces Pod Security `restricted`: the Workers' init
        # container the operator adds must meet it too
        with shared_node.namespace(TRAINING_NS, {**kueue.MANAGED_NAMESPACES, **PSA_RESTRICTED}):
            from reconciler.load.environments import load_environment
            from renderers.versions import model_version
            from specs import Model

            result, environment = load_environment([str(work)], None, "cluster")
            compute = result.specs.get(Compute, "gpu-pool")
            version = model_version(result.specs, result.specs.get(Model, "digits-mlp"), environment)
            # another workload of the same queue holds one of its two GPUs: submitted before the apply,
            # so it is first in the queue whatever the timing (Kueue admits in creation order at equal
            # priority), while the job can exist only once Argo's prepare-data step has finished
            gpu = {"cpu": "50m", "memory": "32Mi", GPU: "1"}
            blocker = q.core.create_namespaced_pod(TRAINING_NS, client.V1Pod(
                metadata=client.V1ObjectMeta(name="holds-one-gpu", labels=queue_labels(compute, environment, TRAINING_NS,
                                                                                      "forge-high")),
                spec=client.V1PodSpec(
                    restart_policy="Never", termination_grace_period_seconds=1,
                    security_context=client.V1PodSecurityContext(run_as_non_root=True, run_as_user=65534,
                                                                 seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault")),
                    containers=[client.V1Container(
                        name="hold", image=stack.node.images["busybox"][1], image_pull_policy="Never", command=["sh", "-c", "sleep 3600"],
                        security_context=client.V1SecurityContext(allow_privilege_escalation=False,
                                                                  capabilities=client.V1Capabilities(drop=["ALL"])),
                        resources=client.V1ResourceRequirements(requests=gpu, limits=gpu))])))
            q.forgectl("apply", "--env", "cluster", "--auto-approve")
            _wait("the blocker to run", lambda: q.core.read_namespaced_pod(
                blocker.metadata.name, TRAINING_NS).status.phase == "Running", timeout=180, every=2)

            def job() -> dict[str, Any] | None:
                items = jobs.get(namespace=TRAINING_NS).to_dict()["items"]
                return items[0] if items else None

            pj = _wait("Argo's train step to create the PyTorchJob", job, timeout=600, every=3)
            name = pj["metadata"]["name"]

            def workload() -> dict[str, Any] | None:
                items = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", TRAINING_NS, "workloads")["items"]
                return next((w for w in items if any(o["kind"] == "PyTorchJob" and o["name"] == name
                                                     for o in w["metadata"].get("ownerReferences") or [])), None)

            wl = _wait("Kueue's Workload of the job", workload, timeout=60)
            # one GPU free of the two the job needs at once: suspended, and no replica has a pod
            for _ in range(10):
                pj, wl = jobs.get(namespace=TRAINING_NS, name=name).to_dict(), workload()
                assert pj["spec"]["runPolicy"].get("suspend") is True, pj["spec"]["runPolicy"]
                admitted = {c["type"]: c["status"] for c in (wl.get("status") or {}).get("conditions") or []}
                assert admitted.get("Admitted") != "True", wl.get("status")
                assert not q.core.list_namespaced_pod(TRAINING_NS, label_selector=f"{JOB_NAME}={name}").items
                time.sleep(1)
            t_freed = time.monotonic()
            q.core.delete_namespaced_pod(blocker.metadata.name, TRAINING_NS, grace_period_seconds=0)

            def both_running() -> list[client.V1Pod] | None:
                pods = q.core.list_namespaced_pod(TRAINING_NS, label_selector=f"{JOB_NAME}={name}").items
                return pods if len(pods) == 2 and all(p.status.phase in ("Running", "Succeeded") for p in pods) else None

            try:
                pods = _wait("both replicas to start", both_running, timeout=300, every=1)
            except AssertionError as e:
                raise AssertionError(f"{e}\n{_explain_training(q, custom, name, workload(), shared_node, operator)}") from e
            t_started = time.monotonic()
            roles = sorted((p.metadata.labels or {}).get("training.kubeflow.org/replica-type", "") for p in pods)
            assert roles == ["master", "worker"], roles

            def succeeded() -> dict[str, Any] | None:
                pj = jobs.get(namespace=TRAINING_NS, name=name).to_dict()
                conds = {c["type"]: c["status"] for c in (pj.get("status") or {}).get("conditions") or []}
                assert conds.get("Failed") != "True", pj.get("status")
                return pj if conds.get("Succeeded") == "True" else None

            try:
                pj = _wait("the PyTorchJob to succeed", succeeded, timeout=900, every=3)
            except AssertionError as e:
                raise AssertionError(f"{e}\n{_explain_training(q, custom, name, workload(), shared_node, operator)}") from e
            t_done = time.monotonic()
            # Argo's train step saw it succeed (its successCondition on the job's Master replicas)
            def train_succeeded() -> dict[str, Any] | None:
                items = q.workflows.get(namespace=TRAINING_NS, label_selector=f"{MODEL_VERSION}={version}").to_dict()["items"]
                return items[0] if items and _nodes(items[0]).get("train", {}).get("phase") == "Succeeded" else None

            wf = _wait("Argo's train step to succeed", train_succeeded, timeout=120, every=3)
            # the training ran in a world of two, on the CPU (gloo), and wrote its metrics as one run
            claim = q.core.read_namespaced_persistent_volume_claim("forge-workspace", TRAINING_NS)
            workspace = Path(q.core.read_persistent_volume(claim.spec.volume_name).spec.host_path.path)
            metrics = json.loads((workspace / "models" / "digits-mlp" / version / "train" / "metrics.json").read_text())
            assert metrics["worldSize"] == 2 and metrics["strategy"] == "ddp" and metrics["device"] == "cpu", metrics
            shown = {s["step"]: s for w in json.loads(q.forgectl("status", "--env", "cluster", "-o", "json").stdout)["workflows"]
                     if w["version"] == version for s in w["steps"]}
            assert shown["train"]["status"] == "succeeded", shown.get("train")
            print(f"\nPyTorchJob {name}: gang-admitted {t_started - t_freed:.1f} s after a GPU was freed (quota free "
                  f"→ both replicas running); trained in {t_done - t_started:.1f} s, world size {metrics['worldSize']}; "
                  f"Workflow phase {wf['status'].get('phase')}")
            q.forgectl("down", "--env", "cluster", "--auto-approve")
    finally:
        q.api.close()


PREEMPT_NS = "forge-preempt"  # a namespace of its own, managed by Kueue
#: One fake GPU of quota: two trainings of this pool cannot run at once.
ONE_GPU_POOL = gpu_pool("gpu-one", 1)
#: The low-priority training: wide enough and long enough (1,500 steps of 25–130 ms, a checkpoint
#: every 50) to be running when the urgent one is submitted; the urgent one of the same pool long
#: enough (1,500 steps) for Argo's retry of the preempted step (after its 10 s backoff) to find the
#: GPU taken and wait gated.
LOW_STEPS = 2000
URGENT_MODEL = """\
apiVersion: forge.dev/v1alpha1
kind: Model
metadata: {name: digits-urgent}
spec:
  datasetRef: digits
  computeRef: gpu-one
  architecture: {type: mlp, hiddenSizes: [1024, 1024]}
  hyperparameters: {learningRate: 0.002, batchSize: 64, epochs: 100, maxSteps: 1500, seed: 11}
  evaluation: {thresholds: [{metric: accuracy, min: 0.5}]}
"""


def _parse_time(text: str) -> datetime.datetime:
    """An RFC 3339 time as the API server writes it (`2026-12-05T10:24:15Z`)."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_8_a_high_priority_training_preempts_a_low_one_which_resumes_from_its_checkpoint(
        stack: _Stack, shared_node: nodekit.SharedNode, tmp_path: Path) -> None:
    """Issue 30: two Models on one queued pool of one fake GPU. The first (`priority: low`, long)
    is admitted and checkpoints; `forgectl plan` of a second (the pool's `high`) against the cluster
    names the low one's Workload as the one it will preempt, read from Kueue's Workloads; applied,
    Kueue preempts it within the queue (`InClusterQueue`) and stops its pod, Argo records the attempt as
    failed and retries the step, whose new pod waits gated until the urgent training is done and
    then resumes from the last checkpoint: its step count continues to the end instead of
    restarting. Kueue, Argo and the train step do all of it; the test reads what they wrote."""
    from devkit.node import kueue
    from renderers.queues import ADMISSION_GATE, queue_object_name

    frameworks = shared_node.kueue().frameworks
    assert "pod" in frameworks, frameworks
    q = _on_gpu_pool(stack, tmp_path / "preempt", ONE_GPU_POOL, PREEMPT_NS, (
        ("computeRef: cpu", "computeRef: gpu-one\n  priority: low"), ("  compressionRef: digits-compact\n", ""),
        ("hiddenSizes: [256, 128]", "hiddenSizes: [1024, 1024]"),
        ("    epochs: 30\n", f"    epochs: 1000\n    maxSteps: {LOW_STEPS}\n")),
        "a long low-priority training on a one-GPU queue")
    work = q.work
    custom = client.CustomObjectsApi(q.api)
    cq_name = queue_object_name(PREEMPT_NS, "gpu-one")

    def workloads() -> list[dict[str, Any]]:
        return custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", PREEMPT_NS, "workloads")["items"]

    def train_pods(model_name: str) -> list[client.V1Pod]:
        pods = q.core.list_namespaced_pod(PREEMPT_NS, label_selector="workflows.argoproj.io/workflow").items
        return [p for p in pods if p.metadata.name.startswith(model_name + "-")
                and (p.metadata.labels or {}).get(STEP) == "train"]

    def running(model_name: str) -> client.V1Pod | None:
        return next((p for p in train_pods(model_name) if p.status.phase == "Running"
                     and p.metadata.deletion_timestamp is None), None)

    def low_workflow() -> dict[str, Any]:
        [wf] = q.workflows.get(namespace=PREEMPT_NS, label_selector=f"{MODEL_VERSION}={low_version}").to_dict()["items"]
        return wf

    def train_node(version: str) -> dict[str, Any] | None:
        items = q.workflows.get(namespace=PREEMPT_NS, label_selector=f"{MODEL_VERSION}={version}").to_dict()["items"]
        return _nodes(items[0]).get("train") if items else None

    def explain() -> str:
        lines = [f"{w['metadata']['name']} ({[o['name'] for o in w['metadata'].get('ownerReferences') or []]}): "
                 f"{[(c['type'], c['status'], c.get('reason')) for c in (w.get('status') or {}).get('conditions') or []]}"
                 for w in workloads()]
        lines += [f"pod {p.metadata.name}: {p.status.phase}, gates {[g.name for g in p.spec.scheduling_gates or []]}"
                  for p in q.core.list_namespaced_pod(PREEMPT_NS).items]
        return "\n".join(lines) + "\nKueue's log:\n" + shared_node.kueue().controller.log_tail()[-3000:]

    try:
        with shared_node.namespace(PREEMPT_NS, {**kueue.MANAGED_NAMESPACES, **PSA_RESTRICTED}):
            low_version = q.version()
            q.forgectl("apply", "--env", "cluster", "--auto-approve")
            low_pod = _wait("the low-priority training to be admitted and run", lambda: running("digits-mlp"), timeout=600, every=2)
            claim = q.core.read_namespaced_persistent_volume_claim("forge-workspace", PREEMPT_NS)
            workspace = Path(q.core.read_persistent_volume(claim.spec.volume_name).spec.host_path.path)
            train_dir = workspace / "models" / "digits-mlp" / low_version / "train"
            _wait("its first checkpoint", lambda: (train_dir / "checkpoints" / "last.pt").exists(), timeout=300, every=0.5)
            # Preempted only once Argo has seen its pod run, as a training of hours always is: Argo's
            # controller processes a Workflow at most every 10 s (its requeue), and a pod deleted
            # while the attempt's node is still `Pending` there is created again under the same
            # name and attempt (`podReconciliation`), which is no retry (stage 3 found it first).
            _wait("Argo to see the low-priority training's pod run (its attempt's node Running)",
                  lambda: (a := _attempts(low_workflow(), "train")) and a[-1]["phase"] == "Running", timeout=120, every=0.5)
            [low_wl] = [w for w in workloads() if any(o["name"] == low_pod.metadata.name
                                                      for o in w["metadata"].get("ownerReferences") or [])]

            # the urgent training: the plan names the workload it will preempt, from Kueue's Workloads
            (work / "urgent.yaml").write_text(URGENT_MODEL)
            q.git("add", ".")
            q.git("commit", "-qm", "an urgent training on the same pool")
            plan = q.forgectl("plan", "--env", "cluster", check=False)
            assert plan.returncode in (0, 2), plan.stdout[-3000:] + plan.stderr[-3000:]
            said = " ".join(plan.stdout.split())
            expected = (f"train asks 1 nvidia.com/gpu of ClusterQueue {cq_name}: will preempt {low_wl['metadata']['name']} "
                        f"(Pod {low_pod.metadata.name}, priority 100): lower priority than its 1000 (0 of 1 free; "
                        "withinClusterQueue LowerPriority)")
            assert expected in said, plan.stdout[-4000:]
            assert not (train_dir / "metrics.json").exists(), "the low-priority training ended before the urgent one came"
            t_apply = time.monotonic()
            q.forgectl("apply", "--env", "cluster", "--auto-approve")
            preempted: dict[str, Any] = {}

            def urgent_running_low_preempted() -> client.V1Pod | None:
                for w in workloads():
                    cond = next((c for c in (w.get("status") or {}).get("conditions") or []
                                 if c["type"] == "Preempted" and c["status"] == "True"), None)
                    if cond and w["metadata"]["name"] == low_wl["metadata"]["name"]:
                        preempted.setdefault("condition", cond)
                        preempted.setdefault("at", time.monotonic())
                return running("digits-urgent") if preempted else None

            try:
                urgent_pod = _wait("Kueue to preempt the low-priority training and run the urgent one",
                                   urgent_running_low_preempted, timeout=600, every=0.5)
            except AssertionError as e:
                raise AssertionError(f"{e}\n{explain()}") from e
            t_urgent = time.monotonic()
            assert preempted["condition"]["reason"] == "InClusterQueue", preempted
            assert not (train_dir / "metrics.json").exists(), "the low-priority training ended before it was preempted"

            # the step is retried; its new pod (a new attempt's) waits gated while the urgent one holds the GPU
            def retry_gated() -> client.V1Pod | None:
                return next((p for p in train_pods("digits-mlp") if p.metadata.uid != low_pod.metadata.uid
                             and any(g.name == ADMISSION_GATE for g in p.spec.scheduling_gates or [])), None)

            try:
                _wait("Argo's retry of the preempted step, gated by Kueue", retry_gated, timeout=300, every=0.5)
            except AssertionError as e:
                raise AssertionError(f"{e}\n{explain()}") from e
            urgent_version = q.version("digits-urgent")
            _wait("the urgent training to finish", lambda: (train_node(urgent_version) or {}).get("phase") == "Succeeded",
                  timeout=600, every=1)
            try:
                resumed = _wait("the low-priority training to be admitted again", lambda: running("digits-mlp"),
                                timeout=300, every=0.5)
            except AssertionError as e:
                raise AssertionError(f"{e}\n{explain()}") from e
            assert resumed.metadata.uid != low_pod.metadata.uid
            # the node's own times (one clock, whole seconds): the urgent training's container ended
            # (Argo's finishedAt of the attempt: its containers' latest end), the GPU's quota free;
            # the retried training's container started; the low one's Workload marked Preempted
            urgent_items = q.workflows.get(namespace=PREEMPT_NS, label_selector=f"{MODEL_VERSION}={urgent_version}").to_dict()["items"]
            freed_at = _parse_time(_attempts(urgent_items[0], "train")[-1]["finishedAt"])
            resumed_at = next(c.state.running.started_at for c in resumed.status.container_statuses or []
                              if c.name == "main" and c.state.running)
            preempted_at = _parse_time(preempted["condition"]["lastTransitionTime"])
            done = _wait("the resumed training to finish", lambda: (train_node(low_version) or {}).get("phase") in (
                "Succeeded", "Failed", "Error") and train_node(low_version), timeout=900, every=2)
            assert done["phase"] == "Succeeded", done
            metrics = json.loads((train_dir / "metrics.json").read_text())
            # resumed from a checkpoint of the first attempt, and counted on to the end
            assert metrics["resumedFromStep"] >= 50 and metrics["resumedFromStep"] % 50 == 0, metrics
            assert metrics["steps"] == LOW_STEPS, metrics
            attempts = _attempts(low_workflow(), "train")
            # Argo recorded the preempted attempt (its pod killed: Failed, or gone before Argo saw it
            # end: Error "pod deleted") and the retry expression retried it
            assert [a["phase"] for a in attempts][1:] == ["Succeeded"] and attempts[0]["phase"] in ("Failed", "Error"), attempts
            print(f"\npreemption within a queue: low preempted {preempted['at'] - t_apply:.1f} s after the urgent one's "
                  f"apply ({preempted['condition'].get('message')}), urgent training running {t_urgent - t_apply:.1f} s "
                  f"after it; quota free → the low one's container running again: "
                  f"{(resumed_at - freed_at).total_seconds():.0f} s; preempted → training again: "
                  f"{(resumed_at - preempted_at).total_seconds():.0f} s (the urgent training in between), from step "
                  f"{metrics['resumedFromStep']} of {LOW_STEPS}; {len(attempts)} attempt(s), the first "
                  f"{attempts[0]['phase']}: {attempts[0].get('message')}; urgent pod {urgent_pod.metadata.name}")
            q.forgectl("down", "--env", "cluster", "--auto-approve")
    finally:
        q.api.close()


def _claim_folder(q: Quickstart, namespace: str, name: str) -> Path:
    """A claim of the platform team's holding data, bound to one of the node's hostPath volumes:
    its folder on this machine (what the test writes the data into)."""
    q.core.create_namespaced_persistent_volume_claim(namespace, client.V1PersistentVolumeClaim(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PersistentVolumeClaimSpec(access_modes=["ReadWriteOnce"],
                                                resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}))))
    claim = _wait(f"the claim {name} to bind", lambda: (c := q.core.read_namespaced_persistent_volume_claim(
        name, namespace)).spec.volume_name and c, timeout=60)
    return Path(q.core.read_persistent_volume(claim.spec.volume_name).spec.host_path.path)


SHARDED = REPO / "examples" / "sharded"
SHARDED_NS = "forge-sharded"  # the example's `cluster` Environment's namespace
SHARDS_CLAIM = "digits-shards"


def test_9_a_sharded_dataset_fans_out_on_argo_from_a_claim_and_trains_streamed(
        stack: _Stack, shared_node: nodekit.SharedNode, tmp_path: Path) -> None:
    """Issue 31: examples/sharded with its shards on a PersistentVolumeClaim (`pvc://`), in a
    namespace enforcing `restricted`: Argo runs the rendered fan-out — one memoized pod per group
    of shards, the claim mounted read-only — then the join that checks the Merkle root, the
    training on the streamed shards, evaluation and registration; the manifest the join wrote
    holds every digit once."""
    work = tmp_path / "sharded"
    shutil.copytree(SHARDED, work, ignore=shutil.ignore_patterns("data"))
    dataset = work / "dataset.yaml"
    text = dataset.read_text()
    assert "uri: file://data/digits/*.parquet" in text
    dataset.write_text(text.replace("uri: file://data/digits/*.parquet", f"uri: pvc://{SHARDS_CLAIM}/digits/*.parquet"))
    q = Quickstart.committed(stack, work, "the sharded example, its shards on a claim")
    try:
        with shared_node.namespace(SHARDED_NS, PSA_RESTRICTED):
            # the platform team's claim holding the shards (the node's hostPath volumes: one directory)
            folder = _claim_folder(q, SHARDED_NS, SHARDS_CLAIM) / "digits"
            shutil.copytree(SHARDED / "data" / "digits", folder)
            version = q.version("digits-sharded")
            q.forgectl("apply", "--env", "cluster", "--auto-approve")

            def finished() -> dict[str, Any] | None:
                items = q.workflows.get(namespace=SHARDED_NS, label_selector=f"{MODEL_VERSION}={version}").to_dict()["items"]
                phase = ((items[0].get("status") or {}).get("phase")) if items else None
                return items[0] if phase in ("Succeeded", "Failed", "Error") else None

            wf = _wait("the sharded Workflow to finish", finished, timeout=900, every=3)
            nodes = wf["status"]["nodes"].values()
            groups = sorted(n["displayName"] for n in nodes if n["type"] == "Pod" and n["displayName"].startswith("prepare-group"))
            failed = [(n["displayName"], n.get("message")) for n in nodes if n["phase"] in ("Failed", "Error")]
            assert wf["status"]["phase"] == "Succeeded", (wf["status"].get("message"), failed)
            fan_out = sorted(n["displayName"] for n in nodes if n["displayName"].startswith("group("))
            assert len(fan_out) == 3 and len(groups) == 3, (fan_out, groups)  # six shards in groups of two, a pod each
            ws_claim = q.core.read_namespaced_persistent_volume_claim("forge-workspace", SHARDED_NS)
            workspace = Path(q.core.read_persistent_volume(ws_claim.spec.volume_name).spec.host_path.path)
            [data] = (workspace / "data" / "digits-shards").glob("[0-9a-f]" * 12)
            manifest = json.loads((data / "manifest.json").read_text())
            assert len(manifest["groups"]) == 3 and sum(manifest["rows"].values()) == 1797, manifest["rows"]
            train = json.loads((workspace / "models" / "digits-sharded" / version / "train" / "metrics.json").read_text())
            evaluated = json.loads((workspace / "models" / "digits-sharded" / version / "evaluate" / "metrics.json").read_text())
            assert evaluated["accuracy"] >= 0.85, evaluated
            assert train["gradientCheckpointing"] == "sqrt", train  # the example's four blocks in two segments
            print(f"\nsharded on Argo: fan-out {fan_out}; rows {manifest['rows']}; trained {train['steps']} steps "
                  f"streamed; accuracy {evaluated['accuracy']:.3f}")
            q.forgectl("down", "--env", "cluster", "--auto-approve")
    finally:
        q.api.close()


SHARDED_LABELLED = REPO / "examples" / "sharded-labelled"
LABELLED_NS = "forge-sharded-labelled"  # the example's `cluster` Environment's namespace
DATA_CLAIM = "digits-data"


def test_10_a_sharded_auto_labelled_search_runs_on_argo_and_its_review_merges_into_the_claim(
        stack: _Stack, shared_node: nodekit.SharedNode, tmp_path: Path, runtime_python: str) -> None:
    """Issue 31: examples/sharded-labelled with its shards and its unlabelled rows on a claim
    (`pvc://`), in a namespace enforcing `restricted`. One apply: Argo prepares the groups of
    shards (memoized, the claim mounted read-only) and trains the labeller; the searched Model's
    Workflow runs its TPE trials with ASHA against one study on the workspace, waits for the
    labeller's registration, pre-labels the unlabelled rows with it, passes the agreement gate and
    registers with the labeller as its parent. Then the review goes round without kubectl:
    `forgectl labels pull` brings the review file off the workspace claim (a one-off pod), a
    reviewer fills half of it, and `forgectl labels merge --commit` writes the merged rows as a
    seventh shard into the data's claim (another pod) and pins it: the plan counts one new shard
    and prepares only its group."""
    from tests.local.test_sharded_labelled_workflow import REVIEW

    work = tmp_path / "sharded-labelled"
    shutil.copytree(SHARDED_LABELLED, work, ignore=shutil.ignore_patterns("data"))
    dataset = work / "dataset.yaml"
    text = dataset.read_text()
    for old, new in (("uri: file://data/digits/*.parquet", f"uri: pvc://{DATA_CLAIM}/digits/*.parquet"),
                     ("unlabelled: file://data/unlabelled.parquet", f"unlabelled: pvc://{DATA_CLAIM}/unlabelled.parquet")):
        assert old in text, old
        text = text.replace(old, new)
    dataset.write_text(text)
    q = Quickstart.committed(stack, work, "the sharded, auto-labelled example, its data on a claim")
    try:
        with shared_node.namespace(LABELLED_NS, PSA_RESTRICTED):
            folder = _claim_folder(q, LABELLED_NS, DATA_CLAIM)
            shutil.copytree(SHARDED_LABELLED / "data" / "digits", folder / "digits")
            shutil.copy(SHARDED_LABELLED / "data" / "unlabelled.parquet", folder / "unlabelled.parquet")
            # The platform team's claim is writable by the runtimes' user (the merge pod adds a shard):
            # a storage driver applies the pod's fsGroup; the node's hostPath volumes do not.
            for path in (folder / "digits", *(folder / "digits").iterdir()):
                os.chown(path, 1000, 1000)
            labeller_version, searched_version = q.version("digits-labeller"), q.version("digits-tpe")
            q.forgectl("apply", "--env", "cluster", "--auto-approve")

            def finished(version: str) -> Callable[[], dict[str, Any] | None]:
                def phase() -> dict[str, Any] | None:
                    items = q.workflows.get(namespace=LABELLED_NS, label_selector=f"{MODEL_VERSION}={version}").to_dict()["items"]
                    done = ((items[0].get("status") or {}).get("phase")) if items else None
                    return items[0] if done in ("Succeeded", "Failed", "Error") else None
                return phase

            wf = _wait("the searched Model's Workflow to finish", finished(searched_version), timeout=1200, every=3)
            failed = [(n["displayName"], n.get("message")) for n in wf["status"]["nodes"].values()
                      if n["phase"] in ("Failed", "Error")]
            assert wf["status"]["phase"] == "Succeeded", (wf["status"].get("message"), failed)
            trials = sorted({n["displayName"].split("(")[0] for n in wf["status"]["nodes"].values()  # "(0)": the attempt
                             if n["type"] == "Pod" and n["displayName"].startswith("train-trial-")})
            assert trials == [f"train-trial-{i}" for i in range(4)], trials
            assert _wait("the labeller's Workflow", finished(labeller_version), timeout=60)["status"]["phase"] == "Succeeded"
            records = {r["model"]: r for r in q.json("models", "list")["versions"]}
            assert records["digits-tpe"]["lineage"]["parents"] == [
                {"model": "digits-labeller", "version": labeller_version, "relation": "labelling model", "variant": None}]

            # the review, pulled off the workspace claim by a pod: no kubectl, no copy by hand
            pulled = q.json("labels", "pull", "digits-tpe", "--to", str(tmp_path / "review"))
            assert pulled["version"] == searched_version, pulled
            assert {"auto-labels.csv", "report.json", "review.csv"} <= set(pulled["files"]), pulled
            report = pulled["report"]
            assert report["rows"] == 597 and report["autoLabelled"] + report["toReview"] == 597 and report["toReview"] > 0
            assert report["gate"]["passed"] is True and report["modelDir"] == f"registry/digits-labeller/{labeller_version}/base"
            reviewed = tmp_path / "reviewed.csv"
            subprocess.run([runtime_python, "-c", REVIEW, str(tmp_path / "review"), str(SHARDED_LABELLED), str(reviewed)],
                           check=True, timeout=120)
            merged = q.json("labels", "merge", "digits-labelled", "--reviewed", str(reviewed), "--auto-labels",
                            str(tmp_path / "review" / "auto-labels.csv"), "--commit")
            assert merged["autoLabelled"] == report["autoLabelled"] and merged["accepted"] == report["toReview"] // 2
            assert merged["shards"] == 7 and merged["source"] == f"pvc://{DATA_CLAIM}/digits/{merged['shard']}", merged
            shard = folder / "digits" / merged["shard"]
            assert "sha256:" + hashlib.sha256(shard.read_bytes()).hexdigest() == merged["shardDigest"]
            assert shard.stat().st_uid == 1000  # written by the merge pod, as the runtimes' user
            spec = yaml.safe_load(dataset.read_text())["spec"]
            assert spec["source"]["shards"]["files"][-1] == {"name": merged["shard"], "digest": merged["shardDigest"]}
            assert spec["digest"] == merged["newDigest"]
            head = subprocess.run(["git", "show", "--name-only", "--format=%H", "HEAD"], cwd=work, check=True,
                                  capture_output=True, text=True).stdout.split()
            assert head == [merged["commit"], "dataset.yaml"], head
            leftovers = q.core.list_namespaced_pod(LABELLED_NS, label_selector="forge.dev/labels").items
            assert not [p for p in leftovers if not p.metadata.deletion_timestamp], leftovers

            plan = " ".join(q.forgectl("plan", "--env", "cluster").stdout.split())
            assert plan.count(f"1 added ({merged['shard']}), 1 of 4 groups changed) → retrain model") == 2, plan
            print(f"\nsharded, auto-labelled search on Argo: trials {trials}; {report['autoLabelled']} rows labelled, "
                  f"{report['toReview']} to review, agreement {report['gate']['agreement']:.3f}; pulled and merged as "
                  f"{merged['shard']} into the claim (shard 7 of 7)")
            q.forgectl("down", "--env", "cluster", "--auto-approve")
    finally:
        q.api.close()


LABELS_NS = "forge-labels"  # the `cluster` Environment of tests/trust/test_autolabel_workflow.py's specs
SCANS_CLAIM = "scans"


def test_10b_reviewed_labels_merge_into_a_single_file_on_a_claim_by_a_pod(
        stack: _Stack, shared_node: nodekit.SharedNode, tmp_path: Path) -> None:
    """Issue 31: a Dataset whose source is one CSV file on a claim (`pvc://`). `forgectl labels
    merge --env cluster` hands the reviewed file and the auto-labels to a pod (a ConfigMap it owns),
    which checks the claim's file against the pinned digest — a file changed behind the spec's back
    is refused with the spec's line and nothing written — then appends the rows to it in place,
    keeping its own lines byte for byte; the spec's digest moves and is committed alone."""
    from tests.trust.test_autolabel_workflow import SPECS

    original = b"".join([b"f0,f1,digit\n", *(f"{i},{i + 1},{i % 10}\n".encode() for i in range(20))])
    digest = "sha256:" + hashlib.sha256(original).hexdigest()
    specs = SPECS.format(labeller="labeller", model_ref="labeller", digest=digest,
                         classes=json.dumps([str(d) for d in range(10)]))
    assert 'uri: "file://data/scans.csv"' in specs
    specs = specs.replace('uri: "file://data/scans.csv"', f'uri: "pvc://{SCANS_CLAIM}/scans.csv"')
    work = tmp_path / "labels"
    (work / "review").mkdir(parents=True)
    (work / "specs.yaml").write_text(specs)
    # what `forgectl labels pull` brings: the auto-labels, the review (one row accepted, one left
    # empty: rejected) and the report naming the digest they were made for
    (work / "review" / "auto-labels.csv").write_bytes(b"f0,f1,digit\n40,41,7\n42,43,8\n")
    (work / "review" / "review.csv").write_bytes(b"f0,f1,digit\n50,51,3\n52,53,\n")
    (work / "review" / "report.json").write_text(json.dumps({"datasetDigest": digest}))
    q = Quickstart.committed(stack, work, "scans on a claim")
    try:
        with shared_node.namespace(LABELS_NS, PSA_RESTRICTED):
            folder = _claim_folder(q, LABELS_NS, SCANS_CLAIM)
            os.chown(folder, 1000, 1000)  # the merge pod writes beside the file (as the runtimes' user)
            scans = folder / "scans.csv"
            scans.write_bytes(original + b"99,99,9\n")  # changed behind the spec's back
            spec_before = (work / "specs.yaml").read_bytes()
            # nothing applied yet: the workspace claim the merge stages on is not there — said at once
            early = q.forgectl("labels", "merge", "scans", "--reviewed", str(work / "review" / "review.csv"), "--env",
                               "cluster", check=False)
            assert early.returncode == 1 and "no PersistentVolumeClaim 'forge-workspace'" in early.stderr, early.stderr
            _claim_folder(q, LABELS_NS, "forge-workspace")  # as `forgectl apply` makes it
            refused = q.forgectl("labels", "merge", "scans", "--reviewed", str(work / "review" / "review.csv"), "--env",
                                 "cluster", check=False)
            assert refused.returncode == 1 and "specs.yaml:" in refused.stderr and "differs from the Dataset's" in refused.stderr, \
                refused.stderr
            assert (work / "specs.yaml").read_bytes() == spec_before and scans.read_bytes() == original + b"99,99,9\n"

            scans.write_bytes(original)
            merged = q.json("labels", "merge", "scans", "--reviewed", str(work / "review" / "review.csv"), "--commit")
            assert scans.read_bytes() == original + b"40,41,7\n42,43,8\n50,51,3\n"  # its own lines byte for byte
            assert merged["newDigest"] == "sha256:" + hashlib.sha256(scans.read_bytes()).hexdigest()
            assert (merged["autoLabelled"], merged["accepted"], merged["rejected"], merged["rows"]) == (2, 1, 1, 23), merged
            assert f"digest: {merged['newDigest']}" in (work / "specs.yaml").read_text()
            head = subprocess.run(["git", "show", "--name-only", "--format=%H", "HEAD"], cwd=work, check=True,
                                  capture_output=True, text=True).stdout.split()
            assert head == [merged["commit"], "specs.yaml"], head
            leftovers = q.core.list_namespaced_pod(LABELS_NS, label_selector="forge.dev/labels").items
            assert not [p for p in leftovers if not p.metadata.deletion_timestamp], leftovers
            again = q.forgectl("labels", "merge", "scans", "--reviewed", str(work / "review" / "review.csv"), "--env",
                               "cluster", check=False)  # the report names the old digest: refused here, no pod
            assert again.returncode == 1 and "were made for" in again.stderr, again.stderr
            print(f"\nmerged into pvc://{SCANS_CLAIM}/scans.csv by a pod: {merged['oldDigest'][:19]} → "
                  f"{merged['newDigest'][:19]} ({merged['rows']} rows)")
    finally:
        q.api.close()
