"""The experiment controller: an Endpoint's A/B(/n) experiment as a resumable state machine.

    (none) ──experiment in the specs──▶ Running: one predictor per arm, with its share
    (none) ──a treatment arm's version failed its offline gate (its variant rejected)──▶ Stopped
      Running ──every `interval`: counts per arm from Prometheus, guardrails, the decision rule──▶
        Decided(winner)   the winner serves all traffic (a treatment, or control when no arm beats it)
        Inconclusive      the deadline (`maxDuration`) passed undecided: control serves all traffic
        Stopped           a guardrail failed more than its `failureLimit` on an arm: control serves all
      a changed experiment (arms, versions, metric, rule) ──▶ Running again, counts from zero

The state is a plain dict inside the endpoint's rollout state (`RolloutState.experiment`), so it
lives where the rollout state lives (the `forge.dev/rollout` annotation in a cluster, the state DB
locally): a controller killed and restarted continues with the same counts window and p-values.
The statistics are :mod:`reconciler.experiment.stats` (pure); this module only fetches counts and
moves traffic.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from reconciler.experiment.stats import ArmCounts, decide
from reconciler.metrics.analysis import Verdict, judge
from reconciler.metrics.prometheus import Prometheus, PrometheusUnavailable
from renderers.seldon import ArmServing, ServingState, experiment_serving
from specs import Endpoint, duration_seconds
from specs.experiment import Experiment, PrimaryMetric
from specs.rollout import SERIES_LABELS, fill_placeholders

RUNNING, DECIDED, INCONCLUSIVE, STOPPED = "Running", "Decided", "Inconclusive", "Stopped"
FINAL = frozenset({DECIDED, INCONCLUSIVE, STOPPED})
HISTORY_LIMIT = 50


def resolve_arms(endpoint: Endpoint, version: str) -> tuple[ArmServing, ...]:
    """The arms of the Endpoint's experiment with their versions and variants filled in (``version``:
    the version the specs build now)."""
    return experiment_serving(endpoint, version).arms


def experiment_key(endpoint: Endpoint, arms: tuple[ArmServing, ...]) -> str:
    """Identity of an experiment: its spec and the arms' resolved versions. A new key starts over."""
    experiment = endpoint.spec.experiment
    assert experiment is not None
    # the write-back says what happens after the decision, not what is measured: not part of the key
    blob = json.dumps({"experiment": experiment.model_dump(mode="json", by_alias=True, exclude={"git_writeback"}),
                       "arms": [asdict(a) for a in arms]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class ExperimentState:
    """Everything needed to resume an experiment."""

    key: str
    phase: str
    started: float
    control: str
    arms: list[dict[str, Any]]
    winner: str | None = None
    last_look: float = 0.0
    looks: int = 0
    counts: dict[str, dict[str, float]] = field(default_factory=dict)
    p_values: dict[str, float] = field(default_factory=dict)
    decision: dict[str, Any] = field(default_factory=dict)
    guardrail_failures: dict[str, int] = field(default_factory=dict)
    guardrails: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    #: What the write-back after the decision did (a commit, or why none), "" when not asked for.
    writeback: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExperimentState:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def arm(self, name: str) -> ArmServing:
        a = next(a for a in self.arms if a["name"] == name)
        return ArmServing(a["name"], a["version"], a["variant"], int(a["share"]))


def ended(endpoint: Endpoint, version: str, saved: Mapping[str, Any] | None) -> ExperimentState | None:
    """The saved state of the Endpoint's experiment when it has ended (decided, inconclusive or
    stopped) for the arms its spec names now (``version``: the one the specs build); None while it
    runs, before it started, or once its spec or arms changed (a new experiment starts over)."""
    experiment = endpoint.spec.experiment
    state = ExperimentState.from_json(saved) if saved and experiment is not None else None
    if state is None or state.phase == RUNNING or state.key != experiment_key(endpoint, resolve_arms(endpoint, version)):
        return None
    return state


def serving_for(endpoint: Endpoint, version: str, saved: Mapping[str, Any] | None) -> ServingState | None:
    """What an Endpoint with an experiment serves, given its saved experiment state (None: the
    Endpoint has no experiment, the rollout logic decides)."""
    experiment = endpoint.spec.experiment
    if experiment is None:
        return None
    state = ended(endpoint, version, saved)
    if state is None:
        return experiment_serving(endpoint, version)
    keep = state.arm(state.winner or state.control)
    return ServingState(keep.version, stable_variant=keep.variant,
                        shadow=endpoint.spec.shadow.version or version if endpoint.spec.shadow else None)


def count_queries(primary: PrimaryMetric, *, endpoint: str, namespace: str, role: str, window: str) -> tuple[str, str]:
    """(successes, trials) PromQL of one arm since the experiment began (``window``)."""
    sel = (f'{SERIES_LABELS["endpoint"]}="{endpoint}",{SERIES_LABELS["namespace"]}="{namespace}",'
           f'{SERIES_LABELS["role"]}="{role}"')
    if primary.kind == "success-rate":
        return (f'sum(increase(forge_requests_total{{{sel},code!~"5.."}}[{window}]))',
                f"sum(increase(forge_requests_total{{{sel}}}[{window}]))")
    if primary.kind == "latency-under":
        le = repr(float(primary.latency_under_seconds or 0))
        return (f'sum(increase(forge_request_duration_seconds_bucket{{{sel},le="{le}"}}[{window}]))',
                f"sum(increase(forge_request_duration_seconds_count{{{sel}}}[{window}]))")
    values = {"endpoint": endpoint, "namespace": namespace, "role": role, "window": window}
    return fill_placeholders(str(primary.numerator), values), fill_placeholders(str(primary.denominator), values)


def _transition(state: ExperimentState, phase: str, reason: str, now: float) -> ExperimentState:
    entry = {"at": now, "from": state.phase, "to": phase, "reason": reason}
    return replace(state, phase=phase, reason=reason, history=(state.history + [entry])[-HISTORY_LIMIT:])


@dataclass
class ExperimentController:
    """Drives the experiments of one environment, on the rollout controller's backend (see
    :class:`reconciler.rollout.controller.Backend`): state in ``RolloutState.experiment``, traffic by
    ``set_serving``, events by ``event``."""

    backend: Any
    prometheus: Prometheus | None
    namespace: str
    clock: Callable[[], float] = time.time
    #: Called once an experiment is decided, with the version the specs build; returns the line
    #: for the state's ``writeback`` (reconciler/experiment/writeback.py: the winner's spec
    #: committed to a branch). Never expected to raise.
    on_decided: Callable[[Endpoint, str, ExperimentState], str] | None = None

    def reconcile(self, endpoint: Endpoint, version: str) -> ExperimentState | None:
        """Do what is due now for the experiment of ``endpoint`` (the specs build ``version``)."""
        from reconciler.rollout.controller import RolloutState

        experiment = endpoint.spec.experiment
        if experiment is None or self.backend.serving(endpoint.name) is None:
            return None
        rollout = self.backend.load_state(endpoint.name)
        serving = self.backend.serving(endpoint.name)
        rollout = rollout or RolloutState(endpoint.name, serving.stable)
        saved = rollout.experiment
        arms = resolve_arms(endpoint, version)
        key = experiment_key(endpoint, arms)
        now = self.clock()
        state = ExperimentState.from_json(saved) if saved else None
        if state is None or state.key != key:
            state = ExperimentState(key, "", now, experiment.control_arm.name, [asdict(a) for a in arms])
            refused = self._refused_arms(endpoint, arms)
            if refused:
                state = _transition(state, STOPPED, f"not started: {refused}; control {state.control} kept", now)
                self.backend.set_serving(endpoint, serving_for(endpoint, version, state.to_json()))
                self.backend.event(endpoint.name, "Warning", "ExperimentStopped", state.reason)
            else:
                state = _transition(state, RUNNING, f"experiment started: {', '.join(f'{a.name} {a.version}/{a.variant} {a.share} %' for a in arms)}", now)
                self.backend.set_serving(endpoint, serving_for(endpoint, version, state.to_json()))
                self.backend.event(endpoint.name, "Normal", "ExperimentStarted", state.reason)
        elif state.phase == RUNNING and serving.arms != arms:
            self.backend.set_serving(endpoint, serving_for(endpoint, version, state.to_json()))
        if state.phase == RUNNING and now >= state.last_look + duration_seconds(experiment.interval):
            state = self._look(endpoint, experiment, state, now)
            if state.phase != RUNNING:
                self.backend.set_serving(endpoint, serving_for(endpoint, version, state.to_json()))
                if state.phase == DECIDED and self.on_decided is not None:
                    state = replace(state, writeback=self.on_decided(endpoint, version, state))
                self.backend.event(endpoint.name, "Normal" if state.phase == DECIDED else "Warning", f"Experiment{state.phase}",
                                   state.reason + (f"; write-back: {state.writeback}" if state.writeback else ""))
        if state.to_json() != saved:
            self.backend.save_state(endpoint.name, replace(rollout, experiment=state.to_json()))
        return state

    def _refused_arms(self, endpoint: Endpoint, arms: tuple[ArmServing, ...]) -> str | None:
        """Why the arms cannot start: a treatment arm whose version's offline gate finished and
        failed — its Workflow failed, or a step rejected the arm's variant, so no server of it could
        start. An arm still training is not refused (its server starts once it is registered).
        Asked of the rollout controller's backend (``model_gate``: both targets have it)."""
        control = endpoint.spec.experiment.control_arm.name if endpoint.spec.experiment else None
        for arm in arms:
            if arm.name == control:
                continue  # control is what serves when the experiment does not run
            finished, passed, detail = self.backend.model_gate(endpoint.spec.model_ref, arm.version,
                                                               endpoint.spec.required_variant(arm.variant))
            if finished and not passed:
                return f"arm {arm.name}: {detail}"
        return None

    def stop(self, endpoint: Endpoint, version: str, who: str = "user") -> ExperimentState:
        """Stop a running experiment by hand: control keeps all traffic."""
        rollout = self.backend.load_state(endpoint.name)
        if rollout is None or not rollout.experiment:
            raise ValueError(f"endpoint {endpoint.name!r} has no experiment")
        state = ExperimentState.from_json(rollout.experiment)
        if state.phase != RUNNING:
            raise ValueError(f"the experiment of endpoint {endpoint.name!r} is {state.phase}, not running")
        state = _transition(state, STOPPED, f"stopped by {who}; control {state.control} kept", self.clock())
        self.backend.set_serving(endpoint, serving_for(endpoint, version, state.to_json()))
        self.backend.save_state(endpoint.name, replace(rollout, experiment=state.to_json()))
        return state

    # -- one look --------------------------------------------------------------------------------
    def _look(self, endpoint: Endpoint, experiment: Experiment, state: ExperimentState, now: float) -> ExperimentState:
        state = replace(state, last_look=now)
        if self.prometheus is None:
            return replace(state, reason="holding: no Prometheus URL configured")
        window = f"{max(1, math.ceil(now - state.started))}s"
        counts: dict[str, dict[str, float]] = {}
        try:
            for arm in state.arms:
                sq, tq = count_queries(experiment.primary, endpoint=endpoint.name, namespace=self.namespace,
                                       role=arm["name"], window=window)
                s, t = self.prometheus.value(sq), self.prometheus.value(tq)
                s = 0.0 if s is None or math.isnan(s) else s
                t = 0.0 if t is None or math.isnan(t) else t
                counts[arm["name"]] = {"successes": min(s, t), "trials": t}
        except PrometheusUnavailable as exc:
            return replace(state, reason=f"holding: Prometheus unreachable ({exc})")
        state = replace(state, counts=counts, looks=state.looks + 1)
        # guardrails: every arm, compareToStable against control
        failures = dict(state.guardrail_failures)
        results = []
        for metric in experiment.guardrails:
            for arm in state.arms:
                query = metric.render(endpoint=endpoint.name, namespace=self.namespace, version=arm["version"], role=arm["name"])
                try:
                    value = self.prometheus.value(query)
                    base = None
                    if metric.compare_to_stable is not None:
                        if arm["name"] == state.control:
                            continue
                        base = self.prometheus.value(metric.render(endpoint=endpoint.name, namespace=self.namespace,
                                                                   version=state.arm(state.control).version, role=state.control))
                    m = judge(metric, value, base, query=query, at=now)
                except PrometheusUnavailable as exc:
                    m = judge(metric, None, None, query=query, at=now, error=str(exc))
                results.append({"arm": arm["name"], **m.to_json()})
                if m.verdict is Verdict.FAIL:
                    k = f"{metric.name}/{arm['name']}"
                    failures[k] = failures.get(k, 0) + 1
                    if failures[k] > metric.failure_limit:
                        state = replace(state, guardrail_failures=failures, guardrails=results)
                        return _transition(state, STOPPED, f"guardrail {metric.name} failed on arm {arm['name']} "
                                           f"{failures[k]} times > failureLimit {metric.failure_limit} ({m.detail}); "
                                           f"control {state.control} kept", now)
        state = replace(state, guardrail_failures=failures, guardrails=results)
        control = ArmCounts(state.control, counts[state.control]["successes"], counts[state.control]["trials"])
        treatments = [ArmCounts(a["name"], counts[a["name"]]["successes"], counts[a["name"]]["trials"])
                      for a in state.arms if a["name"] != state.control]
        d = experiment.decision
        decision = decide(control, treatments, rule=d.rule, alpha=d.alpha, threshold=d.probability_to_beat,
                          tau2=d.mixture_variance, minimum_effect=d.minimum_effect,
                          min_samples=experiment.min_samples_per_arm, higher_is_better=experiment.primary.higher_is_better,
                          deadline_passed=now >= state.started + duration_seconds(experiment.max_duration),
                          previous_p=state.p_values)
        p_values = {c.arm: c.p_value for c in decision.comparisons if c.p_value is not None}
        state = replace(state, decision=decision.to_json(), p_values=p_values or state.p_values)
        samples = ", ".join(f"{n} {c['successes']:.0f}/{c['trials']:.0f}" for n, c in counts.items())
        if decision.outcome == "decided":
            assert decision.winner is not None
            return replace(_transition(state, DECIDED, f"{decision.rule} ({samples}); {decision.winner} serves all traffic", now),
                           winner=decision.winner)
        if decision.outcome == "inconclusive":
            return _transition(state, INCONCLUSIVE, f"{decision.rule} ({samples})", now)
        return replace(state, reason=f"running: {decision.rule} ({samples})")
