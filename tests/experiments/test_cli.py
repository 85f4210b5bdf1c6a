"""`forgectl experiment status|stop` and `rollout status` on a local environment before the first
apply (the wiring; the figures themselves: test_controller.py, test_local_experiment.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from forgectl.cli import app
from reconciler.targets.local import processes
from reconciler.targets.local.state import StateDB

ROOT = Path(__file__).resolve().parents[2]


def test_experiment_commands_before_the_first_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    specs = tmp_path / "specs"
    shutil.copytree(ROOT / "examples" / "experiments", specs)
    monkeypatch.chdir(specs)
    try:
        _commands()
    finally:  # the commands start the environment's local Prometheus: stop what was recorded
        for db_path in specs.glob(".forge/*/state.db"):
            for record in StateDB(db_path).processes():
                processes.stop(record)


def _commands() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["experiment", "status", "digits-ab", "--specs", ".", "--env", "local", "-o", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["endpoint"] == "digits-ab" and data["experiment"] is None and len(data["desiredVersion"]) == 12
    text = runner.invoke(app, ["experiment", "status", "digits-ab", "--specs", ".", "--env", "local"])
    assert "experiment not started yet" in text.stdout
    stop = runner.invoke(app, ["experiment", "stop", "digits-ab", "--specs", ".", "--env", "local"])
    assert stop.exit_code == 1 and "has no experiment" in str(stop.exception)
    missing = runner.invoke(app, ["experiment", "status", "nope", "--specs", ".", "--env", "local"])
    assert missing.exit_code == 1 and "no Endpoint 'nope'" in str(missing.exception)
