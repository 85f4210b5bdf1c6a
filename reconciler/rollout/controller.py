"""The rollout controller: a resumable state machine per endpoint.

Its state lives in the target (an annotation on the SeldonDeployment in a cluster; the state DB
for the local target), never only in memory: each pass loads it, does what is due *now* (move a
weight, take a measurement, promote, roll back), saves it if it changed, and returns. A killed
controller restarted later continues from the same step.

The states and transitions are :mod:`reconciler.rollout.machine` (pure, diagram there); this
module is the loop around them: it reads the target (serving, saved state, the offline gate), asks
the :class:`~reconciler.metrics.prometheus.MetricSource` for measurements, and carries out each
:class:`~reconciler.rollout.machine.Decision` (serving change, event, write-back hook). Every
transition is recorded with its reason: query, value, threshold, step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from reconciler.metrics.analysis import (
    Liveness,
    Measurement,
    Readiness,
    canary_down,
    down,
    judge,
    liveness_queries,
    out_of_step,
    reach,
    render_query,
    skewed,
)
from reconciler.metrics.prometheus import MetricSource, PrometheusUnavailable
from reconciler.rollout import machine
from reconciler.rollout.machine import (
    ACTIVE,
    FINAL,
    HISTORY_LIMIT,
    STATE_ANNOTATION,
    MetricRun,
    OfflineGate,
    Phase,
    RolloutState,
    Step,
    policy_steps,
)
from reconciler.rollout.regression import regression_gate
from renderers.seldon import ServingState
from specs import Endpoint, RolloutPolicy
from specs.rollout import Metric

# The state types are re-exported: the targets and the CLI import them from here.
__all__ = ["ACTIVE", "FINAL", "HISTORY_LIMIT", "STATE_ANNOTATION", "Backend", "Controller", "MetricRun", "Phase",
           "Readiness", "RolloutState", "Step", "policy_steps"]


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

    def model_gate(self, model: str, version: str, variant: str | None) -> tuple[bool, bool, str]:
        """(finished, passed, detail) of the offline gate: the model version's workflow, and that
        it registered ``variant`` (a step may have rejected it; None: the server picks one)."""
        ...

    def registered(self, model: str, version: str) -> dict[str, Any] | None:
        """The registry record of a model version as JSON (None: none yet): what a policy's
        regression gate compares (the local registry, a cluster's Workflow status)."""
        ...

    def canary_ready(self, endpoint: str, version: str) -> Readiness:
        """Whether the endpoint's canary servers of ``version`` are up now, as the target knows
        it: its pods Ready (a cluster), its server answering its readiness path (local)."""
        ...

    def event(self, endpoint: str, kind: str, reason: str, message: str) -> None:
        """Record an event (a Kubernetes Event in a cluster)."""
        ...


@dataclass
class Controller:
    """Drives the rollouts of one environment. ``clock`` is injectable for tests.

    ``prometheus`` answers the analysis queries (None: none configured, every measurement is
    inconclusive as if Prometheus were unreachable)."""

    backend: Backend
    prometheus: MetricSource | None
    namespace: str
    on_rollback: Callable[[Endpoint, RolloutState], str] | None = None
    clock: Callable[[], float] = time.time

    #: The canary's readiness as observed in the current pass (endpoint, version) → Readiness: asked
    #: of the target at most once a pass, and never carried into the next one.
    _ready: dict[tuple[str, str], Readiness] = field(default_factory=dict, init=False, repr=False)
    #: When each (endpoint, canary, step, metric) was last checked for a breach
    #: (:func:`machine.breach_check_due`): in memory only, since a check without a breach writes nothing.
    _breach_checked: dict[tuple[str, str | None, int, str], float] = field(default_factory=dict, init=False, repr=False)
    #: The Events of the decisions carried out since the state was last saved: sent only once the
    #: state they report is saved (:meth:`commit`). The save is the fenced write (the
    #: resourceVersion it read, the Lease checked): a leader paused past its Lease has its save
    #: refused, and the Events of a decision that was never recorded are never sent.
    _events: list[tuple[str, machine.Event]] = field(default_factory=list, init=False, repr=False)

    # -- one pass -------------------------------------------------------------------------
    def reconcile(self, endpoint: Endpoint, desired: str, model: str, policy: RolloutPolicy | None) -> RolloutState | None:
        """Do what is due now for ``endpoint`` whose specs want model version ``desired``."""
        self._ready, self._events = {}, []
        serving = self.backend.serving(endpoint.name)
        if serving is None:
            return None  # not applied yet
        saved = self.backend.load_state(endpoint.name)
        now = self.clock()
        state, recovered = self._start(endpoint.name, saved, serving, desired, model, now)
        if recovered is not None:
            state = self._carry_out(endpoint, recovered)
        elif state.phase in ACTIVE:
            state = self._advance(endpoint, model, policy, state, now)
        # An endpoint at rest with no state saved yet is what its serving says, which the next pass
        # reads again: nothing to save (an environment of 10,000 endpoints applied at once would
        # otherwise cost its first walk 10,000 writes, each after a read of the Lease).
        unsaid = saved is None and state == RolloutState(endpoint.name, serving.stable)
        self.commit(endpoint.name, state, changed=state != saved and not unsaid)
        return state

    def commit(self, endpoint: str, state: RolloutState, *, changed: bool = True) -> None:
        """Save ``state`` (when ``changed``), then send the Events of the decisions it records."""
        events, self._events = self._events, []
        if changed:
            self.backend.save_state(endpoint, state)
        for name, event in events:
            self.backend.event(name, event.kind, event.reason, event.message)

    def observe(self, endpoint: Endpoint, desired: str, model: str) -> RolloutState | None:
        """The state a pass would start from, without acting or writing anything (what a watch that
        does not hold the environment's lock reports while another one acts)."""
        serving = self.backend.serving(endpoint.name)
        if serving is None:
            return None
        return self._start(endpoint.name, self.backend.load_state(endpoint.name), serving, desired, model, self.clock())[0]

    @staticmethod
    def _start(endpoint: str, saved: RolloutState | None, serving: ServingState, desired: str, model: str,
               now: float) -> tuple[RolloutState, machine.Decision | None]:
        """The state a pass starts from, and the decision recovering a traffic move that landed
        without its state (:func:`machine.landed`: then the state is that decision's), if any."""
        recovered = machine.landed(saved, serving, desired, now) if saved is not None else None
        if recovered is not None:
            return recovered.state, recovered
        return machine.observe(saved, endpoint, serving, desired, model, now), None

    def _advance(self, endpoint: Endpoint, model: str, policy: RolloutPolicy | None, state: RolloutState, now: float) -> RolloutState:
        steps = policy_steps(policy)
        if state.phase is Phase.WAITING:
            gate = self._offline_gate(endpoint, model, policy, state)
            ready = self._readiness(endpoint, state) if gate.finished and gate.passed else None
            return self._carry_out(endpoint, machine.after_offline_gate(state, steps, gate, now, ready))
        if not machine.analysis_due(state, steps, now):
            return state  # paused by the policy, or the step's pause has not elapsed
        metrics = {m.name: m for m in (policy.spec.metrics if policy else [])}
        # One metric at a time: a rollback stops the pass before the next metric is queried.
        for name in steps[state.step].analysis:
            metric = metrics[name]
            if machine.measurement_due(state, metric, now):
                decision = machine.record(state, policy, metric, self._measure(metric, endpoint, state), now)
            elif machine.breach_check_due(state, metric, now, self._breach_checked.get(check := (
                    endpoint.name, state.canary, state.step, metric.name), -math.inf)):
                self._breach_checked[check] = now
                early = self._measure(metric, endpoint, state, since=-math.inf)
                decision = machine.record_breach(state, policy, metric, early, now)
            else:
                continue
            if decision.state.phase in FINAL:
                return self._carry_out(endpoint, decision)
            state = decision.state
        # A weight rises only on a canary ready now: asked only when the step is complete (or of
        # this pass's measurements, which asked already).
        ready = self._readiness(endpoint, state) if machine.step_complete(state, policy, steps) else None
        return self._carry_out(endpoint, machine.conclude(state, policy, steps, now, ready))

    def _readiness(self, endpoint: Endpoint, state: RolloutState) -> Readiness:
        """The canary's readiness, asked of the target once per pass."""
        assert state.canary is not None
        key = (endpoint.name, state.canary)
        if key not in self._ready:
            self._ready[key] = self.backend.canary_ready(endpoint.name, state.canary)
        return self._ready[key]

    def _offline_gate(self, endpoint: Endpoint, model: str, policy: RolloutPolicy | None, state: RolloutState) -> OfflineGate:
        """The offline gate of the canary: its workflow, then (once that passed) the policy's regression gate."""
        assert state.canary is not None
        finished, passed, detail = self.backend.model_gate(model, state.canary, endpoint.spec.required_variant())
        gate = policy.spec.regression_gate if policy is not None else None
        if not (finished and passed) or gate is None:
            return OfflineGate(finished, passed, detail)
        registered = self.backend.registered
        result = regression_gate(gate, registered(model, state.canary), registered(model, state.stable), endpoint.spec.variant)
        return OfflineGate(finished, passed, detail, result)

    def _measure(self, metric: Metric, endpoint: Endpoint, state: RolloutState, *, since: float | None = None) -> Measurement:
        """One measurement of ``metric``, judged with the canary's liveness; ``since``: from when its
        samples count (default :func:`machine.since`; a breach check counts the previous step's too)."""
        assert state.canary is not None
        query = render_query(metric, endpoint=endpoint.name, namespace=self.namespace, version=state.canary, role="canary")
        at = self.clock()
        if self.prometheus is None:
            return judge(metric, None, None, query=query, at=at, error="no Prometheus URL configured")
        try:
            value = self.prometheus.value(query)
            if value is not None and not math.isnan(value):
                # A rate() over the window keeps answering from the samples scraped before the
                # canary died: without this, a dead canary could pass its steps and be promoted.
                live = self._liveness(metric, query, endpoint, state, asked=at, since=since)
                # Clocks out of step first (a ready canary's window cannot be lined up with the
                # step: its samples would read as old, or old ones as new); a canary not ready is
                # down whatever the clocks say.
                skew = out_of_step(live) if live.readiness.ready else None
                if skew is not None:
                    return skewed(metric, value, skew, query=query, at=at)
                reason = canary_down(live)
                if reason is not None:
                    return down(metric, value, reason, query=query, at=at)
            stable = None
            if metric.compare_to_stable is not None:
                stable = self.prometheus.value(render_query(metric, endpoint=endpoint.name, namespace=self.namespace,
                                                            version=state.stable, role="stable"))
        except PrometheusUnavailable as exc:
            return judge(metric, None, None, query=query, at=at, error=str(exc))
        return judge(metric, value, stable, query=query, at=at)

    def _liveness(self, metric: Metric, query: str, endpoint: Endpoint, state: RolloutState, *, asked: float,
                  since: float | None = None) -> Liveness:
        """What the target and Prometheus say of the canary now, over the range ``query`` counts
        (``asked``: the clock before the measurement's first query; the clock after its last is
        taken here, so Prometheus's evaluation time can be compared with both)."""
        assert self.prometheus is not None
        queries = liveness_queries(endpoint=endpoint.name, namespace=self.namespace, role="canary", reach=reach(metric, query))
        ready = self._readiness(endpoint, state)
        counted = tuple(self.prometheus.series(queries.counted))
        current = tuple(self.prometheus.series(queries.current))
        up = tuple(self.prometheus.series(queries.up))
        counted_since = machine.since(state) if since is None else since
        return Liveness(ready, queries, counted, current, up, counted_since, asked=asked, answered=self.clock())

    def _carry_out(self, endpoint: Endpoint, decision: machine.Decision) -> RolloutState:
        """The decision's effects, in order: serving, write-back hook; its event waits for the
        state's save (:meth:`commit`). Returns the new state (with the time the target accepted
        its traffic move, from which the step's samples count)."""
        state = decision.state
        if decision.serving is not None:
            self.backend.set_serving(endpoint, decision.serving)
            state = replace(state, weight_at=self.clock())
        if decision.event is not None:
            self._events.append((endpoint.name, decision.event))
        if decision.writeback_due and self.on_rollback is not None:
            state = replace(state, writeback=self.on_rollback(endpoint, state))
        return state

    # -- by hand ------------------------------------------------------------------------------
    def promote(self, endpoint: Endpoint, state: RolloutState, reason: str, now: float | None = None) -> RolloutState:
        """Make the canary the stable version (all traffic)."""
        return self._carry_out(endpoint, machine.promote(state, reason, self.clock() if now is None else now))

    def abort(self, endpoint: Endpoint, state: RolloutState, who: str = "user") -> RolloutState:
        """Roll back now, by hand."""
        return self._carry_out(endpoint, machine.abort(state, who, self.clock()))

    def retry(self, state: RolloutState) -> RolloutState:
        """Start a rolled-back or aborted rollout again from the offline gate."""
        return machine.retry(state, self.clock())
