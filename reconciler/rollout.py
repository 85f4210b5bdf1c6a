"""The rollout controller: a resumable state machine per endpoint.

Its state lives in the target (an annotation on the SeldonDeployment in a cluster; the state DB
for the local target), never only in memory: each pass loads it, does what is due *now* (move a
weight, take a measurement, promote, roll back), saves it if it changed, and returns. A killed
controller restarted later continues from the same step.

    Idle ──new version──▶ WaitingForModel ──offline gate passed──▶ Progressing(step i)
      Progressing ──pause elapsed, analysis passed──▶ Progressing(step i+1) … ──▶ Promoted
      Progressing ──failures > failureLimit──▶ RolledBack   (traffic back to stable, canary removed)
      Progressing ──no data / NaN / Prometheus down──▶ Holding ──data again──▶ Progressing
      Holding ──inconclusiveLimit reached──▶ RolledBack
      WaitingForModel ──offline evaluation failed──▶ RolledBack (no traffic ever moved)
      any ──`rollout abort`──▶ Aborted;  RolledBack/Aborted ──`rollout retry`──▶ WaitingForModel

Every transition is recorded with its reason: query, value, threshold, step.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any, Callable, Mapping, Protocol

from reconciler.analysis import Measurement, Verdict, judge, render_query
from reconciler.prometheus import Prometheus, PrometheusUnavailable
from renderers.seldon import ServingState
from specs import Endpoint, RolloutPolicy, duration_seconds
from specs.rollout import Metric

STATE_ANNOTATION = "forge.dev/rollout"
HISTORY_LIMIT = 50


class Phase(str, Enum):
    """Where a rollout stands."""

    IDLE = "Idle"
    WAITING = "WaitingForModel"
    PROGRESSING = "Progressing"
    HOLDING = "Holding"
    PAUSED = "Paused"
    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"
    ABORTED = "Aborted"


FINAL = frozenset({Phase.PROMOTED, Phase.ROLLED_BACK, Phase.ABORTED})


@dataclass(frozen=True)
class Step:
    """One step of a policy, strategy-independent: a weight, a pause and the metrics to analyse."""

    weight: int
    pause: float
    analysis: tuple[str, ...]


def policy_steps(policy: RolloutPolicy | None) -> list[Step]:
    """A policy's steps; blue-green is one preview step (its preview traffic, its analysis)."""
    if policy is None:
        return [Step(100, 0.0, ())]
    if policy.spec.canary is not None:
        return [Step(s.weight, duration_seconds(s.pause), tuple(s.analysis)) for s in policy.spec.canary.steps]
    bg = policy.spec.blue_green
    assert bg is not None
    return [Step(bg.preview_traffic_percent, 0.0, tuple(bg.analysis))]


@dataclass
class MetricRun:
    """Counters of one metric's analysis in the current step."""

    measurements: int = 0
    failures: int = 0
    inconclusive_in_a_row: int = 0
    last_at: float = 0.0


@dataclass
class RolloutState:
    """Everything the controller needs to resume an endpoint's rollout."""

    endpoint: str
    stable: str
    canary: str | None = None
    phase: Phase = Phase.IDLE
    step: int = -1
    weight: int = 0
    step_started: float = 0.0
    runs: dict[str, MetricRun] = field(default_factory=dict)
    last_analysis: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    writeback: str = ""
    #: The Endpoint's experiment (reconciler/experiment.py `ExperimentState.to_json()`), if any.
    experiment: dict[str, Any] | None = None
    #: The regression gate's result for the current canary (reconciler/regression.py), if the policy has one.
    regression: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain data, stored in the target."""
        data = asdict(self)
        data["phase"] = self.phase.value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RolloutState":
        """Inverse of :meth:`to_json`."""
        values = dict(data)
        values["phase"] = Phase(values.get("phase", "Idle"))
        values["runs"] = {k: MetricRun(**v) for k, v in (values.get("runs") or {}).items()}
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in values.items() if k in known})


class Backend(Protocol):
    """What the controller needs of a target."""

    def serving(self, endpoint: str) -> ServingState | None:
        """What the endpoint serves now (None before its first apply)."""
        ...

    def load_state(self, endpoint: str) -> RolloutState | None:
        """The saved rollout state."""
        ...

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        """Persist the rollout state."""
        ...

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        """Make the endpoint serve ``state`` (re-render and apply its SeldonDeployment)."""
        ...

    def model_gate(self, model: str, version: str) -> tuple[bool, bool, str]:
        """(finished, passed, detail) of the offline gate: the model version's workflow."""
        ...

    def event(self, endpoint: str, kind: str, reason: str, message: str) -> None:
        """Record an event (a Kubernetes Event in a cluster)."""
        ...


def _transition(state: RolloutState, phase: Phase, reason: str, now: float, measurement: Measurement | None = None) -> RolloutState:
    entry = {"at": now, "from": state.phase.value, "to": phase.value, "step": state.step, "weight": state.weight, "reason": reason}
    if measurement is not None:
        entry["measurement"] = measurement.to_json()
    history = (state.history + [entry])[-HISTORY_LIMIT:]
    return replace(state, phase=phase, reason=reason, history=history)


@dataclass
class Controller:
    """Drives the rollouts of one environment. ``clock`` is injectable for tests."""

    backend: Backend
    prometheus: Prometheus | None
    namespace: str
    on_rollback: Callable[[Endpoint, RolloutState], str] | None = None
    clock: Callable[[], float] = time.time

    # -- one pass -------------------------------------------------------------------------
    def reconcile(self, endpoint: Endpoint, desired: str, model: str, policy: RolloutPolicy | None) -> RolloutState | None:
        """Do what is due now for ``endpoint`` whose specs want model version ``desired``."""
        serving = self.backend.serving(endpoint.name)
        if serving is None:
            return None  # not applied yet
        saved = self.backend.load_state(endpoint.name)
        state = saved or RolloutState(endpoint.name, serving.stable)
        now = self.clock()
        if desired == serving.stable and serving.canary is None:
            if state.canary is not None and state.phase not in FINAL:
                state = _transition(replace(state, canary=None, weight=0), Phase.IDLE, f"specs serve {desired} again", now)
        elif state.canary != desired:
            state = replace(state, stable=serving.stable, canary=desired, step=-1, weight=0, runs={}, last_analysis=[], writeback="",
                            regression=None)
            state = _transition(state, Phase.WAITING, f"new version {desired} of model `{model}` (stable {serving.stable})", now)
        if state.phase in (Phase.WAITING, Phase.PROGRESSING, Phase.HOLDING, Phase.PAUSED):
            state = self._advance(endpoint, model, policy, state, now)
        if state != saved:
            self.backend.save_state(endpoint.name, state)
        return state

    def _advance(self, endpoint: Endpoint, model: str, policy: RolloutPolicy | None, state: RolloutState, now: float) -> RolloutState:
        steps = policy_steps(policy)
        if state.phase is Phase.WAITING:
            assert state.canary is not None
            finished, passed, detail = self.backend.model_gate(model, state.canary)
            if not finished:
                return replace(state, reason=f"waiting for the offline gate: {detail}")
            if not passed:
                return self._rollback(endpoint, state, f"offline evaluation failed: {detail}", now)
            gate = policy.spec.regression_gate if policy is not None else None
            if gate is not None:
                from reconciler.regression import GateResult, regression_gate

                registered = getattr(self.backend, "registered", None)
                result = (regression_gate(gate, registered(model, state.canary), registered(model, state.stable),
                                          endpoint.spec.variant) if registered is not None
                          else GateResult(None, "regression gate skipped: this target keeps no registry records"))
                state = replace(state, regression=result.to_json())
                if result.passed is False:
                    return self._rollback(endpoint, state, result.detail, now)
                detail = f"{detail}; {result.detail}"
            return self._enter_step(endpoint, state, 0, steps, f"offline gate passed ({detail})", now)
        if state.phase is Phase.PAUSED:
            return state
        step = steps[state.step]
        if now < state.step_started + step.pause:
            return state
        metrics = {m.name: m for m in (policy.spec.metrics if policy else [])}
        runs = dict(state.runs)
        analysis = list(state.last_analysis)
        for name in step.analysis:
            metric = metrics[name]
            run = runs.get(name, MetricRun())
            if run.measurements >= metric.count or now < run.last_at + duration_seconds(metric.interval):
                continue
            m = self._measure(metric, endpoint, state)
            analysis = [a for a in analysis if a.get("metric") != name] + [m.to_json()]
            run = replace(run, last_at=now)
            if m.verdict is Verdict.INCONCLUSIVE:
                run = replace(run, inconclusive_in_a_row=run.inconclusive_in_a_row + 1)
                runs[name] = run
                state = replace(state, runs=runs, last_analysis=analysis)
                unreachable = m.detail.startswith("Prometheus unreachable")
                if unreachable and policy is not None and policy.spec.on_prometheus_unreachable == "rollback":
                    return self._rollback(endpoint, state, f"step {state.step + 1}: {m.metric}: {m.detail} (policy: rollback)", now, m)
                if metric.inconclusive_limit is not None and run.inconclusive_in_a_row >= metric.inconclusive_limit:
                    return self._rollback(endpoint, state, f"step {state.step + 1}: {m.metric} inconclusive "
                                          f"{run.inconclusive_in_a_row} times in a row ({m.detail})", now, m)
                if state.phase is not Phase.HOLDING:
                    state = _transition(state, Phase.HOLDING, f"step {state.step + 1}: holding, {m.metric} inconclusive: {m.detail}", now, m)
                continue
            run = replace(run, measurements=run.measurements + 1, inconclusive_in_a_row=0,
                          failures=run.failures + (m.verdict is Verdict.FAIL))
            runs[name] = run
            state = replace(state, runs=runs, last_analysis=analysis)
            if run.failures > metric.failure_limit:
                return self._rollback(endpoint, state, f"step {state.step + 1} at {state.weight} %: {m.metric} {m.detail} "
                                      f"({run.failures} failed measurements > failureLimit {metric.failure_limit}); query: {m.query}", now, m)
            if state.phase is Phase.HOLDING:
                state = _transition(state, Phase.PROGRESSING, f"step {state.step + 1}: {m.metric} has data again ({m.detail})", now, m)
        done = all(runs.get(n, MetricRun()).measurements >= metrics[n].count for n in step.analysis)
        if not done:
            return replace(state, runs=runs, last_analysis=analysis)
        summary = ", ".join(f"{a['metric']}={a['value']:.4g}" for a in analysis if a.get("value") is not None) or "no analysis"
        if state.step + 1 < len(steps):
            return self._enter_step(endpoint, state, state.step + 1, steps, f"step {state.step + 1} passed ({summary})", now)
        if policy is not None and policy.spec.blue_green is not None and not policy.spec.blue_green.auto_promote:
            return _transition(state, Phase.PAUSED, f"preview passed ({summary}); waiting for `forgectl rollout promote`", now)
        return self.promote(endpoint, state, f"all {len(steps)} step(s) passed ({summary})", now)

    def _measure(self, metric: Metric, endpoint: Endpoint, state: RolloutState) -> Measurement:
        assert state.canary is not None
        query = render_query(metric, endpoint=endpoint.name, namespace=self.namespace, version=state.canary, role="canary")
        at = self.clock()
        if self.prometheus is None:
            return judge(metric, None, None, query=query, at=at, error="no Prometheus URL configured")
        try:
            value = self.prometheus.value(query)
            stable = None
            if metric.compare_to_stable is not None:
                stable = self.prometheus.value(render_query(metric, endpoint=endpoint.name, namespace=self.namespace,
                                                            version=state.stable, role="stable"))
        except PrometheusUnavailable as exc:
            return judge(metric, None, None, query=query, at=at, error=str(exc))
        return judge(metric, value, stable, query=query, at=at)

    # -- transitions with effects ------------------------------------------------------------
    def _enter_step(self, endpoint: Endpoint, state: RolloutState, index: int, steps: list[Step], reason: str, now: float) -> RolloutState:
        assert state.canary is not None
        weight = steps[index].weight
        if weight >= 100 and index == len(steps) - 1 and not steps[index].analysis:
            return self.promote(endpoint, state, reason, now)
        self.backend.set_serving(endpoint, ServingState(state.stable, state.canary, min(weight, 100)))
        state = replace(state, step=index, weight=weight, step_started=now, runs={})
        message = f"{reason}; step {index + 1}/{len(steps)}: canary {state.canary} at {weight} %"
        self.backend.event(endpoint.name, "Normal", "RolloutStep", message)
        return _transition(state, Phase.PROGRESSING, message, now)

    def promote(self, endpoint: Endpoint, state: RolloutState, reason: str, now: float | None = None) -> RolloutState:
        """Make the canary the stable version (all traffic)."""
        now = self.clock() if now is None else now
        assert state.canary is not None
        self.backend.set_serving(endpoint, ServingState(state.canary))
        message = f"promoted {state.canary} (was {state.stable}): {reason}"
        self.backend.event(endpoint.name, "Normal", "Promoted", message)
        state = replace(state, stable=state.canary, weight=100, runs={})
        return _transition(state, Phase.PROMOTED, message, now)

    def _rollback(self, endpoint: Endpoint, state: RolloutState, reason: str, now: float,
                  measurement: Measurement | None = None, phase: Phase = Phase.ROLLED_BACK) -> RolloutState:
        self.backend.set_serving(endpoint, ServingState(state.stable))
        message = f"rolled back to {state.stable}, canary {state.canary} removed: {reason}"
        self.backend.event(endpoint.name, "Warning", "RolledBack" if phase is Phase.ROLLED_BACK else "Aborted", message)
        state = _transition(replace(state, weight=0, runs={}), phase, message, now, measurement)
        if self.on_rollback is not None and phase is Phase.ROLLED_BACK:
            state = replace(state, writeback=self.on_rollback(endpoint, state))
        return state

    def abort(self, endpoint: Endpoint, state: RolloutState, who: str = "user") -> RolloutState:
        """Roll back now, by hand."""
        return self._rollback(endpoint, state, f"aborted by {who}", self.clock(), phase=Phase.ABORTED)

    def retry(self, state: RolloutState) -> RolloutState:
        """Start a rolled-back or aborted rollout again from the offline gate."""
        return _transition(replace(state, step=-1, weight=0, runs={}, last_analysis=[]), Phase.WAITING, "retry requested", self.clock())
