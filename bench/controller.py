#!/usr/bin/env python3
"""Benchmark: the in-cluster controller's figures (issue 33), on real components.

    .venv/bin/python bench/controller.py [--runs 5] [--interval 10s] [--failovers 3] [--idle 30]

Everything is real and local: a kube-apiserver + etcd with the CRDs (``devkit.cluster.Cluster``;
``FORGE_KUBECONFIG_EXTERNAL`` reuses a running one), a git server (Debian's ``git daemon`` on
127.0.0.1, ``devkit.gitserver``), and the controller as processes (``forgectl controller run``),
the quick-start's ``cluster`` Environment as its source. One clock, ``time.monotonic()``:

* **commit → applied, by polling**: a commit pushed (the learning rate changed), until the Sync
  says Ready with that revision as ``lastAppliedRevision``, the source polled every ``--interval``
  (+ up to 10 % jitter); expected about half an interval plus the sync;
* **commit → applied, by webhook**: the same, the interval an hour, a signed ``POST /hooks/git``
  sent right after the push (goal ≤ 5 s);
* **leader failover**: two replicas; the Lease's holder SIGKILLed, until the other holds the Lease
  and has acted (its Sync status names it as the leader) (goal ≤ 20 s: the Lease's 15 s duration
  and a 2 s retry);
* **idle**: the leader's CPU seconds and RSS (``/proc``) over ``--idle`` seconds with nothing to do.

Prints a table, writes ``bench/results/controller-<date>.json`` and, as its LAST line, one JSON
object with every figure.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import hmac
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devkit.cluster import Cluster  # noqa: E402
from devkit.gitserver import GitServer, start_git_server  # noqa: E402
from reconciler.targets.local.processes import free_port  # noqa: E402

SECRET = b"bench-webhook-secret"
SOURCE = "quickstart"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=60)


def wait(what: str, predicate: Any, timeout: float, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class Bench:
    """One namespace, one git server, the controller replicas started in it."""

    def __init__(self, cluster: Cluster, tmp: Path, name: str) -> None:
        self.cluster, self.tmp = cluster, tmp / name
        self.tmp.mkdir(parents=True)
        self.namespace = f"bench-controller-{name}-{os.getpid()}"
        done = kubectl(cluster.kubeconfig, "create", "namespace", self.namespace)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        self.git: GitServer = start_git_server(self.tmp)
        self.processes: dict[str, tuple[subprocess.Popen[bytes], int]] = {}

    def start(self, name: str, interval: str) -> None:
        port = free_port()
        (self.tmp / "secret").write_bytes(SECRET)
        config = {"apiVersion": "forge.dev/v1alpha1", "kind": "ControllerConfig", "namespace": self.namespace,
                  "identity": f"forge-controller/{name}", "cacheDir": str(self.tmp / f"cache-{name}"),
                  "http": {"address": "127.0.0.1", "port": port}, "webhook": {"secretFile": str(self.tmp / "secret")},
                  "sources": [{"name": SOURCE, "url": self.git.url, "environment": "cluster", "namespace": self.namespace,
                               "interval": interval}]}
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "KUBECONFIG": self.cluster.kubeconfig, "NO_COLOR": "1"}
        process = subprocess.Popen([sys.executable, "-m", "forgectl", "controller", "run", "--config", str(path)], cwd=self.tmp,
                                   env=env, stdout=(self.tmp / f"{name}.log").open("wb"), stderr=subprocess.STDOUT)
        self.processes[name] = (process, port)

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False

        wait(f"{name}'s /readyz", ready, 60)

    def status(self) -> dict[str, Any]:
        done = kubectl(self.cluster.kubeconfig, "-n", self.namespace, "get", f"sync/{SOURCE}", "-o", "json")
        return json.loads(done.stdout).get("status", {}) if done.returncode == 0 else {}

    def applied(self, revision: str) -> bool:
        status = self.status()
        ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
        return status.get("lastAppliedRevision") == revision and ready.get("status") == "True"

    def holder(self) -> str | None:
        done = kubectl(self.cluster.kubeconfig, "-n", self.namespace, "get", "lease", "forgectl-cluster", "-o", "json")
        return json.loads(done.stdout)["spec"].get("holderIdentity") if done.returncode == 0 else None

    def push_change(self, value: str) -> str:
        model = self.git.work / "model.yaml"
        text = model.read_text()
        current = next(line for line in text.splitlines() if "learningRate:" in line)
        model.write_text(text.replace(current, current.split(":")[0] + f": {value}"))
        return self.git.push(f"learning rate {value}")

    def webhook(self, name: str) -> None:
        body = json.dumps({"ref": "refs/heads/main"}).encode()
        signature = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
        request = urllib.request.Request(f"http://127.0.0.1:{self.processes[name][1]}/hooks/git", data=body, method="POST",
                                         headers={"X-Hub-Signature-256": signature, "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as resp:
            assert resp.status == 202

    def close(self) -> None:
        for process, _ in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, _ in self.processes.values():
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
        self.git.stop()
        kubectl(self.cluster.kubeconfig, "delete", "namespace", self.namespace, "--wait=false")


def proc_usage(pid: int) -> tuple[float, int]:
    """CPU seconds (user + system) and RSS bytes of ``pid``, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmRSS:"))
    return cpu, rss


def commit_to_applied(cluster: Cluster, tmp: Path, how: str, runs: int, interval: str) -> list[float]:
    bench = Bench(cluster, tmp, how)
    samples = []
    try:
        first = bench.git.push("quick-start")
        bench.start("a", interval if how == "polling" else "1h")
        wait("the first revision applied", lambda: bench.applied(first), 180)
        for i in range(runs):
            revision = bench.push_change(f"0.00{3 + i % 6}{i}")
            pushed = time.monotonic()
            if how == "webhook":
                bench.webhook("a")
            wait(f"revision {revision[:12]} applied", lambda rev=revision: bench.applied(rev), 180, interval=0.05)
            samples.append(round(time.monotonic() - pushed, 2))
            log(f"{how} run {i + 1}: commit → applied in {samples[-1]:.2f} s")
    finally:
        bench.close()
    return samples


def failover_and_idle(cluster: Cluster, tmp: Path, failovers: int, idle: float) -> tuple[list[float], dict[str, float]]:
    bench = Bench(cluster, tmp, "failover")
    samples = []
    usage: dict[str, float] = {}
    try:
        first = bench.git.push("quick-start")
        names = ["a", "b"]
        for name in names:
            bench.start(name, "10s")
        wait("the first revision applied", lambda: bench.applied(first), 180)
        leader = wait("a Lease holder", bench.holder, 60).split("/")[-1]
        pid = bench.processes[leader][0].pid
        cpu0, _ = proc_usage(pid)
        time.sleep(idle)
        cpu1, rss = proc_usage(pid)
        usage = {"idle_cpu_percent": round(100 * (cpu1 - cpu0) / idle, 2), "idle_rss_mib": round(rss / 2**20, 1)}
        log(f"idle leader over {idle:.0f} s: {usage['idle_cpu_percent']} % of a core, RSS {usage['idle_rss_mib']} MiB")
        spare = 0
        for i in range(failovers):
            leader = wait("a Lease holder", bench.holder, 60).split("/")[-1]
            follower = next(n for n in bench.processes if n != leader and bench.processes[n][0].poll() is None)
            bench.processes[leader][0].send_signal(signal.SIGKILL)
            bench.processes[leader][0].wait(10)
            killed = time.monotonic()
            identity = f"forge-controller/{follower}"
            wait("the follower holding the Lease and acting",
                 lambda who=identity: bench.holder() == who and bench.status().get("leader") == who, 60, interval=0.1)
            samples.append(round(time.monotonic() - killed, 2))
            log(f"failover {i + 1}: {leader} killed → {follower} holds the Lease and acts in {samples[-1]:.2f} s")
            spare += 1
            bench.start(f"spare{spare}", "10s")  # the next failover has a follower again
    finally:
        bench.close()
    return samples, usage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="commits measured per mode (default 5)")
    parser.add_argument("--interval", default="10s", help="the polling interval (default 10s, as the issue's test)")
    parser.add_argument("--failovers", type=int, default=3, help="leader kills measured (default 3)")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds the idle leader is measured (default 30)")
    args = parser.parse_args()
    if not 1 <= args.runs <= 50 or not 1 <= args.failovers <= 20 or not 5 <= args.idle <= 600:
        parser.error("--runs 1..50, --failovers 1..20, --idle 5..600")
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-controller-"))
    cluster = Cluster.external_from_env()
    started = cluster is None
    if cluster is None:
        log("starting kube-apiserver + etcd with the CRDs")
        cluster = Cluster.start(str(tmp / "cluster"), die_with_parent=True, log=lambda msg: None)
    try:
        polling = commit_to_applied(cluster, tmp, "polling", args.runs, args.interval)
        webhook = commit_to_applied(cluster, tmp, "webhook", args.runs, args.interval)
        failover, usage = failover_and_idle(cluster, tmp, args.failovers, args.idle)
    finally:
        if started:
            cluster.stop(quiet=True)
    figures = {
        "polling_interval": args.interval,
        "commit_to_applied_polling_median_s": statistics.median(polling), "commit_to_applied_polling_max_s": max(polling),
        "commit_to_applied_webhook_median_s": statistics.median(webhook), "commit_to_applied_webhook_max_s": max(webhook),
        "webhook_goal_s": 5, "failover_median_s": statistics.median(failover), "failover_max_s": max(failover),
        "failover_goal_s": 20, **usage,
        "samples": {"polling_s": polling, "webhook_s": webhook, "failover_s": failover},
    }
    print(f"commit → applied, polling every {args.interval}: median {figures['commit_to_applied_polling_median_s']:.2f} s, "
          f"max {figures['commit_to_applied_polling_max_s']:.2f} s")
    print(f"commit → applied, webhook: median {figures['commit_to_applied_webhook_median_s']:.2f} s, "
          f"max {figures['commit_to_applied_webhook_max_s']:.2f} s (goal ≤ 5 s)")
    print(f"leader failover, holder killed → new holder acting: median {figures['failover_median_s']:.2f} s, "
          f"max {figures['failover_max_s']:.2f} s (goal ≤ 20 s)")
    print(f"idle leader: {usage.get('idle_cpu_percent')} % of a core, RSS {usage.get('idle_rss_mib')} MiB")
    results = ROOT / "bench" / "results" / f"controller-{datetime.date.today().isoformat()}.json"
    results.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
