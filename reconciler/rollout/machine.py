"""The rollout state machine, pure: states, and the transitions between them as functions.

    Idle ──new version──▶ WaitingForModel ──offline gate passed──▶ Progressing(step i)
      Progressing ──pause elapsed, analysis passed, canary ready now──▶ Progressing(step i+1) … ──▶ Promoted
      Progressing ──a measurement finds the canary down (`canary-down`)──▶ a failure that never counts
                    toward `count`: failures > failureLimit roll back, and the weight never rises on it
      Progressing ──analysis complete but the canary not ready now──▶ Holding ──ready──▶ Progressing(step i+1)
      Progressing ──failures > failureLimit──▶ RolledBack   (traffic back to stable, canary removed)
      Progressing ──no data / NaN / Prometheus down──▶ Holding ──data again──▶ Progressing
      Holding ──inconclusiveLimit reached──▶ RolledBack
      Progressing/Holding ──Prometheus unreachable, `onPrometheusUnreachable: rollback`──▶ RolledBack
      Progressing(blue-green preview) ──analysis passed, autoPromote false──▶ Paused ──promote──▶ Promoted
      WaitingForModel ──offline evaluation failed / regression gate refused──▶ RolledBack (no traffic ever moved)
      WaitingForModel ──gate passed, canary not ready──▶ WaitingForModel (no traffic until it is)
      any ──`rollout abort`──▶ Aborted;  RolledBack/Aborted ──`rollout retry`──▶ WaitingForModel
      a rollout not final ──specs serve the stable version again──▶ Idle

Nothing here reads a clock, a target or Prometheus: each function takes the state, the policy, the
time and what was observed (the offline gate's result, one measurement), and returns the next state
with the effects that go with it as data (:class:`Decision`). :mod:`reconciler.rollout.controller`'s controller
gathers the observations and carries the effects out, so every transition can be tested without
I/O. Every transition is recorded in the state's history with its reason: query, value, threshold, step.

A weight only rises on a canary that is demonstrably alive now: its target says it is ready
(:class:`~reconciler.metrics.analysis.Readiness`, observed in the same pass), and every measurement
that counts toward a step's `count` found its series fresh — all the samples its query counts
scraped after the step began and its weight took effect (:func:`since`; a measurement is not due
before its whole range lies after that, :func:`measurement_due`), and the last scrape of each of
its targets successful. A measurement that finds otherwise is a failure with cause `canary-down`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from reconciler.metrics.analysis import Cause, Measurement, Readiness, Verdict, reach
from reconciler.rollout.regression import GateResult
from renderers.seldon import ServingState
from specs import RolloutPolicy, duration_seconds
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
#: The phases in which a pass has something to do.
ACTIVE = frozenset({Phase.WAITING, Phase.PROGRESSING, Phase.HOLDING, Phase.PAUSED})


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
    #: When the current step's weight took effect: the target accepted the traffic move (set by the
    #: controller after carrying it out; 0 in states saved before it was recorded).
    weight_at: float = 0.0
    runs: dict[str, MetricRun] = field(default_factory=dict)
    last_analysis: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    writeback: str = ""
    #: The Endpoint's experiment (reconciler/experiment/controller.py `ExperimentState.to_json()`), if any.
    experiment: dict[str, Any] | None = None
    #: The regression gate's result for the current canary (reconciler/rollout/regression.py), if the policy has one.
    regression: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain data, stored in the target."""
        data = asdict(self)
        data["phase"] = self.phase.value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RolloutState:
        """Inverse of :meth:`to_json`."""
        values = dict(data)
        values["phase"] = Phase(values.get("phase", "Idle"))
        values["runs"] = {k: MetricRun(**v) for k, v in (values.get("runs") or {}).items()}
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in values.items() if k in known})


@dataclass(frozen=True)
class Event:
    """An event to record for the endpoint (a Kubernetes Event in a cluster)."""

    kind: str  # "Normal" or "Warning", as Kubernetes Events have it
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    """The next state and the effects that go with it, carried out in this order: make the endpoint
    serve ``serving``, record ``event``, then (``writeback_due``) run the rollback hook."""

    state: RolloutState
    serving: ServingState | None = None
    event: Event | None = None
    #: A rollback that the git write-back hook must hear about (not an abort by hand).
    writeback_due: bool = False


@dataclass(frozen=True)
class OfflineGate:
    """What the offline gate says of a canary: whether its workflow finished and passed, and, when
    the policy has a regression gate and the workflow passed, that gate's result."""

    finished: bool
    passed: bool
    detail: str
    regression: GateResult | None = None


def transition(state: RolloutState, phase: Phase, reason: str, now: float, measurement: Measurement | None = None) -> RolloutState:
    """``state`` moved to ``phase`` for ``reason``, with the move appended to its (bounded) history."""
    entry: dict[str, Any] = {"at": now, "from": state.phase.value, "to": phase.value, "step": state.step, "weight": state.weight, "reason": reason}
    if measurement is not None:
        entry["measurement"] = measurement.to_json()
    history = (state.history + [entry])[-HISTORY_LIMIT:]
    return replace(state, phase=phase, reason=reason, history=history)


def observe(saved: RolloutState | None, endpoint: str, serving: ServingState, desired: str, model: str, now: float) -> RolloutState:
    """The state at the start of a pass: the saved one (or a fresh one), moved to Idle when the specs
    serve the stable version again, or to WaitingForModel when they want a version it is not rolling out."""
    state = saved or RolloutState(endpoint, serving.stable)
    if desired == serving.stable and serving.canary is None:
        if state.canary is not None and state.phase not in FINAL:
            state = transition(replace(state, canary=None, weight=0), Phase.IDLE, f"specs serve {desired} again", now)
    elif state.canary != desired:
        state = replace(state, stable=serving.stable, canary=desired, step=-1, weight=0, runs={}, last_analysis=[], writeback="",
                        regression=None)
        state = transition(state, Phase.WAITING, f"new version {desired} of model `{model}` (stable {serving.stable})", now)
    return state


def since(state: RolloutState) -> float:
    """When the current step's samples start to count: the step began and its weight took effect."""
    return max(state.step_started, state.weight_at)


def after_offline_gate(state: RolloutState, steps: list[Step], gate: OfflineGate, now: float,
                       ready: Readiness | None = None) -> Decision:
    """WaitingForModel: wait for the gate, roll back when it fails, else enter the first step once
    the canary is ready (``ready``: observed now; None, not observed, is not ready)."""
    if not gate.finished:
        return Decision(replace(state, reason=f"waiting for the offline gate: {gate.detail}"))
    if not gate.passed:
        return rollback(state, f"offline evaluation failed: {gate.detail}", now)
    detail = gate.detail
    if gate.regression is not None:
        state = replace(state, regression=gate.regression.to_json())
        if gate.regression.passed is False:
            return rollback(state, gate.regression.detail, now)
        detail = f"{detail}; {gate.regression.detail}"
    if ready is None or not ready.ready:
        seen = ready.detail if ready is not None else "not observed"
        return Decision(replace(state, reason=f"offline gate passed ({detail}); waiting for the canary to be ready: {seen}"))
    return enter_step(state, 0, steps, f"offline gate passed ({detail})", now)


def analysis_due(state: RolloutState, steps: list[Step], now: float) -> bool:
    """Whether the current step's analysis may run: Progressing or Holding, its pause elapsed."""
    if state.phase not in (Phase.PROGRESSING, Phase.HOLDING):
        return False
    return now >= state.step_started + steps[state.step].pause


def _paced(state: RolloutState, metric: Metric, now: float) -> bool:
    """Fewer than `count` measurements so far and `interval` elapsed since the last one."""
    run = state.runs.get(metric.name, MetricRun())
    return run.measurements < metric.count and now >= run.last_at + duration_seconds(metric.interval)


def _window_inside_step(state: RolloutState, metric: Metric, now: float) -> bool:
    """Whether the whole range ``metric``'s query counts (:func:`~reconciler.metrics.analysis.reach`)
    lies after :func:`since`."""
    # The ranges of a query do not depend on what fills its placeholders.
    counted = reach(metric, metric.render(endpoint="e", namespace="n", version="v", role="canary"))
    return now >= since(state) + counted


def measurement_due(state: RolloutState, metric: Metric, now: float) -> bool:
    """Whether ``metric`` needs a measurement now: fewer than `count` so far, `interval` elapsed,
    and the whole range its query counts lying after :func:`since` — a window that reaches back
    before the step began would count samples of the previous weight, or of a canary that has died
    since, so it cannot pass the step."""
    return _paced(state, metric, now) and _window_inside_step(state, metric, now)


def breach_check_due(state: RolloutState, metric: Metric, now: float, last_checked: float) -> bool:
    """Whether ``metric`` may be checked for a breach now, before :func:`measurement_due`: paced as
    a measurement (``last_checked``: the controller's last check of it, kept in memory, as a check
    that finds no breach writes nothing), while its window still reaches back before the step.
    Such a check can only fail the step (:func:`record_breach`): a canary whose errors already break
    the rule in a window that is partly the previous weight's breaks it now too, and waiting out a
    whole window (2 m by default) before rolling it back would serve those errors all that time."""
    return (_paced(state, metric, now) and now >= last_checked + duration_seconds(metric.interval)
            and not _window_inside_step(state, metric, now))


#: The causes of a breach: the value, of a live canary, broke a bound of the rule.
BREACHES = frozenset({Cause.BELOW_MIN, Cause.ABOVE_MAX, Cause.ABOVE_STABLE, Cause.BELOW_STABLE})


def record_breach(state: RolloutState, policy: RolloutPolicy | None, metric: Metric, m: Measurement, now: float) -> Decision:
    """Count a check of :func:`breach_check_due`: a breach is a failed measurement toward
    `failureLimit` (never toward `count`: the step completes only on whole windows inside it);
    anything else — a pass, no data, a canary not demonstrably alive — changes nothing, and the
    whole-window measurements decide."""
    if m.cause not in BREACHES:
        return Decision(state)
    run = replace(state.runs.get(metric.name, MetricRun()), last_at=now)
    run = replace(run, failures=run.failures + 1)
    analysis = [a for a in state.last_analysis if a.get("metric") != metric.name] + [m.to_json()]
    state = replace(state, runs={**state.runs, metric.name: run}, last_analysis=analysis)
    if run.failures > metric.failure_limit:
        return rollback(state, f"step {state.step + 1} at {state.weight} %: {m.metric} {m.detail} "
                        f"({run.failures} failed measurements > failureLimit {metric.failure_limit}, the last "
                        f"before its window lay inside the step); query: {m.query}", now, m)
    return Decision(state)


def record(state: RolloutState, policy: RolloutPolicy | None, metric: Metric, m: Measurement, now: float) -> Decision:
    """Count one measurement of ``metric``: hold on an inconclusive one, roll back when the policy's
    limits say so (failures beyond `failureLimit`, `inconclusiveLimit` inconclusive in a row,
    Prometheus unreachable under `onPrometheusUnreachable: rollback`), resume from Holding on data."""
    analysis = [a for a in state.last_analysis if a.get("metric") != metric.name] + [m.to_json()]
    run = replace(state.runs.get(metric.name, MetricRun()), last_at=now)
    step = state.step + 1
    if m.verdict is Verdict.INCONCLUSIVE:
        # The cause, not the detail's wording, says whether Prometheus could not answer at all. An
        # unreachable Prometheus is `onPrometheusUnreachable`'s to decide alone: under `hold` it
        # does not count toward `inconclusiveLimit` (meant for a reachable Prometheus without
        # data), so an outage of any length neither promotes nor rolls back.
        unreachable = m.cause is Cause.UNREACHABLE
        if not unreachable:
            run = replace(run, inconclusive_in_a_row=run.inconclusive_in_a_row + 1)
        state = replace(state, runs={**state.runs, metric.name: run}, last_analysis=analysis)
        if unreachable and policy is not None and policy.spec.on_prometheus_unreachable == "rollback":
            return rollback(state, f"step {step}: {m.metric}: {m.detail} (policy: rollback)", now, m)
        if not unreachable and metric.inconclusive_limit is not None and run.inconclusive_in_a_row >= metric.inconclusive_limit:
            return rollback(state, f"step {step}: {m.metric} inconclusive {run.inconclusive_in_a_row} times in a row ({m.detail})", now, m)
        if state.phase is not Phase.HOLDING:
            state = transition(state, Phase.HOLDING, f"step {step}: holding, {m.metric} inconclusive: {m.detail}", now, m)
        return Decision(state)
    # A canary found down is a failure that does not count toward `count`: the step cannot
    # complete on it (with `failureLimit` > 0 a tolerated failure would otherwise raise the weight).
    counted = m.cause is not Cause.CANARY_DOWN
    run = replace(run, measurements=run.measurements + counted, inconclusive_in_a_row=0,
                  failures=run.failures + (m.verdict is Verdict.FAIL))
    state = replace(state, runs={**state.runs, metric.name: run}, last_analysis=analysis)
    if run.failures > metric.failure_limit:
        return rollback(state, f"step {step} at {state.weight} %: {m.metric} {m.detail} "
                        f"({run.failures} failed measurements > failureLimit {metric.failure_limit}); query: {m.query}", now, m)
    if state.phase is Phase.HOLDING:
        state = transition(state, Phase.PROGRESSING, f"step {step}: {m.metric} has data again ({m.detail})", now, m)
    return Decision(state)


def step_complete(state: RolloutState, policy: RolloutPolicy | None, steps: list[Step]) -> bool:
    """Whether every metric of the current step has its `count` of measurements."""
    metrics = {m.name: m for m in (policy.spec.metrics if policy else [])}
    return all(state.runs.get(n, MetricRun()).measurements >= metrics[n].count for n in steps[state.step].analysis)


def conclude(state: RolloutState, policy: RolloutPolicy | None, steps: list[Step], now: float,
             ready: Readiness | None = None) -> Decision:
    """After a pass's measurements: stay while any metric of the step lacks its `count`, else enter
    the next step, pause a blue-green preview that waits for `promote`, or promote — the last two
    raise the weight, so only on a canary ``ready`` now (None, not observed, is not ready): else
    hold at this weight, saying why, until it is."""
    if not step_complete(state, policy, steps):
        return Decision(state)
    summary = ", ".join(f"{a['metric']}={a['value']:.4g}" for a in state.last_analysis if a.get("value") is not None) or "no analysis"
    paused = policy is not None and policy.spec.blue_green is not None and not policy.spec.blue_green.auto_promote
    if (state.step + 1 < len(steps) or not paused) and (ready is None or not ready.ready):
        reason = (f"step {state.step + 1} passed ({summary}) but the canary is not ready now "
                  f"({ready.detail if ready is not None else 'not observed'}): holding at {state.weight} %")
        if state.phase is Phase.HOLDING:
            return Decision(replace(state, reason=reason))
        return Decision(transition(state, Phase.HOLDING, reason, now))
    if state.step + 1 < len(steps):
        return enter_step(state, state.step + 1, steps, f"step {state.step + 1} passed ({summary})", now)
    if paused:
        return Decision(transition(state, Phase.PAUSED, f"preview passed ({summary}); waiting for `forgectl rollout promote`", now))
    return promote(state, f"all {len(steps)} step(s) passed ({summary})", now)


def enter_step(state: RolloutState, index: int, steps: list[Step], reason: str, now: float) -> Decision:
    """Move the canary to step ``index``'s weight and restart its analysis; a last step at 100 %
    with nothing to analyse is a promotion."""
    assert state.canary is not None
    weight = steps[index].weight
    if weight >= 100 and index == len(steps) - 1 and not steps[index].analysis:
        return promote(state, reason, now)
    serving = ServingState(state.stable, state.canary, min(weight, 100))
    state = replace(state, step=index, weight=weight, step_started=now, weight_at=0.0, runs={})
    message = f"{reason}; step {index + 1}/{len(steps)}: canary {state.canary} at {weight} %"
    return Decision(transition(state, Phase.PROGRESSING, message, now), serving, Event("Normal", "RolloutStep", message))


def promote(state: RolloutState, reason: str, now: float) -> Decision:
    """Make the canary the stable version (all traffic)."""
    assert state.canary is not None
    message = f"promoted {state.canary} (was {state.stable}): {reason}"
    promoted = replace(state, stable=state.canary, weight=100, runs={})
    return Decision(transition(promoted, Phase.PROMOTED, message, now), ServingState(state.canary), Event("Normal", "Promoted", message))


def rollback(state: RolloutState, reason: str, now: float, measurement: Measurement | None = None,
             phase: Phase = Phase.ROLLED_BACK) -> Decision:
    """All traffic back to stable, canary removed; ``phase`` Aborted when done by hand."""
    message = f"rolled back to {state.stable}, canary {state.canary} removed: {reason}"
    event = Event("Warning", "RolledBack" if phase is Phase.ROLLED_BACK else "Aborted", message)
    moved = transition(replace(state, weight=0, runs={}), phase, message, now, measurement)
    return Decision(moved, ServingState(state.stable), event, writeback_due=phase is Phase.ROLLED_BACK)


def landed(state: RolloutState, serving: ServingState, desired: str, now: float) -> Decision | None:
    """A traffic move that reached the cluster while the state deciding it did not (its save was
    refused, or the controller died between the two): in a step the canary serves, so while the
    specs still want the canary (``desired``; a revert applied removes it too, see :func:`observe`)
    a serving state without it says which end was carried out — the canary as the stable (a
    promotion) or the stable alone (a rollback). The decision records it, with nothing left to
    move; None when serving agrees with the state. A recovered rollback's reason is not known, so
    it writes nothing back to git."""
    if (state.phase not in ACTIVE or state.canary is None or state.canary != desired or state.step < 0
            or serving.canary is not None):
        return None
    if serving.stable == state.canary:
        decision = promote(state, "its traffic move had landed when this state was saved", now)
    elif serving.stable == state.stable:
        decision = rollback(state, f"the canary had left serving at step {state.step + 1} before this state was saved", now)
    else:
        return None
    return replace(decision, serving=None, writeback_due=False)


def abort(state: RolloutState, who: str, now: float) -> Decision:
    """Roll back by hand (no write-back)."""
    return rollback(state, f"aborted by {who}", now, phase=Phase.ABORTED)


def retry(state: RolloutState, now: float) -> RolloutState:
    """Start a rolled-back or aborted rollout again from the offline gate."""
    return transition(replace(state, step=-1, weight=0, runs={}, last_analysis=[]), Phase.WAITING, "retry requested", now)
