"""The serving module and the local target's state DB, without processes (fast, order-free).

* what an endpoint serves survives render → read back (`render_serving` / `serving_states`), so
  the plan and the rollout backends, which meet only through the live SeldonDeployment, agree;
* `desired_serving` keeps the stable version and the controller's canary weight, keeps a
  rolled-back canary out, and serves a new version outright on a first apply;
* the StateDB methods that now hold every SQL statement of the local target.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.load.loader import load
from reconciler.rollout.controller import Phase, RolloutState
from reconciler.targets.local.state import StateDB
from reconciler.traffic.serving import desired_serving, render_serving, serving_states, with_namespace
from renderers.seldon import ServingState
from renderers.versions import model_version
from specs import Endpoint, Environment

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def quickstart():
    specs = load([str(ROOT / "examples" / "quickstart")]).specs
    env = specs.environment(None)
    assert env is not None
    endpoint = specs.get(Endpoint, "digits")
    assert endpoint is not None
    return specs, env, endpoint, model_version(specs, specs.model_of(endpoint), env)


@pytest.mark.parametrize("state", [ServingState("v1"), ServingState("v1", "v2", 30), ServingState("v1", "v2", 0)],
                         ids=["stable", "canary-30", "canary-0"])
def test_rendered_serving_reads_back(quickstart, state: ServingState) -> None:
    specs, env, endpoint, _ = quickstart
    obj = render_serving(specs, env, "ns-1", None, endpoint, state)
    assert obj["metadata"]["namespace"] == "ns-1"
    back = serving_states([obj])["digits"]
    assert (back.stable, back.canary, back.canary_weight) == (state.stable, state.canary, state.canary_weight)


def test_desired_serving_follows_live_and_rollout_state(quickstart) -> None:
    specs, env, endpoint, want = quickstart
    # first apply: the specs' version serves alone
    assert desired_serving(specs, env, {}, {}) == {"digits": ServingState(want)}
    # a new version while another is stable: a canary at the weight the controller set
    live = {"digits": ServingState("old", want, 25)}
    assert desired_serving(specs, env, live, {}) == {"digits": ServingState("old", want, 25)}
    # a canary of another version is replaced by the wanted one at 0 %
    live = {"digits": ServingState("old", "other", 25)}
    assert desired_serving(specs, env, live, {}) == {"digits": ServingState("old", want, 0)}
    # rolled back: the plan does not re-add the canary
    rolled_back = RolloutState("digits", "old", want, Phase.ROLLED_BACK)
    assert desired_serving(specs, env, {"digits": ServingState("old")}, {"digits": rolled_back}) == {"digits": ServingState("old")}


def test_with_namespace_overrides_only_a_cluster_namespace(quickstart) -> None:
    specs, env, _, _ = quickstart
    assert env.spec.kubernetes is None and with_namespace(env, "anything") is env  # no cluster settings to move
    cluster = next(e for e in specs.of(Environment) if e.spec.target == "kubernetes")
    moved = with_namespace(cluster, "elsewhere")
    assert moved.spec.kubernetes is not None and moved.spec.kubernetes.namespace == "elsewhere"
    assert cluster.spec.kubernetes is not None and cluster.spec.kubernetes.namespace == "forge-quickstart"  # a copy
    assert with_namespace(cluster, "forge-quickstart") is cluster


def test_state_db_steps_runs_cache_and_rollouts(tmp_path: Path) -> None:
    db = StateDB(tmp_path / "state.db")
    db.start_workflow_run("wf-a", 1.0)
    db.start_workflow_run("digits-mlp-0123456789", 2.0)
    db.set_step("wf-a", "train", status="running", attempts=1, started=10.0)
    db.set_step("wf-a", "prepare", status="succeeded", started=5.0, finished=6.0, exit_code=0)
    db.set_step("wf-a", "train", status="succeeded", finished=12.5, exit_code=0, message="done")
    with pytest.raises(ValueError, match="not a step field"):
        db.set_step("wf-a", "train", **{"status = 'x', exit_code": 1})
    steps = db.step_runs("wf-a")
    assert [(s.step, s.status) for s in steps] == [("prepare", "succeeded"), ("train", "succeeded")]
    assert (steps[1].attempts, steps[1].started, steps[1].finished, steps[1].message) == (1, 10.0, 12.5, "done")
    assert db.step_runs("wf-b") == []

    db.finish_workflow_run("wf-a", "Failed", 20.0, "step train failed")
    assert [r.name for r in db.workflow_runs(phase="Running")] == ["digits-mlp-0123456789"]
    assert [(r.name, r.phase, r.message) for r in db.workflow_runs(name_like="wf-%")] == [("wf-a", "Failed", "step train failed")]
    assert db.workflow_runs(phase="Running", name_like="wf-%") == []

    assert db.cached_step("k1") is None
    db.cache_step("k1", "train", "wf-a", None, 3.0)
    db.cache_step("k2", "train", "wf-a", "models/x", 3.0)
    entry1, entry2 = db.cached_step("k1"), db.cached_step("k2")
    assert entry1 is not None and entry1.output is None  # cached, declares no output
    assert entry2 is not None and entry2.output == "models/x"

    assert db.rollouts() == {}
    db.set_rollout("digits", {"endpoint": "digits", "stable": "v1", "phase": "Idle"})
    assert db.rollouts() == {"digits": {"endpoint": "digits", "stable": "v1", "phase": "Idle"}}


def test_a_plan_reads_the_local_registry_through_the_target(quickstart, tmp_path: Path) -> None:
    """`registry_records` asks the Target (`model_records`, no backfill) only when the plan moves
    an endpoint to another version; the local target answers from its state DB."""
    from reconciler.plan.change import Action, Change
    from reconciler.plan.plan import Plan
    from reconciler.plan.review import registry_records
    from reconciler.registry.records import Record
    from reconciler.resources import ObjectRef
    from reconciler.targets.local.target import LocalTarget
    specs, env, endpoint, _ = quickstart
    target = LocalTarget(env, "forge-local", repo_root=tmp_path)
    target.db.put_model_version(1.0, Record.from_json({"model": "digits-mlp", "version": "v1"}))
    target.db.put_model_version(2.0, Record.from_json({"model": "digits-mlp", "version": "v2"}))
    before = render_serving(specs, env, "forge-local", None, endpoint, ServingState("v1"))
    ref = ObjectRef.of(before)
    moving = render_serving(specs, env, "forge-local", None, endpoint, ServingState("v1", "v2", 0))
    plan = Plan("local", "local", (Change(ref, Action.UPDATE, before, moving),))
    assert [r.version for r in registry_records(plan, target)] == ["v1", "v2"]
    same = Plan("local", "local", (Change(ref, Action.UPDATE, before, before),))
    assert registry_records(same, target) == []
    # nothing live, nothing backfilled; the details of an idle target are empty
    assert target.model_records([], "digits-mlp", backfill=True) == target.db.model_versions("digits-mlp")
    details = target.run_details([])
    assert (dict(details.steps), details.running, details.models, dict(details.endpoint_urls)) == ({}, [], [], {})
    assert target.log_files("train") == []
