"""Two `forgectl reconcile --watch` on the same environment and endpoints (issue 35): exactly one acts.

Two real watch processes against the test API server (no Prometheus, no model server: the policy's
steps have pauses and no analysis, so only the controllers move the rollout). The environment's
Lease decides who acts; each step a controller enters is a `RolloutStep` Event whose
`reportingInstance` is the Lease's holder, and the Event's name carries the creating process's
clock (ns), so the API server says who moved what, and when.

1. Both start: one leads and moves the first steps; the other says it follows and writes nothing.
2. The leader is paused (SIGSTOP) past its Lease: the follower takes the Lease over and moves on.
3. The paused one is continued (SIGCONT): its fence is lost, so it writes nothing and follows —
   the Lease stays the new leader's.
4. The new leader is killed (SIGKILL): the first one takes the Lease over once it expires and
   finishes the rollout.

Each step is entered exactly once. Every wait is for a state, bounded; the Lease lasts 6 s.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devkit.rollout_harness import Rollout, ready_canary_pod, stage_canary
from reconciler.rollout.controller import Phase, RolloutState
from reconciler.targets.kubernetes.rollout import rollout_state_of
from tests.polling import wait_until

pytestmark = [pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 6
#: Seven steps 3 s apart, no analysis: long enough to outlast two hand-overs, short enough for a test.
POLICY = """apiVersion: forge.dev/v1alpha1
kind: RolloutPolicy
metadata:
  name: three-step-canary
spec:
  strategy: canary
  canary:
    steps:
""" + "".join(f"      - {{weight: {w}, pause: 3s}}\n" for w in (5, 10, 20, 35, 50, 75)) + "      - {weight: 100}\n"


class Watch:
    """One `forgectl reconcile --watch` process, its output in a file."""

    def __init__(self, r: Rollout, out: Path) -> None:
        self.out = out
        cmd = [sys.executable, "-m", "forgectl", "reconcile", str(r.specs_dir), "--env", "cluster", "-n", r.namespace,
               "--kubeconfig", r.kubeconfig, "--watch", "--interval", "0.5", "--lease-duration", str(LEASE_SECONDS)]
        with out.open("w") as sink:
            # PYTHONFAULTHANDLER: a SIGABRT writes every thread's stack to the log (see stop()).
            # SIGINT's default disposition, as a terminal's foreground process has it: a suite run
            # in the background of a shell without job control inherits SIGINT ignored, and Python
            # keeps an inherited SIG_IGN (the watch then never sees Ctrl-C, correctly: nohup).
            self.proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT,
                                         env={**os.environ, "NO_COLOR": "1", "PYTHONFAULTHANDLER": "1"},
                                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.tag = f":{self.proc.pid} (reconcile --watch)"

    def text(self) -> str:
        return self.out.read_text()

    def said(self, words: str) -> bool:
        if self.proc.poll() is not None and self.proc.returncode not in (None, -signal.SIGKILL):
            raise AssertionError(f"the watch exited {self.proc.returncode}:\n{self.text()}")
        return words in self.text()

    def stop(self, timeout: float = 30) -> None:
        """SIGINT, as Ctrl-C: the watch lets its Lease go and exits. One still running after
        ``timeout`` is a failure that says where each of its threads waits."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(timeout=10)
            raise AssertionError(f"the watch did not exit within {timeout:.0f} s of SIGINT; its log and threads:\n"
                                 f"{self.text()[-8000:]}") from None

    def holds(self, holder: str | None) -> bool:
        return holder is not None and holder.endswith(self.tag)


@pytest.fixture
def staged(kube_cluster, namespace, tmp_path) -> Rollout:
    """Version 1 stable, version 2 the canary at 0 % with its workflow done and its pod Ready."""
    r = stage_canary(tmp_path / "repo" / "specs", namespace, kube_cluster.kubeconfig, POLICY)
    assert r.canary != r.stable
    r.finish_workflow(r.canary)
    return r


def test_two_watches_exactly_one_acts(staged: Rollout, kube_cluster, tmp_path) -> None:
    r = staged
    raw = kube_cluster.raw_client()

    def lease_holder() -> str | None:
        status, body = raw.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{r.namespace}/leases/forgectl-cluster")
        return (body.get("spec") or {}).get("holderIdentity") if status == 200 else None

    def state() -> RolloutState:
        status, body = raw.request("GET", f"/apis/machinelearning.seldon.io/v1/namespaces/{r.namespace}/seldondeployments/digits")
        assert status == 200, body
        saved = rollout_state_of(body)
        return saved if saved is not None else RolloutState("digits", r.stable)

    def moved() -> list[tuple[int, str, str, str]]:
        """(the creating process's clock in ns, reportingInstance, reason, message) of each move, in order."""
        status, body = raw.request("GET", f"/api/v1/namespaces/{r.namespace}/events")
        assert status == 200, body
        return sorted((int(e["metadata"]["name"].rsplit(".", 1)[1], 16), e.get("reportingInstance") or "", e["reason"],
                       e["message"]) for e in body["items"] if e["reason"] in ("RolloutStep", "Promoted", "RolledBack"))

    with ready_canary_pod(r):
        watches = [Watch(r, tmp_path / "a.out"), Watch(r, tmp_path / "b.out")]
        try:
            # 1. One leads and enters the first two steps; the other follows.
            wait_until(lambda: state().step >= 1, 60, "the first two steps entered")
            holder = lease_holder()
            [first] = [w for w in watches if w.holds(holder)]
            [second] = [w for w in watches if w is not first]
            wait_until(lambda: second.said("following, nothing written"), 20, "the second watch to say it follows")
            # 2. The leader paused past its Lease: the other takes it over and moves on.
            at_stop = state().step
            first.proc.send_signal(signal.SIGSTOP)
            stopped = time.time_ns()
            wait_until(lambda: second.holds(lease_holder()) and state().step > at_stop, 4 * LEASE_SECONDS + 20,
                       "the second watch to take the Lease over and enter a step")
            # 3. The paused one continued: deposed, it writes nothing and follows.
            first.proc.send_signal(signal.SIGCONT)
            wait_until(lambda: first.said("lost the environment's lock"), 30, "the resumed watch to find its lock lost")
            assert second.holds(lease_holder())
            current = state()
            assert current.phase is Phase.PROGRESSING, f"the rollout ended before the second hand-over: {current.reason}"
            # 4. The new leader killed: the first takes the Lease over once it expires and finishes.
            second.proc.send_signal(signal.SIGKILL)
            killed = time.time_ns()
            done = wait_until(lambda: (s := state()).phase in (Phase.PROMOTED, Phase.ROLLED_BACK) and s, 4 * LEASE_SECONDS + 40,
                              "the first watch to take over again and finish the rollout")
            assert first.holds(lease_holder())
            first.stop()
        finally:
            for w in watches:
                if w.proc.poll() is None:
                    w.proc.send_signal(signal.SIGCONT)
                    w.proc.kill()
                    w.proc.wait(timeout=10)
    logs = {w: w.text() for w in watches}
    assert done.phase is Phase.PROMOTED, (done.reason, logs)
    # Each step entered exactly once, in order (the last, 100 % without analysis, is the promotion).
    steps = [h["reason"] for h in done.history if h["to"] == "Progressing"]
    assert [re.search(r"step (\d+)/7", m).group(1) for m in steps] == [str(i) for i in range(1, 7)], steps  # type: ignore[union-attr]
    events = moved()
    assert [m for _, _, why, m in events if why == "RolloutStep"] == steps, (events, logs)
    assert [why for _, _, why, _ in events].count("Promoted") == 1, events
    # Who moved what: the first before its pause and after the second's death, the second in between.
    by_first = [(t, m) for t, who, _, m in events if first.holds(who)]
    by_second = [(t, m) for t, who, _, m in events if second.holds(who)]
    assert len(by_first) + len(by_second) == len(events), (events, logs)
    assert all(t < stopped or t > killed for t, _ in by_first), (by_first, stopped, killed)
    assert all(stopped < t < killed for t, _ in by_second), (by_second, stopped, killed)
    assert by_second and any(t < stopped for t, _ in by_first) and any(t > killed for t, _ in by_first), events
    # Each said so in its own log, in order.
    first_log, second_log = logs[first], logs[second]
    lead, lost = "leading — this watch alone moves the rollouts", "following, nothing written — lost the environment's lock"
    assert first_log.index(lead) < first_log.index(lost) < first_log.index(lead, first_log.index(lost)), first_log
    assert second_log.index("following, nothing written") < second_log.index(lead), second_log
    print(json.dumps({"moves": [(who.rsplit(":", 1)[-1], why) for _, who, why, _ in events]}))
