"""The regression gate: a candidate against the live version on the same held-out data (registry
records), refused with the numbers before any traffic moves."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.load.loader import load_or_raise
from reconciler.rollout.controller import Controller, Phase, Readiness, RolloutState
from reconciler.rollout.regression import regression_gate
from renderers.seldon import ServingState
from specs import Endpoint, RolloutPolicy
from specs.rollout import RegressionGate

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "4e" * 32


def record(version: str, accuracy: float, digest: str = DIGEST, variant: str = "int8") -> dict[str, Any]:
    return {"model": "digits-mlp", "version": version, "lineage": {"datasetDigest": digest},
            "evaluation": {"accuracy": accuracy + 0.001},
            "variants": {variant: {"figures": {"accuracy": accuracy}}, "base": {"figures": {"accuracy": None}}}}


def test_pure_gate() -> None:
    gate = RegressionGate(max_drop=0.01)
    worse = regression_gate(gate, record("b" * 12, 0.90), record("a" * 12, 0.95), "int8")
    assert worse.passed is False and "candidate bbbbbbbbbbbb 0.9000, live aaaaaaaaaaaa 0.9500 (-0.0500" in worse.detail
    within = regression_gate(gate, record("b" * 12, 0.945), record("a" * 12, 0.95), "int8")
    assert within.passed is True
    other = regression_gate(gate, record("b" * 12, 0.5, "sha256:" + "00" * 32), record("a" * 12, 0.95), "int8")
    assert other.passed is None and "different data" in other.detail
    strict = regression_gate(RegressionGate(on_different_data="refuse"), record("b" * 12, 0.99, "sha256:" + "00" * 32),
                             record("a" * 12, 0.95), "int8")
    assert strict.passed is False
    # base falls back to the evaluate step's accuracy
    base = regression_gate(gate, record("b" * 12, 0.9), record("a" * 12, 0.95), "base")
    assert base.passed is False and base.candidate == 0.901
    assert regression_gate(gate, None, record("a" * 12, 0.95), "int8").passed is None


@dataclass
class Backend:
    records: dict[str, dict[str, Any]]
    serving_now: ServingState = field(default_factory=lambda: ServingState("a" * 12))
    state: RolloutState | None = None
    applied: list[ServingState] = field(default_factory=list)

    def serving(self, endpoint: str) -> ServingState | None:
        return self.serving_now

    def load_state(self, endpoint: str) -> RolloutState | None:
        return self.state

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        self.state = RolloutState.from_json(state.to_json())

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        self.serving_now = state
        self.applied.append(state)

    def model_gate(self, model: str, version: str, variant: str | None) -> tuple[bool, bool, str]:
        return True, True, "evaluation thresholds met"

    def canary_ready(self, endpoint: str, version: str) -> Readiness:
        return Readiness(True, "1 canary pod(s) Ready")

    def event(self, endpoint: str, kind: str, reason: str, message: str) -> None:
        pass

    def registered(self, model: str, version: str) -> dict[str, Any] | None:
        return self.records.get(version)


def _specs() -> tuple[Endpoint, RolloutPolicy]:
    specs = load_or_raise([str(ROOT / "examples" / "quickstart")]).specs
    ep = specs.of(Endpoint)[0]
    policy = specs.of(RolloutPolicy)[0]
    policy = policy.model_copy(update={"spec": policy.spec.model_copy(update={"regression_gate": RegressionGate(max_drop=0.01)})})
    return ep, policy


def test_the_controller_refuses_a_worse_candidate_before_any_traffic() -> None:
    ep, policy = _specs()
    backend = Backend({"a" * 12: record("a" * 12, 0.95), "b" * 12: record("b" * 12, 0.80)})
    state = Controller(backend, None, "ns").reconcile(ep, "b" * 12, "digits-mlp", policy)
    assert state is not None and state.phase is Phase.ROLLED_BACK
    assert "regression gate refused" in state.reason and "0.8000" in state.reason and "0.9500" in state.reason
    assert state.regression == {"passed": False, "detail": state.regression["detail"], "candidate": 0.8, "live": 0.95}
    assert all(s.canary is None for s in backend.applied)  # no traffic ever moved


def test_the_controller_lets_an_equal_candidate_through_with_the_numbers() -> None:
    ep, policy = _specs()
    backend = Backend({"a" * 12: record("a" * 12, 0.95), "b" * 12: record("b" * 12, 0.951)})
    state = Controller(backend, None, "ns").reconcile(ep, "b" * 12, "digits-mlp", policy)
    assert state is not None and state.phase is Phase.PROGRESSING
    assert "regression gate passed" in state.history[-1]["reason"]
    assert state.regression["passed"] is True


def test_a_policy_without_the_gate_keeps_its_digest() -> None:
    specs = load_or_raise([str(ROOT / "examples" / "quickstart")]).specs
    dumped = specs.of(RolloutPolicy)[0].model_dump(mode="json", by_alias=True)
    assert "regressionGate" not in dumped["spec"]
