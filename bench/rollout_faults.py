#!/usr/bin/env python3
"""Rollout fault drills (issue 19, the rollout half of "Faults"), each repeated, against the real
components of tests/rollout/test_rollout_controller.py (whose harness is
``devkit.rollout_harness``): a kube-apiserver + etcd (``devkit.cluster``), a Prometheus scraping
every 1 s (``devkit.prometheus``), two real ``python -m runtimes serve`` processes (stable and
canary) and a traffic generator that splits ~``--rate`` req/s between them by the live
SeldonDeployment's weights (what the mesh does in a cluster), logging each request's time, role
and outcome. Each server has a Pod in the API server whose Ready condition follows it
(``devkit.pods``: the kubelet's part, as no node runs here), which the controller reads before a
weight rises. The controller is the real ``forgectl reconcile --watch --interval 0.5`` as a
subprocess.

    .venv/bin/python bench/rollout_faults.py [--drills kill,prometheus,canary,etcd,etcd-nospace,hung,baddata,skew,two,late,two-watchers,stale-write]
        [--kill-runs 10] [--prometheus-runs 3] [--canary-runs 5] [--outage 20] [--runs N]
        [--out bench/results/rollout-faults-DATE.json]

Policy: the quick-start's ``three-step-canary`` (10 → 50 → 100 %, success-rate ≥ 0.99 and p99
latency, interval 2s, window 10s, count 3, failureLimit 1, success-rate inconclusiveLimit 15,
``onPrometheusUnreachable: hold``) with the test harness's changes (pauses 2 s, p99 bound 2 s:
a loaded 2-core machine pushes a healthy canary's p99 past 200 ms).

Drills (one rollout = a new model version: learning rate changed, applied, its Workflow marked
Succeeded; rollouts follow one another in one namespace, the servers keep their roles):

* ``kill``: the controller SIGKILLed once in every step of a rollout (at a uniform time in the
  step's first 14 s: its 10 s window, then 3 measurements 2 s apart), restarted at once; a run is one kill. Fails when the controller re-enters a
  step it had entered (or goes back to an earlier one), when the rollout does not reach Promoted,
  or when a request to stable fails. Printed per step: stable's share of the answered requests vs
  its weight (100 − canary weight).
* ``prometheus``: Prometheus stopped (by PID; same port and data) ``--outage`` seconds (default 20,
  longer than the analysis window of 10 s and than a step's analysis, 3 × 2 s) as the first step's
  analysis starts. Fails on a promotion, a rollback or a weight change while it is down, or when
  the rollout does not leave Holding at the same step once it is back, or does not then promote.
* ``canary``: the canary's serving process SIGKILLed (its process group) 1–3 s into the second
  step's analysis (50 %: after its first measurement, once the window lies in the step). Fails
  unless the rollout rolls back within the policy's bound: interval × (failureLimit + 1) + slack,
  see ``bound_s``; fails when the canary's live weight rises after the kill (issue 35: a dead
  canary was moved to 100 % before the rollback), and when a request to stable fails. Counted per
  run: the requests sent to the canary after the kill and how many of them failed, and the
  weights it had after the kill. The canary server is started again for the next run.

* ``etcd`` (issue 35): etcd SIGKILLed once step 1 is entered and left down ``--etcd-outage``
  seconds (default 15; the API server stays up, answering 5xx). Fails on a transition dated inside
  the outage, a step entered twice, no promotion, or a stable request lost; counted: how the watch
  said it (failed passes, or a write not sent once its Lease's fencing deadline passed) and the
  time from etcd's return to the next transition.
* ``etcd-nospace`` (issue 35): the same with etcd up and out of space — its NOSPACE alarm raised
  for ``--etcd-outage`` seconds (every write refused, reads served), then disarmed.
* ``hung`` (issue 35): Prometheus SIGSTOPped ``--hang`` seconds (default 30) once step 1 has counted a
  measurement — its port still accepts connections, nothing answers: each query times out after
  the Environment's `prometheus.timeout` (the product's default, 5 s). Fails on a promotion, a
  rollback or a weight change while it hangs, when the rollout is not Holding on `unreachable` by
  the end of it, or when it is not promoted after SIGCONT.
* ``baddata`` (issue 35): the controller's Prometheus is :mod:`devkit.prometheus_faults` in front of
  the real one; once step 1 has counted a measurement it answers the analysis queries with NaN,
  an empty vector, HTTP 503, then every query frozen at one moment, each until both metrics were
  measured under it, then +Inf. Fails when any of them is judged a pass or the weight rises, and
  unless the +Inf ends in a rollback (latency's `max` refuses it; success-rate's `min` cannot
  judge it: `not-finite`).
* ``skew`` (issue 35): the controller (the CLI, under Debian's libfaketime, ``--skew`` seconds
  ahead, default 5) against Prometheus's clock. Fails unless every measurement is `clock-skew`
  (inconclusive, the skew named), the weight holds at step 1 and the rollout ends rolled back on
  `inconclusiveLimit` naming the skew — never promoted.
* ``two`` (issue 35): two `forgectl reconcile --watch` on the same environment and endpoints for
  a whole rollout. Counted: the rollout-state writes (the SeldonDeployment's resourceVersion
  changes the mesh follower saw), and the state transitions each controller printed; "exactly one
  acts" holds when only one of them printed a transition (the other says it follows: the watch
  holds the environment's Lease). A failure when both acted: a count that went back, measurements
  closer than the metric's interval, a step entered twice, or transitions printed by both.

* ``two-watchers`` (issue 35): two watches on one rollout (Lease 6 s), hand-overs forced: the
  leader SIGSTOPped past its Lease (the other must take it over and enter a step), SIGCONTed (it must say
  it lost the lock and write nothing), the new leader SIGKILLed (the first must take over and
  promote). Who moved what comes from the API server: each step's Event names its writer
  (reportingInstance, the Lease's holder) and carries the writer's clock. Fails on an Event by the
  first while paused or deposed, by the second outside its tenure, a step entered twice, no promotion.
* ``stale-write`` (issue 35): a leader paused between a write's Lease check and its send, past its
  Lease (Lease 3 s). Two controllers in this process (each its own target and Lease, as two
  `reconcile --watch`); the first's next rollout write once step 1 has counted a measurement is
  held right before its send (``KubernetesTarget.pause_before_send``; its Lease renewer held too,
  as SIGSTOP would), the second takes the Lease over, stamps its tenure and writes, then the first
  is resumed and its write goes out with the resourceVersion it read. Fails unless the API server
  refuses it (409, in the first's own log line), the first sends no other write after (its
  requests after the resume are recorded before each send) and follows, the second's fencing
  token is on the SeldonDeployment, no Event of the first's is dated after the hold, and the
  second promotes with 0 stable requests lost. The held write is whichever rollout write came
  next (a measurement's state, or a traffic move); tests/rollout/test_fenced_writes.py holds
  each kind in turn.
* ``late`` (issue 35): a canary that degrades late — its server healthy for its first
  ``--late-after`` requests (`faultInjection.afterRequests`, default 150: through step 1 at 10 %),
  then failing ``--late-error-rate`` of them (default 5 %). Fails unless it is rolled back from
  the step where its first request failed, with its weight never raised after that failure.

Every request of the traffic is counted per role and window (sent, answered, failed by reason,
skipped ticks: ``devkit.rollout``'s ``Tally``); a failure to stable is a lost request.

Last line: one JSON object, ``{"drills": {name: {"runs", "failures", "max_converge_s",
"stable_lost", ...}}, ...}`` (goal: 0 failures, 0 stable requests lost in every row); the same object is written to
``--out`` (default ``bench/results/rollout-faults-<date>.json``).

Starts everything it uses and stops it by PID in ``finally`` blocks; traffic to 127.0.0.1 only;
every wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import git  # noqa: E402

from bench.rollback_latency import create_namespace, drain, runtime_python, train_digits  # noqa: E402
from devkit.cluster import Cluster  # noqa: E402
from devkit.namespaces import delete_namespace  # noqa: E402
from devkit.pods import ServerPod  # noqa: E402
from devkit.prometheus import Prometheus  # noqa: E402
from devkit.prometheus_faults import BadDataPrometheus, Fault  # noqa: E402
from devkit.rollout import PacedTraffic  # noqa: E402
from devkit.rollout_harness import Rollout  # noqa: E402
from devkit.runtime_steps import Runner, Server  # noqa: E402
from reconciler.rollout.controller import Phase, RolloutState, policy_steps  # noqa: E402
from reconciler.targets.kubernetes.rollout import rollout_state_of  # noqa: E402
from reconciler.traffic.serving import serving_states  # noqa: E402
from specs import duration_seconds  # noqa: E402

STEPS = (10, 50, 100)


def log(msg: str) -> None:
    print(f"[rollout_faults {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if old not in text:
        raise SystemExit(f"{path.name}: {old!r} not found (examples/quickstart changed?)")
    path.write_text(text.replace(old, new))


@dataclass
class Live:
    """The mesh: follows the live SeldonDeployment every 0.1 s (weights → traffic) and records the
    rollout state annotation's changes and every weight it saw, with their times."""

    cluster: Cluster
    namespace: str
    traffic: PacedTraffic
    state: RolloutState | None = None
    weights: list[tuple[float, str | None, int]] = field(default_factory=list)  # (t, canary, weight) on change
    states: list[tuple[float, RolloutState]] = field(default_factory=list)  # on change
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        raw = self.cluster.raw_client()
        path = f"/apis/machinelearning.seldon.io/v1/namespaces/{self.namespace}/seldondeployments"
        while not self.stop.is_set():
            try:
                status, doc = raw.request("GET", path, timeout=5)
            except OSError:
                status, doc = 0, {}
            now = time.monotonic()
            if status == 200 and doc.get("items"):
                obj = doc["items"][0]
                serving = serving_states([obj]).get("digits")
                weight = serving.canary_weight if serving and serving.canary else 0
                self.traffic.weight = weight
                key = (serving.canary if serving else None, weight)
                if not self.weights or self.weights[-1][1:] != key:
                    self.weights.append((now, *key))
                state = rollout_state_of(obj)
                if state is not None and (self.state is None or state.to_json() != self.state.to_json()):
                    self.state = state
                    self.states.append((now, state))
            self.stop.wait(0.1)

    def wait(self, pred: Any, timeout: float, what: str) -> RolloutState:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.state
            if s is not None and pred(s):
                return s
            time.sleep(0.05)
        raise TimeoutError(f"{what}: not within {timeout:.0f} s; last state {self.state.phase.value if self.state else None}: "
                           f"{self.state.reason if self.state else ''}")


class ControllerProc:
    """`forgectl reconcile --watch --interval 0.5` as a subprocess, killed by its PID."""

    def __init__(self, r: Rollout, workdir: Path, name: str = "controller", prefix: list[str] | None = None,
                 lease: float | None = None) -> None:
        self.name = name
        self.cmd = [*(prefix or []), sys.executable, "-m", "forgectl", "reconcile", str(r.specs_dir), "--env", "cluster", "-n", r.namespace,
                    "--kubeconfig", r.kubeconfig, "--watch", "--interval", "0.5",
                    *(["--lease-duration", f"{lease:g}"] if lease else [])]
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        out = open(self.workdir / f"{self.name}-{self.starts}.log", "wb")
        # A session of its own, killed as a group: under a wrapper (faketime) the controller is a
        # child, which a SIGKILL of the wrapper alone would leave running.
        self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "NO_COLOR": "1"},
                                     start_new_session=True)
        out.close()

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = (self.workdir / f"{self.name}-{self.starts}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"forgectl reconcile exited {self.proc.returncode} by itself:\n{tail}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the controller's process group (SIGSTOP, SIGCONT)."""
        assert self.proc is not None and self.proc.poll() is None, f"{self.name} is not running"
        os.killpg(self.proc.pid, sig)

    def log_text(self) -> str:
        return (self.workdir / f"{self.name}-{self.starts}.log").read_text(errors="replace")

    def holds(self, holder: str | None) -> bool:
        """Whether a Lease holder (or an Event's reportingInstance) names this controller's process."""
        return self.proc is not None and holder is not None and holder.endswith(f":{self.proc.pid} (reconcile --watch)")


class Harness:
    """One namespace with the quick-start applied at version 1 (stable, Workflow done), the servers,
    Prometheus's targets, the traffic and the mesh follower; :meth:`new_version` makes the next canary."""

    def __init__(self, cluster: Cluster, prom: Prometheus, runner: Runner, args: argparse.Namespace, work: Path) -> None:
        self.cluster, self.prom, self.runner, self.args, self.work = cluster, prom, runner, args, work
        self.namespace = create_namespace(cluster)
        self.lr = 2
        specs_dir = work / "repo" / "specs"
        import shutil

        shutil.copytree(ROOT / "examples" / "quickstart", specs_dir)
        # The controllers ask the bad-data server, which passes every query through to the real
        # Prometheus until the baddata drill sets a fault.
        self.bad = BadDataPrometheus(prom.url)
        _replace(specs_dir / "environments.yaml", "url: http://prometheus-operated.monitoring.svc:9090", f"url: {self.bad.url}")
        _replace(specs_dir / "rollout.yaml", "pause: 5s", "pause: 2s")
        _replace(specs_dir / "rollout.yaml", "max: 0.2", "max: 2.0")
        self.repo = git.Repo.init(specs_dir.parent)
        self.repo.config_writer().set_value("user", "name", "bench").set_value("user", "email", "bench@example.com").release()
        self.repo.index.add(["specs"])
        self.repo.index.commit("version 1")
        self.r = Rollout(specs_dir, self.namespace, cluster.kubeconfig, prom, runner)
        self.r.apply()
        *_, self.r.stable = self.r.controller()
        self.r.finish_workflow(self.r.stable)
        _, _, _, self.policy, _ = self.r.controller()
        self.servers: dict[str, Server] = {}
        #: role → the pod standing for its server, labelled with the version it serves now
        self.pods: dict[str, ServerPod] = {}
        for role in ("stable", "canary"):
            self.start_server(role)
        self.publish("stable", self.r.stable)
        self.traffic = PacedTraffic(self.servers["stable"].url, self.servers["canary"].url)
        self.live = Live(cluster, self.namespace, self.traffic)
        self.threads = [threading.Thread(target=self.traffic.run, args=(args.rate,), daemon=True),
                        threading.Thread(target=self.live.run, daemon=True)]
        for t in self.threads:
            t.start()

    def start_server(self, role: str, faults: dict[str, Any] | None = None) -> None:
        """Start (or start again, on the same port: the traffic and Prometheus keep its URL) ``role``'s
        server, with ``faults`` (an Endpoint's `faultInjection`) when given."""
        old = self.servers.get(role)
        if old is not None:
            old.stop()
        config: dict[str, Any] = {"endpoint": "digits", "namespace": self.namespace, "model": "digits-mlp",
                                  "version": self.r.stable, "variant": "base", "role": role, "modelDir": "models/base",
                                  "host": "127.0.0.1", "port": int(old.url.rsplit(":", 1)[1]) if old is not None else 0,
                                  "batching": {"enabled": True, "maxBatchSize": 8, "maxLatencyMs": 2}}
        if faults:
            config["faultInjection"] = faults
        s = Server(self.runner, "serve", config)
        s.__enter__()
        drain(s)
        self.servers[role] = s
        self.prom.set_targets([self.servers[k].url.removeprefix("http://") for k in self.servers])
        if role in self.pods:
            self.publish(role, self.pods[role].labels["forge.dev/model-version"])

    def publish(self, role: str, version: str) -> None:
        """(Re)create ``role``'s pod for ``version`` — a new version is new pods in a cluster —
        its Ready condition following the role's server."""
        old = self.pods.pop(role, None)
        if old is not None:
            old.stop()
        server = self.servers[role]
        self.pods[role] = ServerPod(self.cluster.kubeconfig, self.namespace, endpoint="digits", role=role, version=version,
                                    url=server.url, alive=lambda: server.proc.poll() is None).start()

    def new_version(self) -> str:
        """Change the learning rate, apply: the new version is the canary at 0 %, its Workflow done."""
        old = f"learningRate: 0.00{self.lr}"
        self.lr += 1
        _replace(self.r.specs_dir / "model.yaml", old, f"learningRate: 0.00{self.lr}")
        self.repo.index.add(["specs/model.yaml"])
        self.repo.index.commit(f"learning rate 0.00{self.lr}")
        self.r.apply()
        *_, canary = self.r.controller()
        self.publish("canary", canary)
        self.r.finish_workflow(canary)
        self.r.canary = canary
        return canary

    def close(self) -> None:
        self.traffic.stop.set()
        self.live.stop.set()
        for t in self.threads:
            t.join(timeout=10)
        for pod in self.pods.values():
            pod.stop()
        for s in self.servers.values():
            s.stop()
        self.bad.close()
        try:
            self.prom.set_targets([])
        except OSError:
            pass
        try:
            delete_namespace(self.cluster, self.namespace)
        except Exception as exc:  # noqa: BLE001 — clean-up must not hide the run's own error
            log(f"could not delete namespace {self.namespace}: {exc}")


def promoted_once(final: RolloutState | None, canary: str, counts: dict[str, Any], problems: list[str]) -> list[int]:
    """The end every leader drill wants (two watchers, a stale write): each step entered once, in
    order, the canary promoted, no request to stable failed; what is not so goes to ``problems``.
    Returns the steps entered."""
    steps = entered_steps(final, canary) if final else []
    if steps != sorted(set(steps)):
        problems.append(f"a step entered twice: {steps}")
    if final is None or final.phase is not Phase.PROMOTED:
        problems.append(f"not promoted: {final.phase.value if final else None}: {final.reason if final else ''}")
    if counts["stable"]["failed"]:
        problems.append(f"{counts['stable']['failed']} requests to stable failed: {counts['stable']['reasons']}")
    return steps


def entered_steps(state: RolloutState, canary: str) -> list[int]:
    """The steps (1-based) the rollout of ``canary`` entered, in order, from its history."""
    out = []
    for h in state.history:
        if h["to"] == "Progressing" and f"canary {canary} at" in h["reason"]:
            out.append(int(h["reason"].split("step ")[-1].split("/")[0]))
    return out


def ended(canary: str) -> Any:
    """The rollout of ``canary`` promoted or rolled back."""
    return lambda s: s.canary == canary and s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK)


def wait_for_the_end(h: Harness, canary: str, timeout: float, problems: list[str],
                     *controllers: ControllerProc) -> tuple[RolloutState | None, float]:
    """Wait up to ``timeout`` s for the rollout of ``canary`` to end; then kill ``controllers``,
    whatever happened. A timeout is one of the run's ``problems`` (the last state seen stands for
    the end). Returns the final state and the monotonic time once the controllers are dead."""
    try:
        final: RolloutState | None = h.live.wait(ended(canary), timeout, "the end of the rollout")
    except TimeoutError as exc:
        problems.append(str(exc))
        final = h.live.state
    finally:
        for c in controllers:
            c.kill()
    return final, time.monotonic()


def stable_shares(h: Harness, since: float, until: float) -> list[dict[str, Any]]:
    """Per interval of constant live weight in [since, until): stable's share of the answered
    requests vs its weight, and requests to stable that failed. The first 0.5 s after a change
    (requests in flight when the weight moved) and intervals under 1 s are left out of the share
    — said so in each entry (``excluded_s``, ``excluded``) —, never out of the lost requests, which
    the drills count over the whole span (:meth:`Traffic.tally`)."""
    changes = [(t, w) for t, _, w in h.live.weights if t < until]
    out: list[dict[str, Any]] = []
    for i, (t, w) in enumerate(changes):
        end = changes[i + 1][0] if i + 1 < len(changes) else until
        lo, hi = max(t, since) + 0.5, end  # 0.5 s: requests in flight when the weight changed
        if end <= since:
            continue  # before the span
        if hi - lo < 1:
            out.append({"canary_weight": w, "seconds": round(max(0.0, end - max(t, since)), 2), "excluded": "shorter than 1.5 s",
                        "sent": h.traffic.count("stable", since=max(t, since), until=end)
                        + h.traffic.count("canary", since=max(t, since), until=end),
                        "stable_failed": h.traffic.count("stable", ok=False, since=max(t, since), until=end)})
            continue
        ok_stable = h.traffic.count("stable", ok=True, since=lo, until=hi)
        ok_all = ok_stable + h.traffic.count("canary", ok=True, since=lo, until=hi)
        p = (100 - w) / 100
        share = ok_stable / ok_all if ok_all else None
        # How many binomial standard deviations the share is below its weight (each request picks
        # its arm at random with the weight): below −3 is a real shortfall, not sampling.
        z = (share - p) / math.sqrt(p * (1 - p) / ok_all) if share is not None and 0 < p < 1 else 0.0
        out.append({"canary_weight": w, "seconds": round(hi - lo, 1), "excluded_s": 0.5, "answered": ok_all,
                    "stable_share": round(share, 3) if share is not None else None, "stable_weight": p, "z": round(z, 2),
                    "stable_failed": h.traffic.count("stable", ok=False, since=lo, until=hi)})
    return out


# -- drill 1: the controller killed mid-step -------------------------------------------------------

def drill_kill(h: Harness, runs: int, ctl: ControllerProc) -> dict[str, Any]:
    rng = random.Random(19)
    results: list[dict[str, Any]] = []
    per_rollout: list[dict[str, Any]] = []
    rollouts = 0
    while len(results) < runs:
        rollouts += 1
        canary = h.new_version()
        t0 = time.monotonic()
        ctl.start()
        problems: list[str] = []
        for step in (1, 2, 3):
            if len(results) >= runs:
                break
            idx = step - 1
            try:
                entered = h.live.wait(lambda s: s.canary == canary and (s.step >= idx or s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK)),  # noqa: B023
                                      90, f"step {step}")
            except TimeoutError as exc:
                problems.append(str(exc))
                break
            if entered.phase is not Phase.PROGRESSING and entered.phase is not Phase.HOLDING or entered.step != idx:
                break  # promoted already (the last step can be quick)
            # Each step: its 10 s window (longer than the 2 s pause), then 3 measurements 2 s apart.
            delay = rng.uniform(0.0, 14.0)
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline:
                ctl.check()
                time.sleep(0.05)
            ctl.kill()
            t_kill = time.monotonic()
            time.sleep(0.3)  # the follower's next look (every 0.1 s): the state the dead controller left
            before = h.live.state
            ctl.start()
            if before is None or before.phase not in (Phase.PROGRESSING, Phase.HOLDING):
                continue  # it had finished the rollout just before the kill: not a kill mid-step
            # Resumed: the saved state changes again (a measurement, the next step, or the promotion).
            try:
                after = h.live.wait(lambda s, b=before: s.to_json() != (b.to_json() if b else None), 60, "resume after the kill")
                resume_s = time.monotonic() - t_kill
            except TimeoutError as exc:
                problems.append(str(exc))
                after, resume_s = None, None
            res: dict[str, Any] = {"rollout": rollouts, "step": step, "killed_after_s": round(delay, 2),
                   "killed_at": {"phase": before.phase.value, "step": before.step + 1} if before else None,
                   "resume_s": round(resume_s, 2) if resume_s is not None else None,
                   "resumed_to": {"phase": after.phase.value, "step": after.step + 1} if after else None}
            if before is not None and after is not None and after.step < before.step:
                problems.append(f"went back from step {before.step + 1} to {after.step + 1}")
            results.append(res)
        final, t_end = wait_for_the_end(h, canary, 120, problems, ctl)
        assert final is not None
        steps = entered_steps(final, canary)
        if final.phase is not Phase.PROMOTED:
            problems.append(f"not promoted: {final.phase.value}: {final.reason}")
        if steps != sorted(set(steps)):
            problems.append(f"steps entered {steps}: a step entered twice or an earlier one re-entered")
        weights = [w for t, c, w in h.live.weights if t0 <= t <= t_end and c == canary]
        if any(b < a for a, b in zip(weights, weights[1:])):
            problems.append(f"the live canary weight went down during the rollout: {weights}")
        shares = stable_shares(h, t0, t_end)
        lost = h.traffic.tally("stable", t0, t_end).failed  # over the whole span: no window left out
        if lost:
            problems.append(f"{lost} requests to stable failed")
        short = [s for s in shares if s.get("z", 0.0) < -3]
        if short:
            problems.append(f"stable's share below its weight by more than 3 standard deviations: {short}")
        per_rollout.append({"rollout": rollouts, "stable_lost": lost, "stable_shares": shares, "steps_entered": steps,
                            "phase": final.phase.value, "rollout_s": round(t_end - t0, 1)})
        for res in results:
            if res["rollout"] == rollouts:
                res.update({"failed": bool(problems), "problems": problems})
        log(f"kill drill, rollout {rollouts}: {final.phase.value}, steps entered {steps}, stable lost {lost}, "
            f"resume {[r['resume_s'] for r in results if r['rollout'] == rollouts]} s{'; ' + '; '.join(problems) if problems else ''}")
    resumes = [r["resume_s"] for r in results if r["resume_s"] is not None]
    return {"runs": len(results), "rollouts": rollouts, "failures": sum(r["failed"] for r in results),
            "max_converge_s": max(resumes) if resumes else None,
            "stable_lost": sum(r["stable_lost"] for r in per_rollout),
            "min_stable_share_z": min((s["z"] for r in per_rollout for s in r["stable_shares"] if "z" in s), default=None),
            "rollouts_detail": per_rollout,
            "samples": results}


# -- drill 2: Prometheus stopped -------------------------------------------------------------------

def _moved_during(h: Harness, ctl: ControllerProc, first: RolloutState, seconds: float, when: str) -> list[str]:
    """Watch the rollout for ``seconds`` while Prometheus cannot answer: it must stay at ``first``'s
    step and weight, neither promoted nor rolled back; the first move seen, in words (or none)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        ctl.check()
        s = h.live.state
        if s is not None and (s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK) or s.weight != first.weight or s.step != 0):
            return [f"{when}: {s.phase.value} step {s.step + 1} at {s.weight} %: {s.reason}"]
        time.sleep(0.1)
    return []


def drill_prometheus(h: Harness, runs: int, ctl: ControllerProc, outage: float) -> dict[str, Any]:
    results = []
    for run in range(1, runs + 1):
        canary = h.new_version()
        t0 = time.monotonic()
        ctl.start()
        problems: list[str] = []
        resumed_s = None
        try:
            first = h.live.wait(lambda s: s.canary == canary and s.phase is Phase.PROGRESSING and s.step == 0, 90, "step 1")  # noqa: B023
            time.sleep(duration_seconds("2s"))  # the step's pause: its analysis starts
            h.prom.pause()
            problems += _moved_during(h, ctl, first, outage, "while Prometheus was down")
            held = h.live.state
            assert held is not None
            if not problems and held.phase is not Phase.HOLDING:
                problems.append(f"not Holding after {outage:.0f} s without Prometheus: {held.phase.value}: {held.reason}")
            h.prom.resume()
            t_up = time.monotonic()
            back = h.live.wait(lambda s: s.phase is not Phase.HOLDING, 60, "leaving Holding after Prometheus is back")
            resumed_s = time.monotonic() - t_up
            if back.phase is not Phase.PROGRESSING or back.step != 0:
                problems.append(f"after Prometheus came back: {back.phase.value} step {back.step + 1}: {back.reason}")
            final = h.live.wait(lambda s: s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK), 120, "the end of the rollout")
            if final.phase is not Phase.PROMOTED:
                problems.append(f"not promoted: {final.phase.value}: {final.reason}")
        except TimeoutError as exc:
            problems.append(str(exc))
            held = h.live.state
        finally:
            h.prom.resume()
            ctl.kill()
        t_end = time.monotonic()
        counts = tallies(h, t0, t_end)
        lost = counts["stable"]["failed"]  # over the whole span: no window left out
        if lost:
            problems.append(f"{lost} requests to stable failed: {counts['stable']['reasons']}")
        run_states = [s for t, s in h.live.states if t0 <= t <= t_end]
        inconclusive = max((s.runs["success-rate"].inconclusive_in_a_row for s in run_states if "success-rate" in s.runs), default=0)
        res = {"run": run, "outage_s": outage, "held_reason": held.reason if held else None,
               "max_inconclusive_in_a_row": inconclusive, "resume_s": round(resumed_s, 2) if resumed_s is not None else None,
               "stable_lost": lost, "requests": counts, "failed": bool(problems), "problems": problems,
               "rollout_s": round(t_end - t0, 1)}
        results.append(res)
        log(f"prometheus drill, run {run}: resumed {res['resume_s']} s after Prometheus was back, "
            f"{inconclusive} inconclusive in a row, stable lost {lost}{'; ' + '; '.join(problems) if problems else ''}")
    resumes = [r["resume_s"] for r in results if r["resume_s"] is not None]
    limit = next(m.inconclusive_limit for m in h.policy.spec.metrics if m.name == "success-rate")
    return {"runs": len(results), "failures": sum(r["failed"] for r in results), "outage_s": outage,
            "max_inconclusive_in_a_row": max(r["max_inconclusive_in_a_row"] for r in results), "inconclusive_limit": limit,
            "max_converge_s": max(resumes) if resumes else None, "stable_lost": sum(r["stable_lost"] for r in results),
            "samples": results}


def _etcd_out_of_space(h: Harness, outage: float) -> None:
    """etcd's NOSPACE alarm for ``outage`` seconds (every write refused, reads served), then
    disarmed as its operator does once space is freed."""
    h.cluster.raise_etcd_nospace()
    try:
        time.sleep(outage)
    finally:
        h.cluster.disarm_etcd_alarms()


def drill_etcd(h: Harness, runs: int, ctl: ControllerProc, outage: float, nospace: bool = False) -> dict[str, Any]:
    """etcd SIGKILLed once step 1 is entered (after its pause) and left down ``outage`` seconds;
    the API server stays up and answers 5xx. With ``nospace`` (the ``etcd-nospace`` drill) etcd
    stays up and refuses every write for ``outage`` seconds (its NOSPACE alarm), then is disarmed.
    Fails on any transition dated inside the outage (a decision made while writes fail), on a step
    entered twice, when the rollout does not end promoted, or when a request to stable fails.
    Counted: how the watch said it (a failed pass, or a write not sent once its Lease's fencing
    deadline passed), and the time from etcd's return to the rollout's next transition."""
    results = []
    for run in range(1, runs + 1):
        canary = h.new_version()
        t0 = time.monotonic()
        ctl.start()
        problems: list[str] = []
        resumed_s = None
        try:
            h.live.wait(lambda s: s.canary == canary and s.phase is Phase.PROGRESSING and s.step == 0, 90, "step 1")  # noqa: B023
            time.sleep(duration_seconds("2s"))  # the step's pause: its analysis starts
            wall_down = time.time()
            if nospace:
                _etcd_out_of_space(h, outage)
            else:
                h.cluster.restart_etcd(down_seconds=outage)
            wall_back = time.time()
            final = h.live.wait(lambda s: s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK), 180, "the end of the rollout")
            during = [x for x in final.history if wall_down < x["at"] < wall_back]
            if during:
                problems.append(f"decided while etcd was down: {during}")
            after = [x["at"] for x in final.history if x["at"] >= wall_back]
            resumed_s = round(min(after) - wall_back, 2) if after else None
            if final.phase is not Phase.PROMOTED:
                problems.append(f"not promoted: {final.phase.value}: {final.reason}")
            for n in (1, 2, 3):
                entered = [x for x in final.history if x["to"] == "Progressing" and f"step {n}/3:" in x["reason"]]
                if len(entered) != 1:
                    problems.append(f"step {n} entered {len(entered)} times")
        except TimeoutError as exc:
            problems.append(str(exc))
        finally:
            ctl.kill()
        t_end = time.monotonic()
        said = ctl.log_text()
        how = ("failed passes" if "the cluster did not answer" in said else
               "writes refused for space" if "the cluster refuses every write" in said else
               "a write not sent (fencing deadline passed)" if "not sent: the environment's Lease" in said else "nothing said")
        if how == "nothing said":
            problems.append("the watch did not say the cluster was down")
        counts = tallies(h, t0, t_end)
        lost = counts["stable"]["failed"]
        if lost:
            problems.append(f"{lost} requests to stable failed: {counts['stable']['reasons']}")
        res = {"run": run, "outage_s": outage, "watch_said": how, "resume_s": resumed_s, "stable_lost": lost,
               "requests": counts, "failed": bool(problems), "problems": problems, "rollout_s": round(t_end - t0, 1)}
        results.append(res)
        log(f"etcd{' out of space' if nospace else ''} drill, run {run}: {how}; next transition {resumed_s} s after etcd was back, stable lost {lost}"
            f"{'; ' + '; '.join(problems) if problems else ''}")
    resumes = [r["resume_s"] for r in results if r["resume_s"] is not None]
    return {"runs": len(results), "failures": sum(r["failed"] for r in results), "outage_s": outage,
            "max_converge_s": max(resumes) if resumes else None, "stable_lost": sum(r["stable_lost"] for r in results),
            "samples": results}


# -- drill 3: the canary's serving process killed --------------------------------------------------

def canary_weight_rises(weights: list[tuple[float, str | None, int]], history: list[dict[str, Any]], canary: str,
                        t_kill: float, wall_kill: float) -> tuple[int, list[int], list[str]]:
    """The canary's live weight when it was killed, the weights the mesh follower saw it get after
    (``weights``: (monotonic time, canary, weight) on change), and what says its weight rose after
    the kill: a live weight above the one at the kill, or a step the controller entered after it
    (``history``: the rollout state's, times on the wall clock) — the follower looks every 0.1 s
    and could miss a short-lived weight, the state's history cannot."""
    before = [w for t, c, w in weights if c == canary and t <= t_kill]
    at_kill = before[-1] if before else 0
    after = [w for t, c, w in weights if c == canary and t > t_kill]
    rises = [f"live weight {w} % after the kill (it was {at_kill} %)" for w in after if w > at_kill]
    rises += [f"entered after the kill: {h['reason']}" for h in history
              if h.get("to") == "Progressing" and h.get("at", 0) > wall_kill and f"canary {canary} at" in h.get("reason", "")]
    return at_kill, after, rises


def bound_s(h: Harness) -> float:
    """The policy's bound on the rollback after the canary dies in a step's analysis: the failing
    measurements need interval × (failureLimit + 1) (the metric with the longest), plus the
    staleness of the scrape (1 s) and a controller pass (0.5 s) and 2 s of slack on this loaded machine."""
    worst = max(duration_seconds(m.interval) * (m.failure_limit + 1) for m in h.policy.spec.metrics)
    return worst + 1.0 + 0.5 + 2.0


def drill_canary(h: Harness, runs: int, ctl: ControllerProc) -> dict[str, Any]:
    rng = random.Random(3)
    bound = bound_s(h)
    results = []
    for run in range(1, runs + 1):
        canary = h.new_version()
        t0 = time.monotonic()
        ctl.start()
        problems: list[str] = []
        rollback_s = None
        t_kill = wall_kill = None
        try:
            h.live.wait(lambda s: s.canary == canary and s.phase is Phase.PROGRESSING and s.step == 1, 90, "step 2")  # noqa: B023
            # Step 2's analysis starts once its window lies in the step (it outlasts the 2 s pause):
            # the kill lands 1–3 s after its first measurement.
            window = max(duration_seconds(m.window) for m in h.policy.spec.metrics)
            time.sleep(window + rng.uniform(1.0, 3.0))
            proc = h.servers["canary"].proc
            os.killpg(proc.pid, signal.SIGKILL)
            t_kill, wall_kill = time.monotonic(), time.time()
            final = h.live.wait(lambda s: s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK), 120, "the end of the rollout")
            t_final = next(t for t, s in h.live.states if s.phase is final.phase and s.canary == canary)
            zero = [t for t, c, w in h.live.weights if t > t_kill and w == 0]
            rollback_s = (zero[0] if zero else t_final) - t_kill
            if final.phase is not Phase.ROLLED_BACK:
                problems.append(f"not rolled back: {final.phase.value}: {final.reason}")
            elif rollback_s > bound:
                problems.append(f"rolled back {rollback_s:.1f} s after the kill > bound {bound:.1f} s: {final.reason}")
        except TimeoutError as exc:
            problems.append(str(exc))
            final = h.live.state
        finally:
            ctl.kill()
        t_end = time.monotonic()
        counts = tallies(h, t0, t_end)
        lost = counts["stable"]["failed"]  # over the whole span: no window left out
        if lost:
            problems.append(f"{lost} requests to stable failed: {counts['stable']['reasons']}")
        steps = entered_steps(final, canary) if final else []
        after: dict[str, Any] = {}
        if t_kill is not None and wall_kill is not None:
            at_kill, weights, rises = canary_weight_rises(h.live.weights, final.history if final else [], canary, t_kill, wall_kill)
            problems.extend(f"the dead canary's weight rose: {r}" for r in rises)
            sent = h.traffic.count("canary", since=t_kill, until=t_end)
            failed = h.traffic.count("canary", ok=False, since=t_kill, until=t_end)
            after = {"weight_at_kill": at_kill, "weights_after_kill": weights, "canary_sent_after_kill": sent,
                     "canary_failed_after_kill": failed, "canary_answered_after_kill": sent - failed,
                     "canary_failures_after_kill_by_reason": h.traffic.tally("canary", t_kill, t_end).reasons}
        else:
            problems.append("the canary was never killed: no run")
        res = {"run": run, "rollback_s": round(rollback_s, 2) if rollback_s is not None else None, "bound_s": bound,
               "reason": final.reason if final else None, "steps_entered": steps, "stable_lost": lost,
               "canary_failed_requests": h.traffic.count("canary", ok=False, since=t0, until=t_end), **after, "requests": counts,
               "failed": bool(problems), "problems": problems}
        results.append(res)
        log(f"canary drill, run {run}: {final.phase.value if final else None} {res['rollback_s']} s after the kill "
            f"(bound {bound:.1f} s), stable lost {lost}{'; ' + '; '.join(problems) if problems else ''}")
        h.start_server("canary")  # the next run's canary
    worst = [r["rollback_s"] for r in results if r["rollback_s"] is not None]
    return {"runs": len(results), "failures": sum(r["failed"] for r in results), "bound_s": bound,
            "max_converge_s": max(worst) if worst else None, "stable_lost": sum(r["stable_lost"] for r in results),
            "weight_rose_after_kill": sum(any("weight rose" in p for p in r["problems"]) for r in results),
            "canary_sent_after_kill": sum(r.get("canary_sent_after_kill", 0) for r in results),
            "canary_failed_after_kill": sum(r.get("canary_failed_after_kill", 0) for r in results),
            "samples": results}


# -- the drills of issue 35: a hung Prometheus, bad data, two controllers -----------------------------

def tallies(h: Harness, since: float, until: float) -> dict[str, Any]:
    """Every request of [since, until): per role sent, answered, failed by reason; skipped ticks."""
    return {"stable": h.traffic.tally("stable", since, until).to_json(), "canary": h.traffic.tally("canary", since, until).to_json(),
            "skipped": h.traffic.skipped_between(since, until)}


def counted_at_step_1(canary: str) -> Any:
    """The rollout of ``canary`` at step 1 with a success-rate measurement counted: its analysis runs on data."""
    def pred(s: RolloutState) -> bool:
        run = s.runs.get("success-rate")
        return s.canary == canary and s.phase is Phase.PROGRESSING and s.step == 0 and run is not None and run.measurements >= 1
    return pred


def causes(s: RolloutState) -> dict[str, str]:
    return {a["metric"]: a["cause"] for a in s.last_analysis}


def rose_after(h: Harness, canary: str, t: float, until: float = math.inf) -> list[int]:
    """The canary's live weights in (t, until] that are above its weight at ``t``."""
    before = [w for at, c, w in h.live.weights if c == canary and at <= t]
    at_t = before[-1] if before else 0
    return [w for at, c, w in h.live.weights if c == canary and t < at <= until and w > at_t]


def drill_hung(h: Harness, runs: int, ctl: ControllerProc, outage: float) -> dict[str, Any]:
    results = []
    for run in range(1, runs + 1):
        canary = h.new_version()
        t0 = time.monotonic()
        ctl.start()
        problems: list[str] = []
        held = None
        resumed_s = None
        try:
            first = h.live.wait(counted_at_step_1(canary), 90, "a measurement at step 1")
            h.prom.freeze()
            t_hang = time.monotonic()
            problems += _moved_during(h, ctl, first, outage, "while Prometheus hung")
            held = h.live.state
            assert held is not None
            if not problems and (held.phase is not Phase.HOLDING or causes(held).get("success-rate") != "unreachable"):
                problems.append(f"not Holding on unreachable after {outage:.0f} s of a hung Prometheus: {held.phase.value}: {held.reason}")
            h.prom.thaw()
            t_up, wall_up = time.monotonic(), time.time()
            problems.extend(f"the weight rose while Prometheus hung: {w} %" for w in rose_after(h, canary, t_hang, t_up))
            final = h.live.wait(lambda s: s.canary == canary and s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK), 120,  # noqa: B023
                                "the end of the rollout")
            left = [x["at"] for x in final.history if x.get("from") == "Holding" and x.get("at", 0) >= wall_up]
            resumed_s = round(left[0] - wall_up, 2) if left else None
            if final.phase is not Phase.PROMOTED:
                problems.append(f"not promoted after SIGCONT: {final.phase.value}: {final.reason}")
        except TimeoutError as exc:
            problems.append(str(exc))
        finally:
            h.prom.thaw()
            ctl.kill()
        t_end = time.monotonic()
        counts = tallies(h, t0, t_end)
        lost = counts["stable"]["failed"]
        if lost:
            problems.append(f"{lost} requests to stable failed: {counts['stable']['reasons']}")
        res = {"run": run, "outage_s": outage, "held_reason": held.reason if held else None,
               "held_cause": causes(held).get("success-rate") if held else None, "resume_s": resumed_s,
               "stable_lost": lost, "requests": counts, "failed": bool(problems), "problems": problems,
               "rollout_s": round(t_end - t0, 1)}
        results.append(res)
        log(f"hung drill, run {run}: held on {res['held_cause']}, stable lost {lost}{'; ' + '; '.join(problems) if problems else ''}")
    return {"runs": len(results), "failures": sum(r["failed"] for r in results), "outage_s": outage,
            "max_converge_s": max((r["resume_s"] for r in results if r["resume_s"] is not None), default=None),
            "stable_lost": sum(r["stable_lost"] for r in results), "wrong_promotions": sum(
                any("rose" in p or "while Prometheus hung" in p for p in r["problems"]) for r in results),
            "samples": results}


BAD = ((Fault.NAN, "no-data"), (Fault.EMPTY, "no-data"), (Fault.UNAVAILABLE, "unreachable"), (Fault.FROZEN, "clock-skew"))


def drill_baddata(h: Harness, runs: int, ctl: ControllerProc) -> dict[str, Any]:
    results = []
    for run in range(1, runs + 1):
        canary = h.new_version()
        t0 = time.monotonic()
        ctl.start()
        problems: list[str] = []
        judged: dict[str, Any] = {}
        final = None
        try:
            h.live.wait(counted_at_step_1(canary), 90, "a measurement at step 1")
            t_bad = time.monotonic()
            for fault, cause in BAD:
                h.bad.set(fault)
                t_set = time.time()
                try:
                    s = h.live.wait(lambda s, c=cause, t=t_set: set(causes(s).values()) == {c}
                                    and all(a["at"] >= t for a in s.last_analysis), 60, f"both metrics judged under {fault.value}")
                except TimeoutError as exc:
                    problems.append(str(exc))
                    break
                judged[fault.value] = {"phase": s.phase.value, "causes": causes(s), "weight": s.weight,
                                       "analysis_answers": h.bad.served(fault)}
                if s.phase is not Phase.HOLDING or s.weight != 10:
                    problems.append(f"under {fault.value}: {s.phase.value} at {s.weight} %: {s.reason}")
            h.bad.set(Fault.INF)
            final = h.live.wait(lambda s: s.canary == canary and s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK), 60,  # noqa: B023
                                "the end of the rollout under +Inf")
            judged["inf"] = {"phase": final.phase.value, "reason": final.reason}
            if final.phase is not Phase.ROLLED_BACK:
                problems.append(f"+Inf did not roll back: {final.phase.value}: {final.reason}")
            problems.extend(f"the weight rose under bad data: {w} %" for w in rose_after(h, canary, t_bad))
        except TimeoutError as exc:
            problems.append(str(exc))
        finally:
            h.bad.set(Fault.NONE)
            ctl.kill()
        t_end = time.monotonic()
        counts = tallies(h, t0, t_end)
        lost = counts["stable"]["failed"]
        if lost:
            problems.append(f"{lost} requests to stable failed: {counts['stable']['reasons']}")
        res = {"run": run, "judged": judged, "stable_lost": lost, "requests": counts, "failed": bool(problems),
               "problems": problems, "rollout_s": round(t_end - t0, 1)}
        results.append(res)
        log(f"baddata drill, run {run}: {json.dumps(judged)[:400]}, stable lost {lost}{'; ' + '; '.join(problems) if problems else ''}")
    return {"runs": len(results), "failures": sum(r["failed"] for r in results), "max_converge_s": None,
            "stable_lost": sum(r["stable_lost"] for r in results),
            "wrong_promotions": sum(any("rose" in p or "did not roll back" in p for p in r["problems"]) for r in results),
            "samples": results}


def drill_skew(h: Harness, runs: int, ctl: ControllerProc, skew: float) -> dict[str, Any]:
    """The controller's clock ``skew`` seconds ahead of Prometheus's (``ctl`` runs under Debian's
    libfaketime): every measurement must be `clock-skew`, the weight must hold at step 1, and the
    rollout may end only rolled back on `inconclusiveLimit` (naming the skew) — never promoted."""
    results = []
    for run in range(1, runs + 1):
        canary = h.new_version()
        t0 = time.monotonic()
        ctl.start()
        problems: list[str] = []
        final = None
        try:
            held = h.live.wait(lambda s: s.canary == canary and s.phase is not Phase.WAITING and bool(s.last_analysis), 90,  # noqa: B023
                               "the first measurement")
            t_held = time.monotonic()
            final = h.live.wait(lambda s: s.canary == canary and s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK), 120,  # noqa: B023
                                "the end of the rollout")
            seen = {a["cause"] for t, s in h.live.states if t >= t0 and s.canary == canary for a in s.last_analysis}
            if seen != {"clock-skew"}:
                problems.append(f"measurements judged other than clock-skew: {sorted(seen)}")
            if final.phase is not Phase.ROLLED_BACK or "clocks out of step" not in final.reason:
                problems.append(f"not rolled back on the named skew: {final.phase.value}: {final.reason}")
            problems.extend(f"the weight rose under the skew: {w} %" for w in rose_after(h, canary, t_held))
        except TimeoutError as exc:
            problems.append(str(exc))
            held = None
        finally:
            ctl.kill()
        t_end = time.monotonic()
        counts = tallies(h, t0, t_end)
        lost = counts["stable"]["failed"]
        if lost:
            problems.append(f"{lost} requests to stable failed: {counts['stable']['reasons']}")
        res = {"run": run, "skew_s": skew, "first": held.last_analysis if held else None,
               "reason": final.reason if final else None, "phase": final.phase.value if final else None,
               "stable_lost": lost, "requests": counts, "failed": bool(problems), "problems": problems,
               "rollout_s": round(t_end - t0, 1)}
        results.append(res)
        log(f"skew drill, run {run}: {res['phase']}: {(res['reason'] or '')[:200]}; stable lost {lost}"
            f"{'; ' + '; '.join(problems) if problems else ''}")
    return {"runs": len(results), "failures": sum(r["failed"] for r in results), "skew_s": skew, "max_converge_s": None,
            "stable_lost": sum(r["stable_lost"] for r in results),
            "wrong_promotions": sum(r["phase"] == Phase.PROMOTED.value for r in results), "samples": results}


def faketime(skew: float) -> list[str]:
    """The command prefix that runs a process with its clock ``skew`` seconds ahead: Debian's
    libfaketime (package faketime, installed with apt-get on first use, as Prometheus is)."""
    from reconciler.targets.local import processes

    exe = processes.ensure_package("/usr/bin/faketime", "faketime", log=log)
    return [exe, "-f", f"{skew:+g}s"]


def drill_two(h: Harness, runs: int, ctl: ControllerProc, second: ControllerProc) -> dict[str, Any]:
    interval = min(duration_seconds(m.interval) for m in h.policy.spec.metrics)
    results = []
    for run in range(1, runs + 1):
        canary = h.new_version()
        t0 = time.monotonic()
        ctl.start()
        second.start()
        problems: list[str] = []
        final, t_end = wait_for_the_end(h, canary, 180, problems, ctl, second)
        states = [s for t, s in h.live.states if t0 <= t <= t_end and s.canary == canary]
        # Evidence that both act: a count that went back (one controller's write over the other's),
        # measurements of one metric closer than its interval, a step entered twice.
        regressions, close = 0, []
        for a, b in zip(states, states[1:]):
            ra, rb = a.runs.get("success-rate"), b.runs.get("success-rate")
            if a.step == b.step and ra is not None and rb is not None:
                if rb.measurements < ra.measurements:
                    regressions += 1
                if rb.last_at and ra.last_at and 0 < rb.last_at - ra.last_at < interval - 0.25:
                    close.append(round(rb.last_at - ra.last_at, 2))
        steps = entered_steps(final, canary) if final else []
        lines = {c.name: sum(1 for line in (c.workdir / f"{c.name}-{c.starts}.log").read_text(errors="replace").splitlines()
                             if line.startswith("digits:")) for c in (ctl, second)}
        followed = {c.name: "following, nothing written" in (c.workdir / f"{c.name}-{c.starts}.log").read_text(errors="replace")
                    for c in (ctl, second)}
        both = bool(regressions or close or steps != sorted(set(steps)) or all(lines.values()))
        if both:
            problems.append(f"both controllers acted: {regressions} count regressions, measurements {close} s apart, "
                            f"steps entered {steps}, transitions printed {lines}")
        counts = tallies(h, t0, t_end)
        res = {"run": run, "phase": final.phase.value if final else None, "state_writes": len(states),
               "count_regressions": regressions, "measurements_closer_than_interval": close, "steps_entered": steps,
               "lines_printed": lines, "said_following": followed, "both_acted": both, "stable_lost": counts["stable"]["failed"], "requests": counts,
               "failed": bool(problems), "problems": problems, "rollout_s": round(t_end - t0, 1)}
        results.append(res)
        log(f"two-controllers drill, run {run}: {res['phase']}, {len(states)} state writes, {regressions} count regressions, "
            f"{len(close)} measurements closer than {interval:g} s: both acted {both}")
    return {"runs": len(results), "failures": sum(r["failed"] for r in results), "max_converge_s": None,
            "stable_lost": sum(r["stable_lost"] for r in results), "both_acted": sum(r["both_acted"] for r in results),
            "samples": results}


def drill_late(h: Harness, runs: int, ctl: ControllerProc, after_requests: int, error_rate: float) -> dict[str, Any]:
    """A canary healthy for its first ``after_requests`` requests (`faultInjection.afterRequests`),
    then failing ``error_rate`` of them: it must be rolled back at the step where it began failing,
    its weight never raised after its first failure."""
    results = []
    for run in range(1, runs + 1):
        h.start_server("canary", {"errorRate": error_rate, "afterRequests": after_requests})
        canary = h.new_version()
        t0 = time.monotonic()
        ctl.start()
        problems: list[str] = []
        final, t_end = wait_for_the_end(h, canary, 180, problems, ctl)
        failed = [r for r in list(h.traffic.log) if r.role == "canary" and not r.ok and t0 <= r.at < t_end]
        degraded = failed[0].at if failed else None
        weights = [(t, w) for t, c, w in h.live.weights if c == canary]
        at_degradation = next((w for t, w in reversed(weights) if degraded is not None and t <= degraded), None)
        after = [w for t, w in weights if degraded is not None and t > degraded]
        steps = entered_steps(final, canary) if final else []
        weights_of_steps = [st.weight for st in policy_steps(h.policy)]
        rolled_back_at = weights_of_steps[final.step] if final and 0 <= final.step < len(weights_of_steps) else None
        if degraded is None:
            problems.append("the canary never failed: it was not asked past its healthy requests")
        elif final is None or final.phase is not Phase.ROLLED_BACK:
            problems.append(f"not rolled back: {final.phase.value if final else None}: {final.reason if final else ''}")
        elif rolled_back_at != at_degradation:
            problems.append(f"degraded at {at_degradation} %, rolled back from the step at {rolled_back_at} %: {final.reason}")
        if degraded is not None and any(w > (at_degradation or 0) for w in after):
            problems.append(f"the weight rose after the canary began failing: {after}")
        counts = tallies(h, t0, t_end)
        lost = counts["stable"]["failed"]
        if lost:
            problems.append(f"{lost} requests to stable failed: {counts['stable']['reasons']}")
        res = {"run": run, "phase": final.phase.value if final else None, "reason": final.reason if final else None,
               "steps_entered": steps, "weight_when_degraded": at_degradation, "rolled_back_from_weight": rolled_back_at,
               "canary_healthy_before": h.traffic.count("canary", since=t0, until=degraded) if degraded is not None else None,
               "weights_after_degraded": after, "degraded_to_rollback_s":
                   round(next((t for t, w in weights if degraded is not None and t > degraded and w == 0), t_end) - degraded, 2)
                   if degraded is not None else None,
               "stable_lost": lost, "requests": counts, "failed": bool(problems), "problems": problems}
        results.append(res)
        log(f"late drill, run {run}: degraded at {at_degradation} %, {res['phase']} from {rolled_back_at} % "
            f"{res['degraded_to_rollback_s']} s later{'; ' + '; '.join(problems) if problems else ''}")
        h.start_server("canary")  # healthy again for what follows
    worst = [r["degraded_to_rollback_s"] for r in results if r["degraded_to_rollback_s"] is not None]
    return {"runs": len(results), "failures": sum(r["failed"] for r in results), "max_converge_s": max(worst) if worst else None,
            "stable_lost": sum(r["stable_lost"] for r in results), "samples": results}


def drill_handover(h: Harness, runs: int, a: ControllerProc, b: ControllerProc, lease: float) -> dict[str, Any]:
    """Two watches on one rollout, hand-overs forced: the leader SIGSTOPped past its Lease (the other
    must take over and act), SIGCONTed (it must write nothing and follow), the new leader SIGKILLed
    (the first must take over and finish). Who moved what is read from the API server: each step's
    Event names the Lease's holder (reportingInstance) and carries its writer's clock (ns)."""
    raw = h.cluster.raw_client()

    def holder() -> str | None:
        status, body = raw.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{h.namespace}/leases/forgectl-cluster")
        return (body.get("spec") or {}).get("holderIdentity") if status == 200 else None

    def moves(canary: str) -> list[tuple[int, str, str]]:
        status, body = raw.request("GET", f"/api/v1/namespaces/{h.namespace}/events")
        return sorted((int(e["metadata"]["name"].rsplit(".", 1)[1], 16), e.get("reportingInstance") or "", e["reason"])
                      for e in body.get("items", []) if e["reason"] in ("RolloutStep", "Promoted", "RolledBack")
                      and canary in e.get("message", ""))

    def until(pred: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:.0f} s")
            time.sleep(0.1)

    results = []
    for run in range(1, runs + 1):
        canary = h.new_version()
        t0 = time.monotonic()
        a.start()
        b.start()
        problems: list[str] = []
        marks: dict[str, float] = {}
        first = second = None
        final = None
        try:
            h.live.wait(lambda s: s.canary == canary and s.phase is Phase.PROGRESSING, 120, "step 1")  # noqa: B023
            leader = holder()
            first, second = (a, b) if a.holds(leader) else (b, a)
            first.signal(signal.SIGSTOP)
            stopped, marks["stopped"] = time.time_ns(), time.monotonic() - t0
            until(lambda: second.holds(holder()), 4 * lease + 30, "the second to take the Lease over")  # noqa: B023
            marks["taken_over_after_stop_s"] = round(time.monotonic() - t0 - marks["stopped"], 2)
            # it acts: a step entered by it (its Event), not only a measurement written
            until(lambda: any(second.holds(who) for _, who, _ in moves(canary)), 90, "the second to enter a step")  # noqa: B023
            marks["second_moved_after_stop_s"] = round(time.monotonic() - t0 - marks["stopped"], 2)
            first.signal(signal.SIGCONT)
            until(lambda: "lost the environment's lock" in first.log_text(), 30, "the resumed one to find its lock lost")  # noqa: B023
            if not second.holds(holder()):
                problems.append(f"the Lease left the second after the first resumed: {holder()}")
            second.kill()
            killed, marks["killed"] = time.time_ns(), time.monotonic() - t0
            final = h.live.wait(lambda s: s.canary == canary and s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK), 180,  # noqa: B023
                                "the first to take over again and finish")
            marks["finished_after_kill_s"] = round(time.monotonic() - t0 - marks["killed"], 2)
        except (TimeoutError, AssertionError) as exc:
            problems.append(str(exc))
            final = final or h.live.state
        finally:
            for c in (a, b):
                if c.proc is not None and c.proc.poll() is None:
                    os.killpg(c.proc.pid, signal.SIGCONT)
                c.kill()
        t_end = time.monotonic()
        events = moves(canary)
        by = {"first": 0, "second": 0, "other": 0}
        for t, who, _ in events:
            if first is not None and first.holds(who):
                by["first"] += 1
                if "killed" in marks and stopped < t < killed:
                    problems.append("the first wrote an Event while paused or deposed")
            elif second is not None and second.holds(who):
                by["second"] += 1
                if "killed" in marks and not stopped < t < killed:
                    problems.append("the second wrote an Event outside its tenure")
            else:
                by["other"] += 1
        counts = tallies(h, t0, t_end)
        steps = promoted_once(final, canary, counts, problems)
        res = {"run": run, "phase": final.phase.value if final else None, "steps_entered": steps, "moves_by": by,
               "moves": [(who.rsplit(":", 1)[-1], why) for _, who, why in events], **marks,
               "first_said_lost": first is not None and "lost the environment's lock" in first.log_text(),
               "stable_lost": counts["stable"]["failed"], "requests": counts, "failed": bool(problems), "problems": problems}
        results.append(res)
        log(f"handover drill, run {run}: {res['phase']}, moves {by}, taken over {marks.get('taken_over_after_stop_s')} s after "
            f"the SIGSTOP{'; ' + '; '.join(problems) if problems else ''}")
    return {"runs": len(results), "failures": sum(r["failed"] for r in results), "max_converge_s": None,
            "stable_lost": sum(r["stable_lost"] for r in results), "lease_s": lease, "samples": results}


# -- a leader paused between a write's Lease check and its send ------------------------------------

@dataclass
class HeldSend:
    """The first replica's target paused between a request's fence check and its send
    (``KubernetesTarget.pause_before_send``): once ``armed``, the first PATCH of the
    SeldonDeployment — a rollout write — stops there, and so does every later request of that
    target (its Lease renewer's too), as SIGSTOP would stop the process, until :meth:`resume`.
    What it sends after that is recorded (method, what)."""

    armed: threading.Event = field(default_factory=threading.Event)
    holding: threading.Event = field(default_factory=threading.Event)
    resumed: threading.Event = field(default_factory=threading.Event)
    held: tuple[str, str] | None = None
    sent_after: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, method: str, what: str) -> None:
        if self.resumed.is_set():
            self.sent_after.append((method, what))
            return
        if not self.holding.is_set():
            if not (self.armed.is_set() and method == "PATCH" and "SeldonDeployment" in what):
                return
            self.held = (method, what)
            self.holding.set()
        self.resumed.wait(300)
        self.sent_after.append((method, what))

    def resume(self) -> None:
        self.resumed.set()


class _Followed(Exception):
    """Ends the first replica's watch once it follows."""


def drill_stale_write(h: Harness, runs: int, lease: float) -> dict[str, Any]:
    """Two in-process controllers (each its own target and Lease, as two `forgectl reconcile
    --watch`): the first leads until a rollout write of step 1's analysis is held between its Lease
    check and its send (:class:`HeldSend`), the second takes the expired Lease over, stamps its
    tenure and moves the rollout on; then the first is resumed — its write goes out with the
    resourceVersion it read. Fails unless the API server refuses it (409, in the first's own
    words), the first then sends no other write (its requests after the resume, recorded before
    each send) and follows, the Lease stays the second's, the second's token is on the
    SeldonDeployment, no Event is the first's after the hold, and the second promotes with 0
    stable requests lost."""
    from reconciler.controller.leadership import Leadership, watch_lease
    from reconciler.controller.watch import WatchOptions, controllers_for, prometheus_for
    from reconciler.controller.watch import run as watch
    from reconciler.load.endpoints import desired_endpoints
    from reconciler.load.sources import revision_of
    from reconciler.plan.session import TargetOptions, open_target
    from reconciler.targets.kubernetes.rollout import fence_of
    from reconciler.targets.kubernetes.target import KubernetesTarget

    raw = h.cluster.raw_client()

    def get(path: str) -> dict[str, Any]:
        status, body = raw.request("GET", path)
        return body if status == 200 else {}

    def holder() -> str | None:
        return (get(f"/apis/coordination.k8s.io/v1/namespaces/{h.namespace}/leases/forgectl-cluster").get("spec") or {}).get("holderIdentity")

    def deployment() -> dict[str, Any]:
        return get(f"/apis/machinelearning.seldon.io/v1/namespaces/{h.namespace}/seldondeployments/digits")

    def replica(name: str) -> tuple[KubernetesTarget, Any, Leadership, Any]:
        result, env = h.r.load()
        target = open_target(env, TargetOptions(kubeconfig=h.r.kubeconfig, namespace=h.namespace, lease=watch_lease(lease)))
        assert isinstance(target, KubernetesTarget)
        backend = target.rollout_backend(result.specs, env, revision_of([str(h.r.specs_dir)], None, repository=h.r.specs_dir))
        controllers = controllers_for(result, env, backend, prometheus_for(env, target), h.namespace)
        return target, controllers, Leadership(target.lock, name), desired_endpoints(result.specs, env)

    def until(pred: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:.0f} s")
            time.sleep(0.1)

    names = ("first@bench:1", "second@bench:2")
    results = []
    for run_no in range(1, runs + 1):
        canary = h.new_version()
        t0, wall0 = time.monotonic(), time.time_ns()
        problems: list[str] = []
        wall_hold: int | None = None
        t_first, c_first, l_first, endpoints = replica(names[0])
        _, c_second, l_second, _ = replica(names[1])
        held = HeldSend()
        t_first.pause_before_send = held
        lines: dict[str, list[str]] = {"first": [], "second": []}
        ends: dict[str, Any] = {}

        def first_pass(states: dict[str, RolloutState]) -> None:
            if counted_at_step_1(canary)(states.get("digits") or RolloutState("digits", "")):  # noqa: B023
                held.armed.set()  # noqa: B023
            if l_first.waiting is not None and "lost the environment's lock" in l_first.waiting:  # noqa: B023
                raise _Followed

        def drive(name: str, controllers: Any, leadership: Leadership, options: WatchOptions, on_pass: Any) -> None:
            try:
                ends[name] = watch(controllers, endpoints, options, leadership=leadership,  # noqa: B023
                                   on_line=lines[name].append, on_pass=on_pass)  # noqa: B023
            except BaseException as exc:  # noqa: BLE001 — _Followed, or what failed: judged below
                ends[name] = exc  # noqa: B023

        threads = {"first": threading.Thread(target=drive, daemon=True, args=(
            "first", c_first, l_first, WatchOptions(watch=True, interval=0.5, timeout=240), first_pass))}
        threads["first"].start()
        marks: dict[str, Any] = {}
        final = None
        try:
            until(held.holding.is_set, 120, "a rollout write of the first to be held between its check and its send")
            t_hold, wall_hold = time.monotonic(), time.time_ns()
            marks["held"] = held.held
            marks["held_after_s"] = round(t_hold - t0, 2)
            version_held = deployment()["metadata"]["resourceVersion"]
            threads["second"] = threading.Thread(target=drive, daemon=True, args=(
                "second", c_second, l_second, WatchOptions(watch=True, interval=0.5, until_settled=True, timeout=240), None))
            threads["second"].start()
            until(lambda: holder() == names[1], 4 * lease + 20, "the second to take the Lease over")
            marks["taken_over_after_hold_s"] = round(time.monotonic() - t_hold, 2)
            # it acts: its tenure stamped, and a rollout write of its own after the stamp
            until(lambda: (f := fence_of(deployment())) is not None and f.holder == names[1], 30, "the second's stamp")
            stamped = deployment()["metadata"]["resourceVersion"]
            until(lambda v=stamped: deployment()["metadata"]["resourceVersion"] != v, 60, "a write of the second after its stamp")
            version_at_resume = deployment()["metadata"]["resourceVersion"]
            marks["second_wrote_after_hold_s"] = round(time.monotonic() - t_hold, 2)
            held.resume()
            threads["first"].join(60)
            if threads["first"].is_alive():
                problems.append("the first did not follow within 60 s of its resume")
            final = h.live.wait(ended(canary), 180, "the second to finish the rollout")
            threads["second"].join(30)
            marks["resource_versions"] = {"when_held": version_held, "second_stamped": stamped,
                                          "at_resume": version_at_resume}
        except TimeoutError as exc:
            problems.append(str(exc))
            final = final or h.live.state
        finally:
            held.resume()
            for t in threads.values():
                t.join(60)
            for leadership in (l_first, l_second):
                leadership.release()
        t_end = time.monotonic()
        refusal = [x for x in lines["first"] if "following, nothing written" in x and "lost the environment's lock" in x]
        if not (refusal and "refused by the API server as stale (409" in refusal[0] and "the object has been modified" in refusal[0]):
            problems.append(f"the first's held write was not refused by the API server: {lines['first'][-3:]}")
        if not isinstance(ends.get("first"), _Followed):
            problems.append(f"the first did not end following: {ends.get('first')!r}")
        writes = [(m, w) for m, w in held.sent_after if m != "GET"]
        lease_writes = [(m, w) for m, w in writes if w.split(" ", 2)[1:2] == ["Lease"]]
        other_writes = [x for x in writes if x != held.held and x not in lease_writes]
        if other_writes:
            problems.append(f"the first sent writes after its resume besides the held one: {other_writes}")
        token = fence_of(deployment())
        if token is None or token.holder != names[1]:
            problems.append(f"the SeldonDeployment's fence is not the second's: {token}")
        status, body = raw.request("GET", f"/api/v1/namespaces/{h.namespace}/events")
        by_first_late = [e["reason"] for e in body.get("items", []) if e.get("reportingInstance") == names[0]
                         and int(e["metadata"]["name"].rsplit(".", 1)[1], 16) > wall_hold] if wall_hold is not None else []
        if by_first_late:
            problems.append(f"Events by the first after its hold: {by_first_late}")
        if holder() not in (names[1], None):
            problems.append(f"the Lease left the second: {holder()}")
        counts = tallies(h, t0, t_end)
        steps = promoted_once(final, canary, counts, problems)
        res = {"run": run_no, "phase": final.phase.value if final else None, "steps_entered": steps, **marks,
               "first_refused": refusal[0] if refusal else None, "first_sent_after_resume": held.sent_after,
               "first_lease_writes_after_resume": lease_writes, "first_other_writes_after_resume": other_writes,
               "fence_at_end": token.to_text() if token else None, "events_by_first_after_hold": by_first_late,
               "second_lines": lines["second"], "stable_lost": counts["stable"]["failed"], "requests": counts,
               "failed": bool(problems), "problems": problems, "rollout_s": round(t_end - t0, 1), "started_ns": wall0}
        results.append(res)
        log(f"stale-write drill, run {run_no}: held {marks.get('held')}, taken over {marks.get('taken_over_after_hold_s')} s "
            f"after, first refused: {bool(refusal)}, {res['phase']}{'; ' + '; '.join(problems) if problems else ''}")
    return {"runs": len(results), "failures": sum(r["failed"] for r in results), "max_converge_s": None,
            "stable_lost": sum(r["stable_lost"] for r in results), "lease_s": lease,
            "refused_by_the_api_server": sum(bool(r["first_refused"]) for r in results), "samples": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drills", default="kill,prometheus,canary,hung,baddata,skew,two,late,two-watchers,stale-write",
                        help="comma-separated: kill, prometheus, canary, etcd, hung, baddata, skew, two, late, two-watchers, stale-write")
    parser.add_argument("--hang", type=float, default=30.0,
                        help="seconds the hung drill keeps Prometheus stopped (default 30: a pass waits out two queries "
                             "of two 5 s attempts each before it saves)")
    parser.add_argument("--etcd-outage", type=float, default=15.0,
                        help="seconds the etcd drill leaves etcd down (default 15: longer than the watch's Lease's renew deadline)")
    parser.add_argument("--skew", type=float, default=5.0, help="seconds the skew drill's controller clock is ahead (default 5)")
    parser.add_argument("--runs", type=int, default=1,
                        help="runs of each of etcd, hung, baddata, skew, two, late, two-watchers and stale-write (default 1)")
    parser.add_argument("--late-after", type=int, default=150,
                        help="the late drill's canary answers this many requests healthy first (default 150: through step 1 at 10 %%)")
    parser.add_argument("--late-error-rate", type=float, default=0.05, help="then fails this fraction (default 0.05)")
    parser.add_argument("--out", type=Path, default=None,
                        help="result file (default bench/results/rollout-faults-<date>.json)")
    parser.add_argument("--kill-runs", type=int, default=10, help="controller kills (one per step; default 10)")
    parser.add_argument("--prometheus-runs", type=int, default=3, help="Prometheus outages (default 3)")
    parser.add_argument("--canary-runs", type=int, default=5, help="canary kills (default 5)")
    parser.add_argument("--outage", type=float, default=20.0, help="seconds Prometheus is down (default 20)")
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second, split by the live weights (default 40)")
    args = parser.parse_args()
    drills = [d.strip() for d in args.drills.split(",") if d.strip()]
    unknown = set(drills) - {"kill", "prometheus", "canary", "etcd", "etcd-nospace", "hung", "baddata", "skew", "two", "late", "two-watchers", "stale-write"}
    if unknown:
        parser.error(f"unknown drills: {sorted(unknown)}")
    for name in ("kill_runs", "prometheus_runs", "canary_runs", "runs"):
        if not 1 <= getattr(args, name) <= 50:
            parser.error(f"--{name.replace('_', '-')} must be between 1 and 50")

    import shutil

    python = runtime_python()
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-rollout-faults-"))
    cluster = prom = None
    harness = None
    out: dict[str, Any] = {}
    t_all = time.monotonic()
    try:
        log("training the digits MLP once for all runs (prepare + train)")
        runner = train_digits(python, tmp / "digits")
        cluster = Cluster.start(tmp / "cluster", die_with_parent=True, log=lambda msg: None)
        prom = Prometheus.start(state_dir=tmp / "prometheus", scrape_interval="1s", die_with_parent=True, log=log)
        log(f"apiserver {cluster.server}, prometheus {prom.url}")
        harness = Harness(cluster, prom, runner, args, tmp / "work")
        prom.wait_for_targets(2, timeout=30)
        ctl = ControllerProc(harness.r, tmp)
        for name in drills:
            t = time.monotonic()
            try:
                if name == "kill":
                    out[name] = drill_kill(harness, args.kill_runs, ctl)
                elif name == "prometheus":
                    out[name] = drill_prometheus(harness, args.prometheus_runs, ctl, args.outage)
                elif name == "hung":
                    out[name] = drill_hung(harness, args.runs, ctl, args.hang)
                elif name == "etcd":
                    out[name] = drill_etcd(harness, args.runs, ctl, args.etcd_outage)
                elif name == "etcd-nospace":
                    out[name] = drill_etcd(harness, args.runs, ctl, args.etcd_outage, nospace=True)
                elif name == "baddata":
                    out[name] = drill_baddata(harness, args.runs, ctl)
                elif name == "skew":
                    skewed = ControllerProc(harness.r, tmp, "skewed", prefix=faketime(args.skew))
                    try:
                        out[name] = drill_skew(harness, args.runs, skewed, args.skew)
                    finally:
                        skewed.kill()
                elif name == "two-watchers":
                    pair = [ControllerProc(harness.r, tmp, f"watch-{k}", lease=6.0) for k in "ab"]
                    try:
                        out[name] = drill_handover(harness, args.runs, *pair, lease=6.0)
                    finally:
                        for c in pair:
                            c.kill()
                elif name == "stale-write":
                    out[name] = drill_stale_write(harness, args.runs, lease=3.0)
                elif name == "late":
                    out[name] = drill_late(harness, args.runs, ctl, args.late_after, args.late_error_rate)
                elif name == "two":
                    second = ControllerProc(harness.r, tmp, "second")
                    try:
                        out[name] = drill_two(harness, args.runs, ctl, second)
                    finally:
                        second.kill()
                else:
                    out[name] = drill_canary(harness, args.canary_runs, ctl)
            finally:
                ctl.kill()
            out[name]["seconds"] = round(time.monotonic() - t, 1)
    finally:
        if harness is not None:
            harness.close()
        if prom is not None:
            prom.stop()
        if cluster is not None:
            cluster.stop(quiet=True)
        shutil.rmtree(tmp, ignore_errors=True)

    for name, row in out.items():
        print(f"{name:>10}: runs {row['runs']}, failures {row['failures']}, max time to converge {row['max_converge_s']} s, "
              f"stable requests lost {row['stable_lost']} ({row['seconds']} s)")
        for s in row["samples"]:
            if s.get("problems"):
                print(f"{'':>12}{s}")
    summary = {name: {k: v for k, v in row.items() if k not in ("samples", "rollouts_detail")} for name, row in out.items()}
    result = {"drills": summary, "total_s": round(time.monotonic() - t_all, 1), "command": " ".join(sys.argv),
              "samples": {name: row["samples"] for name, row in out.items()},
              "rollouts": out.get("kill", {}).get("rollouts_detail")}
    path = args.out or ROOT / "bench" / "results" / f"rollout-faults-{time.strftime('%Y-%m-%d')}.json"
    path.write_text(json.dumps(result) + "\n")
    log(f"wrote {path}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
