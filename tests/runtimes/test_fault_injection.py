"""A Model's `faultInjection` for retry drills (issue 35). `holdFirstAttemptSeconds`: the train
step's first attempt holds, saying so, until it is killed; a retry finds the attempt's marker and
trains as usual. `killFirstAttempt`: the first attempt kills itself (SIGKILL, a container's exit
137), deterministically, which is what the end-to-end test's retried training
(tests/cluster/test_runtime_node.py, stage 3) runs on, where deleting a running pod raced Argo."""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from devkit.digits import DIGITS_MODEL, train_config
from devkit.runtime_steps import Runner
from runtimes._step import first_attempt, hold_first_attempt
from tests.polling import holds_for
from tests.runtimes.helpers import ROOT, events

HOLD = 600  # far longer than the test takes to see the hold and kill the attempt


def _drill_config(output: str, faults: dict[str, Any]) -> dict[str, Any]:
    """The digits train step's config for a short run with ``faults`` as its faultInjection."""
    spec = copy.deepcopy(DIGITS_MODEL)
    spec["hyperparameters"]["epochs"] = 2
    spec["faultInjection"] = faults
    return train_config(output, spec)


def _retry_trains(digits: Runner, config: dict[str, Any], event: str) -> None:
    """The retry (the same config, as Argo's next attempt runs it) finds the first attempt's
    marker, so no ``event`` this time, and trains to the end."""
    retry = digits.run("train", config, timeout=600)
    kinds = [e["event"] for e in events(retry.stdout)]
    assert event not in kinds and kinds[-1] == "done", kinds


def test_the_first_caller_holds_and_a_later_one_does_not(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "out" / "checkpoints" / "held"
    assert hold_first_attempt(marker, 0) is True
    assert marker.exists()
    assert [e["event"] for e in events(capsys.readouterr().out)] == ["hold"]
    started = time.monotonic()
    assert hold_first_attempt(marker, HOLD) is False  # the marker is there: no wait, no event
    assert time.monotonic() - started < 5 and events(capsys.readouterr().out) == []


@pytest.mark.runtime
def test_a_held_training_is_killed_while_it_holds_and_the_retry_trains(digits: Runner) -> None:
    config = _drill_config("models/held", {"holdFirstAttemptSeconds": HOLD})
    proc = subprocess.Popen(digits.command("train", config), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=digits.env(), cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"the step exited {proc.wait()} without a line"
        first = json.loads(line)  # the hold comes before anything else
        assert first["event"] == "hold" and first["seconds"] == HOLD, first
        assert Path(first["marker"]) == digits.workspace / "models/held/checkpoints/fault-injection-held"
        assert Path(first["marker"]).exists()
        # held: the attempt neither ends nor writes anything while the drill gets to it
        holds_for(lambda: proc.poll() is None and not (digits.workspace / "models/held/metrics.json").exists(), 2.0,
                  "the held attempt waiting")
    finally:
        proc.send_signal(signal.SIGKILL)  # the drill: what a deleted pod does to the step
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    _retry_trains(digits, config, "hold")
    metrics = digits.read("models/held/metrics.json")
    assert metrics["resumedFromStep"] == 0 and metrics["steps"] > 0


def test_one_first_attempt_whoever_asks(tmp_path: Path) -> None:
    marker = tmp_path / "out" / "checkpoints" / "killed"
    assert first_attempt(marker, "killed") is True
    assert [first_attempt(marker, "killed") for _ in range(3)] == [False, False, False]
    assert marker.read_text().startswith("killed at ")


@pytest.mark.runtime
def test_the_first_training_attempt_kills_itself_and_the_retry_trains(digits: Runner) -> None:
    config = _drill_config("models/killed", {"killFirstAttempt": True})
    first = subprocess.run(digits.command("train", config), capture_output=True, text=True, env=digits.env(), cwd=ROOT,
                           timeout=300)
    # killed by the kernel's signal, as the OOM killer ends a process: a container reports 137
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr[-2000:])
    [kill] = events(first.stdout)  # the kill comes before anything else
    assert kill["event"] == "kill" and Path(kill["marker"]).exists(), kill
    assert not (digits.workspace / "models/killed/metrics.json").exists()

    _retry_trains(digits, config, "kill")
    assert digits.read("models/killed/metrics.json")["steps"] > 0
