"""examples/trust end to end on the local target (issue 18's first "done when"): the model trains
with DP-SGD at its stated ε, `forgectl models show` and `forgectl status` show the privacy
budget, the robustness metrics and the explanations, and the ε / PGD gates pass — then, tightened
below what the model achieves, fail the workflow at `evaluate` so that nothing is registered."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import git
import pytest

pytestmark = pytest.mark.runtime

ROOT = Path(__file__).resolve().parents[2]


def _forgectl(repo: Path, python: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FORGE_RUNTIME_PYTHON": python, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "forgectl", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trust") / "repo"
    shutil.copytree(ROOT / "examples" / "trust", path / "specs")
    r = git.Repo.init(path)
    r.index.add(["specs/specs.yaml", "specs/environments.yaml"])
    r.index.commit("trust example")
    return path


def test_the_example_trains_privately_and_shows_its_trust_figures(repo: Path, runtime_python: str) -> None:
    plan = _forgectl(repo, runtime_python, "plan", "specs")
    assert "why: train with DP-SGD (Opacus): privacy budget ε ≤ 4 at δ 1e-05" in plan.stdout, plan.stdout
    applied = _forgectl(repo, runtime_python, "apply", "specs", "--auto-approve")
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    record = json.loads(_forgectl(repo, runtime_python, "models", "show", "digits-private", "--specs", "specs", "-o", "json").stdout)
    privacy, robust, explained = record["privacy"], record["robustness"], record["explanations"]
    assert 3.6 <= privacy["epsilonSpent"] <= 4.0 == privacy["epsilonTarget"]
    assert record["evaluation"]["epsilon"] == privacy["epsilonSpent"] and record["evaluation"]["passed"] is True
    assert record["evaluation"]["accuracy"] >= 0.8 and record["evaluation"]["pgdAccuracy"] >= 0.4
    assert robust["pgdAccuracy"] < robust["cleanAccuracy"] and robust["epsilon"] == 1.0
    assert explained["sanityPassed"] and explained["maps"] == 2 * 10 * 2
    maps = repo / ".forge" / "local" / "workspace" / explained["folder"] / "maps"
    assert len(list(maps.glob("*.png"))) == explained["maps"]
    text = _forgectl(repo, runtime_python, "models", "show", "digits-private", "--specs", "specs").stdout
    assert "privacy       DP-SGD ε" in text and "robustness    L∞ ε 1: FGSM" in text and "randomised-weights sanity" in text
    status = _forgectl(repo, runtime_python, "status", "specs").stdout
    assert "privacy ε" in status and "pgdAccuracy" in status


def test_tightened_gates_fail_the_workflow_at_evaluate(repo: Path, runtime_python: str) -> None:
    spec = repo / "specs" / "specs.yaml"
    text = spec.read_text()
    for old, new in (("      - metric: epsilon\n        max: 4.0", "      - metric: epsilon\n        max: 1.0"),
                     ("        min: 0.4", "        min: 0.95")):
        assert old in text
        text = text.replace(old, new)
    spec.write_text(text)
    r = git.Repo(repo)
    r.index.add(["specs/specs.yaml"])
    r.index.commit("tighter gates")
    applied = _forgectl(repo, runtime_python, "apply", "specs", "--auto-approve")
    out = applied.stdout + applied.stderr
    assert applied.returncode != 0
    assert "epsilon ≤ 1 (got 3.99" in out and "pgdAccuracy ≥ 0.95 (got" in out, out[-3000:]
    versions = json.loads(_forgectl(repo, runtime_python, "models", "--specs", "specs", "-o", "json").stdout)
    assert len(versions["versions"]) == 1  # the failed version registered nothing
