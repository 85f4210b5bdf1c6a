"""The faults a rollout controller meets from its Prometheus (issue 35), one short run each, against
the real components of test_rollout_controller.py: the API server, Debian's Prometheus scraping
the real model servers every second, and the traffic split by the live weights.

* **Prometheus hung, not down**: the real server SIGSTOPped — its port still accepts connections,
  nothing answers, so each query times out instead of being refused. `onPrometheusUnreachable:
  hold` holds the rollout at its weight, the outage does not count toward `inconclusiveLimit`,
  and it goes on once the server is continued (SIGCONT).
* **Prometheus answering bad data**: :mod:`devkit.prometheus_faults` in front of the real server
  answers the analysis queries with NaN, an empty vector, HTTP 503, then every query frozen at one
  moment, then +Inf. Each is judged by the policy's rule — inconclusive (`no-data`,
  `unreachable`, `clock-skew`) or failed (`above-max` on latency's +Inf) — never passed: the
  weight never rises while it lasts, and the last one rolls the canary back.
* **Clock skew**: the controller's clock 5 s ahead of Prometheus's (its injectable clock; the bench
  drill runs the CLI under Debian's libfaketime): the windows cannot be lined up with the step, so
  the skew is detected and named (`clock-skew`, inconclusive) and the rollout holds at its weight.
* **etcd down, then out of space, mid-rollout** (one rollout under the real `forgectl reconcile
  --watch`): etcd SIGKILLed at step 1 and left down 15 s — nothing moves while the API server
  answers 5xx (a failed pass, or a write not sent once the Lease's fencing deadline passed); at
  step 2 its NOSPACE alarm for 15 s (every write refused, reads served), then disarmed — the watch
  says the cluster refuses writes for want of space and holds (no rollback, no exit). The rollout
  goes on to the promotion from the same step after each.
* **A canary that degrades late**: healthy for its first 120 requests (`faultInjection.afterRequests`,
  so through step 1), then 5 % errors early in step 2: rolled back at step 2, where it degraded —
  never a weight above 50 % after its first failure.

The faults are set when the rollout reaches a state (a measurement counted at step 1), never at a
time; each wait is bounded. The goal of each: 0 requests to stable lost, 0 wrong promotions.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from devkit.prometheus_faults import BadDataPrometheus, Fault
from devkit.rollout import Traffic
from devkit.rollout_harness import Rollout
from reconciler.rollout.controller import Phase, RolloutState
from tests.polling import wait_until
from tests.rollout.test_rollout_controller import rollout, start_traffic  # noqa: F401 — the fixture, shared

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.runtime, pytest.mark.slow]


class Driver:
    """The rollout controller, one pass at a time (as `reconcile --watch --interval 0.5` runs them),
    the traffic following the live weight; every state and every weight the canary got recorded."""

    def __init__(self, r: Rollout, traffic: Traffic, skew: float = 0.0) -> None:
        self.r, self.traffic = r, traffic
        self.controller, self.backend, self.endpoint, self.policy, self.version = r.controller()
        if skew:
            self.controller.clock = lambda: time.time() + skew
        self.states: list[RolloutState] = []
        #: (time.monotonic(), the canary's live weight) after each pass
        self.weights: list[tuple[float, int]] = []

    def one_pass(self) -> RolloutState:
        self.backend.refresh()
        state = self.controller.reconcile(self.endpoint, self.version, "digits-mlp", self.policy)
        assert state is not None
        serving = self.backend.serving("digits")
        weight = serving.canary_weight if serving and serving.canary else (100 if state.phase is Phase.PROMOTED else 0)
        self.traffic.weight = weight if serving and serving.canary else 0
        self.states.append(state)
        self.weights.append((time.monotonic(), weight))
        return state

    def until(self, pred: Callable[[RolloutState], bool], timeout: float, what: str) -> RolloutState:
        seen: list[RolloutState] = []

        def check() -> bool:
            seen.append(self.one_pass())
            return pred(seen[-1])

        try:
            wait_until(check, timeout, what, interval=0.5)
        except Exception as exc:
            raise AssertionError(f"{exc}; the last state: {seen[-1] if seen else None}") from None
        return seen[-1]

    def weights_since(self, t: float) -> list[int]:
        return [w for at, w in self.weights if at >= t]


def counted_at(state: RolloutState, step: int) -> bool:
    """Step ``step`` (0-based) entered and one success-rate measurement counted in it."""
    run = state.runs.get("success-rate")
    return state.phase is Phase.PROGRESSING and state.step == step and run is not None and run.measurements >= 1


def counted_at_step_1(state: RolloutState) -> bool:
    """Step 1 (10 %) entered and one success-rate measurement counted: the analysis runs on data."""
    return counted_at(state, 0)


def measured_since(state: RolloutState, t: float) -> bool:
    """Every metric of the last analysis measured at or after ``t`` (wall clock)."""
    return bool(state.last_analysis) and all(a["at"] >= t for a in state.last_analysis)


def causes(state: RolloutState) -> dict[str, str]:
    return {a["metric"]: a["cause"] for a in state.last_analysis}


def stable_lost(traffic: Traffic) -> dict[str, object]:
    tally = traffic.tally("stable")
    assert tally.sent > 100, tally  # the denominator: stable was asked throughout
    return tally.to_json()


def test_prometheus_hung_holds_the_weight_then_resumes(rollout: Rollout, server_factory) -> None:  # noqa: F811
    rollout.finish_workflow(rollout.canary)
    traffic = start_traffic(rollout, server_factory)
    d = Driver(rollout, traffic)
    try:
        entered = d.until(counted_at_step_1, 90, "a measurement counted at step 1")
        inconclusive = entered.runs["success-rate"].inconclusive_in_a_row
        rollout.prometheus.freeze()
        frozen = time.monotonic()
        held = d.until(lambda s: s.phase is not Phase.PROGRESSING, 60, "the controller to notice the hang")
        assert held.phase is Phase.HOLDING and held.step == 0, held.reason
        assert causes(held)["success-rate"] == "unreachable" and "Prometheus unreachable" in held.reason
        assert "timed out" in held.reason.lower() or "timeout" in held.reason.lower(), held.reason  # a hang, not a refusal
        # Two more passes while it hangs (each waits out the client's timeouts): held, not counted.
        for _ in range(2):
            again = d.one_pass()
            assert again.phase is Phase.HOLDING and again.weight == 10, again.reason
            assert again.runs["success-rate"].inconclusive_in_a_row == inconclusive  # `hold`: an outage is not "no data"
        assert set(d.weights_since(frozen)) == {10}
        rollout.prometheus.thaw()
        done = d.until(lambda s: s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK), 120, "the end of the rollout")
    finally:
        rollout.prometheus.thaw()
        traffic.stop.set()
    assert done.phase is Phase.PROMOTED, done.reason
    left = next(h for h in done.history if h["from"] == "Holding")
    assert "has data again" in left["reason"] and left["to"] == "Progressing"
    tally = stable_lost(traffic)
    assert tally["failed"] == 0, tally


def test_bad_data_is_never_a_pass(rollout: Rollout, server_factory) -> None:  # noqa: F811
    rollout.finish_workflow(rollout.canary)
    traffic = start_traffic(rollout, server_factory)
    bad = BadDataPrometheus(rollout.prometheus.url)
    d = Driver(dataclasses.replace(rollout, prometheus=bad), traffic)
    seen: dict[str, dict[str, str]] = {}
    try:
        d.until(counted_at_step_1, 90, "a measurement counted at step 1")
        began = time.monotonic()
        # Each fault until both metrics were measured under it; each answer is inconclusive.
        for fault, expected in ((Fault.NAN, {"success-rate": "no-data", "latency-p99": "no-data"}),
                                (Fault.EMPTY, {"success-rate": "no-data", "latency-p99": "no-data"}),
                                (Fault.UNAVAILABLE, {"success-rate": "unreachable", "latency-p99": "unreachable"}),
                                (Fault.FROZEN, {"success-rate": "clock-skew", "latency-p99": "clock-skew"})):
            bad.set(fault)
            t_set = time.time()
            state = d.until(lambda s, e=expected, t=t_set: causes(s) == e and measured_since(s, t), 60,
                            f"both metrics measured under {fault.value}")
            assert state.phase is Phase.HOLDING and state.step == 0 and state.weight == 10, (fault, state.reason)
            seen[fault.value] = causes(state)
            assert bad.served(fault) >= 2
        # +Inf: success-rate ≥ 0.99 cannot judge it (not-finite), latency's max can (above-max):
        # two failures > failureLimit 1 roll the canary back.
        bad.set(Fault.INF)
        done = d.until(lambda s: s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK), 60, "the end of the rollout under +Inf")
    finally:
        traffic.stop.set()
        bad.close()
    assert done.phase is Phase.ROLLED_BACK and done.step == 0, done.reason
    assert "latency-p99 inf > 2" in done.reason and "2 failed measurements > failureLimit 1" in done.reason
    assert "success-rate" in {h.get("measurement", {}).get("metric") for h in done.history}
    assert any(a["cause"] == "not-finite" for s in d.states for a in s.last_analysis), "success-rate's +Inf was judged"
    # never a pass: the canary's weight never rose after the first fault, and no step was entered
    assert set(d.weights_since(began)) <= {10, 0}, d.weights_since(began)
    assert max(s.step for s in d.states) == 0
    tally = stable_lost(traffic)
    assert tally["failed"] == 0, tally


def test_a_skewed_controller_clock_is_named_and_holds_the_weight(rollout: Rollout, server_factory) -> None:  # noqa: F811
    rollout.finish_workflow(rollout.canary)
    traffic = start_traffic(rollout, server_factory)
    d = Driver(rollout, traffic, skew=5.0)
    try:
        held = d.until(lambda s: s.phase in (Phase.HOLDING, Phase.PROMOTED, Phase.ROLLED_BACK), 90,
                       "the first measurement at step 1 to hold the rollout")
        entered = time.monotonic()
        for _ in range(6):  # three measurements more (2 s apart): held at step 1, each named
            held = d.one_pass()
            time.sleep(0.5)
    finally:
        traffic.stop.set()
    assert held.phase is Phase.HOLDING and held.step == 0 and held.weight == 10, held.reason
    assert set(causes(held).values()) == {"clock-skew"}, held.last_analysis
    assert "s before the controller's clock" in held.reason and "clocks out of step" in held.reason
    assert held.runs["success-rate"].measurements == 0  # nothing counted on a misaligned window
    assert set(d.weights_since(entered)) == {10}
    tally = stable_lost(traffic)
    assert tally["failed"] == 0, tally


#: The canary's inference requests answered healthy before it degrades. The traffic is paced (40
#: a second, whatever the machine's load): at 10 % step 1 takes some 15 s, about 60 requests, and
#: would need 30 s to reach this; at 50 % (20 a second) the rest goes some 3 s into step 2, before
#: the first of its measurements (its whole window inside the step: 10 s in) — so at least two of
#: step 2's three measurements see the errors, more than failureLimit 1. (Unpaced, a loaded
#: machine sent so few that the canary degraded with only step 2's last measurement ahead, and
#: one failure is within failureLimit: step 2 rightly passed and step 3 caught it.)
LATE_AFTER_REQUESTS = 120


def test_a_canary_that_degrades_late_is_caught_at_the_step_where_it_degrades(rollout: Rollout, server_factory) -> None:  # noqa: F811
    rollout.finish_workflow(rollout.canary)
    # 5 % errors, from its 121st request on (faultInjection.afterRequests): healthy through step 1
    traffic = start_traffic(rollout, server_factory, canary_error_rate=0.05,
                            canary_delay={"afterRequests": LATE_AFTER_REQUESTS}, paced=True)
    d = Driver(rollout, traffic)
    try:
        done = d.until(lambda s: s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK), 150, "the end of the rollout")
    finally:
        traffic.stop.set()
    canary = [s for s in list(traffic.log) if s.role == "canary"]
    failed = [s for s in canary if not s.ok]
    assert failed, "the canary never failed: it was not asked past its healthy requests"
    degraded = failed[0].at
    # the weight the traffic went by when the canary began failing: the one of the pass before it
    at_degradation = [w for t, w in d.weights if t <= degraded][-1]
    assert sum(1 for s in canary if s.at < degraded) >= LATE_AFTER_REQUESTS  # healthy until then
    assert at_degradation == 50, f"degraded at {at_degradation} %, not late in the rollout (step 2)"
    assert any(h["reason"].startswith("step 1 passed") for h in done.history), "step 1 passed on healthy data"
    # caught there: rolled back from step 2 on success-rate, never a weight above 50 % after it began failing
    assert done.phase is Phase.ROLLED_BACK and done.step == 1, done.reason
    assert "success-rate" in done.reason and "failureLimit 1" in done.reason, done.reason
    assert max(d.weights_since(degraded)) <= 50 and max(s.step for s in d.states) == 1, d.weights_since(degraded)
    tally = stable_lost(traffic)
    assert tally["failed"] == 0, tally


def test_etcd_down_then_out_of_space_mid_rollout_moves_nothing_and_the_watch_goes_on(
        rollout: Rollout, server_factory, kube_cluster) -> None:  # noqa: F811
    """The real `forgectl reconcile --watch` walks the canary through two etcd faults, each once a
    measurement is counted in its step: at step 1 (10 %) etcd SIGKILLed and left down 15 s (the
    API server stays up and answers 5xx); at step 2 (50 %) etcd up but out of space — its NOSPACE
    alarm raised for 15 s (every write refused, reads served), then disarmed as its operator does.
    Through each the watch says why (the cluster did not answer; the cluster refuses every write —
    or a write not sent past the Lease's fencing deadline) and moves nothing: no transition dated
    inside, no rollback, no exit. Then it goes on from the same step to the promotion, each step
    entered once, with 0 requests to stable lost."""
    if kube_cluster.external:
        pytest.skip("needs the test cluster's own etcd process (FORGE_TEST_CLUSTER names another)")

    def out_of_space() -> None:
        kube_cluster.raise_etcd_nospace()
        try:
            time.sleep(15)
        finally:
            assert kube_cluster.disarm_etcd_alarms() == ["NOSPACE"]

    faults: list[tuple[int, int, Callable[[], None], str]] = [  # (step, its weight, the fault, what the watch says)
        (0, 10, lambda: kube_cluster.restart_etcd(down_seconds=15), "the cluster did not answer, nothing moved"),
        (1, 50, out_of_space, "the cluster refuses every write (its etcd is out of space), nothing moved"),
    ]
    rollout.finish_workflow(rollout.canary)
    traffic = start_traffic(rollout, server_factory)
    _, backend, *_ = rollout.controller()
    cmd = [sys.executable, "-m", "forgectl", "reconcile", str(rollout.specs_dir), "--env", "cluster", "-n", rollout.namespace,
           "--kubeconfig", rollout.kubeconfig, "--watch", "--interval", "0.5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "NO_COLOR": "1"})

    def state_now() -> RolloutState | None:
        if proc.poll() is not None:
            raise AssertionError(f"forgectl reconcile exited {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        backend.refresh()
        serving = backend.serving("digits")
        traffic.weight = serving.canary_weight if serving and serving.canary else 0
        return backend.load_state("digits")

    windows: list[tuple[float, float, RolloutState]] = []
    try:
        for step, _, fault, _ in faults:
            before = wait_until(lambda step=step: (s := state_now()) is not None and counted_at(s, step) and s, 120,
                                f"a measurement counted at step {step + 1}", interval=0.3)
            down = time.time()
            fault()
            windows.append((down, time.time(), before))
        done = wait_until(lambda: (s := state_now()) is not None and s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK) and s,
                          180, "the rollout to end after the faults", interval=0.5)
    finally:
        traffic.stop.set()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert done.phase is Phase.PROMOTED, (done.reason, out[-3000:])
    # the watch said why; when the Lease's renewals failed past its fencing deadline, a write was
    # not sent and the lock let go, then taken again once etcd wrote again
    for _, _, _, said in faults:
        assert said in out or "not sent: the environment's Lease" in out, out[-3000:]
    assert out.count("leading — this watch alone moves the rollouts") >= (2 if "not sent" in out else 1), out[-3000:]
    for (down, back, before), (_, weight, _, _) in zip(windows, faults, strict=True):
        # nothing was decided during a fault: every transition before it or after its end
        assert not [h for h in done.history if down < h["at"] < back], done.history
        assert before.weight == weight and [h for h in done.history if h["at"] <= down][-1]["weight"] <= weight, done.history
    for n in (1, 2, 3):  # each step entered once
        assert len([h for h in done.history if h["to"] == "Progressing" and f"step {n}/3:" in h["reason"]]) == 1, done.history
    tally = stable_lost(traffic)
    assert tally["failed"] == 0, tally
