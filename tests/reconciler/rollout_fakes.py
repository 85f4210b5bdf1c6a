"""The target as the rollout commands see it, faked (state kept as JSON, as both targets keep it),
and the endpoints they are asked about: shared by test_watch, test_steering and test_writeback."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from reconciler.rollout.controller import Readiness, RolloutState
from renderers.seldon import ServingState
from specs import Endpoint

V1, V2 = "a" * 12, "b" * 12


def an_endpoint(name: str, *, experiment: bool = False, shadow: bool = False) -> Endpoint:
    """A valid Endpoint of the quick-start's model; with an A/B experiment or a shadow when asked."""
    spec: dict[str, Any] = {"modelRef": "digits-mlp"}
    if experiment:
        spec["experiment"] = {"arms": [{"name": "control", "share": 50}, {"name": "int8", "variant": "int8", "share": 50}],
                              "primary": {"kind": "success-rate"}}
    if shadow:
        spec["shadow"] = {"variant": "pruned", "percent": 100}
    return Endpoint.model_validate({"apiVersion": "forge.dev/v1alpha1", "kind": "Endpoint", "metadata": {"name": name},
                                    "spec": spec})


@dataclass
class FakeBackend:
    """The target as the rollout commands see it: what serves, the saved state (as JSON), the
    offline gate, events, and how often the loop read the target afresh."""

    serving_now: dict[str, ServingState] = field(default_factory=dict)
    gate: tuple[bool, bool, str] = (True, True, "Workflow succeeded: evaluation thresholds met")
    saved: dict[str, dict[str, Any]] = field(default_factory=dict)
    refreshes: int = 0
    revisions: dict[str, str] = field(default_factory=dict)

    def refresh(self) -> None:
        self.refreshes += 1

    def serving(self, endpoint: str) -> ServingState | None:
        return self.serving_now.get(endpoint)

    def load_state(self, endpoint: str) -> RolloutState | None:
        data = self.saved.get(endpoint)
        return RolloutState.from_json(data) if data is not None else None

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        self.saved[endpoint] = json.loads(json.dumps(state.to_json()))

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        self.serving_now[endpoint.name] = state

    def model_gate(self, model: str, version: str, variant: str | None) -> tuple[bool, bool, str]:
        return self.gate

    def canary_ready(self, endpoint: str, version: str) -> Readiness:
        return Readiness(True, "1 canary pod(s) Ready")

    def event(self, endpoint: str, kind: str, reason: str, message: str) -> None:
        pass

    def stable_revision(self, model: str, version: str) -> str | None:
        return self.revisions.get(version)

    def shadow_stats(self, endpoint: str) -> dict[str, Any] | None:
        return {"mirrored": 3}


def desired_of(*endpoints: Endpoint, version: str = V1) -> list[Any]:
    from reconciler.load.endpoints import DesiredEndpoint

    return [DesiredEndpoint(e, "digits-mlp", version, None) for e in endpoints]
