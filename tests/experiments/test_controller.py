"""The experiment controller's state machine: start, looks, decided / inconclusive / stopped by a
guardrail, resume after a restart, the serving state it leaves behind.

The backend keeps its state in memory like the local target's state DB; "Prometheus" answers the
count queries from simulated per-arm counters (a Bernoulli stream per arm, fixed seed). What the
real Prometheus makes of the same queries is tested in tests/monitoring-style suites; here only the
controller's decisions are under test.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.experiment.controller import (
    DECIDED,
    INCONCLUSIVE,
    RUNNING,
    STOPPED,
    ExperimentController,
    count_queries,
    serving_for,
)
from reconciler.load.loader import load_or_raise
from reconciler.rollout.controller import RolloutState
from renderers.seldon import ServingState
from specs import Endpoint
from specs.experiment import PrimaryMetric

ROOT = Path(__file__).resolve().parents[2]
VERSION = "0123456789ab"


@dataclass
class Backend:
    state: dict[str, RolloutState] = field(default_factory=dict)
    serving_now: dict[str, ServingState] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)
    #: The offline gate per (version, variant) the targets' `model_gate` would answer (default: registered).
    gates: dict[tuple[str, str | None], tuple[bool, bool, str]] = field(default_factory=dict)

    def model_gate(self, model: str, version: str, variant: str | None) -> tuple[bool, bool, str]:
        return self.gates.get((version, variant), (True, True, "Workflow succeeded: version registered"))

    def serving(self, endpoint: str) -> ServingState | None:
        return self.serving_now.get(endpoint)

    def load_state(self, endpoint: str) -> RolloutState | None:
        return self.state.get(endpoint)

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        self.state[endpoint] = RolloutState.from_json(state.to_json())  # through plain data, as stored

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        self.serving_now[endpoint.name] = state

    def event(self, endpoint: str, kind: str, reason: str, message: str) -> None:
        self.events.append((reason, message))


@dataclass
class Counters:
    """Per arm: requests and successes so far; `value` answers the controller's queries."""

    p: dict[str, float]
    latency: dict[str, float] = field(default_factory=dict)
    rng: random.Random = field(default_factory=lambda: random.Random(1))
    n: dict[str, int] = field(default_factory=dict)
    s: dict[str, int] = field(default_factory=dict)

    def serve(self, per_arm: int) -> None:
        for arm, p in self.p.items():
            self.n[arm] = self.n.get(arm, 0) + per_arm
            self.s[arm] = self.s.get(arm, 0) + sum(self.rng.random() < p for _ in range(per_arm))

    def value(self, query: str) -> float | None:
        role = re.search(r'forge_role="([^"]+)"', query)[1]
        if "histogram_quantile" in query:
            return self.latency.get(role, 0.05)
        if 'code!~"5.."' in query:
            return float(self.s.get(role, 0))
        return float(self.n.get(role, 0))


def _endpoint(**experiment: Any) -> Endpoint:
    specs = load_or_raise([str(ROOT / "examples" / "experiments")]).specs
    ep = next(e for e in specs.of(Endpoint) if e.name == "digits-ab")
    exp = ep.spec.experiment.model_copy(update=experiment)
    return ep.model_copy(update={"spec": ep.spec.model_copy(update={"experiment": exp})})


def _run(ep: Endpoint, counters: Counters, *, looks: int, per_look: int = 200, backend: Backend | None = None,
         start: float = 1000.0) -> tuple[Backend, Any]:
    backend = backend or Backend(serving_now={ep.name: ServingState(VERSION)})
    clock = [start]
    ctl = ExperimentController(backend, counters, "ns", clock=lambda: clock[0])
    state = ctl.reconcile(ep, VERSION)
    for _ in range(looks):
        if state is not None and state.phase != RUNNING:
            break
        counters.serve(per_look)
        clock[0] += 10
        state = ctl.reconcile(ep, VERSION)
    return backend, state


def test_starts_with_the_arms_and_decides_for_the_better_arm() -> None:
    ep = _endpoint(min_samples_per_arm=1000)
    counters = Counters({"base": 0.90, "int8": 0.97})
    backend = Backend(serving_now={ep.name: ServingState(VERSION)})
    ctl = ExperimentController(backend, counters, "ns", clock=lambda: 1000.0)
    first = ctl.reconcile(ep, VERSION)
    assert first is not None and first.phase == RUNNING
    assert [a.name for a in backend.serving_now[ep.name].arms] == ["base", "int8"]
    _, state = _run(ep, counters, looks=100, backend=backend)
    assert state.phase == DECIDED and state.winner == "int8"
    assert state.decision["comparisons"][0]["pValue"] <= 0.05
    assert min(c["trials"] for c in state.counts.values()) >= 1000  # never before the minimum sample
    # the winner serves alone, with its variant; the shadow stays
    assert backend.serving_now[ep.name] == ServingState(VERSION, stable_variant="int8", shadow=VERSION)
    assert any(reason == "ExperimentDecided" for reason, _ in backend.events)


def test_identical_arms_end_inconclusive_and_keep_control() -> None:
    ep = _endpoint(min_samples_per_arm=500, max_duration="5m")
    _, state = _run(ep, Counters({"base": 0.95, "int8": 0.95}), looks=100)
    assert state.phase == INCONCLUSIVE and state.winner is None
    assert "control base kept" in state.reason


def test_a_failing_guardrail_stops_the_experiment() -> None:
    ep = _endpoint(min_samples_per_arm=100_000)
    backend, state = _run(ep, Counters({"base": 0.95, "int8": 0.95}, latency={"base": 0.05, "int8": 0.5}), looks=10)
    assert state.phase == STOPPED and "guardrail latency-p99 failed on arm int8" in state.reason
    assert backend.serving_now[ep.name].arms == () and backend.serving_now[ep.name].stable_variant == "base"


def test_an_arm_whose_variant_a_step_rejected_is_not_started_and_control_serves() -> None:
    # what the targets' gate says (tests/registry/test_registry.py) of a variant its step rejected
    why = ("Workflow digits-mlp-0123456789 succeeded, but variant int8 of version 0123456789ab was rejected: "
           "accuracy dropped 3.10 points, more than the allowed 1 (registered: base, pruned)")
    ep = _endpoint()
    backend = Backend(serving_now={ep.name: ServingState(VERSION)}, gates={(VERSION, "int8"): (True, False, why)})
    backend, state = _run(ep, Counters({"base": 0.9, "int8": 0.95}), looks=3, backend=backend)
    assert state.phase == STOPPED and state.reason == f"not started: arm int8: {why}; control base kept"
    assert backend.serving_now[ep.name].arms == () and backend.serving_now[ep.name].stable_variant == "base"
    assert backend.events == [("ExperimentStopped", state.reason)]
    # an arm still training is not refused: it starts, its server coming up once it is registered
    training = Backend(serving_now={ep.name: ServingState(VERSION)},
                       gates={(VERSION, "int8"): (False, False, "Workflow digits-mlp-0123456789 is Running")})
    _, started = _run(ep, Counters({"base": 0.9, "int8": 0.9}), looks=0, backend=training)
    assert started.phase == RUNNING and [a.name for a in training.serving_now[ep.name].arms] == ["base", "int8"]


def test_a_restarted_controller_resumes_from_the_saved_state() -> None:
    ep = _endpoint(min_samples_per_arm=1000)
    counters = Counters({"base": 0.90, "int8": 0.97})
    backend, state = _run(ep, counters, looks=2)
    assert state.phase == RUNNING and state.looks == 3  # one look when it starts, one per pass
    saved = backend.state[ep.name].experiment
    # a new controller (new process) on the same backend: same key, same start, more looks
    backend2, state2 = _run(ep, counters, looks=1, backend=backend, start=1030.0)
    assert state2.started == saved["started"] and state2.looks == 5


def test_a_changed_experiment_starts_over() -> None:
    ep = _endpoint(min_samples_per_arm=1000)
    backend, state = _run(ep, Counters({"base": 0.9, "int8": 0.9}), looks=2)
    changed = _endpoint(min_samples_per_arm=2000)
    _, again = _run(changed, Counters({"base": 0.9, "int8": 0.9}), looks=0, backend=backend, start=5000.0)
    assert again.key != state.key and again.looks == 1 and again.started == 5000.0


def test_serving_for_after_a_decision() -> None:
    ep = _endpoint()
    assert [a.share for a in serving_for(ep, VERSION, None).arms] == [50, 50]


def test_count_queries_parse() -> None:
    import promql_parser

    for primary in (PrimaryMetric(kind="success-rate"), PrimaryMetric(kind="latency-under", latency_under_seconds=0.1),
                    PrimaryMetric(kind="ratio", numerator='sum(increase(c_total{forge_role="{role}"}[{window}]))',
                                  denominator='sum(increase(r_total{forge_role="{role}"}[{window}]))')):
        for q in count_queries(primary, endpoint="e", namespace="n", role="int8", window="125s"):
            promql_parser.parse(q)
            assert 'forge_role="int8"' in q and "[125s]" in q
    s, _ = count_queries(PrimaryMetric(kind="latency-under", latency_under_seconds=0.1), endpoint="e", namespace="n",
                         role="a", window="1s")
    assert 'le="0.1"' in s


def test_status_text_and_json() -> None:
    from forgectl.experiment_cli import status_data, status_text

    ep = _endpoint(min_samples_per_arm=1000)
    backend, state = _run(ep, Counters({"base": 0.90, "int8": 0.97}), looks=100)
    data = status_data(ep.name, "digits-mlp", VERSION, backend.state[ep.name].experiment)
    text = status_text(data)
    assert "Decided — winner int8" in text and "(control)" in text and "better" in text
    assert "p (always valid)" in text
    import json

    again = json.loads(json.dumps(data))
    assert again["experiment"]["decision"]["comparisons"][0]["verdict"] == "better"


def test_versions_an_experiment_serves_are_kept() -> None:
    """A Workflow whose version an arm or the shadow serves is not pruned (session.in_use)."""
    from reconciler.plan.session import in_use
    from reconciler.resources import ObjectRef
    from renderers.seldon import ArmServing, render_seldon

    specs = load_or_raise([str(ROOT / "examples" / "experiments")]).specs
    ep = next(e for e in specs.of(Endpoint) if e.name == "digits-ab")
    env = specs.environment("local")
    state = ServingState("aaaaaaaaaaaa", arms=(ArmServing("base", "aaaaaaaaaaaa", "base", 50),
                                                ArmServing("int8", "bbbbbbbbbbbb", "int8", 50)), shadow="cccccccccccc")
    sd = render_seldon(specs, ep, env, "ns", None, state)
    workflows = [{"kind": "Workflow", "metadata": {"name": f"wf-{v[:2]}", "namespace": "ns",
                                                   "labels": {"forge.dev/model-version": v}}}
                 for v in ("aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc", "dddddddddddd")]
    kept = {ref.name for ref in in_use([sd, *workflows], {ObjectRef.of(sd)})}
    assert kept == {"wf-aa", "wf-bb", "wf-cc"}
    # the endpoint itself removed from the specs: its SeldonDeployment goes, and keeps nothing
    assert in_use([sd, *workflows], set()) == {}
