#!/usr/bin/env python3
"""Benchmark: how long a failing canary keeps traffic once Prometheus shows the breach, with the
DEFAULT analysis settings (issue 6).

    .venv/bin/python bench/rollback_latency.py [--runs 5] [--rate 40] [--error-rate 0.5]
                                               [--scrape-interval 1s] [--run-timeout 180]

Everything is real and local: a kube-apiserver + etcd with the CRDs (``devkit.cluster.Cluster``),
a Prometheus scraping the model servers (``devkit.prometheus.Prometheus``), two
``python -m runtimes serve`` processes of the runtime environment (``scripts/runtime-env main``)
serving a digits MLP trained once for all runs (stable, and canary with fault injection
``errorRate``), a traffic generator that splits ~``--rate`` req/s between them by the weights of
the live SeldonDeployment (what the mesh does in a cluster), and the rollout controller
(``reconciler.rollout.controller.Controller`` + ``KubernetesRolloutBackend``) run every 1 s, as
``forgectl reconcile --watch --interval 1`` does.

The RolloutPolicy is the default one: canary steps [20 %, 100 %], each analysed by ONE metric,
``template: success-rate, min: 0.99``, every other field left at its default (interval 5s, window
2m, count 3, failureLimit 1; no step pause).

Per run, in a fresh namespace: apply the specs at version 1, mark its Workflow Succeeded (no Argo
controller here: status.phase is patched, as tests/rollout does), change the learning rate, apply
again (version 2 = canary at weight 0), mark that Workflow Succeeded, start the servers and the
traffic, run the controller loop. Two watcher threads, one clock (``time.monotonic()``):

* t_visible: the first time the controller's own PromQL for the canary
  (``reconciler.metrics.analysis.render_query``), polled every 0.25 s, answers a value below 0.99;
* t_zero: the first time the live SeldonDeployment (polled every 0.1 s) gives the canary weight 0
  after it had given it traffic: the rollback.

Sample = t_zero − t_visible. Also printed per run: canary traffic → visible (scrape interval and
rate() needing two samples), and the controller's own queries (when its failing measurements
came), which split the sample into "phase of the 5 s interval" + "interval × failures" + "apply".

Prints the figures next to Flagger's default (analysis interval 60 s × threshold 5 = 300 s), then
as its LAST line one JSON object:
``{"runs": N, "median_s": …, "max_s": …, "flagger_default_s": 300, "samples_s": [...]}``.

Starts everything it uses and stops it by PID in finally blocks (kube-apiserver, etcd and
Prometheus also get SIGKILL if this process dies); sends traffic to 127.0.0.1 only; every loop is
bounded in time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import git  # noqa: E402

from devkit.cluster import Cluster  # noqa: E402
from devkit.common import ClusterError  # noqa: E402
from devkit.digits import DIGITS_DATASET, train_config  # noqa: E402
from devkit.namespaces import delete_namespace  # noqa: E402
from devkit.pods import ServerPod  # noqa: E402
from devkit.prometheus import Prometheus  # noqa: E402
from devkit.rollout import PacedTraffic, Traffic  # noqa: E402
from devkit.rollout_harness import Rollout  # noqa: E402
from devkit.runtime_steps import Runner, Server  # noqa: E402
from reconciler.metrics.analysis import render_query  # noqa: E402
from reconciler.metrics.prometheus import Prometheus as PromClient  # noqa: E402
from reconciler.metrics.prometheus import PrometheusUnavailable  # noqa: E402
from reconciler.plan.session import serving_states  # noqa: E402
from reconciler.rollout.controller import Phase  # noqa: E402

FLAGGER_DEFAULT_S = 60 * 5  # Flagger: analysis interval 1m × threshold 5
TARGET_S = 20.0
THRESHOLD = 0.99

DEFAULT_POLICY = """\
# The default analysis: one metric, only its template and rule set (interval 5s, window 2m,
# count 3, failureLimit 1 are the defaults of specs.rollout.Metric).
apiVersion: forge.dev/v1alpha1
kind: RolloutPolicy
metadata:
  name: default-analysis
spec:
  strategy: canary
  canary:
    steps:
      - weight: 20
        analysis: [success-rate]
      - weight: 100
        analysis: [success-rate]
  metrics:
    - name: success-rate
      template: success-rate
      min: 0.99
"""


def log(msg: str) -> None:
    print(f"[rollback_latency {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- set-up shared by all runs -----------------------------------------------------------------------

def runtime_python() -> str:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "runtime-env"), "main"], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"scripts/runtime-env main failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def train_digits(python: str, workspace: Path) -> Runner:
    """Prepare digits and train the MLP once (as tests/conftest.py's `digits` fixture)."""
    runner = Runner(python, workspace)
    runner.run("prepare", {"step": "prepare", "dataset": "digits", "spec": DIGITS_DATASET, "output": "data/digits"})
    runner.run("train", train_config("models/base"), timeout=600)
    return runner


def create_namespace(cluster: Cluster) -> str:
    name = f"bench-rollback-{uuid.uuid4().hex[:6]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"forge.dev/bench": "true"}}}
    status, resp = cluster.raw_client().request("POST", "/api/v1/namespaces", json.dumps(body).encode())
    if status != 201:
        raise ClusterError(f"creating namespace {name}: HTTP {status}: {resp}")
    return name


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if old not in text:
        raise SystemExit(f"{path.name}: {old!r} not found (examples/quickstart changed?)")
    path.write_text(text.replace(old, new))


def prepare_rollout(cluster: Cluster, prom: Prometheus, runner: Runner, namespace: str, work: Path) -> Rollout:
    """Quick-start specs with the default policy, applied at version 1 (workflow done), then a
    learning-rate change applied: version 2 is the canary at weight 0, its workflow done."""
    specs_dir = work / "repo" / "specs"
    shutil.copytree(ROOT / "examples" / "quickstart", specs_dir)
    _replace(specs_dir / "environments.yaml", "url: http://prometheus-operated.monitoring.svc:9090", f"url: {prom.url}")
    _replace(specs_dir / "environments.yaml", "rolloutPolicyRef: three-step-canary", "rolloutPolicyRef: default-analysis")
    (specs_dir / "rollout.yaml").write_text(DEFAULT_POLICY)
    repo = git.Repo.init(specs_dir.parent)
    repo.config_writer().set_value("user", "name", "bench").set_value("user", "email", "bench@example.com").release()
    repo.index.add(["specs"])
    repo.index.commit("version 1")
    r = Rollout(specs_dir, namespace, cluster.kubeconfig, prom, runner)
    r.apply()
    *_, r.stable = r.controller()
    r.finish_workflow(r.stable)
    _replace(specs_dir / "model.yaml", "learningRate: 0.002", "learningRate: 0.003")
    repo.index.add(["specs/model.yaml"])
    repo.index.commit("version 2: learning rate 0.003")
    r.apply()
    *_, r.canary = r.controller()
    if r.canary == r.stable:
        raise SystemExit("the learning-rate change did not make a new model version")
    r.finish_workflow(r.canary)
    # The policy the controller will use must be the default one.
    _, _, _, policy, _ = r.controller()
    (metric,) = policy.spec.metrics
    from specs.rollout import Metric as _Metric

    fields = ("interval", "window", "count", "failure_limit", "inconclusive_limit")
    defaults = tuple(getattr(metric, f) for f in fields)
    if defaults != tuple(_Metric.model_fields[f].default for f in fields):
        raise SystemExit(f"policy is not the default one: interval/window/count/failureLimit/inconclusiveLimit = {defaults}")
    return r


# -- one run ------------------------------------------------------------------------------------------

class RecordingProm(PromClient):
    """The controller's Prometheus client, recording when it asked and what it got."""

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        super().__init__(url, timeout=timeout)
        self.calls: list[tuple[float, str, float | None]] = []

    def value(self, query: str) -> float | None:
        at = time.monotonic()
        try:
            v = super().value(query)
        except PrometheusUnavailable:
            self.calls.append((at, query, None))
            raise
        self.calls.append((at, query, v))
        return v


def start_server(runner: Runner, r: Rollout, role: str, version: str, error_rate: float) -> Server:
    config: dict[str, Any] = {"endpoint": "digits", "namespace": r.namespace, "model": "digits-mlp", "version": version,
                              "variant": "base", "role": role, "modelDir": "models/base", "host": "127.0.0.1", "port": 0,
                              "batching": {"enabled": True, "maxBatchSize": 8, "maxLatencyMs": 2}}
    if error_rate:
        config["faultInjection"] = {"errorRate": error_rate, "addedLatencyMs": 0}
    return Server(runner, "serve", config)


def drain(server: Server) -> None:
    """Keep reading the server's pipes so that its logging never blocks it."""
    for stream in (server.proc.stdout, server.proc.stderr):
        if stream is not None:
            threading.Thread(target=lambda s=stream: [None for _ in iter(s.readline, "")], daemon=True).start()


@dataclass
class Marks:
    t_traffic: float | None = None  # live SeldonDeployment first gives the canary > 0 %
    t_visible: float | None = None  # Prometheus first answers < 0.99 for the canary
    t_zero: float | None = None  # live SeldonDeployment gives the canary 0 % again
    visible_value: float | None = None
    stop: threading.Event = field(default_factory=threading.Event)


def watch_seldon(cluster: Cluster, r: Rollout, traffic: Traffic, marks: Marks, deadline: float) -> None:
    """The mesh: follow the live weights (every 0.1 s), and mark when the canary gets / loses traffic."""
    raw = cluster.raw_client()
    path = f"/apis/machinelearning.seldon.io/v1/namespaces/{r.namespace}/seldondeployments"
    while not marks.stop.is_set() and time.monotonic() < deadline:
        status, doc = raw.request("GET", path, timeout=5)
        now = time.monotonic()
        if status == 200:
            state = serving_states(doc.get("items", [])).get("digits")
            weight = state.canary_weight if state and state.canary else 0
            traffic.weight = weight
            if weight > 0 and marks.t_traffic is None:
                marks.t_traffic = now
            elif weight == 0 and marks.t_traffic is not None and marks.t_zero is None:
                marks.t_zero = now
                return
        marks.stop.wait(0.1)


def watch_prometheus(url: str, query: str, marks: Marks, deadline: float) -> None:
    """The controller's PromQL every 0.25 s: mark when the breach is first visible."""
    client = PromClient(url, timeout=2)
    while not marks.stop.is_set() and time.monotonic() < deadline:
        at = time.monotonic()
        try:
            value = client.value(query)
        except PrometheusUnavailable:
            value = None
        if value is not None and value < THRESHOLD:
            marks.t_visible, marks.visible_value = at, value
            return
        marks.stop.wait(max(0.0, at + 0.25 - time.monotonic()))


def one_run(index: int, cluster: Cluster, prom: Prometheus, runner: Runner, args: argparse.Namespace) -> dict[str, Any]:
    namespace = create_namespace(cluster)
    work = Path(tempfile.mkdtemp(prefix="forge-bench-rollback-"))
    servers: list[Server] = []
    pods: list[ServerPod] = []
    traffic: PacedTraffic | None = None
    marks = Marks()
    threads: list[threading.Thread] = []
    try:
        prom.reset()  # no targets, no series from the previous run
        r = prepare_rollout(cluster, prom, runner, namespace, work)
        # Both servers start at once (each takes seconds), then wait for their "serving" line.
        servers = [start_server(runner, r, "stable", r.stable, 0.0), start_server(runner, r, "canary", r.canary, args.error_rate)]
        for s in servers:
            s.__enter__()
            drain(s)
        stable, canary = servers
        # Their pods, Ready while they answer (the kubelet's part: no node runs here); the
        # controller raises the canary's weight only while its pods are Ready.
        pods = [ServerPod(cluster.kubeconfig, namespace, endpoint="digits", role=role, version=version, url=s.url,
                          alive=lambda s=s: s.proc.poll() is None).start()
                for role, version, s in (("stable", r.stable, stable), ("canary", r.canary, canary))]
        prom.set_targets([stable.url.removeprefix("http://"), canary.url.removeprefix("http://")])
        prom.wait_for_targets(2, timeout=30)

        controller, backend, endpoint, policy, version = r.controller()
        recorder = RecordingProm(prom.url, timeout=2)
        controller.prometheus = recorder
        (metric,) = policy.spec.metrics
        query = render_query(metric, endpoint=endpoint.name, namespace=namespace, version=r.canary, role="canary")

        traffic = PacedTraffic(stable.url, canary.url)
        deadline = time.monotonic() + args.run_timeout
        threads = [threading.Thread(target=traffic.run, args=(args.rate,), daemon=True),
                   threading.Thread(target=watch_seldon, args=(cluster, r, traffic, marks, deadline), daemon=True),
                   threading.Thread(target=watch_prometheus, args=(prom.url, query, marks, deadline), daemon=True)]
        for t in threads:
            t.start()
        t_start = time.monotonic()

        # The controller, as `forgectl reconcile --watch --interval 1`: a pass, then 1 s of sleep.
        state = None
        t_decided = None
        while time.monotonic() < deadline:
            backend.refresh()
            state = controller.reconcile(endpoint, version, "digits-mlp", policy)
            if state is not None and state.phase in (Phase.ROLLED_BACK, Phase.PROMOTED, Phase.ABORTED):
                t_decided = time.monotonic()
                break
            time.sleep(args.interval)
        # Let the watchers see the result (bounded).
        while marks.t_zero is None and time.monotonic() < min(deadline, (t_decided or 0) + 5):
            time.sleep(0.05)
        marks.stop.set()
        traffic.stop.set()
        for t in threads:
            t.join(timeout=10)
        if state is None or state.phase is not Phase.ROLLED_BACK:
            raise SystemExit(f"run {index}: the canary was not rolled back within {args.run_timeout:.0f} s: "
                             f"{state.phase.value if state else None}: {state.reason if state else ''}")
        if marks.t_visible is None or marks.t_zero is None or marks.t_traffic is None:
            raise SystemExit(f"run {index}: missing marks: traffic={marks.t_traffic} visible={marks.t_visible} zero={marks.t_zero}")

        fails = [at for at, q, v in recorder.calls if q == query and v is not None and v < THRESHOLD]
        asked = [(round(at - marks.t_visible, 2), None if v is None else round(v, 3)) for at, q, v in recorder.calls if q == query]
        elapsed = max(1e-9, time.monotonic() - t_start)
        result = {
            "run": index,
            "sample_s": round(marks.t_zero - marks.t_visible, 2),
            "traffic_to_visible_s": round(marks.t_visible - marks.t_traffic, 2),
            "visible_value": round(marks.visible_value or 0.0, 3),
            "first_fail_after_visible_s": round(fails[0] - marks.t_visible, 2) if fails else None,
            "between_fails_s": round(fails[-1] - fails[0], 2) if len(fails) > 1 else None,
            "last_fail_to_zero_s": round(marks.t_zero - fails[-1], 2) if fails else None,
            "failed_measurements": len(fails),
            "controller_queries": asked,  # (seconds after t_visible, value) of each controller query
            "requests": {role: traffic.count(role) for role in ("stable", "canary")},
            "failed_requests": {role: traffic.count(role, ok=False) for role in ("stable", "canary")},
            "rps": round(len(traffic.log) / elapsed, 1),
            "reason": state.reason,
        }
        return result
    finally:
        marks.stop.set()
        if traffic is not None:
            traffic.stop.set()
        for t in threads:
            t.join(timeout=10)
        for pod in pods:
            pod.stop()
        for s in servers:
            s.stop()
        try:
            prom.set_targets([])
        except OSError:
            pass
        try:
            delete_namespace(cluster, namespace)
        except Exception as exc:  # noqa: BLE001 — clean-up must not hide the run's own error
            log(f"could not delete namespace {namespace}: {exc}")
        shutil.rmtree(work, ignore_errors=True)


# -- main ---------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="number of rollbacks to measure (default 5)")
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second sent, split by the live weights (default 40)")
    parser.add_argument("--error-rate", type=float, default=0.5, help="canary fault injection errorRate (default 0.5)")
    parser.add_argument("--scrape-interval", default="1s", help="Prometheus scrape interval (default 1s, as the test harness)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between controller passes (default 1, as `reconcile --watch`)")
    parser.add_argument("--run-timeout", type=float, default=180.0, help="give a run up to this many seconds (default 180)")
    parser.add_argument("--out", type=Path, default=None, help="result file (default bench/results/rollback-latency-<date>.json)")
    args = parser.parse_args()
    if not 1 <= args.runs <= 50:
        parser.error("--runs must be between 1 and 50")
    if not 1 <= args.rate <= 500:
        parser.error("--rate must be between 1 and 500")

    python = runtime_python()
    cluster_dir = Path(tempfile.mkdtemp(prefix="forge-bench-cluster-"))
    prom_dir = Path(tempfile.mkdtemp(prefix="forge-bench-prometheus-"))
    workspace = Path(tempfile.mkdtemp(prefix="forge-bench-digits-"))
    cluster: Cluster | None = None
    prom: Prometheus | None = None
    results: list[dict[str, Any]] = []
    try:
        log("training the digits MLP once for all runs (prepare + train)")
        t0 = time.monotonic()
        runner = train_digits(python, workspace)
        log(f"trained in {time.monotonic() - t0:.1f} s; starting kube-apiserver + etcd and Prometheus")
        cluster = Cluster.start(cluster_dir, die_with_parent=True, log=lambda msg: None)
        prom = Prometheus.start(state_dir=prom_dir, scrape_interval=args.scrape_interval, die_with_parent=True, log=log)
        log(f"apiserver {cluster.server}, prometheus {prom.url} (scrape every {args.scrape_interval})")
        for i in range(1, args.runs + 1):
            res = one_run(i, cluster, prom, runner, args)
            results.append(res)
            log(f"run {i}: {res['sample_s']:.2f} s from visible to 0 % ({res['failed_measurements']} failed measurements; "
                f"{res['rps']} req/s)")
    finally:
        if prom is not None:
            prom.stop()
        if cluster is not None:
            cluster.stop(quiet=True)
        shutil.rmtree(cluster_dir, ignore_errors=True)
        shutil.rmtree(prom_dir, ignore_errors=True)
        shutil.rmtree(workspace, ignore_errors=True)

    samples = [r["sample_s"] for r in results]
    median, worst = statistics.median(samples), max(samples)
    print(f"Rollback latency, default analysis (success-rate ≥ {THRESHOLD}; interval 5s, window 2m, count 3, failureLimit 1),")
    print(f"canary errorRate {args.error_rate}, ~{args.rate:g} req/s, Prometheus scrape {args.scrape_interval}, controller every {args.interval:g} s")
    print()
    print(f"{'run':>3}  {'visible→0%':>10}  {'traffic→visible':>15}  {'visible→1st fail':>16}  {'1st→2nd fail':>12}  {'2nd fail→0%':>11}  value@visible")
    for r in results:
        def f(v: Any) -> str:
            return "-" if v is None else f"{v:.2f} s"
        print(f"{r['run']:>3}  {f(r['sample_s']):>10}  {f(r['traffic_to_visible_s']):>15}  {f(r['first_fail_after_visible_s']):>16}  "
              f"{f(r['between_fails_s']):>12}  {f(r['last_fail_to_zero_s']):>11}  {r['visible_value']:.3f}")
    print()
    for r in results:
        print(f"run {r['run']} controller queries (s after visible, value): {r['controller_queries']}")
    print(f"rollback reason (run {results[-1]['run']}): {results[-1]['reason']}")
    print()
    print(f"median {median:.2f} s, max {worst:.2f} s over {len(samples)} runs   "
          f"(Flagger default: {FLAGGER_DEFAULT_S} s = interval 60 s × threshold 5; target ≤ {TARGET_S:g} s: "
          f"{'met' if worst <= TARGET_S else 'NOT met'})")
    result = {"runs": len(samples), "median_s": round(median, 2), "max_s": round(worst, 2), "target_s": TARGET_S,
              "flagger_default_s": FLAGGER_DEFAULT_S, "samples_s": samples,
              "command": " ".join(["bench/rollback_latency.py", *sys.argv[1:]]), "samples": results}
    path = args.out or Path(__file__).resolve().parents[1] / "bench" / "results" / f"rollback-latency-{time.strftime('%Y-%m-%d')}.json"
    path.write_text(json.dumps(result) + "\n")
    log(f"wrote {path}")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}))


if __name__ == "__main__":
    main()
