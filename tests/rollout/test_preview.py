"""The rollout a plan shows (reconciler/rollout/preview.py) is the one the controller walks: its
first state is the controller's own first pass (machine.observe), and its weights are the ones the
controller then sets, step by step, on the fakes of test_rollout_core (a healthy canary)."""

from __future__ import annotations

from reconciler.load.endpoints import DesiredEndpoint
from reconciler.rollout.controller import Phase
from reconciler.rollout.preview import PlannedRollout, planned_rollout
from renderers.seldon import ServingState
from specs import Endpoint
from tests.rollout.test_rollout_core import ENDPOINT, V1, V2, FakeBackend, phase_is, policy, rig


def test_the_planned_canary_is_the_rollout_the_controller_walks() -> None:
    wanted = policy()
    planned = planned_rollout(DesiredEndpoint(ENDPOINT, "digits-mlp", V2, wanted), ServingState(V1))
    assert planned is not None and planned.strategy == "canary" and (planned.stable, planned.canary) == (V1, V2)
    assert planned.summary() == f"canary of version {V2} (stable {V1}) by policy `p`: 10 → 50 → 100 %"
    assert planned.steps[0].gates == ("success-rate ≥ 0.99", "latency-p99 ≤ 0.2") and planned.steps[0].pause_seconds == 5
    assert planned.steps[2].gates == ("success-rate ≥ 0.99",)
    assert PlannedRollout.from_json(planned.to_json()) == planned

    r = rig(wanted, FakeBackend(serving_now=ServingState(V1)))  # what an apply leaves: the canary at 0 %
    r.backend.gate = (False, False, "Workflow digits-mlp-b is Running")
    first = r.reconcile()
    assert (first.phase.value, first.history[0]["reason"]) == (planned.first_phase, planned.first_reason)
    r.backend.gate = (True, True, "Workflow digits-mlp-b succeeded")
    r.drive(phase_is(Phase.PROMOTED))
    walked = [s.canary_weight for s in r.backend.applied if s.canary == V2]
    assert walked == [s.weight for s in planned.steps], walked


def test_blue_green_without_a_policy_and_nothing_new() -> None:
    blue_green = policy(blue_green={"analysis": ["success-rate"], "previewTrafficPercent": 5, "autoPromote": False})
    planned = planned_rollout(DesiredEndpoint(ENDPOINT, "digits-mlp", V2, blue_green), ServingState(V1))
    assert planned is not None and planned.strategy == "blueGreen"
    assert planned.summary().endswith("preview at 5 %, then wait for `forgectl rollout promote`"), planned.summary()
    bare = planned_rollout(DesiredEndpoint(ENDPOINT, "digits-mlp", V2, None), ServingState(V1))
    assert bare is not None and bare.summary().endswith("with no RolloutPolicy: 100 %") and bare.steps[0].gates == ()
    # the stable version again, a first deployment, an experiment: no rollout starts
    assert planned_rollout(DesiredEndpoint(ENDPOINT, "digits-mlp", V1, policy()), ServingState(V1)) is None
    assert planned_rollout(DesiredEndpoint(ENDPOINT, "digits-mlp", V2, policy()), None) is None
    experiment = Endpoint.model_validate({**ENDPOINT.model_dump(by_alias=True, exclude_none=True), "spec": {
        **ENDPOINT.spec.model_dump(by_alias=True, exclude_none=True),
        "experiment": {"arms": [{"name": "base", "share": 50}, {"name": "int8", "variant": "int8", "share": 50}],
                       "primary": {"kind": "success-rate"}}}})
    assert planned_rollout(DesiredEndpoint(experiment, "digits-mlp", V2, policy()), ServingState(V1)) is None
