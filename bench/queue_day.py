#!/usr/bin/env python3
"""Benchmark: a simulated day of training jobs over the node's fake GPUs, under the real Kueue,
with and without borrowing (issue 30's "simulated day").

    .venv/bin/python bench/queue_day.py [--seed 1] [--hour-s 10] [--day-hours 24] [--out FILE]
    .venv/bin/python bench/queue_day.py --smoke          # a 6-hour day at 6 s an hour
    .venv/bin/python bench/queue_day.py --trace-only     # the trace and what it asks for; no cluster

The cluster is the project's own one-node test cluster, started as the node tests start theirs
(``devkit.cluster.Cluster`` with ``node=True``, ``devkit.node.node.Node``, the real Kueue v0.17.0
manager of ``devkit.node.kueue``; root needed), or, with ``--kubeconfig``, a running one whose node
Kueue already manages (as ``kueue.start`` sets it up: namespaces labelled
``kueue.MANAGED_NAMESPACES`` are managed). The node advertises 8 fake ``nvidia.com/gpu``
(``devkit.node.extended_resources``); busybox never touches a device.

The trace (bench/queue_day_core.py ``make_trace``, seeded): three teams, each with a queued pool
(nominal quota 4, 2 and 2 GPUs: the node's 8), each busy over its own part of the day and nearly
idle otherwise; jobs of 1, 2 or 4 GPUs, 0.5–3 hours, a quarter of them high priority. Each team's
pool is a ``Compute`` with a ``queue``, rendered by Forge's own ``renderers.queues.render_queues``
(ResourceFlavor, ClusterQueue, LocalQueue, WorkloadPriorityClasses ``<ns>-high`` / ``-low``) and
applied server-side (``devkit.node.controllers.apply_docs``). A job is a pod ``sleep <duration>``
with Forge's queue labels (``queue_labels``), created at its submit time, so Kueue gates, admits,
borrows and preempts it; the bench decides no admission.

Two replays of the same trace, the baseline first:

* **no borrowing**: the pools in no cohort, each team capped at its own quota;
* **borrowing**: the pools in one cohort (no borrowing limit; Forge's default preemption:
  ``reclaimWithinCohort: Any``, ``withinClusterQueue: LowerPriority``).

What is measured, polling the API server every ``--poll-s`` (pods by the run's label, Workloads):
each attempt's Workload first seen admitted (``QuotaReserved``/``Admitted``), its pod first seen
running, first seen ended (``Succeeded``, or stopped by Kueue: the pod's ``TerminationTarget``
condition or deletion; the Workload's ``Preempted``/``Evicted`` reason when seen). A preempted job
is **resubmitted at once** as a new pod asking the duration it has left (Argo's retry of the train
step, which resumes from its checkpoint; the checkpoint interval is not modelled). From that
(bench/queue_day_core.py ``summarise``): GPU-hours used (pods running) in the day against
8 × the day (utilisation, idle fraction — the seed's "35 % idle" is the anchor) and against
8 × the makespan, the quota held (Kueue's admitted), p50/p95 wait (submit → first admitted) per
priority, preemptions, makespan. Borrowing's figures are also printed as ratios against the
baseline's.

Prints a table; writes ``--out`` (the summary plus every job's attempts) and, as its LAST line, the
summary as one JSON object. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import queue_day_core as core  # noqa: E402
from devkit import pools  # noqa: E402
from devkit.node import extended_resources, kueue  # noqa: E402
from devkit.node.controllers import apply_docs  # noqa: E402
from renderers.queues import queue_labels, render_queues  # noqa: E402
from specs import Compute, Environment  # noqa: E402

GPU = "nvidia.com/gpu"
NODE_LABELS = pools.GPU_NODE_LABELS  # the pools' nodeSelector: their flavor's nodeLabels
POOL = "gpu-pool"
COHORT = "forge-queue-day"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
RUN_LABEL, JOB_LABEL = "forge.dev/queue-day-run", "forge.dev/queue-day-job"
MODES = ("no-borrowing", "borrowing")  # the baseline first
CLUSTER_PLURALS = {"ClusterQueue": "clusterqueues", "ResourceFlavor": "resourceflavors",
                   "WorkloadPriorityClass": "workloadpriorityclasses"}
REQUESTS = {"cpu": "10m", "memory": "16Mi"}  # per pod, besides its GPUs


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the cluster -------------------------------------------------------------------------------------


@dataclass
class ExternalNode:
    """A running cluster given by ``--kubeconfig``: what ``apply_docs`` (kubeconfig, kubectl) and
    ``extended_resources`` (``api()``, the node's name) ask of a node."""

    kubeconfig: str
    name: str
    exes: dict[str, str] = field(default_factory=dict)
    images: dict[str, list[str]] = field(default_factory=dict)

    def api(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=self.kubeconfig)


def _busybox_on(api: client.ApiClient, node: str) -> str | None:
    """A busybox image the node's container runtime already holds (pods never pull here)."""
    for image in client.CoreV1Api(api).read_node(node).status.images or []:
        for name in image.names or []:
            if "busybox" in name and "@sha256:" not in name:
                return str(name)
    return None


def external_node(kubeconfig: str, image: str | None) -> ExternalNode:
    """The cluster of ``kubeconfig``: its one node, busybox on it, Kueue's webhook installed."""
    kubectl = shutil.which("kubectl") or str(Path(sys.executable).with_name("kubectl"))
    probe = ExternalNode(kubeconfig, "", {"kubectl": kubectl})
    api = probe.api()
    try:
        nodes = client.CoreV1Api(api).list_node().items
        if len(nodes) != 1:
            raise SystemExit(f"--kubeconfig: expected one node, found {len(nodes)}")
        probe.name = nodes[0].metadata.name
        hooks = client.AdmissionregistrationV1Api(api).list_mutating_webhook_configuration().items
        if not any(h.metadata.name.startswith(kueue.NAME_PREFIX) for h in hooks):
            raise SystemExit("--kubeconfig: Kueue's webhooks are not installed (devkit.node.kueue.start)")
        ref = image or _busybox_on(api, probe.name)
    finally:
        api.close()
    if not ref:
        raise SystemExit("--kubeconfig: no busybox image on the node; name one with --image")
    probe.images["busybox"] = ["", ref]
    return probe


@contextlib.contextmanager
def own_cluster() -> Iterator[Any]:
    """A cluster + node + Kueue of our own, as the node tests start theirs (tests/cluster/nodekit.py
    ``node_cluster`` and ``SharedNode.kueue``), every process stopped by its PID at the end."""
    from devkit.node.session import cluster_with_node

    if os.geteuid() != 0:
        raise SystemExit("the node needs root (containerd, runc, iptables, cgroups); or pass --kubeconfig")
    kueue.ensure_binary(log)
    t0 = time.monotonic()
    log("starting kube-apiserver + etcd with the CRDs, and the node (containerd, kubelet, scheduler, "
        "controller-manager, kube-proxy, CoreDNS)")
    with cluster_with_node("forge-bench-day", node_prefix="forge-bench-day-node-", log=log) as (cluster, node):
        manager = kueue.start(cluster, node, die_with_parent=True, log=log)
        log(f"cluster, node and Kueue up in {time.monotonic() - t0:.1f} s")
        try:
            yield node
        finally:
            log("stopping Kueue, the node and the cluster")
            manager.controller.stop()


def advertise_gpus(node: Any, gpus: int) -> None:
    """The node advertises ``gpus`` fake GPUs and the pools' node label; wait until it reports them."""
    extended_resources.advertise(node, {GPU: str(gpus)}, NODE_LABELS)
    deadline = time.monotonic() + 60
    while extended_resources.advertised(node).get(GPU) != str(gpus):
        if time.monotonic() > deadline:
            raise SystemExit(f"the node does not advertise {gpus} {GPU}")
        time.sleep(0.5)


# -- the pools -----------------------------------------------------------------------------------------


def pool_specs(team: core.Team, namespace: str, borrowing: bool) -> tuple[Compute, Environment, Any]:
    """A team's Environment and queued pool (its quota; in the cohort when ``borrowing``), loaded
    and validated as forgectl loads specs."""
    text = pools.environment(namespace) + "---\n" + pools.queued_pool(
        POOL, gpus_per_node=core.NODE_GPUS, min_gpus=1, max_gpus=team.quota, quota=team.quota,
        cohort=COHORT if borrowing else None, node_labels=NODE_LABELS)
    try:
        return pools.load_pool(text, POOL, f"team-{team.name}.yaml")
    except ValueError as exc:
        raise SystemExit(f"team {team.name}'s pool: {exc}") from None


@dataclass
class Pools:
    """The replay's teams: namespace and queue labels per priority, and the cluster objects applied."""

    namespaces: dict[str, str] = field(default_factory=dict)
    labels: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # team → priority → pod labels
    cluster_objects: list[dict[str, Any]] = field(default_factory=list)


def namespace_of(mode: str, team: str) -> str:
    return f"forge-day-{'borrow' if mode == 'borrowing' else 'solo'}-{team}"


def pool_objects(mode: str, teams: Sequence[core.Team]) -> tuple[Pools, list[dict[str, Any]]]:
    """The teams' namespaces and pod labels, and every queue object Forge renders for their pools
    (the one flavor they share once; each team's LocalQueue, ClusterQueue, WorkloadPriorityClasses)."""
    pools, objects = Pools(), []
    for team in teams:
        ns = namespace_of(mode, team.name)
        compute, env, specs = pool_specs(team, ns, mode == "borrowing")
        pools.namespaces[team.name] = ns
        objects += render_queues(specs, env, ns, None, set(core.PRIORITY_CLASS.values()))
        pools.labels[team.name] = {p: queue_labels(compute, env, ns, pc) for p, pc in core.PRIORITY_CLASS.items()}
    # LocalQueues of the same name live in different namespaces: the key has the namespace
    unique = list({(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects}.values())
    pools.cluster_objects = [o for o in unique if o["kind"] in CLUSTER_PLURALS]
    return pools, unique


def deploy_pools(node: Any, api: client.ApiClient, mode: str, teams: Sequence[core.Team], pools: Pools) -> None:
    """Create the teams' namespaces (managed by Kueue) and apply their rendered queues, recording
    each in ``pools`` as it is made (so a failure half-way is cleaned up too)."""
    rendered, objects = pool_objects(mode, teams)
    core_api = client.CoreV1Api(api)
    for team, ns in rendered.namespaces.items():
        core_api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels=kueue.MANAGED_NAMESPACES)))
        pools.namespaces[team] = ns
    pools.labels, pools.cluster_objects = rendered.labels, rendered.cluster_objects
    apply_docs(node, objects)
    _wait_queues_active(api, [o["metadata"]["name"] for o in objects if o["kind"] == "ClusterQueue"])


def _wait_queues_active(api: client.ApiClient, names: list[str], timeout: float = 60) -> None:
    """Until Kueue reports each ClusterQueue Active (it admits nothing before)."""
    custom = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            cq = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", name)
            if _conditions(cq).get("Active", {}).get("status") == "True":
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"ClusterQueue {name} not Active after {timeout:.0f} s: {cq.get('status')}")
            time.sleep(0.5)


def remove_pools(api: client.ApiClient, pools: Pools, timeout: float = 180) -> None:
    """Delete the namespaces (their pods, Workloads, LocalQueues) and wait until they are gone, then
    the ClusterQueues, WorkloadPriorityClasses and the flavor."""
    core_api = client.CoreV1Api(api)
    for ns in pools.namespaces.values():
        with contextlib.suppress(ApiException):
            core_api.delete_namespace(ns, grace_period_seconds=1)
    deadline = time.monotonic() + timeout
    for ns in pools.namespaces.values():
        while time.monotonic() < deadline:
            try:
                core_api.read_namespace(ns)
            except ApiException as e:
                if e.status == 404:
                    break
                raise
            time.sleep(1)
    custom = client.CustomObjectsApi(api)
    for obj in pools.cluster_objects:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, CLUSTER_PLURALS[obj["kind"]], obj["metadata"]["name"])


# -- submitting and observing ------------------------------------------------------------------------


def job_pod(name: str, labels: dict[str, str], image: str, gpus: int, seconds: int) -> client.V1Pod:
    """A training job's pod: Forge's queue labels, ``gpus`` fake GPUs, ``sleep seconds``."""
    requests = {**REQUESTS, GPU: str(gpus)}
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            restart_policy="Never", termination_grace_period_seconds=1,
            containers=[client.V1Container(name="train", image=image, image_pull_policy="Never",
                                           command=["sleep", str(seconds)],
                                           resources=client.V1ResourceRequirements(requests=requests, limits=requests))]))


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def _true(conds: dict[str, dict[str, Any]], kind: str) -> bool:
    return conds.get(kind, {}).get("status") == "True"


@dataclass
class Snapshot:
    """One poll: the run's pods and the Workloads of its namespaces, by pod name."""

    pods: dict[str, dict[str, Any]]
    workloads: dict[str, dict[str, Any]]


def observe(api: client.ApiClient, run: str, namespaces: set[str]) -> Snapshot:
    """The run's pods (by label) and the Workloads owned by pods in ``namespaces`` (raw JSON: fast)."""
    raw = client.CoreV1Api(api).list_pod_for_all_namespaces(label_selector=f"{RUN_LABEL}={run}", _preload_content=False)
    pods = {p["metadata"]["name"]: p for p in json.loads(raw.data)["items"]}
    workloads = {}
    for w in client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, "workloads")["items"]:
        if w["metadata"]["namespace"] not in namespaces:
            continue
        for owner in w["metadata"].get("ownerReferences") or []:
            if owner["kind"] == "Pod":
                workloads[owner["name"]] = w
    return Snapshot(pods, workloads)


def update_attempt(attempt: core.Attempt, snap: Snapshot, now_h: float) -> bool:
    """Advance ``attempt`` by what ``snap`` shows at ``now_h``; True when it has just ended."""
    if attempt.ended_h is not None:
        return False
    pod, wl = snap.pods.get(attempt.pod), snap.workloads.get(attempt.pod)
    wconds = _conditions(wl) if wl else {}
    for kind in ("Preempted", "Evicted"):
        if _true(wconds, kind):
            attempt.reason = attempt.reason or f"{kind}:{wconds[kind].get('reason')}"
    if attempt.admitted_h is None and (_true(wconds, "QuotaReserved") or _true(wconds, "Admitted")):
        attempt.admitted_h = now_h
    if pod is None:  # gone: only Kueue deletes our pods while the replay runs
        return _end(attempt, now_h, core.PREEMPTED, attempt.reason or "deleted")
    pconds = _conditions(pod)
    phase = (pod.get("status") or {}).get("phase")
    stopped = _true(pconds, "TerminationTarget") or pod["metadata"].get("deletionTimestamp")
    if phase == "Running" and attempt.running_h is None and not stopped:
        attempt.running_h = now_h
        attempt.admitted_h = attempt.admitted_h if attempt.admitted_h is not None else now_h
    if stopped:
        why = attempt.reason or f"TerminationTarget:{pconds.get('TerminationTarget', {}).get('reason', 'deleted')}"
        return _end(attempt, now_h, core.PREEMPTED, why)
    if phase == "Succeeded":
        if attempt.running_h is None:  # ran between two polls
            attempt.running_h = max(attempt.admitted_h or attempt.submitted_h, now_h)
        return _end(attempt, now_h, core.SUCCEEDED, None)
    if phase == "Failed":
        return _end(attempt, now_h, core.PREEMPTED if attempt.reason else core.FAILED, attempt.reason)
    return False


def _end(attempt: core.Attempt, now_h: float, outcome: str, reason: str | None) -> bool:
    attempt.ended_h, attempt.outcome, attempt.reason = now_h, outcome, reason
    return True


def retrying(call: Callable[[], Any], what: str, tries: int = 5) -> Any:
    """``call()``, again after a second when the API server (or Kueue's webhook behind it) answers
    5xx or the connection fails; the last error otherwise. A 409 after a retry is the earlier try's
    create having landed: done."""
    for attempt in range(tries):
        try:
            return call()
        except (ApiException, OSError, urllib3.exceptions.HTTPError) as e:
            status = getattr(e, "status", None)
            if status == 409 and attempt > 0:
                return None
            if (status is not None and status < 500) or attempt == tries - 1:
                raise
            log(f"{what}: {type(e).__name__} {status or ''}, retrying")
            time.sleep(1)
    return None


# -- one replay ----------------------------------------------------------------------------------------


@dataclass
class Settings:
    """How a replay runs: real seconds per simulated hour, the day, the poll interval, the image."""

    hour_s: float
    day_h: float
    poll_s: float
    image: str
    max_h: float  # stop observing after this many simulated hours (unfinished jobs counted)
    gpus: int = core.NODE_GPUS


class Replay:
    """One replay of the trace in ``mode``: submit each job at its time, resubmit what Kueue
    preempts, observe until every job succeeded or failed (or ``max_h``)."""

    def __init__(self, api: client.ApiClient, pools: Pools, trace: Sequence[core.Job], mode: str, s: Settings) -> None:
        self.api, self.pools, self.mode, self.s = api, pools, mode, s
        self.core = client.CoreV1Api(api)
        self.run = f"{mode}-{int(time.time())}"
        self.records = {j.id: core.JobRecord(j) for j in trace}
        self.queue = sorted(trace, key=lambda j: j.submit_h)
        self.live: dict[str, core.JobRecord] = {}  # pod → its job, while the pod has not ended
        self.t0 = 0.0

    def now_h(self) -> float:
        return (time.monotonic() - self.t0) / self.s.hour_s

    def submit(self, record: core.JobRecord, hours: float) -> None:
        """Create the job's next attempt, asking ``hours`` of work."""
        job, n = record.job, len(record.attempts)
        name = f"{job.id}-{n}"
        seconds = max(1, round(hours * self.s.hour_s))
        labels = {**self.pools.labels[job.team][job.priority], RUN_LABEL: self.run, JOB_LABEL: job.id}
        submitted = self.now_h()
        pod = job_pod(name, labels, self.s.image, job.gpus, seconds)
        retrying(lambda: self.core.create_namespaced_pod(self.pools.namespaces[job.team], pod), f"creating pod {name}")
        record.attempts.append(core.Attempt(name, round(submitted, 4), seconds, work_h=seconds / self.s.hour_s))
        self.live[name] = record

    def step(self) -> None:
        """Submit what is due, observe, resubmit what was preempted."""
        while self.queue and self.queue[0].submit_h <= self.now_h():
            job = self.queue.pop(0)
            self.submit(self.records[job.id], job.hours)
        try:
            snap = observe(self.api, self.run, set(self.pools.namespaces.values()))
        except (ApiException, OSError, urllib3.exceptions.HTTPError) as e:  # a loaded API server: the next poll
            log(f"[{self.mode}] poll failed ({type(e).__name__}: {str(e)[:200]}); polling again")
            return
        now = self.now_h()
        for pod, record in list(self.live.items()):
            attempt = record.attempts[-1]
            if update_attempt(attempt, snap, now):
                del self.live[pod]
                if attempt.outcome == core.PREEMPTED:
                    self.submit(record, record.remaining_h())

    def progress(self) -> str:
        running = [r for r in self.live.values() if r.attempts[-1].running_h is not None]
        waiting = [r for r in self.live.values() if r.attempts[-1].admitted_h is None]
        done = sum(r.outcome == core.SUCCEEDED for r in self.records.values())
        stopped = sum(a.outcome == core.PREEMPTED for r in self.records.values() for a in r.attempts)
        return (f"[{self.mode}] {self.now_h():5.1f} h of {self.s.day_h:g} h: submitted "
                f"{len(self.records) - len(self.queue)}/{len(self.records)}, waiting {len(waiting)}, running "
                f"{len(running)} ({sum(r.job.gpus for r in running)} GPUs), done {done}, preempted {stopped}")

    def finished(self) -> bool:
        return not self.queue and not self.live

    def play(self, every_s: float = 15.0) -> tuple[list[core.JobRecord], float]:
        """Run the replay; returns the records and when observation stopped (hours)."""
        self.t0 = time.monotonic()
        shown = self.t0
        while not self.finished() and self.now_h() < self.s.max_h:
            self.step()
            if time.monotonic() - shown >= every_s:
                log(self.progress())
                shown = time.monotonic()
            due = (self.queue[0].submit_h - self.now_h()) * self.s.hour_s if self.queue else self.s.poll_s
            time.sleep(max(0.0, min(self.s.poll_s, due)))
        end = self.now_h()
        log(self.progress() + (" — all jobs ended" if self.finished() else f" — stopped at {self.s.max_h:g} h"))
        return list(self.records.values()), end


def replay(node: Any, trace: Sequence[core.Job], mode: str, s: Settings,
           teams: Sequence[core.Team]) -> tuple[dict[str, Any], list[core.JobRecord]]:
    """Deploy the pools for ``mode``, play the trace, remove the pools; the summary and the records."""
    api = node.api()
    try:
        log(f"[{mode}] deploying the pools ({', '.join(f'{t.name}: {t.quota} GPUs' for t in teams)}"
            f"{', one cohort' if mode == 'borrowing' else ', no cohort'})")
        pools = Pools()
        try:
            deploy_pools(node, api, mode, teams, pools)
            t0 = time.monotonic()
            records, end_h = Replay(api, pools, trace, mode, s).play()
            wall = time.monotonic() - t0
        finally:
            remove_pools(api, pools)
    finally:
        api.close()
    summary = core.summarise(records, gpus=s.gpus, day_h=s.day_h, end_h=end_h)
    summary["wall_s"] = round(wall, 1)
    start = summary["admitted_to_running_p50_h"]
    summary["admitted_to_running_p50_s"] = None if start is None else round(start * s.hour_s, 2)
    return summary, records


# -- the bench -----------------------------------------------------------------------------------------


def _load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def result_of(args: argparse.Namespace, trace: Sequence[core.Job], summaries: dict[str, dict[str, Any]],
              wall_s: float, load: Sequence[float]) -> dict[str, Any]:
    """The JSON summary: parameters, the trace's demand, each replay, borrowing / baseline."""
    return {
        "bench": "queue-day", "date": datetime.date.today().isoformat(), "seed": args.seed, "hour_s": args.hour_s,
        "day_h": args.day_hours, "node_gpus": core.NODE_GPUS, "poll_s": args.poll_s,
        "teams": [{"name": t.name, "quota": t.quota, "busy_h": [round(x * args.day_hours, 2) for x in t.busy]}
                  for t in core.TEAMS],
        "trace": core.trace_summary(trace, core.NODE_GPUS, args.day_hours),
        "preempted_jobs": "resubmitted at once with the duration left (Argo's retry; the train step resumes from its checkpoint)",
        "wait": "submit → the job's first attempt admitted (its Workload QuotaReserved/Admitted first seen)",
        "anchor_idle_fraction": 0.35, "baseline": MODES[0], **summaries,
        "ratios_vs_baseline": core.compare(summaries[MODES[0]], summaries[MODES[1]]),
        "wall_s": round(wall_s, 1), "load_average_start": list(load), "load_average_end": _load_average(),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="the trace's seed (default 1)")
    parser.add_argument("--hour-s", type=float, default=10.0,
                        help="real seconds per simulated hour (default 10: a pod's ~5 s start on the node is half an hour)")
    parser.add_argument("--day-hours", type=float, default=24.0, help="the simulated day's length in hours (default 24)")
    parser.add_argument("--max-hours", type=float, default=None,
                        help="stop a replay after this many simulated hours (default 2 × the day)")
    parser.add_argument("--poll-s", type=float, default=0.5, help="seconds between polls of the API server (default 0.5)")
    parser.add_argument("--smoke", action="store_true", help="a short trace: a 6-hour day at 6 s an hour")
    parser.add_argument("--kubeconfig", help="use this running cluster (a node Kueue manages) instead of starting one")
    parser.add_argument("--image", help="with --kubeconfig: the busybox image on the node (default: found on the node)")
    parser.add_argument("--only", choices=MODES, help="run one replay only (no ratios)")
    parser.add_argument("--trace-only", action="store_true", help="print the trace and what it asks for; no cluster")
    parser.add_argument("--out", help="write the summary and every job's attempts here (JSON)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.day_hours, args.hour_s = 6.0, 6.0
    args.max_hours = args.max_hours or 2 * args.day_hours
    if not (0.5 <= args.hour_s <= 600 and 1 <= args.day_hours <= 168 and 0.1 <= args.poll_s <= 10):
        parser.error("--hour-s 0.5..600, --day-hours 1..168, --poll-s 0.1..10")
    return args


def _print_trace(trace: Sequence[core.Job], day_h: float) -> None:
    for j in trace:
        print(f"{j.submit_h:6.2f} h  {j.id}  {j.gpus} GPU  {j.hours:.1f} h  {j.priority}")
    print(json.dumps(core.trace_summary(trace, core.NODE_GPUS, day_h)))


def run(args: argparse.Namespace, trace: Sequence[core.Job],
        cluster: Callable[[], contextlib.AbstractContextManager[Any]]) -> tuple[dict[str, Any], dict[str, list[core.JobRecord]]]:
    """Both replays (or ``--only`` one) on the cluster ``cluster()`` gives."""
    summaries: dict[str, dict[str, Any]] = {}
    records: dict[str, list[core.JobRecord]] = {}
    with cluster() as node:
        advertise_gpus(node, core.NODE_GPUS)
        s = Settings(args.hour_s, args.day_hours, args.poll_s, node.images["busybox"][1], args.max_hours)
        for mode in [args.only] if args.only else MODES:
            summaries[mode], records[mode] = replay(node, trace, mode, s, core.TEAMS)
    return summaries, records


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    trace = core.make_trace(args.seed, core.TEAMS, args.day_hours)
    if args.trace_only:
        _print_trace(trace, args.day_hours)
        return
    demand = core.trace_summary(trace, core.NODE_GPUS, args.day_hours)
    log(f"trace (seed {args.seed}): {demand['jobs']} jobs ({demand['high']} high), {demand['gpu_hours_demanded']} "
        f"GPU-hours asked of {core.NODE_GPUS * args.day_hours:g}; 1 h = {args.hour_s:g} s, so one replay ≈ "
        f"{args.day_hours * args.hour_s / 60:.1f} min + the spill-over")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the clean-up (`finally`) runs
    load, t0 = _load_average(), time.monotonic()
    cluster = (lambda: contextlib.nullcontext(external_node(args.kubeconfig, args.image))) if args.kubeconfig else own_cluster
    summaries, records = run(args, trace, cluster)
    if args.only:
        result = {"bench": "queue-day", "seed": args.seed, "hour_s": args.hour_s, "day_h": args.day_hours, **summaries}
    else:
        result = result_of(args, trace, summaries, time.monotonic() - t0, load)
        print(core.table(summaries[MODES[0]], summaries[MODES[1]], result["ratios_vs_baseline"]))
    if args.out:
        detail = {**result, "jobs": {mode: [r.to_json() for r in recs] for mode, recs in records.items()}}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(detail, indent=2) + "\n")
        log(f"wrote {args.out}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
