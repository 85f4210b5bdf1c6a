"""Issue 18 in the runtimes, on scikit-learn's digits: DP-SGD training (Opacus) and its refusal of
BatchNorm, the evaluate step's ε and FGSM/PGD gates failing and passing, and the explain step
(Captum) with its PNG maps and randomised-weights sanity check. The steps run as subprocesses of
the runtime environment, as the rendered Workflow runs them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devkit.digits import train_config
from devkit.runtime_steps import Runner
from tests.runtimes.helpers import events

pytestmark = pytest.mark.runtime

SMALL = {"datasetRef": "digits", "architecture": {"type": "mlp", "hiddenSizes": [128]},
         "hyperparameters": {"learningRate": 0.005, "batchSize": 64, "epochs": 6, "optimizer": "adamw", "seed": 7}}
BUDGET = 2.0


def _evaluate(runner: Runner, model_dir: str, out: str, thresholds: list[dict[str, Any]], **extra: Any):
    return runner.run("evaluate", {"step": "evaluate", "model": "m", "modelDir": model_dir, "data": "data/digits",
                                   "output": out, "thresholds": thresholds, **extra}, check=False)


@pytest.fixture(scope="module")
def private(digits: Runner) -> Runner:
    spec = {**SMALL, "privacy": {"epsilon": BUDGET, "delta": 1e-5, "maxGradNorm": 1.0}}
    proc = digits.run("train", train_config("models/private", spec), timeout=600)
    digits.private_events = events(proc.stdout)
    return digits


def test_dp_sgd_spends_at_most_its_budget_and_still_learns(private: Runner) -> None:
    metrics = private.read("models/private/metrics.json")
    privacy = metrics["privacy"]
    assert privacy["mechanism"] == "DP-SGD (Opacus)" and privacy["accountant"] == "rdp"
    # make_private_with_epsilon calibrates the noise to the budget: spent just under it.
    assert 0.9 * BUDGET <= privacy["epsilonSpent"] <= BUDGET and metrics["epsilon"] == privacy["epsilonSpent"]
    assert privacy["noiseMultiplier"] > 0.5 and privacy["maxGradNorm"] == 1.0
    assert privacy["steps"] == metrics["steps"] > 0 and privacy["poissonSampling"]
    assert metrics["accuracy"] >= 0.6  # ten classes: chance is 0.1
    progress = [e for e in private.private_events if e.get("event") == "progress"]
    assert progress and all(e["epsilon"] <= BUDGET for e in progress)
    assert progress[-1]["epsilon"] >= progress[0]["epsilon"]  # the accountant only grows


def test_the_epsilon_gate_fails_and_passes(private: Runner) -> None:
    ok = _evaluate(private, "models/private", "eval/eps-ok", [{"metric": "epsilon", "max": BUDGET}])
    assert ok.returncode == 0, ok.stderr[-2000:]
    result = private.read("eval/eps-ok/metrics.json")
    assert result["passed"] and result["epsilon"] <= BUDGET and result["privacy"]["epsilonTarget"] == BUDGET
    strict = _evaluate(private, "models/private", "eval/eps-strict", [{"metric": "epsilon", "max": 0.5}])
    assert strict.returncode == 3 and "epsilon ≤ 0.5 (got 1." in strict.stderr and "Traceback" not in strict.stderr
    # A model trained without privacy has no ε: the gate fails and says why.
    plain = _evaluate(private, "models/base", "eval/eps-plain", [{"metric": "epsilon", "max": 100}])
    assert plain.returncode == 3 and "not trained with differential privacy" in plain.stderr


def test_dp_refuses_batchnorm_and_names_the_layer(digits: Runner) -> None:
    spec = {**SMALL, "architecture": {"type": "cnn", "channels": [8]}, "privacy": {"epsilon": 1.0}}
    proc = digits.run("train", train_config("models/private-cnn", spec), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "`blocks.0.1` (BatchNorm2d): BatchNorm cannot support training with differential privacy" in proc.stderr
    assert not (digits.workspace / "models/private-cnn/model.pt").exists()


def test_accuracy_under_attack_is_measured_and_gated(digits: Runner) -> None:
    robustness = {"epsilon": 1.0, "attacks": ["fgsm", "pgd"], "pgdSteps": 10}
    proc = _evaluate(digits, "models/base", "eval/robust", [{"metric": "pgdAccuracy", "min": 0.05}], robustness=robustness)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = digits.read("eval/robust/metrics.json")
    r = m["robustness"]
    assert r["cleanAccuracy"] == pytest.approx(m["accuracy"], abs=1e-6) and r["rows"] == m["testRows"]
    assert m["fgsmAccuracy"] < m["accuracy"] - 0.05  # one grey level of 16 moves an undefended MLP
    assert m["pgdAccuracy"] <= m["fgsmAccuracy"] + 0.01  # the iterated attack is at least as strong
    assert r["stepSize"] == pytest.approx(0.25)
    tiny = _evaluate(digits, "models/base", "eval/robust-tiny", [], robustness={**robustness, "epsilon": 1e-4})
    assert tiny.returncode == 0
    t = digits.read("eval/robust-tiny/metrics.json")
    assert abs(t["fgsmAccuracy"] - t["accuracy"]) <= 0.01 and abs(t["pgdAccuracy"] - t["accuracy"]) <= 0.01
    gate = _evaluate(digits, "models/base", "eval/robust-gate", [{"metric": "pgdAccuracy", "min": 0.99}], robustness=robustness)
    assert gate.returncode == 3 and "pgdAccuracy ≥ 0.99 (got" in gate.stderr


def test_explanations_maps_and_the_sanity_check(digits: Runner) -> None:
    settings = {"methods": ["integratedGradients", "saliency", "inputXGradient"], "samples": 150, "mapsPerClass": 2}
    digits.run("explain", {"step": "explain", "model": "m", "modelDir": "models/base", "data": "data/digits",
                           "output": "explain/base", "settings": settings}, timeout=600)
    summary = digits.read("explain/base/metrics.json")
    full = digits.read("explain/base/explanations.json")
    assert summary["rows"] == 150 and summary["primary"] == "integratedGradients"
    # Attributions of the trained model differ from those of a re-initialised one.
    assert summary["sanityPassed"] and summary["sanityRankCorrelation"] < summary["sanityBound"] == 0.5
    assert set(summary["sanityByMethod"]) == set(settings["methods"])
    assert summary["completenessError"] < 0.05  # IG: Σ attributions ≈ f(x) − f(0)
    assert -1 <= summary["agreement"]["saliency"] <= 1 and summary["agreement"]["inputXGradient"] > 0.5
    per_class = full["perClass"]["integratedGradients"]
    assert sorted(per_class) == [str(i) for i in range(10)]
    assert all(len(c["meanAbsAttribution"]) == 64 and len(c["top"]) == 8 for c in per_class.values())
    # PNG maps: one mean map per class and method, plus a second example per class.
    maps = sorted((digits.workspace / "explain/base/maps").glob("*.png"))
    assert len(maps) == summary["maps"] == 3 * (10 + 10)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in maps)
    assert (digits.workspace / "explain/base/maps/integratedGradients-class-3.png").stat().st_size > 1000
    assert json.dumps(full)  # plain JSON (no NaN)
