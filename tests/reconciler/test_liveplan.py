"""The plan `plan` shows and `apply` carries out (`reconciler/plan/live.py`): a saved plan read
back, a blocked plan refused, the prerequisite notes of its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.diagnostics import ForgeError
from tests.reconciler.quickstart_repo import copied_example


def test_saved_plan_is_read_only_from_one_existing_json_file(tmp_path: Path) -> None:
    from reconciler.plan.live import saved_plan
    from reconciler.plan.plan import Plan

    plan = Plan("local", "local", (), live_fingerprint="f" * 16, notes=("a note",))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_json()))
    assert saved_plan([str(path)]) == plan
    (tmp_path / "specs").mkdir()
    for paths in (None, [], [str(tmp_path / "specs")], [str(tmp_path / "missing.json")], [str(path), str(path)]):
        assert saved_plan(paths) is None  # specs to plan, not a saved plan
    bad = tmp_path / "bad.json"
    for text in ("{not json", json.dumps({"format": 1})):
        bad.write_text(text)
        with pytest.raises(ForgeError, match=r"bad\.json: not a saved Forge plan"):
            saved_plan([str(bad)])


def test_ensure_runnable_refuses_a_blocked_plan_naming_the_first_blocker() -> None:
    from reconciler.plan.live import ensure_runnable
    from reconciler.plan.plan import Plan
    from reconciler.plan.risks import Finding

    ensure_runnable(Plan("local", "local", ()))
    one = Finding("gpu-capacity", "model `big` needs 16 GPUs; pool `a100` has 8")
    with pytest.raises(ForgeError, match=r"^the target cannot run this plan: model `big` needs 16 GPUs; pool `a100` has 8$"):
        ensure_runnable(Plan("local", "local", (), blockers=(one,)))
    with pytest.raises(ForgeError, match=r"pool `a100` has 8 \(and 2 more\)$"):
        ensure_runnable(Plan("local", "local", (), blockers=(one, one, one)))


def test_plan_json_adds_prerequisite_notes_only_for_a_cluster(tmp_path: Path) -> None:
    from reconciler.plan.live import plan_json
    from reconciler.plan.plan import Plan
    from reconciler.targets.local.target import LocalTarget

    result = copied_example(tmp_path)
    local = result.specs.environment("local")
    plan = Plan("local", "local", (), notes=("a note",))
    # the local target has no cluster to check (Target.cluster_api is None): the notes stay the plan's
    target = LocalTarget(local, "forge-local", repo_root=tmp_path)
    assert target.cluster_api() is None
    assert plan_json(plan, local, target) == plan.to_json()
