#!/usr/bin/env python3
"""Benchmark: the controller's memory and sync time at scale, beside `forgectl apply` doing the same.

For each N (default 1,000 and 10,000) this

1. starts a real kube-apiserver + etcd with the real CRDs (`devkit/cluster.py`, Forge's Sync among
   them) and `git daemon` on 127.0.0.1 (`devkit/gitserver.py`) serving a repository of
   `bench/plan_scale.py`'s specs: N Models + N Endpoints, an Environment `cluster` (namespace
   `forge-bench`), a Dataset, a Compute and a RolloutPolicy;
2. creates the 5 N + 5 objects a first apply would, in bulk (`plan_scale.bulk_setup`, in a child
   process), so the controller starts on an applied environment as it would after a restart;
3. starts `forgectl controller run` (the real controller, one replica, a host process with the
   admin kubeconfig) on that repository (git polled every 5 s, rollouts walked every 2 s), and
   measures from `/proc`: the time until its Sync reports the revision applied, its peak RSS
   (VmHWM) then, its RSS and CPU over `--idle` seconds of walking N endpoints' rollouts, then
   after a pushed change of 1 % of the models' `learningRate` and a request for a sync at once (the
   Sync's `forge.dev/requested-at`, what the push webhook sets): push → applied, the sync's own
   seconds and the walks' (the controller's `/metrics`), and its peak RSS;
4. stops the controller and applies another 1 % change with `forgectl apply --auto-approve` (the
   baseline: the same plan and apply, once, in a process of its own), measured with `os.wait4`
   (wall, CPU) and its own VmHWM.

The controller's Deployment (`forgectl install`) limits its memory to `--memory-limit` (default
1Gi, what `forgectl install` sets unless told otherwise); the bench says whether the peak fits.
Prints a table, then as its LAST line one JSON object: per N the controller's and the CLI's figures
and the ratios controller / CLI.

    .venv/bin/python bench/controller_scale.py                     # N = 1000, 10000
    .venv/bin/python bench/controller_scale.py --n 200 --idle 5    # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

import plan_scale  # noqa: E402  (the specs, the change and the bulk set-up, shared with the plan bench)

log = partial(plan_scale.log, bench="controller_scale")

from devkit.gitserver import git, start_git_server  # noqa: E402
from reconciler.targets.local.processes import free_port  # noqa: E402

SOURCE = "bench"
CONTROLLER_NS = "forge-system"
NAMESPACE = "forge-bench"


def mib(quantity: str) -> float:
    """A Kubernetes memory quantity (`1Gi`, `768Mi`) in MiB."""
    units = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    return float(quantity) / 2**20


def proc_memory(pid: int) -> dict[str, float]:
    """VmHWM and VmRSS (MiB) and CPU seconds of a live process, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            fields[key] = int(value.split()[0]) / 1024
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {"peak_rss_mib": round(fields["VmHWM"], 1), "rss_mib": round(fields["VmRSS"], 1),
            "cpu_s": round((int(stat[11]) + int(stat[12])) / ticks, 2)}


def controller_metrics(port: int) -> dict[str, float]:
    """From the controller's own `/metrics`: the seconds and count of its successful syncs and of its
    rollout walks so far (sums of the two histograms)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    names = {"forge_controller_sync_duration_seconds_sum": "sync_s", "forge_controller_sync_duration_seconds_count": "syncs",
             "forge_controller_rollout_walk_duration_seconds_sum": "walk_s",
             "forge_controller_rollout_walk_duration_seconds_count": "walks"}
    figures = dict.fromkeys(names.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = names.get(sample.name)
            if key is not None and sample.labels.get("result", "Succeeded") == "Succeeded":
                figures[key] += sample.value
    return figures


def between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the controller did between two reads of :func:`controller_metrics`: its syncs and walks,
    their count and mean seconds."""
    syncs, walks = after["syncs"] - before["syncs"], after["walks"] - before["walks"]
    return {"syncs": int(syncs), "sync_mean_s": round((after["sync_s"] - before["sync_s"]) / syncs, 2) if syncs else None,
            "walks": int(walks), "walk_mean_s": round((after["walk_s"] - before["walk_s"]) / walks, 2) if walks else None}


def kubectl_json(kubectl: str, kubeconfig: str, *args: str) -> dict[str, Any] | None:
    proc = subprocess.run([kubectl, "--kubeconfig", kubeconfig, *args, "-o", "json"], capture_output=True, text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def applied(kubectl: str, kubeconfig: str, revision: str) -> bool:
    sync = kubectl_json(kubectl, kubeconfig, "-n", CONTROLLER_NS, "get", "syncs.forge.dev", SOURCE) or {}
    status = sync.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return ready and status.get("lastAppliedRevision") == revision


def wait(what: str, predicate: Any, timeout: float, process: subprocess.Popen[bytes], log_path: Path) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if process.poll() is not None:
            raise SystemExit(f"the controller exited {process.returncode} while waiting for {what}:\n"
                             + log_path.read_text()[-4000:])
        if predicate():
            return time.perf_counter() - start
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}:\n" + log_path.read_text()[-4000:])


def bench_n(n: int, idle: float, kubectl: str, work: Path) -> dict[str, Any]:
    from devkit.cluster import Cluster

    result: dict[str, Any] = {"n": n, "objects": 5 * n + 5}
    cluster = Cluster.start(work / f"cluster-{n}", die_with_parent=True)
    server = start_git_server(work / f"git-{n}")
    controller: subprocess.Popen[bytes] | None = None
    try:
        kubeconfig = cluster.kubeconfig
        specs = server.work
        for entry in specs.iterdir():  # the quick-start start_git_server copied, replaced by the bench's specs
            if entry.name != ".git":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        plan_scale.generate_specs(specs, n, NAMESPACE)
        base = server.push("base")
        log(f"N={n}: the specs pushed; bulk set-up of {5 * n + 5:,} objects")
        setup = subprocess.run(
            [sys.executable, "-c", "import json, sys; from pathlib import Path; sys.path[:0] = sys.argv[3:5]; import plan_scale;"
             " print(json.dumps(plan_scale.bulk_setup(Path(sys.argv[1]), sys.argv[2], 32)))",
             str(specs), kubeconfig, str(Path(__file__).resolve().parent), str(REPO)],
            check=True, capture_output=True, text=True)
        result["setup"] = json.loads(setup.stdout.strip().splitlines()[-1])
        log(result["setup"]["summary"])
        subprocess.run([kubectl, "--kubeconfig", kubeconfig, "create", "namespace", CONTROLLER_NS], check=True,
                       capture_output=True)

        port = free_port()
        config = {"apiVersion": "forge.dev/v1alpha1", "kind": "ControllerConfig", "namespace": CONTROLLER_NS,
                  "identity": "forge-controller/bench", "cacheDir": str(work / f"controller-cache-{n}"),
                  "http": {"address": "127.0.0.1", "port": port},
                  "sources": [{"name": SOURCE, "url": server.url, "branch": "main", "path": ".", "environment": "cluster",
                               "namespace": NAMESPACE, "interval": "5s", "timeout": "60s", "rolloutInterval": "2s"}]}
        config_path = work / f"controller-{n}.yaml"
        config_path.write_text(yaml.safe_dump(config))
        log_path = work / f"controller-{n}.log"
        env = {**os.environ, "KUBECONFIG": kubeconfig, "NO_COLOR": "1", "FORGE_CACHE": str(work / f"forge-cache-{n}")}
        started = time.perf_counter()
        controller = subprocess.Popen([sys.executable, "-m", "forgectl", "controller", "run", "--config", str(config_path)],
                                      cwd=work, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
        wait("the first sync", lambda: applied(kubectl, kubeconfig, base), 900, controller, log_path)
        first = {"start_to_applied_s": round(time.perf_counter() - started, 2), **proc_memory(controller.pid)}
        log(f"N={n}: controller started → revision applied in {first['start_to_applied_s']} s, peak RSS "
            f"{first['peak_rss_mib']:.0f} MiB")
        before, counted = proc_memory(controller.pid), controller_metrics(port)
        time.sleep(idle)
        after = proc_memory(controller.pid)
        idle_figures = {"seconds": idle, "rss_mib": after["rss_mib"], "peak_rss_mib": after["peak_rss_mib"],
                        "cpu_millicores": round(1000 * (after["cpu_s"] - before["cpu_s"]) / idle),
                        **between(counted, controller_metrics(port))}
        log(f"N={n}: idle {idle:.0f} s (walking {n:,} endpoints' rollouts): RSS {after['rss_mib']:.0f} MiB, "
            f"{idle_figures['cpu_millicores']} millicores, {idle_figures['walks']} walks of {idle_figures['walk_mean_s']} s")

        indices = plan_scale.changed_indices(n, 1.0)
        plan_scale.change_models(specs, indices)
        counted = controller_metrics(port)
        revision = server.push("1 % of the models' learningRate")
        pushed = time.perf_counter()
        # what a push webhook does (its follower passes it on so): ask the leader for a sync now
        subprocess.run([kubectl, "--kubeconfig", kubeconfig, "-n", CONTROLLER_NS, "annotate", f"sync/{SOURCE}",
                        f"forge.dev/requested-at={time.time():.3f}", "--overwrite"], check=True, capture_output=True)
        wait("the change's sync", lambda: applied(kubectl, kubeconfig, revision), 900, controller, log_path)
        change = {"push_to_applied_s": round(time.perf_counter() - pushed, 2), **proc_memory(controller.pid),
                  **between(counted, controller_metrics(port))}
        log(f"N={n}: push → applied {change['push_to_applied_s']} s (the sync itself {change['sync_mean_s']} s; "
            f"{change['walks']} walks of {change['walk_mean_s']} s meanwhile), peak RSS {change['peak_rss_mib']:.0f} MiB")
        controller.send_signal(signal.SIGTERM)
        controller.wait(60)
        output = log_path.read_text()
        if "internal error" in output or "Traceback" in output:
            raise SystemExit(f"the controller logged an error:\n{output[-4000:]}")
        result["controller"] = {"first_sync": first, "idle": idle_figures, "change_sync": change}

        # The baseline: the CLI applying a change of the same size (other models: those keep the old rate).
        plan_scale.change_models(specs, [(i + 1) % n for i in indices])
        git("commit", "-qam", "another 1 %", cwd=specs)
        cmd, counts = plan_scale.forgectl_counted(work, "apply", str(specs), "--kubeconfig", kubeconfig, "--auto-approve")
        measured = plan_scale.run_measured(cmd, (0,), {**env, "PYTHONPATH": str(REPO)}, timeout=900, counted=counts)
        result["cli_apply"] = {"wall_s": round(measured.wall_s, 2), "cpu_s": round(measured.cpu_s, 2),
                               "peak_rss_mib": round(measured.peak_rss_bytes / 2**20, 1), "writes": measured.writes}
        log(f"N={n}: forgectl apply of the same-size change {measured.wall_s:.1f} s, peak RSS "
            f"{result['cli_apply']['peak_rss_mib']:.0f} MiB, {measured.writes} writes")
    finally:
        if controller is not None and controller.poll() is None:
            controller.kill()
            controller.wait()
        server.stop()
        cluster.stop(quiet=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle walking measured after the first sync")
    parser.add_argument("--memory-limit", default="1Gi", help="the controller Deployment's memory limit to judge by")
    args = parser.parse_args()
    kubectl, _ = plan_scale.find_kubectl()
    limit = mib(args.memory_limit)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out: dict[str, Any] = {"bench": "controller_scale", "revision": head, "uptime_start": plan_scale.uptime(),
                           "memory_limit_mib": limit, "runs": []}
    with tempfile.TemporaryDirectory(prefix="forge-controller-scale-") as tmp:
        for n in args.n:
            run = bench_n(n, args.idle, kubectl, Path(tmp))
            c, cli = run["controller"], run["cli_apply"]
            peak = max(c["first_sync"]["peak_rss_mib"], c["change_sync"]["peak_rss_mib"])
            run["ratios"] = {"peak_rss_controller_vs_cli": round(peak / cli["peak_rss_mib"], 3),
                             "change_sync_vs_cli_apply_wall": round(c["change_sync"]["push_to_applied_s"] / cli["wall_s"], 3)}
            run["fits_memory_limit"] = peak < limit
            out["runs"].append(run)
            print(f"\nN = {n:,} ({5 * n + 5:,} objects)")
            print(f"  controller: start → applied {c['first_sync']['start_to_applied_s']} s; idle RSS "
                  f"{c['idle']['rss_mib']:.0f} MiB at {c['idle']['cpu_millicores']} millicores; push → applied "
                  f"{c['change_sync']['push_to_applied_s']} s; peak RSS {peak:.0f} MiB "
                  f"({'within' if peak < limit else 'OVER'} the {args.memory_limit} limit)")
            print(f"  forgectl apply, same-size change: {cli['wall_s']} s wall, {cli['cpu_s']} s CPU, peak RSS "
                  f"{cli['peak_rss_mib']:.0f} MiB; controller / CLI peak RSS {run['ratios']['peak_rss_controller_vs_cli']}×")
    out["uptime_end"] = plan_scale.uptime()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
