"""An experiment that has ended serves its decision while the specs still name its arms: the plan
says which arm serves, why, and what edit makes the Endpoint say so — from the rollout state the
experiment controller saved, through `forgectl plan` on the local target."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import asdict
from pathlib import Path

from reconciler.experiment.controller import DECIDED, RUNNING, STOPPED, ExperimentState, experiment_key, resolve_arms
from reconciler.load.loader import load_or_raise
from reconciler.plan.experiments import experiment_notes
from reconciler.rollout.machine import RolloutState
from reconciler.targets.local.state import StateDB
from renderers.versions import model_version
from specs import Endpoint, SpecSet

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "experiments"
ENDPOINT = "digits-ab"
WHY = "msprt (2,412 and 2,398 samples, p = 0.003); int8 serves all traffic"


def _specs(folder: Path = EXAMPLE) -> tuple[SpecSet, str]:
    specs = load_or_raise([str(folder)]).specs
    env = specs.environment("local")
    assert env is not None
    return specs, model_version(specs, specs.model_of(_endpoint(specs)), env)


def _endpoint(specs: SpecSet) -> Endpoint:
    endpoint = specs.get(Endpoint, ENDPOINT)
    assert endpoint is not None
    return endpoint


def _ended(specs: SpecSet, version: str, phase: str, winner: str | None, reason: str) -> RolloutState:
    """The rollout state the experiment controller saves once the experiment of these specs ended."""
    endpoint = _endpoint(specs)
    arms = resolve_arms(endpoint, version)
    state = ExperimentState(experiment_key(endpoint, arms), phase, time.time(), "base", [asdict(a) for a in arms],
                            winner=winner, reason=reason)
    return RolloutState(ENDPOINT, version, experiment=state.to_json())


def test_a_decided_experiment_names_the_winner_and_the_edit() -> None:
    specs, version = _specs()
    [note] = experiment_notes(specs, {ENDPOINT: _ended(specs, version, DECIDED, "int8", WHY)}, {"digits-mlp": version})
    assert note == (f"endpoint {ENDPOINT}: its experiment decided — {WHY}; arm int8 (version {version}, variant int8) "
                    "serves all traffic, while the spec still names the arms: to make git say what serves, "
                    "replace `experiment` with `variant: int8`")
    # the control arm serves the Endpoint's own variant: removing the experiment is the whole edit
    [note] = experiment_notes(specs, {ENDPOINT: _ended(specs, version, DECIDED, "base", WHY)}, {"digits-mlp": version})
    assert note.endswith("remove `experiment`")


def test_a_stopped_experiment_says_control_serves_and_a_running_or_changed_one_says_nothing(tmp_path: Path) -> None:
    specs, version = _specs()
    stopped = _ended(specs, version, STOPPED, None, "guardrail latency-p99 failed on arm int8 2 times")
    [note] = experiment_notes(specs, {ENDPOINT: stopped}, {"digits-mlp": version})
    assert note.startswith(f"endpoint {ENDPOINT}: its experiment ended Stopped — guardrail latency-p99 failed")
    assert f"arm base (version {version}, variant base) serves all traffic" in note
    assert experiment_notes(specs, {ENDPOINT: _ended(specs, version, RUNNING, None, "running")}, {"digits-mlp": version}) == []
    # the arms changed since: a new experiment starts over, the old decision is not the plan's to report
    shutil.copytree(EXAMPLE, tmp_path / "specs")
    endpoint = tmp_path / "specs" / "endpoint.yaml"
    endpoint.write_text(endpoint.read_text().replace("share: 50", "share: 60", 1).replace("share: 50", "share: 40", 1))
    changed, _ = _specs(tmp_path / "specs")
    assert experiment_notes(changed, {ENDPOINT: _ended(specs, version, DECIDED, "int8", WHY)}, {"digits-mlp": version}) == []


def test_forgectl_plan_shows_the_decision_saved_in_the_state(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLE, tmp_path / "specs")
    specs, version = _specs(tmp_path / "specs")
    state_dir = tmp_path / ".forge" / "local"
    state_dir.mkdir(parents=True)
    with closing(StateDB(state_dir / "state.db")) as db:
        db.set_rollout(ENDPOINT, _ended(specs, version, DECIDED, "int8", WHY).to_json())
    out = subprocess.run([sys.executable, "-m", "forgectl", "plan", "specs", "-o", "json"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})
    assert out.returncode in (0, 2), out.stderr
    notes = json.loads(out.stdout)["notes"]
    assert any(n.startswith(f"endpoint {ENDPOINT}: its experiment decided — {WHY}") and n.endswith("`variant: int8`")
               for n in notes), notes



def test_the_plan_says_a_new_experiment_starts_with_its_arms(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLE, tmp_path / "specs")
    _, version = _specs(tmp_path / "specs")
    out = subprocess.run([sys.executable, "-m", "forgectl", "plan", "specs", "-o", "json"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})
    assert out.returncode in (0, 2), out.stderr
    [change] = [c for c in json.loads(out.stdout)["changes"]
                if c["ref"]["kind"] == "SeldonDeployment" and c["ref"]["name"] == ENDPOINT]
    assert change["reasons"] == [f"start an experiment: base ({version}, variant base) 50 %, int8 ({version}, variant int8) 50 %"]
