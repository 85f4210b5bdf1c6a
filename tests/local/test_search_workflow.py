"""A hyperparameter search end to end on the local target: `forgectl apply` of examples/search runs
the rendered Workflow — prepare, a TPE + ASHA fan-out of trial processes sharing one Optuna study
in a SQLite file on the workspace, pick-best, evaluate, register — and what Forge then shows the
user (`forgectl status`, `forgectl models show`) agrees with the study Optuna itself reads back.

Nothing here knows which trial wins or how many are pruned: the draws are the sampler's and the
stopping the pruner's. The test asserts the relations that must hold whatever they decide.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from contextlib import closing
from pathlib import Path
from typing import Any

import git
import pytest
import yaml

from reconciler.targets.local.state import StateDB
from tests.local.test_local_target import Workspace

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "search"
pytestmark = pytest.mark.runtime


def _example_model() -> dict[str, Any]:
    """The example's Model spec, as the user wrote it."""
    [doc] = [d for d in yaml.safe_load_all((EXAMPLE / "model.yaml").read_text()) if d["kind"] == "Model"]
    return dict(doc["spec"])


def _optuna_trials(python: str, storage: Path | str, study: str) -> list[dict[str, Any]]:
    """The study's trials as Optuna loads them from the SQLite file (a path) or the database (a
    SQLAlchemy URL), in the runtime environment, where Optuna is installed: number, state, value,
    params."""
    url = storage if isinstance(storage, str) else f"sqlite:///{storage}"
    code = (
        "import json, sys, optuna\n"
        "optuna.logging.set_verbosity(optuna.logging.WARNING)\n"
        "s = optuna.load_study(study_name=sys.argv[2], storage=sys.argv[1])\n"
        "print(json.dumps([{'number': t.number, 'state': t.state.name.lower(), 'value': t.value, 'params': t.params}"
        " for t in s.trials]))\n"
    )
    out = subprocess.run([python, "-c", code, url, study], capture_output=True, text=True, timeout=120, check=True)
    return list(json.loads(out.stdout))


def _most_at_once(runs: list[tuple[float, float]]) -> int:
    """The largest number of (started, finished) intervals that overlap at one moment."""
    edges = sorted([(s, 1) for s, _ in runs] + [(f, -1) for _, f in runs])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_tpe_search_with_asha_runs_as_a_rendered_workflow(tmp_path: Path, runtime_python: str) -> None:
    spec = _example_model()
    search, epochs = spec["search"], spec["hyperparameters"]["epochs"]
    trials = [f"train-trial-{i}" for i in range(search["trials"])]
    path = tmp_path / "repo"
    shutil.copytree(EXAMPLE, path / "specs")
    repo = git.Repo.init(path)
    repo.config_writer().set_value("user", "name", "T").set_value("user", "email", "t@example.com").release()
    repo.index.add(["specs"])
    repo.index.commit("the search example")
    ws = Workspace(path, runtime_python)
    try:
        applied = ws.forgectl("apply", "specs", "--auto-approve").stdout
        # The plan named the fan-out and the study before anything ran.
        assert " → ".join(["prepare-data", *trials, "pick-best", "evaluate", "register"]) + " will run" in applied, applied
        assert f"search: tpe, early stopping asha — {search['trials']} trials, {search['parallelism']} at a time" in applied

        status = ws.status()
        [wf] = status["workflows"]
        assert wf["phase"] == "Succeeded", wf
        steps = {s["step"]: s["status"] for s in wf["steps"]}
        assert steps == dict.fromkeys(["prepare-data", *trials, "pick-best", "evaluate", "register"], "succeeded"), steps
        # The trials ran as separate processes side by side, as many at once as the search allows.
        with closing(StateDB(path / ".forge" / "local" / "state.db")) as db:
            runs = [(r.started, r.finished) for r in db.step_runs(wf["name"]) if r.step in trials]
        ran = [(s, f) for s, f in runs if s is not None and f is not None]
        assert len(ran) == len(trials), runs
        assert _most_at_once(ran) == search["parallelism"], ran

        record = json.loads(ws.forgectl("models", "show", "digits-search", "--specs", "specs", "-o", "json").stdout)
        assert record["version"] == wf["version"]
        result = record["search"]
        study = result["study"]
        assert (study["algorithm"], study["earlyStopping"]) == ("tpe", "asha")
        assert result["metric"] == "accuracy" and result["goal"] == "maximize"
        rows = study["trials"]
        # Every trial task made one trial of the study; the states' counts add up to them.
        assert sorted(r["index"] for r in rows) == list(range(search["trials"]))
        assert len({r["number"] for r in rows}) == len(rows) == sum(study["states"].values())
        assert set(study["states"]) <= {"complete", "pruned"}
        assert study["states"] == {s: sum(r["state"] == s for r in rows) for s in study["states"]}
        for r in rows:  # each trial trained with values inside the search space
            assert set(r["params"]) == set(search["space"])
            for name, dim in search["space"].items():
                value = r["params"][name]
                assert value in dim["values"] if dim["type"] == "choice" else dim["min"] <= value <= dim["max"], (name, r)
        # The best trial is a completed one, with the highest value of the completed trials.
        complete = [r for r in rows if r["state"] == "complete"]
        assert complete, rows
        [best] = [r for r in rows if r["number"] == study["bestTrial"]]
        assert best["state"] == "complete"
        assert best["value"] == study["bestValue"] == max(r["value"] for r in complete)
        assert study["bestParams"] == best["params"]
        # ASHA: a completed trial trained every epoch; a pruned one stopped at a rung (1, 3, 9, …
        # epochs) and trained no further; the budget and what pruning saved follow from them.
        rungs = {3**k for k in range(epochs) if 3**k <= epochs}
        for r in rows:
            if r["state"] == "complete":
                assert r["epochsTrained"] == epochs and r["prunedAtEpoch"] is None, r
            else:
                assert r["prunedAtEpoch"] in rungs and r["epochsTrained"] == r["prunedAtEpoch"], r
        assert study["epochsBudget"] == search["trials"] * epochs
        assert study["epochsTrained"] == sum(r["epochsTrained"] for r in rows)
        assert study["epochsSaved"] == study["epochsBudget"] - study["epochsTrained"]
        # The version registered is the best trial's model: evaluated on the test split.
        assert 0.0 < record["evaluation"]["accuracy"] <= 1.0

        # What the registry shows is what Optuna reads back from the study file the trials shared.
        storage = path / ".forge" / "local" / "workspace" / study["storage"]
        assert storage.is_file(), storage
        optuna_rows = {t["number"]: t for t in _optuna_trials(runtime_python, storage, study["name"])}
        assert set(optuna_rows) == {r["number"] for r in rows}
        for r in rows:
            seen = optuna_rows[r["number"]]
            assert seen["state"] == r["state"] and seen["params"] == pytest.approx(r["params"])
            if r["state"] == "complete":
                assert seen["value"] == pytest.approx(r["value"])

        # `models show` prints the same search to the user.
        text = ws.forgectl("models", "show", "digits-search", "--specs", "specs").stdout
        assert f"tpe, early stopping asha: {search['trials']} trials" in text, text
        assert f"best trial {study['bestTrial']}" in text
        assert f"{study['epochsTrained']} of {study['epochsBudget']} trial-epochs trained" in text
        # The HTML report plots the search: one point per trial, each in its state.
        page = tmp_path / "report.html"
        ws.forgectl("models", "report", "--specs", "specs", "--html", str(page))
        drawn = re.findall(r'<g class="trial" data-trial="(\d+)" data-state="(\w+)">', page.read_text())
        assert sorted((int(n), s) for n, s in drawn) == sorted((r["number"], r["state"]) for r in rows)
        # Applied once, nothing is left to do: the search is not run again.
        plan = ws.forgectl("plan", "specs", "--detailed-exitcode", check=False)
        assert plan.returncode == 0, plan.stdout
    finally:
        ws.forgectl("down", "specs", check=False)
