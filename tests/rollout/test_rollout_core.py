"""Every transition of the rollout state machine, with a fake clock, a fake target and a fake
metric source: no server, no sleep, each test a few milliseconds.

The fakes stand in for what the end-to-end tests (test_rollout_controller.py) run for real; they
keep only what the controller relies on. The backend stores the state as JSON, as both targets do,
so every pass also exercises the save/load round trip; the metric source answers only the exact
queries it expects (endpoint, namespace, version and role filled in), so a wrong query fails.
"""

from __future__ import annotations

import ast
import math
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import urllib3.util.connection
import urllib3.util.retry

from reconciler.errors import ConflictError
from reconciler.metrics.analysis import Cause, Readiness, Series, Verdict, judge, liveness_queries, reach, render_query
from reconciler.metrics.prometheus import Prometheus, PrometheusUnavailable
from reconciler.rollout.controller import Controller, Phase, RolloutState, machine
from renderers.seldon import ServingState
from specs import Endpoint, RolloutPolicy
from specs.rollout import Metric

ROOT = Path(__file__).resolve().parents[2]
V1, V2, V3 = "a" * 12, "b" * 12, "c" * 12
NAMESPACE = "forge-test"
DOWN = "down"  # an answer of the fake source: raise PrometheusUnavailable
Answer = float | None | str

ENDPOINT = Endpoint.model_validate({"apiVersion": "forge.dev/v1alpha1", "kind": "Endpoint", "metadata": {"name": "digits"},
                                    "spec": {"modelRef": "digits-mlp", "variant": "int8"}})
SUCCESS = {"name": "success-rate", "template": "success-rate", "min": 0.99, "interval": "2s", "window": "10s",
           "count": 3, "failureLimit": 1}
LATENCY = {"name": "latency-p99", "template": "latency-p99", "max": 0.2, "interval": "2s", "window": "10s",
           "count": 3, "failureLimit": 1}
#: Their window: a step's first measurement waits until it lies after the step's weight took effect.
WINDOW = 10.0


def policy(steps: list[dict[str, Any]] | None = None, metrics: list[dict[str, Any]] | None = None,
           unreachable: str = "hold", blue_green: dict[str, Any] | None = None, **spec: Any) -> RolloutPolicy:
    """The quick-start's three-step canary (10 → 50 → 100 %, 5 s pauses), or what the arguments say."""
    if blue_green is not None:
        strategy: dict[str, Any] = {"strategy": "blueGreen", "blueGreen": blue_green}
    else:
        strategy = {"strategy": "canary", "canary": {"steps": steps if steps is not None else [
            {"weight": 10, "pause": "5s", "analysis": ["success-rate", "latency-p99"]},
            {"weight": 50, "pause": "5s", "analysis": ["success-rate", "latency-p99"]},
            {"weight": 100, "analysis": ["success-rate"]}]}}
    return RolloutPolicy.model_validate({
        "apiVersion": "forge.dev/v1alpha1", "kind": "RolloutPolicy", "metadata": {"name": "p"},
        "spec": {**strategy, "metrics": metrics if metrics is not None else [SUCCESS, LATENCY],
                 "onPrometheusUnreachable": unreachable, **spec}})


def one_step(metric: dict[str, Any] | None = None, **spec: Any) -> RolloutPolicy:
    """One canary step at 10 % (no pause) analysed by one metric, then 100 %: the smallest policy
    that exercises the analysis."""
    metric = metric or SUCCESS
    return policy([{"weight": 10, "analysis": [metric["name"]]}, {"weight": 100}], [metric], **spec)


@dataclass
class Clock:
    """The controller's clock, moved by hand."""

    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeBackend:
    """The target as the controller sees it: serving state, saved rollout state, offline gate, events."""

    serving_now: ServingState | None = field(default_factory=lambda: ServingState(V1, V2, 0))
    gate: tuple[bool, bool, str] = (True, True, "Workflow digits-mlp-b succeeded: evaluation thresholds met")
    saved: dict[str, Any] | None = None
    saves: int = 0
    applied: list[ServingState] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    #: The registry records by version (what the regression gate compares).
    records: dict[str, dict[str, Any]] = field(default_factory=dict)

    def serving(self, endpoint: str) -> ServingState | None:
        return self.serving_now

    def registered(self, model: str, version: str) -> dict[str, Any] | None:
        return self.records.get(version)

    def load_state(self, endpoint: str) -> RolloutState | None:
        return RolloutState.from_json(self.saved) if self.saved is not None else None

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        self.saved = state.to_json()
        self.saves += 1

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        self.serving_now = state  # what the re-applied SeldonDeployment then reads back as
        self.applied.append(state)

    def model_gate(self, model: str, version: str, variant: str | None) -> tuple[bool, bool, str]:
        return self.gate

    def canary_ready(self, endpoint: str, version: str) -> Readiness:
        return Readiness(True, "its server answers")  # the canary's liveness: tests/rollout/test_canary_liveness.py

    def event(self, endpoint: str, kind: str, reason: str, message: str) -> None:
        self.events.append((kind, reason, message))



class FakePrometheus:
    """A metric source that answers the exact queries the controller should ask, per metric and role."""

    def __init__(self, policy: RolloutPolicy) -> None:
        self.metrics = {m.name: m for m in policy.spec.metrics}
        self.answers: dict[str, Answer] = {}
        self.asked: list[str] = []
        #: Whether the canary's own series are fresh (not stale); the controller's liveness
        #: queries are answered from this, with samples of the last second of ``clock``, and kept
        #: apart from ``asked``.
        self.canary_up = True
        self.liveness_asked: list[str] = []
        self.clock: Callable[[], float] = Clock()
        self.liveness = {liveness_queries(endpoint="digits", namespace=NAMESPACE, role="canary",
                                          reach=reach(m, self.query(m.name))).counted for m in self.metrics.values()}

    def query(self, metric: str, role: str = "canary", version: str | None = None) -> str:
        version = version or (V2 if role == "canary" else V1)
        return render_query(self.metrics[metric], endpoint="digits", namespace=NAMESPACE, version=version, role=role)

    def set(self, metric: str, answer: Answer, role: str = "canary", version: str | None = None) -> None:
        self.answers[self.query(metric, role, version)] = answer

    def healthy(self) -> FakePrometheus:
        for name in self.metrics:
            self.set(name, 0.01 if name == "latency-p99" else 1.0)
        return self

    def series(self, query: str) -> list[Series]:
        self.liveness_asked.append(query)
        now, labels = self.clock(), {"forge_role": "canary", "job": f"{NAMESPACE}/digits", "instance": "10.0.0.7:8080"}
        if query in self.liveness:  # the counted samples
            return [Series({"__name__": "forge_requests_total", **labels}, ((now - 1, 1.0), (now, 2.0)))]
        if query.startswith("timestamp("):  # the series not stale now
            return [Series(labels, ((now, now),))] if self.canary_up else []
        assert query.startswith("up and on(job, instance) "), f"unexpected query: {query}"
        return [Series(labels, ((now, 1.0),))]

    def value(self, query: str) -> float | None:
        self.asked.append(query)
        if query not in self.answers:
            raise AssertionError(f"unexpected query: {query}")
        answer = self.answers[query]
        if answer == DOWN:
            raise PrometheusUnavailable("http://prometheus:9090: ConnectionError: connection refused")
        assert not isinstance(answer, str)
        return answer


@dataclass
class Rig:
    """A controller on fakes, and the desired version the specs build."""

    policy: RolloutPolicy | None
    backend: FakeBackend = field(default_factory=FakeBackend)
    prometheus: FakePrometheus | None = None
    clock: Clock = field(default_factory=Clock)
    desired: str = V2
    rollbacks: list[RolloutState] = field(default_factory=list)
    controller: Controller = field(init=False)

    def __post_init__(self) -> None:
        self.controller = self.new_controller()

    def new_controller(self) -> Controller:
        """A fresh controller on the same target: nothing carried over in memory."""
        def hook(endpoint: Endpoint, state: RolloutState) -> str:
            self.rollbacks.append(state)
            return f"committed 0123456789ab on branch forge/rollback-{endpoint.name}"

        return Controller(self.backend, self.prometheus, NAMESPACE, on_rollback=hook, clock=self.clock)

    def reconcile(self) -> RolloutState:
        state = self.controller.reconcile(ENDPOINT, self.desired, "digits-mlp", self.policy)
        assert state is not None
        return state

    def drive(self, until: Callable[[RolloutState], bool], every: float = 1.0, passes: int = 200) -> RolloutState:
        """Reconcile, then move the clock ``every`` seconds, until ``until`` holds (at most ``passes`` passes)."""
        for _ in range(passes):
            state = self.reconcile()
            if until(state):
                return state
            self.clock.now += every
        raise AssertionError(f"not reached in {passes} passes: {state.phase} {state.reason}")


def rig(policy: RolloutPolicy | None, backend: FakeBackend | None = None, healthy: bool = True) -> Rig:
    prometheus = None
    if policy is not None:
        prometheus = FakePrometheus(policy)
        if healthy:
            prometheus.healthy()
    r = Rig(policy, backend or FakeBackend(), prometheus)
    if prometheus is not None:
        prometheus.clock = r.clock
    return r


def phase_is(*phases: Phase) -> Callable[[RolloutState], bool]:
    return lambda state: state.phase in phases


def at_step(index: int) -> Callable[[RolloutState], bool]:
    return lambda state: state.phase is Phase.PROGRESSING and state.step == index


def moves(state: RolloutState) -> list[str]:
    return [h["to"] for h in state.history]


# -- analysis: one measurement, every cause -----------------------------------------------------

def _metric(**rule: Any) -> Metric:
    return Metric.model_validate({"name": "m", "template": "latency-p99", **rule})


@pytest.mark.parametrize("rule, value, stable, error, cause", [
    ({"min": 0.99}, 0.995, None, None, Cause.MET),
    ({"min": 0.99}, 0.5, None, None, Cause.BELOW_MIN),
    ({"max": 0.2}, 0.3, None, None, Cause.ABOVE_MAX),
    ({"max": 0.2}, None, None, None, Cause.NO_DATA),
    ({"max": 0.2}, math.nan, None, None, Cause.NO_DATA),
    ({"max": 0.2}, 0.1, None, "http://p:9090: ConnectTimeout", Cause.UNREACHABLE),
    ({"compareToStable": {"maxIncrease": 0.05}}, 0.30, 0.20, None, Cause.ABOVE_STABLE),
    ({"compareToStable": {"maxIncrease": 0.05}}, 0.24, 0.20, None, Cause.MET),
    ({"compareToStable": {"maxDecrease": 0.05}}, 0.10, 0.20, None, Cause.BELOW_STABLE),
    ({"compareToStable": {"maxDecrease": 0.05}}, 0.10, math.nan, None, Cause.NO_STABLE_DATA),
])
def test_judge_names_the_cause_of_each_verdict(rule: dict[str, Any], value: float | None, stable: float | None,
                                              error: str | None, cause: Cause) -> None:
    m = judge(_metric(**rule), value, stable, query="q", at=5.0, error=error)
    assert m.cause is cause
    expected = {Cause.MET: Verdict.PASS, Cause.NO_DATA: Verdict.INCONCLUSIVE, Cause.NO_STABLE_DATA: Verdict.INCONCLUSIVE,
                Cause.UNREACHABLE: Verdict.INCONCLUSIVE}.get(cause, Verdict.FAIL)
    assert m.verdict is expected
    assert m.to_json()["cause"] == cause.value and m.to_json()["verdict"] == expected.value


def test_the_prometheus_client_gives_up_on_an_unreachable_server_within_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A down Prometheus reads as "inconclusive within seconds", not after a long retry loop:
    counted, not timed. Every connection the client opens goes through urllib3's
    `create_connection`, faked here to refuse and to record the timeout it was given; the pauses
    between retries are recorded instead of slept. The worst case — every attempt waiting its whole
    timeout, as for a host that drops packets instead of refusing them — is then attempts × timeout
    + the pauses, whatever the machine's load. A retry loop that grew (more attempts, a backoff)
    or a connection without a timeout (None: wait forever) fails here."""
    attempts: list[float | None] = []
    paused: list[float] = []

    def refuse(address: tuple[str, int], timeout: float | None = None, *args: Any, **kwargs: Any) -> socket.socket:
        attempts.append(timeout)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(urllib3.util.connection, "create_connection", refuse)
    monkeypatch.setattr(urllib3.util.retry.time, "sleep", paused.append)
    with pytest.raises(PrometheusUnavailable, match="127.0.0.1:9090"):
        Prometheus("http://127.0.0.1:9090", timeout=1).value("up")
    assert attempts == [1, 1]  # the first try and one quick retry, each bounded by the client's timeout
    assert sum(t for t in attempts if t is not None) + sum(paused) < 3


def test_the_state_machine_does_no_io() -> None:
    """The pure core reads no clock and talks to nothing: its imports say so."""
    forbidden = ("time", "datetime", "socket", "subprocess", "requests", "urllib", "sqlite3", "os",
                 "reconciler.metrics.prometheus", "reconciler.targets", "reconciler.plan.session", "kubernetes", "prometheus_api_client")
    for module in ("rollout/machine", "metrics/analysis"):
        tree = ast.parse((ROOT / "reconciler" / f"{module}.py").read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        bad = [n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden)]
        assert not bad, f"reconciler/{module}.py imports {bad}"


# -- Idle / WaitingForModel ---------------------------------------------------------------------

def test_before_the_first_apply_there_is_nothing_to_do() -> None:
    r = rig(policy())
    r.backend.serving_now = None
    assert r.controller.reconcile(ENDPOINT, V2, "digits-mlp", r.policy) is None
    assert r.backend.saves == 0 and r.backend.applied == []


def test_an_endpoint_serving_what_the_specs_want_stays_idle() -> None:
    r = rig(policy())
    r.backend.serving_now = ServingState(V1)
    r.desired = V1
    state = r.reconcile()
    assert state.phase is Phase.IDLE and state.canary is None and state.history == []
    # the fresh state is what serving says, read again by each pass: never saved (10,000 endpoints
    # applied at once would cost the first walk 10,000 writes) …
    assert r.backend.saves == 0 and r.backend.applied == []
    assert r.reconcile() == state and r.backend.saves == 0
    # … until there is something to say: a new version, saved once, and an unchanged state never again
    r.desired, r.backend.gate = V2, (False, False, "Workflow digits-mlp-b is Running")
    assert r.reconcile().phase is Phase.WAITING and r.backend.saves == 1
    r.reconcile()
    assert r.backend.saves == 1


def test_a_new_version_waits_for_the_offline_gate_without_traffic() -> None:
    r = rig(policy())
    r.backend.gate = (False, False, "Workflow digits-mlp-b is Running")
    state = r.reconcile()
    assert state.phase is Phase.WAITING and state.canary == V2 and state.stable == V1 and state.weight == 0
    assert moves(state) == ["WaitingForModel"] and f"new version {V2} of model `digits-mlp`" in state.history[0]["reason"]
    assert state.reason == "waiting for the offline gate: Workflow digits-mlp-b is Running"
    r.clock.now += 30
    assert r.reconcile().phase is Phase.WAITING
    assert r.backend.applied == [] and r.backend.events == [] and r.prometheus is not None and r.prometheus.asked == []


def test_a_failed_offline_evaluation_rolls_back_before_any_traffic_moves() -> None:
    r = rig(policy())
    r.backend.gate = (True, False, "Workflow digits-mlp-b failed: evaluate: accuracy 0.91 < 0.95")
    state = r.reconcile()
    assert state.phase is Phase.ROLLED_BACK and moves(state) == ["WaitingForModel", "RolledBack"]
    assert "offline evaluation failed" in state.reason and "accuracy 0.91 < 0.95" in state.reason
    assert r.backend.applied == [ServingState(V1)]
    assert [e[:2] for e in r.backend.events] == [("Warning", "RolledBack")]
    assert [s.phase for s in r.rollbacks] == [Phase.ROLLED_BACK] and state.writeback.startswith("committed ")


def test_a_passed_offline_gate_enters_the_first_step() -> None:
    r = rig(policy())
    state = r.reconcile()
    assert state.phase is Phase.PROGRESSING and state.step == 0 and state.weight == 10
    assert state.step_started == r.clock.now and state.regression is None
    assert r.backend.applied == [ServingState(V1, V2, 10)]
    assert r.backend.events == [("Normal", "RolloutStep", state.reason)]
    assert state.reason.startswith("offline gate passed (Workflow digits-mlp-b succeeded") and "step 1/3: canary" in state.reason


def _record(version: str, accuracy: float) -> dict[str, Any]:
    return {"model": "digits-mlp", "version": version, "lineage": {"datasetDigest": "sha256:" + "4e" * 32},
            "variants": {"int8": {"figures": {"accuracy": accuracy}}}}


@pytest.mark.parametrize("backend, phase, passed, says", [
    (FakeBackend(records={V1: _record(V1, 0.95), V2: _record(V2, 0.80)}), Phase.ROLLED_BACK, False, "regression gate refused"),
    (FakeBackend(records={V1: _record(V1, 0.95), V2: _record(V2, 0.951)}), Phase.PROGRESSING, True, "regression gate passed"),
    (FakeBackend(records={V1: _record(V1, 0.95)}), Phase.PROGRESSING, None, "regression gate skipped: no registry record of the candidate"),
])
def test_the_regression_gate_refuses_passes_or_is_skipped(backend: FakeBackend, phase: Phase, passed: bool | None, says: str) -> None:
    r = rig(policy(regressionGate={"maxDrop": 0.01}), backend)
    state = r.reconcile()
    assert state.phase is phase and state.regression is not None and state.regression["passed"] is passed
    assert says in state.reason
    if phase is Phase.ROLLED_BACK:
        assert r.backend.applied == [ServingState(V1)]  # the canary never got traffic


def test_without_a_policy_a_passed_gate_promotes_at_once() -> None:
    r = rig(None)
    state = r.reconcile()
    assert state.phase is Phase.PROMOTED and state.stable == V2 and state.weight == 100
    assert r.backend.applied == [ServingState(V2)] and [e[1] for e in r.backend.events] == ["Promoted"]


# -- Progressing: pauses, intervals, steps, promotion -------------------------------------------

def test_the_analysis_waits_for_the_step_pause_then_for_each_interval() -> None:
    r = rig(policy())
    assert r.prometheus is not None
    entered = r.reconcile().step_started
    saves = r.backend.saves
    for offset in (1.0, 2.5, 4.99):  # inside the 5 s pause: nothing asked, nothing saved
        r.clock.now = entered + offset
        assert r.reconcile().runs == {}
    assert r.prometheus.asked == [] and r.backend.saves == saves
    # After the pause, while the 10 s window still reaches back before the step: each metric is
    # checked for a breach, once an interval; a healthy canary's check counts and saves nothing.
    for offset in (5.0, 6.9):
        r.clock.now = entered + offset
        assert r.reconcile().runs == {}
    assert r.prometheus.asked == [r.prometheus.query("success-rate"), r.prometheus.query("latency-p99")]
    assert r.backend.saves == saves
    r.prometheus.asked.clear()
    r.clock.now = entered + WINDOW
    state = r.reconcile()
    assert r.prometheus.asked == [r.prometheus.query("success-rate"), r.prometheus.query("latency-p99")]
    assert {n: run.measurements for n, run in state.runs.items()} == {"success-rate": 1, "latency-p99": 1}
    r.clock.now = entered + WINDOW + 1.9  # within the 2 s interval: no new query
    r.reconcile()
    assert len(r.prometheus.asked) == 2
    r.clock.now = entered + WINDOW + 2.0
    assert r.reconcile().runs["success-rate"].measurements == 2 and len(r.prometheus.asked) == 4


def test_a_healthy_canary_walks_every_step_and_is_promoted() -> None:
    r = rig(policy())
    state = r.drive(phase_is(Phase.PROMOTED, Phase.ROLLED_BACK))
    assert state.phase is Phase.PROMOTED and state.stable == V2 and state.weight == 100
    assert moves(state) == ["WaitingForModel", "Progressing", "Progressing", "Progressing", "Promoted"]
    assert r.backend.applied == [ServingState(V1, V2, 10), ServingState(V1, V2, 50), ServingState(V1, V2, 100), ServingState(V2)]
    assert [e[1] for e in r.backend.events] == ["RolloutStep", "RolloutStep", "RolloutStep", "Promoted"]
    entered = [h["at"] for h in state.history if h["to"] == "Progressing"]
    # Each step: its 10 s window (it outlasts the 5 s pause), then 3 measurements 2 s apart → the
    # next step 10 + 2 × 2 = 14 s later.
    assert entered[1] - entered[0] == 14.0 and entered[2] - entered[1] == 14.0
    assert "step 1 passed (success-rate=1, latency-p99=0.01)" in state.history[2]["reason"]
    # The summary lists each metric's latest value (latency-p99's from step 2, the last step has none).
    assert state.reason == f"promoted {V2} (was {V1}): all 3 step(s) passed (latency-p99=0.01, success-rate=1)"
    assert r.rollbacks == [] and state.writeback == ""
    saves = r.backend.saves
    r.clock.now += 60
    assert r.reconcile().phase is Phase.PROMOTED and r.backend.saves == saves  # final: nothing more to save


def test_a_last_step_at_full_weight_without_analysis_promotes_on_entry() -> None:
    r = rig(one_step())
    state = r.drive(phase_is(Phase.PROMOTED))
    assert moves(state) == ["WaitingForModel", "Progressing", "Promoted"]
    assert r.backend.applied == [ServingState(V1, V2, 10), ServingState(V2)]  # never a 100 % canary
    assert "step 1 passed (success-rate=1)" in state.reason


# -- failures --------------------------------------------------------------------------------------

def test_failures_beyond_the_failure_limit_roll_back_with_the_numbers() -> None:
    r = rig(policy())
    assert r.prometheus is not None
    r.prometheus.set("success-rate", 0.5)
    state = r.drive(phase_is(Phase.ROLLED_BACK, Phase.PROMOTED))
    assert state.phase is Phase.ROLLED_BACK and state.weight == 0 and state.stable == V1
    # Caught by the breach checks, before a whole window lay inside the step: 5 s pause + 2 s interval.
    assert state.reason == (f"rolled back to {V1}, canary {V2} removed: step 1 at 10 %: success-rate 0.5 < 0.99 "
                            f"(2 failed measurements > failureLimit 1, the last before its window lay inside the step); "
                            f"query: {r.prometheus.query('success-rate')}")
    assert state.history[-1]["at"] - state.history[1]["at"] == 5 + 2
    assert state.history[-1]["measurement"]["cause"] == "below-min"
    assert r.backend.applied[-1] == ServingState(V1) and r.backend.events[-1][:2] == ("Warning", "RolledBack")
    assert len(r.rollbacks) == 1 and state.writeback == "committed 0123456789ab on branch forge/rollback-digits"
    # Rolled back and final: later passes neither move traffic nor try the canary again.
    applied = len(r.backend.applied)
    r.clock.now += 60
    assert r.reconcile().phase is Phase.ROLLED_BACK and len(r.backend.applied) == applied


def test_failures_within_the_failure_limit_are_tolerated() -> None:
    r = rig(one_step())
    assert r.prometheus is not None
    r.prometheus.set("success-rate", 0.5)
    state = r.reconcile()
    r.clock.now += WINDOW
    state = r.reconcile()
    assert state.phase is Phase.PROGRESSING and state.runs["success-rate"].failures == 1
    r.prometheus.set("success-rate", 1.0)
    assert r.drive(phase_is(Phase.PROMOTED, Phase.ROLLED_BACK), every=2).phase is Phase.PROMOTED


def test_a_metric_compared_with_stable_asks_for_both_versions() -> None:
    metric = {**LATENCY, "max": None, "compareToStable": {"maxIncrease": 0.05}}
    r = rig(one_step(metric), healthy=False)
    assert r.prometheus is not None
    r.prometheus.set("latency-p99", 0.30)
    r.prometheus.set("latency-p99", 0.20, role="stable")
    r.reconcile()  # enters step 1 (no pause) …
    r.clock.now += WINDOW
    r.reconcile()  # … and measures once its window is in it
    assert r.prometheus.asked == [r.prometheus.query("latency-p99"), r.prometheus.query("latency-p99", "stable")]
    state = r.drive(phase_is(Phase.ROLLED_BACK, Phase.PROMOTED))
    assert state.phase is Phase.ROLLED_BACK and "0.3 > stable 0.2 + 0.05" in state.reason
    assert state.history[-1]["measurement"]["cause"] == "above-stable"


# -- Holding: no data, Prometheus down, inconclusiveLimit, onPrometheusUnreachable -----------------

def test_no_data_holds_at_the_same_weight_then_resumes_when_data_returns() -> None:
    r = rig(one_step())
    assert r.prometheus is not None
    r.prometheus.set("success-rate", None)
    r.reconcile()  # enters step 1
    applied = list(r.backend.applied)
    r.clock.now += WINDOW - 2
    for _ in range(10):
        r.clock.now += 2
        state = r.reconcile()
        assert state.phase is Phase.HOLDING and state.weight == 10
    assert r.backend.applied == applied  # holding moves no traffic
    assert state.runs["success-rate"].measurements == 0 and state.runs["success-rate"].inconclusive_in_a_row == 10
    assert moves(state).count("Holding") == 1 and "holding, success-rate inconclusive: no data" in state.reason
    r.prometheus.set("success-rate", 1.0)
    r.clock.now += 2
    state = r.reconcile()
    assert state.phase is Phase.PROGRESSING and "success-rate has data again (1 meets ≥ 0.99)" in state.reason
    assert state.runs["success-rate"].inconclusive_in_a_row == 0 and state.runs["success-rate"].measurements == 1
    assert r.drive(phase_is(Phase.PROMOTED, Phase.ROLLED_BACK)).phase is Phase.PROMOTED


def test_the_inconclusive_limit_rolls_back_after_that_many_in_a_row() -> None:
    r = rig(one_step({**SUCCESS, "inconclusiveLimit": 3}))
    assert r.prometheus is not None
    r.prometheus.set("success-rate", None)
    state = r.drive(phase_is(Phase.ROLLED_BACK), every=2)
    assert moves(state) == ["WaitingForModel", "Progressing", "Holding", "RolledBack"]
    assert "step 1: success-rate inconclusive 3 times in a row (no data (no samples yet, or NaN))" in state.reason
    assert state.history[-1]["measurement"]["cause"] == "no-data" and len(r.rollbacks) == 1


def test_a_conclusive_measurement_restarts_the_inconclusive_count() -> None:
    r = rig(one_step({**SUCCESS, "inconclusiveLimit": 3, "count": 10}))
    assert r.prometheus is not None
    for answer in (None, None, 1.0, None, None, 1.0, None, None):
        r.prometheus.set("success-rate", answer)
        state = r.reconcile()
        r.clock.now += 2
    assert state.phase is Phase.HOLDING and state.runs["success-rate"].inconclusive_in_a_row == 2


def test_a_dead_canary_fails_its_step_although_the_window_still_has_its_old_samples() -> None:
    """The canary's server killed mid-step: Prometheus's rate() over the window keeps answering from
    the samples scraped before (success rate 1), but the canary's series are stale. Each such value
    is a failure (`canary-down`), so the step fails and the rollout rolls back after failureLimit + 1
    of them, `interval` apart — never passing the step, never promoting (issue 19's drill found a
    dead canary promoted on its old samples)."""
    r = rig(policy())
    assert r.prometheus is not None
    state = r.drive(lambda s: s.phase is Phase.PROGRESSING and s.step == 1 and s.runs.get("success-rate", None) is not None)
    assert state.runs["success-rate"].measurements == 1 and state.runs["success-rate"].failures == 0
    r.prometheus.canary_up = False  # killed: the values stay (old samples), the series go stale
    killed_at = r.clock.now
    state = r.drive(lambda s: s.phase is not Phase.PROGRESSING or s.step != 1)
    assert state.phase is Phase.ROLLED_BACK and state.step == 1, state.reason
    assert r.clock.now - killed_at <= 2 * 2 + 1  # interval × (failureLimit + 1), a pass of 1 s
    assert "canary down: its series are stale" in state.reason and "failureLimit 1" in state.reason
    assert state.history[-1]["measurement"]["cause"] == "canary-down"
    assert [h["weight"] for h in state.history if "/3: canary" in h["reason"]] == [10, 50]
    assert r.backend.applied[-1] == ServingState(V1) and len(r.rollbacks) == 1


def test_no_data_from_a_dead_canary_holds_as_before() -> None:
    """Once the window has no samples left the query has no value: inconclusive (Holding, and
    `inconclusiveLimit` if set), not a failure — and the liveness query is only asked for a value."""
    r = rig(one_step())
    assert r.prometheus is not None
    r.prometheus.canary_up = False
    r.prometheus.set("success-rate", None)
    r.reconcile()  # enters step 1
    for _ in range(5):
        r.clock.now += 2
        state = r.reconcile()
    assert state.phase is Phase.HOLDING and state.runs["success-rate"].failures == 0
    assert r.prometheus.liveness_asked == []


def test_prometheus_down_holds_under_the_hold_policy() -> None:
    r = rig(one_step(unreachable="hold"))
    assert r.prometheus is not None
    r.prometheus.set("success-rate", DOWN)
    for _ in range(30):
        state = r.reconcile()
        r.clock.now += 2
    assert state.phase is Phase.HOLDING and state.weight == 10 and "Prometheus unreachable" in state.reason
    assert state.last_analysis[-1]["cause"] == "unreachable"


def test_a_prometheus_outage_under_hold_does_not_count_toward_the_inconclusive_limit() -> None:
    """`inconclusiveLimit` is for a reachable Prometheus without data: an outage longer than the
    limit's measurements still holds (issue 19's drill: no promotion, no rollback; resumes after)."""
    r = rig(one_step({**SUCCESS, "inconclusiveLimit": 3}, unreachable="hold"))
    assert r.prometheus is not None
    r.prometheus.set("success-rate", DOWN)
    for _ in range(20):
        state = r.reconcile()
        r.clock.now += 2
    assert state.phase is Phase.HOLDING and r.rollbacks == [] and state.runs["success-rate"].inconclusive_in_a_row == 0
    r.prometheus.set("success-rate", 1.0)
    assert r.drive(phase_is(Phase.PROMOTED, Phase.ROLLED_BACK)).phase is Phase.PROMOTED


def test_prometheus_down_rolls_back_under_the_rollback_policy() -> None:
    r = rig(one_step(unreachable="rollback"))
    assert r.prometheus is not None
    r.prometheus.set("success-rate", DOWN)
    r.reconcile()  # enters step 1
    r.clock.now += WINDOW
    state = r.reconcile()
    assert state.phase is Phase.ROLLED_BACK and state.reason.endswith("(policy: rollback)")
    assert "step 1: success-rate: Prometheus unreachable: http://prometheus:9090: ConnectionError" in state.reason
    assert state.history[-1]["measurement"]["cause"] == "unreachable" and r.backend.applied[-1] == ServingState(V1)


def test_no_data_is_not_unreachable_even_under_the_rollback_policy() -> None:
    """The decision is on the cause: Prometheus answering "no samples" is not Prometheus down."""
    r = rig(one_step(unreachable="rollback"))
    assert r.prometheus is not None
    r.prometheus.set("success-rate", math.nan)
    r.reconcile()  # enters step 1
    r.clock.now += WINDOW
    for _ in range(5):
        state = r.reconcile()
        r.clock.now += 2
    assert state.phase is Phase.HOLDING and r.rollbacks == []


@pytest.mark.parametrize("unreachable, phase", [("hold", Phase.HOLDING), ("rollback", Phase.ROLLED_BACK)])
def test_no_prometheus_configured_counts_as_unreachable(unreachable: str, phase: Phase) -> None:
    r = rig(one_step(unreachable=unreachable))
    r.controller.prometheus = None
    r.reconcile()  # enters step 1
    r.clock.now += WINDOW
    state = r.reconcile()
    assert state.phase is phase and "Prometheus unreachable: no Prometheus URL configured" in state.reason


# -- blue-green ------------------------------------------------------------------------------------

def test_blue_green_promotes_after_the_preview_analysis() -> None:
    r = rig(policy(blue_green={"analysis": ["success-rate"], "previewTrafficPercent": 0}))
    state = r.drive(phase_is(Phase.PROMOTED, Phase.PAUSED, Phase.ROLLED_BACK))
    assert state.phase is Phase.PROMOTED and state.reason.startswith(f"promoted {V2} (was {V1}): all 1 step(s) passed")
    assert r.backend.applied == [ServingState(V1, V2, 0), ServingState(V2)]


def test_blue_green_without_auto_promote_pauses_until_promoted_by_hand() -> None:
    r = rig(policy(blue_green={"analysis": ["success-rate"], "previewTrafficPercent": 5, "autoPromote": False}))
    assert r.prometheus is not None
    state = r.drive(phase_is(Phase.PROMOTED, Phase.PAUSED, Phase.ROLLED_BACK))
    assert state.phase is Phase.PAUSED and "preview passed (success-rate=1); waiting for `forgectl rollout promote`" in state.reason
    asked, saves = len(r.prometheus.asked), r.backend.saves
    for _ in range(10):  # paused: no query, no traffic change, nothing saved
        r.clock.now += 5
        assert r.reconcile().phase is Phase.PAUSED
    assert len(r.prometheus.asked) == asked and r.backend.saves == saves and r.backend.serving_now == ServingState(V1, V2, 5)
    state = r.controller.promote(ENDPOINT, state, "promoted by hand")
    assert state.phase is Phase.PROMOTED and state.stable == V2 and state.history[-1]["from"] == "Paused"
    assert r.backend.serving_now == ServingState(V2) and state.reason.endswith(": promoted by hand")


# -- by hand: abort, retry; the specs change under a rollout ------------------------------------------

def test_abort_rolls_back_by_hand_without_a_write_back() -> None:
    r = rig(policy())
    state = r.drive(at_step(1))
    state = r.controller.abort(ENDPOINT, state, who="alice")
    events = len(r.backend.events)
    r.controller.commit("digits", state)  # what `forgectl rollout abort` does next: save, then tell
    assert len(r.backend.events) == events + 1 and RolloutState.from_json(r.backend.saved).phase is Phase.ABORTED
    assert state.phase is Phase.ABORTED and state.weight == 0 and state.reason.endswith("aborted by alice")
    assert r.backend.serving_now == ServingState(V1) and r.backend.events[-1][:2] == ("Warning", "Aborted")
    assert r.rollbacks == [] and state.writeback == ""
    r.clock.now += 60
    assert r.reconcile().phase is Phase.ABORTED and r.backend.serving_now == ServingState(V1)


def test_retry_starts_again_from_the_offline_gate() -> None:
    r = rig(one_step())
    assert r.prometheus is not None
    r.prometheus.set("success-rate", 0.5)
    state = r.drive(phase_is(Phase.ROLLED_BACK))
    r.backend.save_state("digits", r.controller.retry(state))  # what `forgectl rollout retry` does
    retried = r.backend.load_state("digits")
    assert retried is not None and retried.phase is Phase.WAITING and retried.step == -1 and retried.runs == {}
    assert retried.last_analysis == [] and retried.reason == "retry requested"
    r.prometheus.set("success-rate", 1.0)
    state = r.drive(phase_is(Phase.PROMOTED, Phase.ROLLED_BACK))
    assert state.phase is Phase.PROMOTED
    assert moves(state)[-4:] == ["RolledBack", "WaitingForModel", "Progressing", "Promoted"]


def test_specs_that_serve_the_stable_version_again_end_the_rollout_idle() -> None:
    r = rig(policy())
    r.drive(at_step(1))
    r.backend.serving_now, r.desired = ServingState(V1), V1  # a revert applied: the canary is gone
    state = r.reconcile()
    assert state.phase is Phase.IDLE and state.canary is None and state.weight == 0
    assert state.reason == f"specs serve {V1} again"


def test_a_newer_version_restarts_the_rollout_from_the_gate() -> None:
    r = rig(policy())
    r.drive(at_step(1))
    r.backend.serving_now, r.desired = ServingState(V1, V3, 0), V3  # `apply` of a third version
    r.backend.gate = (False, False, "Workflow digits-mlp-c is Running")
    state = r.reconcile()
    assert state.phase is Phase.WAITING and state.canary == V3 and state.stable == V1
    assert state.step == -1 and state.weight == 0 and state.runs == {} and state.last_analysis == []


def test_a_new_controller_continues_from_the_saved_step() -> None:
    r = rig(policy())
    r.drive(lambda s: s.step == 1 and "latency-p99" in s.runs)  # mid-analysis of step 2
    r.controller = r.new_controller()  # the old one killed: only the saved state remains
    state = r.drive(phase_is(Phase.PROMOTED, Phase.ROLLED_BACK))
    assert state.phase is Phase.PROMOTED
    assert sum(1 for h in state.history if "step 2/3" in h["reason"]) == 1  # step 2 entered once, never again
    assert r.backend.applied.count(ServingState(V1, V2, 50)) == 1


def test_the_history_keeps_the_latest_transitions_only() -> None:
    state = RolloutState("digits", V1, V2, Phase.PROGRESSING, step=0)
    for i in range(machine.HISTORY_LIMIT + 10):
        state = machine.transition(state, Phase.HOLDING if i % 2 == 0 else Phase.PROGRESSING, f"move {i}", float(i))
    assert len(state.history) == machine.HISTORY_LIMIT
    assert state.history[-1]["reason"] == f"move {machine.HISTORY_LIMIT + 9}" and state.history[0]["reason"] == "move 10"


def test_the_pure_functions_return_effects_instead_of_doing_them() -> None:
    state = RolloutState("digits", V1, V2, Phase.WAITING)
    steps = machine.policy_steps(policy())
    entered = machine.after_offline_gate(state, steps, machine.OfflineGate(True, True, "ok"), 10.0, Readiness(True, "ready"))
    assert entered.serving == ServingState(V1, V2, 10) and entered.event is not None and entered.event.reason == "RolloutStep"
    assert not entered.writeback_due and state.phase is Phase.WAITING  # the input is left as it was
    rolled = machine.rollback(entered.state, "because", 11.0)
    assert rolled.serving == ServingState(V1) and rolled.writeback_due and rolled.state.phase is Phase.ROLLED_BACK
    aborted = machine.abort(entered.state, "bob", 11.0)
    assert aborted.state.phase is Phase.ABORTED and not aborted.writeback_due


class RefusedSaveBackend(FakeBackend):
    """The state's save is refused from the ``refuse_from``-th on (409: a new leader wrote first,
    as the API server refuses a paused leader's write with the resourceVersion it read)."""

    refuse_from: int = 10**9

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        if self.saves + 1 >= self.refuse_from:
            raise ConflictError("the rollout state of digits: refused by the API server as stale (409)", status=409)
        super().save_state(endpoint, state)


def test_an_event_is_sent_only_after_the_state_it_reports_is_saved() -> None:
    """Events are not fenced by the API server (a create carries no resourceVersion): each waits for
    the save of the state it reports, which is. A decision whose save is refused tells nobody."""
    backend = RefusedSaveBackend()
    r = rig(policy(), backend)
    r.drive(at_step(0))
    told = list(backend.events)
    assert told and told[-1][1] == "RolloutStep"
    backend.refuse_from = backend.saves + 1
    with pytest.raises(ConflictError, match="refused by the API server as stale"):
        r.drive(at_step(1))  # step 1 passes and step 2 is entered: the traffic moves, the save is refused
    assert backend.events == told  # no "RolloutStep" for a step the saved state never entered
    assert RolloutState.from_json(backend.saved).step == 0


@pytest.mark.parametrize(("serving", "phase", "event"), [
    (ServingState(V2), Phase.PROMOTED, "Promoted"),
    (ServingState(V1), Phase.ROLLED_BACK, "RolledBack"),
])
def test_a_move_that_landed_without_its_state_is_recorded_not_undone(serving: ServingState, phase: Phase,
                                                                     event: str) -> None:
    """Found on the node: the promotion's traffic move landed, then its state's save was refused
    (Seldon's operator had written the status). The next pass must not read the canary-less
    serving as "the specs serve it again", nor add a removed canary back: it records the end the
    cluster shows, moving nothing, and tells it."""
    r = rig(policy())
    r.drive(at_step(1))
    moves = len(r.backend.applied)
    r.backend.serving_now = serving  # the move landed; the saved state is still at step 2
    state = r.reconcile()
    assert state.phase is phase and state.weight == (100 if phase is Phase.PROMOTED else 0), state.reason
    assert "before this state was saved" in state.reason or "had landed" in state.reason
    assert len(r.backend.applied) == moves  # nothing moved again
    assert r.backend.events[-1][1] == event and r.rollbacks == []  # no write-back on a reason not known
    assert RolloutState.from_json(r.backend.saved).phase is phase
