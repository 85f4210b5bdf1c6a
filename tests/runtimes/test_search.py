"""A search that learns and stops early, through the product's own train and pick-best steps and a
real Optuna study in a SQLite file on the workspace (what every trial pod of the Workflow mounts).

The trial configs are the ones ``renderers.workflow.plan_steps`` renders for a Model with a search;
the trials run as the Workflow's fan-out runs them (separate processes, two at a time for TPE)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from devkit.runtime_steps import Runner
from tests.runtimes.helpers import ROOT

pytestmark = pytest.mark.runtime

#: Three TPE trials at once, stopped early by the median rule.
TPE_MEDIAN = """\
  search:
    algorithm: tpe
    earlyStopping: median
    trials: 3
    parallelism: 3
    space:
      learningRate: {type: logUniform, min: 0.0001, max: 0.03}
      weightDecay: {type: uniform, min: 0.0, max: 0.001}
"""


def _rendered(tmp_path: Path, search: str, epochs: int) -> list[Any]:
    """plan_steps' steps for the quick-start's digits MLP with ``search`` (YAML under `spec:`)."""
    from reconciler.load.loader import load_or_raise
    from renderers.workflow import plan_steps
    from specs import Model

    root = tmp_path / "specs"
    shutil.copytree(ROOT / "examples" / "quickstart", root)
    text = (root / "model.yaml").read_text().replace("    epochs: 30\n", f"    epochs: {epochs}\n").replace("    batchSize: 64\n", "    batchSize: 128\n")
    (root / "model.yaml").write_text(text.replace("  precision: fp32\n", "  precision: fp32\n" + search))
    specs = load_or_raise([str(root)]).specs
    env, model = specs.environment("local"), specs.get(Model, "digits-mlp")
    assert env is not None and model is not None
    steps = plan_steps(specs, model, env)[1]
    for step in steps:  # the digits fixture prepared its data at data/digits
        if "data" in step.config:
            step.config["data"] = "data/digits"
    return steps


def _run_trials(digits: Runner, trials: list[Any], at_once: int) -> None:
    for start in range(0, len(trials), at_once):
        procs = [subprocess.Popen(digits.command("train", t.config), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=digits.env(), cwd=ROOT) for t in trials[start:start + at_once]]
        for proc in procs:
            out, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, err[-4000:]


def _register(digits: Runner, steps: list[Any], pick: Any) -> dict[str, Any]:
    """The register step over the picked bundle (as the Workflow's register task runs it): the
    registry records the search, and its summary (the cluster's record) lists the trials."""
    register = dict(next(s for s in steps if s.name == "register").config)
    register.update(variants={"base": pick.config["output"]}, benchmark=None, artifacts={})
    register.pop("benchmark")
    digits.run("register", register)
    registry = digits.read(f"{register['output']}/registry.json")
    summary = digits.read(f"{register['output']}/metrics.json")
    assert summary["search"]["study"]["trials"] == sorted(summary["search"]["study"]["trials"], key=lambda r: (
        r["state"] != "complete", r["value"] is None, -(r["value"] or 0.0), r["number"]))  # the best first
    return registry


def _shown(search: dict[str, Any]) -> str:
    """What `forgectl models show` prints for a version's search (its line and the trials table)."""
    from rich.console import Console

    from forgectl.models_cli import search_line, trials_table
    from specs.searchresult import SearchResult

    console = Console(width=200, record=True)
    result = SearchResult.from_json(search)
    console.print(search_line(result))
    console.print(trials_table(result))
    return console.export_text()


def test_grid_with_asha_prunes_the_trial_below_the_best_at_the_first_rung(digits: Runner, tmp_path: Path) -> None:
    steps = _rendered(tmp_path, """\
  search:
    algorithm: grid
    earlyStopping: asha
    trials: 2
    parallelism: 1
    space:
      learningRate: {type: choice, values: [0.01, 0.000001]}
""", epochs=4)
    trials = [s for s in steps if s.name.startswith("train-trial-")]
    _run_trials(digits, trials, at_once=1)
    first = digits.read(f"{trials[0].config['output']}/metrics.json")
    assert first["trial"]["state"] == "complete" and first["trial"]["epochsTrained"] == 4
    # ASHA's first rung is epoch 1: a trial goes on only in the top third of the trials there (the
    # best one while there are fewer than three), so the hopeless learning rate stops after one epoch.
    second = digits.read(f"{trials[1].config['output']}/metrics.json")
    assert second["trial"]["state"] == "pruned" and second["trial"]["prunedAtEpoch"] == 1, second["trial"]
    assert second["steps"] < first["steps"]
    pick = next(s for s in steps if s.name == "pick-best")
    digits.run("pick-best", pick.config)
    chosen = digits.read(f"{pick.config['output']}/trials.json")
    assert chosen["best"] == trials[0].config["output"]
    study = chosen["study"]
    assert study["states"] == {"complete": 1, "pruned": 1}
    assert study["epochsTrained"] == 4 + 1 and study["epochsBudget"] == 8 and study["epochsSaved"] == 3
    assert study["bestParams"] == {"learningRate": 0.01}
    rows = {r["number"]: r for r in study["trials"]}
    assert rows[first["trial"]["number"]]["value"] == pytest.approx(first["accuracy"])
    assert rows[second["trial"]["number"]]["prunedAtEpoch"] == 1 and rows[second["trial"]["number"]]["params"] == {"learningRate": 1e-06}
    assert (digits.workspace / pick.config["output"] / "model.pt").exists()
    registry = _register(digits, steps, pick)
    assert registry["search"]["study"] == study
    shown = _shown(registry["search"])
    assert "grid, early stopping asha: 2 trials (1 complete, 1 pruned)" in shown and "5 of 8 trial-epochs trained, 3 saved by pruning" in shown
    assert "learningRate 1e-06" in shown and "pruned" in shown


def test_tpe_trials_ask_the_study_in_parallel_and_pick_best_reads_it(digits: Runner, tmp_path: Path) -> None:
    steps = _rendered(tmp_path, TPE_MEDIAN, epochs=3)
    trials = [s for s in steps if s.name.startswith("train-trial-")]
    _run_trials(digits, trials, at_once=3)
    storage = digits.workspace / trials[0].config["trial"]["study"]["storage"]
    with sqlite3.connect(storage) as db:  # the study Optuna wrote: three trials, each with its two values
        assert db.execute("select count(*) from trials").fetchone()[0] == 3
        assert db.execute("select count(*) from trial_params").fetchone()[0] == 6
    asked = [digits.read(f"{t.config['output']}/metrics.json")["trial"]["asked"] for t in trials]
    assert all(0.0001 <= a["learningRate"] <= 0.03 and 0 <= a["weightDecay"] <= 0.001 for a in asked)
    assert len({a["learningRate"] for a in asked}) == 3
    for t, a in zip(trials, asked):  # the trial trained with the values it was asked
        assert digits.read(f"{t.config['output']}/metrics.json")["hyperparameters"]["learningRate"] == pytest.approx(a["learningRate"])
    pick = next(s for s in steps if s.name == "pick-best")
    digits.run("pick-best", pick.config)
    chosen = digits.read(f"{pick.config['output']}/trials.json")
    study = chosen["study"]
    assert study["algorithm"] == "tpe" and sum(study["states"].values()) == 3 and study["states"].get("complete", 0) >= 1
    best = digits.read(f"{chosen['best']}/metrics.json")
    assert best["trial"]["state"] == "complete" and best["accuracy"] == max(chosen["values"].values())
    assert study["bestParams"]["learningRate"] == pytest.approx(best["hyperparameters"]["learningRate"])
    assert {r["number"] for r in study["trials"]} == {digits.read(f"{t.config['output']}/metrics.json")["trial"]["number"] for t in trials}
    shown = _shown(_register(digits, steps, pick)["search"])
    assert f"best trial {study['bestTrial']}" in shown and "tpe, early stopping median: 3 trials" in shown


def test_trials_share_one_study_in_postgresql_per_run(digits: Runner, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch, runtime_python: str) -> None:
    """A cluster's study kept in PostgreSQL (Debian's server, as the node's pod runs it, here on
    127.0.0.1): three TPE trials open a study in a database with no tables yet at once (the
    race to create them is Optuna's and the server's), pick-best reads it back, and it is named by
    the run (the Workflow's uid), so a version trained again starts a study of its own."""
    from devkit.node import postgres

    steps = _rendered(tmp_path, TPE_MEDIAN, epochs=2)
    database = {"secret": "forge-studies", "key": "url"}  # what the cluster's Environment renders
    for step in steps:
        study = step.config.get("study") or (step.config.get("trial") or {}).get("study")
        if study is not None:
            study["database"] = database
    trials = [s for s in steps if s.name.startswith("train-trial-")]
    pick = next(s for s in steps if s.name == "pick-best")
    with postgres.on_host() as url:
        monkeypatch.setenv("FORGE_STUDY_URL", url)
        monkeypatch.setenv("FORGE_STUDY_RUN", "run-1")
        _run_trials(digits, trials, at_once=3)
        digits.run("pick-best", pick.config)
        study = digits.read(f"{pick.config['output']}/trials.json")["study"]
        name = f"{trials[0].config['trial']['study']['name']}-run-1"
        assert study["name"] == name and study["storage"] == "the PostgreSQL database of Secret forge-studies"
        assert sum(study["states"].values()) == 3
        assert not (digits.workspace / trials[0].config["trial"]["study"]["storage"]).exists()  # no SQLite file
        code = ("import json, sys, optuna\n"
                "optuna.logging.set_verbosity(optuna.logging.WARNING)\n"
                "print(json.dumps(optuna.get_all_study_names(storage=sys.argv[1])))\n")
        names = subprocess.run([runtime_python, "-c", code, url], capture_output=True, text=True, check=True).stdout
        assert json.loads(names) == [name]
        # the same version trained again (another run): a study of its own, its first trial number 0
        monkeypatch.setenv("FORGE_STUDY_RUN", "run-2")
        digits.run("train", trials[0].config)
        assert digits.read(f"{trials[0].config['output']}/metrics.json")["trial"]["number"] == 0
        names = subprocess.run([runtime_python, "-c", code, url], capture_output=True, text=True, check=True).stdout
        assert sorted(json.loads(names)) == [name, name[: -len("run-1")] + "run-2"]
