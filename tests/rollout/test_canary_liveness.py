"""A weight rises only on a canary that is demonstrably alive now (issue 35: a canary SIGKILLed
1–3 s into step 2's analysis was moved to 100 % in 4 of 5 drill runs, its analysis passed on
samples scraped before the kill).

Alive now means: the target says its servers are ready (pods Ready, or the local server
answering), every sample the measurement's query counts was scraped after the step began and its
weight took effect, and the last scrape of each of the canary's targets succeeded (`up == 1`, no
staleness marker, no scrape interval missed). Otherwise the measurement fails with cause
`canary-down` — and never counts toward the step's `count`, so a `failureLimit` that tolerates a
failure cannot let the weight rise on it.

Everything runs on fakes: a clock moved by hand, a backend that stores the state as JSON and
says whether the canary is ready, and a metric source standing in for a Prometheus that scrapes
the canary's one target every second — its samples are made from the clock, so each fault is a
change of what that Prometheus saw (its samples stop, its last scrape fails, its target is
dropped, its clock lags), not a flag the controller reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from reconciler.metrics.analysis import (
    Cause,
    Liveness,
    LivenessQueries,
    Readiness,
    Series,
    canary_down,
    liveness_queries,
    reach,
    render_query,
)
from reconciler.rollout.controller import Controller, Phase, RolloutState, machine
from renderers.seldon import ServingState
from specs import Endpoint, RolloutPolicy

V1, V2 = "a" * 12, "b" * 12
NAMESPACE = "forge-test"
ENDPOINT = Endpoint.model_validate({"apiVersion": "forge.dev/v1alpha1", "kind": "Endpoint", "metadata": {"name": "digits"},
                                    "spec": {"modelRef": "digits-mlp"}})
SUCCESS = {"name": "success-rate", "template": "success-rate", "min": 0.99, "interval": "2s", "window": "10s",
           "count": 3, "failureLimit": 1}
#: The canary's scrape target, as the Prometheus Operator's PodMonitor job labels it.
TARGET = {"job": f"{NAMESPACE}/digits", "instance": "10.0.0.7:8080", "namespace": NAMESPACE, "pod": "digits-canary-0"}


def policy(steps: list[dict[str, Any]] | None = None, **success: Any) -> RolloutPolicy:
    """The quick-start's three steps (10 → 50 → 100 %, 2 s pauses), analysed by the success rate
    (``success``: fields of its metric changed)."""
    return RolloutPolicy.model_validate({
        "apiVersion": "forge.dev/v1alpha1", "kind": "RolloutPolicy", "metadata": {"name": "p"},
        "spec": {"strategy": "canary", "canary": {"steps": steps if steps is not None else [
            {"weight": 10, "pause": "2s", "analysis": ["success-rate"]},
            {"weight": 50, "pause": "2s", "analysis": ["success-rate"]},
            {"weight": 100, "analysis": ["success-rate"]}]}, "metrics": [{**SUCCESS, **success}]}})


@dataclass
class Clock:
    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Backend:
    """The target: serving state, saved rollout state (as JSON), offline gate, and the canary's
    readiness (what its pods' Ready condition, or its server's readiness path, says now)."""

    serving_now: ServingState = field(default_factory=lambda: ServingState(V1, V2, 0))
    saved: dict[str, Any] | None = None
    ready: bool = True
    applied: list[tuple[float, ServingState]] = field(default_factory=list)
    asked_ready: int = 0
    clock: Clock = field(default_factory=Clock)

    def serving(self, endpoint: str) -> ServingState | None:
        return self.serving_now

    def load_state(self, endpoint: str) -> RolloutState | None:
        return RolloutState.from_json(self.saved) if self.saved is not None else None

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        self.saved = state.to_json()

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        self.serving_now = state
        self.applied.append((self.clock(), state))

    def model_gate(self, model: str, version: str, variant: str | None) -> tuple[bool, bool, str]:
        return True, True, "Workflow digits-mlp-b succeeded"

    def canary_ready(self, endpoint: str, version: str) -> Readiness:
        assert (endpoint, version) == ("digits", V2)
        self.asked_ready += 1
        return Readiness(True, "1 canary pod(s) Ready") if self.ready else Readiness(False, "1 of 1 canary pod(s) not Ready: digits-canary-0 (ContainersNotReady)")

    def event(self, endpoint: str, kind: str, reason: str, message: str) -> None:
        pass

    def canary_weights(self, after: float = -math.inf) -> list[int]:
        """The weights the canary was given at or after ``after`` (100 for a promotion)."""
        return [s.canary_weight if s.canary else (100 if s.stable == V2 else 0) for t, s in self.applied if t >= after]


@dataclass
class Scraper:
    """A metric source standing in for a Prometheus that scrapes the canary's target every
    ``every`` seconds (at whole multiples of it) since ``started``. It answers the analysis query
    with ``value`` and the liveness queries from the samples it holds; ``lag`` is how far its
    clock is behind the controller's."""

    clock: Clock
    policy: RolloutPolicy
    value_now: float | None = 1.0
    every: float = 1.0
    started: float = 0.0
    #: the last scrape that returned samples (None: every one up to now)
    last_sample: float | None = None
    #: `up` of the last scrape: 1, 0 (it failed), or None (the target was dropped: no `up` at all)
    up_now: float | None = 1.0
    #: a staleness marker was written: the series are gone from instant queries
    stale: bool = False
    lag: float = 0.0
    #: answers every query as at this moment (its clock and samples stopped there: a query cache
    #: that no longer moves), None: answers now
    frozen_at: float | None = None
    asked: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        metric = self.policy.spec.metrics[0]
        self.query = render_query(metric, endpoint="digits", namespace=NAMESPACE, version=V2, role="canary")
        self.queries: LivenessQueries = liveness_queries(endpoint="digits", namespace=NAMESPACE, role="canary",
                                                         reach=reach(metric, self.query))
        self.range = reach(metric, self.query)

    def value(self, query: str) -> float | None:
        assert query == self.query, f"unexpected query: {query}"
        self.asked.append(query)
        return self.value_now

    def _now(self) -> float:
        return self.clock() - self.lag if self.frozen_at is None else self.frozen_at

    def _times(self) -> list[float]:
        now = self._now()
        newest = now if self.last_sample is None else min(now, self.last_sample)
        first = max(self.started, now - self.range)
        t = math.floor(newest / self.every) * self.every
        out = []
        while t >= first:
            out.append(t)
            t -= self.every
        return sorted(out)

    def series(self, query: str) -> list[Series]:
        self.asked.append(query)
        now = self._now()
        labels = {"forge_endpoint": "digits", "forge_namespace": NAMESPACE, "forge_role": "canary", "forge_version": V2,
                  "code": "200", **TARGET}
        times = self._times()
        if query == self.queries.counted:
            return [Series({"__name__": "forge_requests_total", **labels}, tuple((t, 100.0 + t) for t in times))] if times else []
        if query == self.queries.current:
            return [] if self.stale or not times else [Series(labels, ((now, times[-1]),))]
        if query == self.queries.up:
            return [] if self.up_now is None else [Series(dict(TARGET), ((now, self.up_now),))]
        raise AssertionError(f"unexpected query: {query}")


@dataclass
class Rig:
    policy: RolloutPolicy
    clock: Clock = field(default_factory=Clock)
    backend: Backend = field(init=False)
    prometheus: Scraper = field(init=False)
    controller: Controller = field(init=False)

    def __post_init__(self) -> None:
        self.backend = Backend(clock=self.clock)
        self.prometheus = Scraper(self.clock, self.policy, started=self.clock.now - 60)
        self.controller = Controller(self.backend, self.prometheus, NAMESPACE, clock=self.clock)

    def reconcile(self) -> RolloutState:
        state = self.controller.reconcile(ENDPOINT, V2, "digits-mlp", self.policy)
        assert state is not None
        return state

    def drive(self, until: Callable[[RolloutState], bool], every: float = 0.5, passes: int = 400) -> RolloutState:
        for _ in range(passes):
            state = self.reconcile()
            if until(state):
                return state
            self.clock.now += every
        raise AssertionError(f"not reached in {passes} passes: {state.phase} {state.reason}")


def measured(step: int, n: int = 1) -> Callable[[RolloutState], bool]:
    """Step ``step`` (0-based) has ``n`` measurements of the success rate counted."""
    return lambda s: s.phase is Phase.PROGRESSING and s.step == step and s.runs.get("success-rate") is not None \
        and s.runs["success-rate"].measurements >= n


def final(state: RolloutState) -> bool:
    return state.phase in (Phase.PROMOTED, Phase.ROLLED_BACK)


def canary_down_measurements(state: RolloutState) -> list[dict[str, Any]]:
    return [h["measurement"] for h in state.history if h.get("measurement", {}).get("cause") == "canary-down"] + \
        [a for a in state.last_analysis if a.get("cause") == "canary-down"]


# -- the healthy case --------------------------------------------------------------------------------

def test_a_live_canary_with_fresh_series_is_promoted_step_by_step() -> None:
    r = Rig(policy())
    state = r.drive(final)
    assert state.phase is Phase.PROMOTED and state.stable == V2
    assert r.backend.canary_weights() == [10, 50, 100, 100]
    # Each step's first measurement waits until its whole 10 s window lies after the weight took
    # effect: no sample of the previous weight is ever counted.
    entered = [h["at"] for h in state.history if h["to"] == "Progressing"]
    assert entered[1] - entered[0] >= 10 + 2 * 2 and entered[2] - entered[1] >= 10 + 2 * 2
    assert r.prometheus.queries.counted in r.prometheus.asked and r.prometheus.queries.up in r.prometheus.asked
    assert canary_down_measurements(state) == []


def test_the_first_measurement_waits_for_a_window_entirely_inside_the_step() -> None:
    r = Rig(policy())
    entered = r.drive(lambda s: s.phase is Phase.PROGRESSING and s.step == 0)
    since = machine.since(entered)
    assert since >= entered.step_started
    while r.clock.now < since + 10 - 0.5:  # the 2 s pause is over, the 10 s window is not
        r.clock.now += 0.5
        run = r.reconcile().runs.get("success-rate")
        # checked for a breach only (the canary is healthy): nothing counted, nothing failed
        assert run is None or (run.measurements, run.failures) == (0, 0), run
    r.clock.now = since + 10
    assert r.reconcile().runs["success-rate"].measurements == 1


def test_a_breach_rolls_back_before_a_whole_window_lies_inside_the_step() -> None:
    # The canary's success rate falls below the rule at step 2: its window still reaches into
    # step 1, yet the breach is acted on within two intervals, not after a whole window.
    r = Rig(policy(window="60s"))
    entered = r.drive(lambda s: s.phase is Phase.PROGRESSING and s.step == 1)
    r.prometheus.value_now = 0.5
    at = r.clock.now
    state = r.drive(final)
    assert state.phase is Phase.ROLLED_BACK and state.step == 1, state.reason
    assert state.history[-1]["at"] - at <= 2 * 2 + 1, (state.history[-1]["at"] - at, state.reason)
    assert state.history[-1]["at"] < machine.since(entered) + 60  # before a whole window lay inside the step
    assert "before its window lay inside the step" in state.reason
    assert r.backend.canary_weights(after=at + 0.1) == [0]  # straight back from 50 %: never 100 %


def test_a_breach_check_never_completes_a_step() -> None:
    # With failureLimit 1 a single breach is tolerated; it is not a measurement toward `count`,
    # so the step still needs its three whole-window measurements before the weight rises.
    r = Rig(policy(window="20s"))
    entered = r.drive(lambda s: s.phase is Phase.PROGRESSING and s.step == 0)
    since = machine.since(entered)
    r.clock.now = since + 4
    r.prometheus.value_now = 0.5
    state = r.reconcile()
    assert state.runs["success-rate"].failures == 1 and state.runs["success-rate"].measurements == 0
    r.prometheus.value_now = 1.0
    state = r.drive(lambda s: s.step == 1 or s.phase in (Phase.ROLLED_BACK, Phase.PROMOTED))
    assert state.step == 1 and state.phase is Phase.PROGRESSING, state.reason
    assert state.history[-1]["at"] >= since + 20 + 2 * 2  # three whole windows' measurements, 2 s apart


# -- the faults: each a failure `canary-down`, and the weight never rises ----------------------------------

def fault_at_step_2(r: Rig, fault: Callable[[Rig], None]) -> tuple[RolloutState, float]:
    """Drive to step 2 (50 %) with one measurement counted, inject ``fault``, drive to the end."""
    r.drive(measured(1, 1))
    fault(r)
    at = r.clock.now
    return r.drive(final), at


def frozen(r: Rig) -> None:
    # Prometheus holds samples up to 3 s ago and nothing since, without a staleness marker (it lost
    # the target across its own restart): the instant queries still see the series and `up == 1`.
    r.prometheus.last_sample = r.clock.now - 3


def scrape_failed(r: Rig) -> None:
    r.prometheus.up_now, r.prometheus.stale = 0.0, True


def scrape_failed_marker_not_seen(r: Rig) -> None:
    r.prometheus.up_now = 0.0  # `up` already 0, the series' staleness marker not yet read back


def target_missing(r: Rig) -> None:
    r.prometheus.up_now = None  # dropped from service discovery: no `up` at all


def series_stale(r: Rig) -> None:
    r.prometheus.stale = True  # `up == 1`, but the scrape no longer returns the canary's series


def not_ready(r: Rig) -> None:
    r.backend.ready = False  # killed a second ago: Prometheus has not scraped since, all looks fine there


@pytest.mark.parametrize("fault, says", [
    (frozen, "more than two scrape intervals"),
    (scrape_failed, "the last scrape of 10.0.0.7:8080 failed (up == 0)"),
    (scrape_failed_marker_not_seen, "the last scrape of 10.0.0.7:8080 failed (up == 0)"),
    (target_missing, "its scrape target 10.0.0.7:8080 (job forge-test/digits) is missing"),
    (series_stale, "its series are stale"),
    (not_ready, "not ready (1 of 1 canary pod(s) not Ready: digits-canary-0 (ContainersNotReady))"),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_a_canary_not_alive_now_fails_its_measurements_and_its_weight_never_rises(
        fault: Callable[[Rig], None], says: str) -> None:
    r = Rig(policy())
    state, at = fault_at_step_2(r, fault)
    assert state.phase is Phase.ROLLED_BACK and state.step == 1, state.reason
    assert r.backend.canary_weights(after=at) == [0]  # straight back to stable: never 100 %
    assert r.backend.canary_weights() == [10, 50, 0]
    down = state.history[-1]["measurement"]
    assert down["cause"] == "canary-down" and down["verdict"] == "fail" and down["value"] == 1.0
    assert says in down["detail"] and "canary down" in state.reason
    # The value was a pass (1 ≥ 0.99): what failed it was the canary, twice, `interval` apart.
    assert "2 failed measurements > failureLimit 1" in state.reason
    assert r.clock.now - at <= 2 * 2 + 0.5


@pytest.mark.parametrize("lag, says", [
    (4.0, "4 s before the controller's clock (1024.000): its clock is behind, or its answers are frozen"),
    (-4.0, "4 s after the controller's clock"),
], ids=["prometheus-behind", "prometheus-ahead"])
def test_clocks_out_of_step_hold_the_weight_and_name_the_skew(lag: float, says: str) -> None:
    """Prometheus's clock 4 s behind the controller's (its window would count samples of step 1,
    at 10 %) or 4 s ahead (samples scraped before the weight took effect would read as after it):
    the windows cannot be lined up with the step, so each measurement is inconclusive with cause
    `clock-skew`, naming by how much and which way — the rollout holds at its weight, it never
    passes a measurement on a misaligned window."""
    r = Rig(policy())
    entered = r.drive(lambda s: s.phase is Phase.PROGRESSING and s.step == 1)
    r.prometheus.lag = lag
    r.clock.now = 1_024.0 - 0.5 if lag > 0 else r.clock.now
    state = r.drive(lambda s: s.phase is Phase.HOLDING)
    for _ in range(40):  # 20 s more: still held, never promoted, never rolled back
        r.clock.now += 0.5
        state = r.reconcile()
    assert state.phase is Phase.HOLDING and state.step == 1, state.reason
    assert r.backend.canary_weights(after=entered.step_started) == [50]
    [m] = [a for a in state.last_analysis if a["metric"] == "success-rate"]
    assert m["cause"] == "clock-skew" and m["verdict"] == "inconclusive" and "clocks out of step" in m["detail"]
    assert (says if lag < 0 else "s before the controller's clock") in m["detail"]
    assert state.runs["success-rate"].measurements == 0 and state.runs["success-rate"].inconclusive_in_a_row >= 10


def test_answers_frozen_at_one_moment_never_pass() -> None:
    """Prometheus (or a query cache in front of it) answering every query as it did at one moment —
    the same evaluation time and samples forever — is out of step with the controller's clock a
    second later: inconclusive, and with `inconclusiveLimit` the rollout is rolled back, never
    promoted on the frozen value (1 ≥ 0.99)."""
    r = Rig(policy(inconclusiveLimit=5))
    r.drive(measured(1, 1))
    frozen_at = r.clock.now
    r.prometheus.frozen_at = frozen_at
    state = r.drive(final)
    assert state.phase is Phase.ROLLED_BACK and state.step == 1, state.reason
    assert r.backend.canary_weights(after=frozen_at) == [0]
    assert "success-rate inconclusive 5 times in a row" in state.reason and "its answers are frozen" in state.reason
    last = state.history[-1]["measurement"]
    assert last["cause"] == "clock-skew" and last["verdict"] == "inconclusive" and last["value"] == 1.0


def test_a_failure_the_limit_tolerates_does_not_complete_the_step() -> None:
    """failureLimit 1 tolerates one failed measurement — but a `canary-down` one never counts
    toward `count`: after two passes and a dead canary the step is not complete, so the weight
    does not rise even though the run's failures are within the limit."""
    r = Rig(policy())
    state = r.drive(measured(1, 2))
    r.backend.ready = False
    r.clock.now += 2
    state = r.reconcile()
    run = state.runs["success-rate"]
    assert (run.measurements, run.failures) == (2, 1) and state.step == 1 and state.weight == 50
    assert r.backend.canary_weights()[-1] == 50
    r.backend.ready = True  # back (a pod restarted): measured again, the step completes, on to 100 %
    state = r.drive(lambda s: s.step == 2 or final(s))
    assert state.phase is Phase.PROGRESSING and state.step == 2 and r.backend.canary_weights()[-1] == 100


def test_without_a_value_the_canary_is_not_asked_about() -> None:
    """No data is inconclusive (Holding), as before: the liveness queries are for a value only."""
    r = Rig(policy())
    r.prometheus.value_now = None
    state = r.drive(lambda s: s.phase is Phase.HOLDING)
    assert [q for q in r.prometheus.asked if q != r.prometheus.query] == []
    assert state.weight == 10


# -- the moments a weight rises without a measurement ------------------------------------------------------

def test_the_first_step_waits_for_a_ready_canary() -> None:
    r = Rig(policy())
    r.backend.ready = False
    for _ in range(5):
        state = r.reconcile()
        r.clock.now += 1
    assert state.phase is Phase.WAITING and r.backend.applied == []
    assert "waiting for the canary to be ready: 1 of 1 canary pod(s) not Ready" in state.reason
    r.backend.ready = True
    assert r.reconcile().phase is Phase.PROGRESSING and r.backend.canary_weights() == [10]


def test_a_step_without_analysis_holds_its_weight_until_the_canary_is_ready() -> None:
    r = Rig(policy([{"weight": 10, "pause": "2s"}, {"weight": 50, "pause": "2s"}, {"weight": 100, "analysis": ["success-rate"]}]))
    r.drive(lambda s: s.step == 1)
    r.backend.ready = False
    r.clock.now += 3  # the pause is over: the step would be complete
    state = r.reconcile()
    assert state.phase is Phase.HOLDING and state.step == 1 and r.backend.canary_weights()[-1] == 50
    assert "step 2 passed (no analysis) but the canary is not ready now" in state.reason
    for _ in range(4):
        r.clock.now += 1
        assert r.reconcile().weight == 50
    r.backend.ready = True
    r.clock.now += 1
    state = r.reconcile()
    assert state.phase is Phase.PROGRESSING and state.step == 2 and r.backend.canary_weights()[-1] == 100


def test_readiness_is_asked_once_a_pass() -> None:
    r = Rig(policy())
    r.drive(measured(0, 1))
    r.backend.asked_ready = 0
    r.clock.now += 2
    r.reconcile()  # a measurement and (not yet) a complete step: one question
    assert r.backend.asked_ready == 1


# -- the state: when the weight took effect ---------------------------------------------------------------

def test_the_state_records_when_the_weight_took_effect_and_reads_old_states() -> None:
    r = Rig(policy())
    state = r.drive(lambda s: s.phase is Phase.PROGRESSING)
    assert state.weight_at == r.backend.applied[-1][0] and machine.since(state) == state.weight_at
    old = {k: v for k, v in state.to_json().items() if k != "weight_at"}  # saved before it was recorded
    loaded = RolloutState.from_json(old)
    assert loaded.weight_at == 0.0 and machine.since(loaded) == loaded.step_started


# -- the pure check, case by case ------------------------------------------------------------------------

def _live(**kw: Any) -> Liveness:
    queries = liveness_queries(endpoint="digits", namespace=NAMESPACE, role="canary", reach=10.0)
    series = {"forge_role": "canary", **TARGET}
    base: dict[str, Any] = {
        "readiness": Readiness(True, "ready"), "queries": queries,
        "counted": (Series({"__name__": "forge_requests_total", **series}, tuple((float(t), 1.0) for t in range(101, 111))),),
        "current": (Series(series, ((110.5, 110.0),)),), "up": (Series(dict(TARGET), ((110.5, 1.0),)),), "since": 100.0}
    return Liveness(**{**base, **kw})


def test_canary_down_names_each_reason() -> None:
    assert canary_down(_live()) is None
    assert "not ready (gone)" in (canary_down(_live(readiness=Readiness(False, "gone"))) or "")
    assert "no samples of its series" in (canary_down(_live(counted=())) or "")
    assert "missing" in (canary_down(_live(up=())) or "")
    assert "failed (up == 0)" in (canary_down(_live(up=(Series(dict(TARGET), ((110.5, 0.0),)),))) or "")
    assert "stale" in (canary_down(_live(current=())) or "")
    assert "0.5 s before the step began" in (canary_down(_live(since=101.5)) or "")
    assert "more than two scrape intervals" in (canary_down(_live(up=(Series(dict(TARGET), ((113.5, 1.0),)),))) or "")


def test_a_prometheus_resumed_after_a_pause_is_not_taken_for_a_missed_scrape() -> None:
    # The CI failure this guards: Prometheus resumed from a pause scrapes at once, 0.3 s after its
    # last regular scrape, and the next regular scrape is 0.85 s away. That one short gap is not
    # the scrape interval (1 s): the last sample is fresh.
    times = (*range(101, 110), 109.3)
    series = {"__name__": "forge_requests_total", "forge_role": "canary", **TARGET}
    resumed = (Series(series, tuple((float(t), 1.0) for t in times)),)
    assert canary_down(_live(counted=resumed, up=(Series(dict(TARGET), ((110.15, 1.0),)),))) is None
    # ... while two missed 1 s scrapes are still seen, whatever the one short gap.
    assert "more than two scrape intervals" in (
        canary_down(_live(counted=resumed, up=(Series(dict(TARGET), ((111.5, 1.0),)),))) or "")

def test_reach_is_the_window_or_the_longest_range_the_query_counts() -> None:
    from specs.rollout import Metric

    m = Metric.model_validate({**SUCCESS, "template": None,
                               "query": 'sum(rate(forge_requests_total{forge_role="{role}"}[{window}] offset 30s))', "min": 0.9})
    assert reach(m, m.render(endpoint="e", namespace="n", version="v", role="canary")) == 40.0
    plain = Metric.model_validate(SUCCESS)
    assert reach(plain, plain.render(endpoint="e", namespace="n", version="v", role="canary")) == 10.0
    assert Cause.CANARY_DOWN.verdict.value == "fail"
