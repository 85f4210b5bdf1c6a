"""Steering a rollout by hand (`forgectl rollout promote|abort|retry|status`,
`reconciler/rollout/steering.py`), on the real rollout controller over a fake backend."""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.diagnostics import ForgeError
from reconciler.rollout.controller import Controller, Phase, RolloutState
from reconciler.rollout.steering import retry, status_data, steer
from renderers.seldon import ServingState
from specs import Endpoint
from tests.reconciler.rollout_fakes import V1, V2, FakeBackend, an_endpoint, desired_of


def _in_progress(backend: FakeBackend, endpoint: Endpoint) -> RolloutState:
    """A rollout waiting for its model (the offline gate not passed yet), as `reconcile` leaves it."""
    backend.serving_now[endpoint.name] = ServingState(V1, V2, 0)
    backend.gate = (False, False, "Workflow still running")
    state = Controller(backend, None, "forge-test").reconcile(endpoint, V2, "digits-mlp", None)
    assert state is not None and state.phase is Phase.WAITING
    return state


@pytest.mark.parametrize("promote, phase", [(True, Phase.PROMOTED), (False, Phase.ABORTED)])
def test_steer_promotes_or_aborts_a_rollout_in_progress_and_saves_it(promote: bool, phase: Phase) -> None:
    backend = FakeBackend()
    desired = desired_of(an_endpoint("digits"), version=V2)[0]
    state = _in_progress(backend, desired.endpoint)
    controller = Controller(backend, None, "forge-test")
    after = steer(controller, backend, desired, state, promote=promote)
    assert after.phase is phase and backend.load_state("digits") == after
    with pytest.raises(ForgeError, match="endpoint 'digits' has no rollout in progress"):
        steer(controller, backend, desired, after, promote=promote)  # at rest now


def test_steer_refuses_without_a_rollout() -> None:
    backend = FakeBackend()
    desired = desired_of(an_endpoint("digits"))[0]
    controller = Controller(backend, None, "forge-test")
    for state in (None, RolloutState("digits", V1), RolloutState("digits", V1, V2, Phase.IDLE)):
        with pytest.raises(ForgeError, match="has no rollout in progress"):
            steer(controller, backend, desired, state, promote=True)
    assert backend.saved == {}


def test_retry_starts_a_failed_rollout_again_and_refuses_others() -> None:
    backend = FakeBackend()
    desired = desired_of(an_endpoint("digits"), version=V2)[0]
    controller = Controller(backend, None, "forge-test")
    aborted = steer(controller, backend, desired, _in_progress(backend, desired.endpoint), promote=False)
    again = retry(controller, backend, desired, aborted)
    assert again.phase is Phase.WAITING and again.canary == V2 and backend.load_state("digits") == again
    for state in (None, again, RolloutState("digits", V1, V2, Phase.PROMOTED)):
        with pytest.raises(ForgeError, match="has no rolled-back or aborted rollout to retry"):
            retry(controller, backend, desired, state)


def test_status_data_asks_for_shadow_figures_only_with_a_shadow() -> None:
    asked: list[str] = []

    def stats(endpoint: str) -> dict[str, Any]:
        asked.append(endpoint)
        return {"mirrored": 3}

    desired = desired_of(an_endpoint("digits"), version=V2)[0]
    state = RolloutState("digits", V1, V2, Phase.PROGRESSING, step=0, weight=10)
    data = status_data(desired, ServingState(V1, V2, 10), state, stats)
    assert data == {"endpoint": "digits", "model": "digits-mlp", "desiredVersion": V2,
                    "serving": {"stable": V1, "canary": V2, "weights": {"stable": 90, "canary": 10}},
                    "rollout": state.to_json(), "shadow": None}
    assert asked == []
    shadowed = desired_of(an_endpoint("digits", shadow=True), version=V2)[0]
    assert status_data(shadowed, None, None, stats)["shadow"] == {"mirrored": 3} and asked == ["digits"]
    assert status_data(desired, None, None, None) == {"endpoint": "digits", "model": "digits-mlp", "desiredVersion": V2,
                                                      "serving": None, "rollout": None, "shadow": None}
