"""Issue 18 in the control plane: the privacy, robustness and explanation fields of a Model, what
they render to, what the plan says, and what the registry, `models show`, the leaderboard and
`status` show. No runtime environment needed (the runtimes: tests/trust/test_trust_runtime.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from forgectl.models_cli import trust_lines
from reconciler.load.loader import load_or_raise
from reconciler.registry.leaderboard import rows
from reconciler.registry.records import Record, build_record
from renderers import RenderContext, render
from renderers.hardware import export_reasons
from renderers.workflow import workflow_steps
from specs.model import ModelSpec

ROOT = Path(__file__).resolve().parents[2]
BASE = {"datasetRef": "digits", "architecture": {"type": "mlp"}}


def _spec(**extra: Any) -> ModelSpec:
    return ModelSpec.model_validate({**copy.deepcopy(BASE), **extra})


def test_unset_fields_stay_out_of_the_dump() -> None:
    dumped = _spec().model_dump(mode="json", by_alias=True)
    assert "privacy" not in dumped and "explanations" not in dumped and "robustness" not in dumped["evaluation"]


def test_set_fields_are_dumped_with_their_defaults() -> None:
    spec = _spec(privacy={"epsilon": 2}, explanations={},
                 evaluation={"robustness": {"epsilon": 0.5}, "thresholds": [{"metric": "pgdAccuracy", "min": 0.5}]})
    dumped = spec.model_dump(mode="json", by_alias=True)
    assert dumped["privacy"] == {"epsilon": 2.0, "delta": 1e-5, "maxGradNorm": 1.0}
    assert dumped["explanations"]["methods"] == ["integratedGradients", "saliency"]
    assert dumped["evaluation"]["robustness"]["attacks"] == ["fgsm", "pgd"]


@pytest.mark.parametrize("extra, words", [
    ({"distributed": {"strategy": "ddp"}}, "strategy ddp"),
    ({"precision": "bf16"}, "precision bf16"),
    ({"compile": True}, "compile"),
    ({"hyperparameters": {"gradientAccumulationSteps": 4}}, "gradientAccumulationSteps"),
])
def test_privacy_refuses_what_dp_sgd_does_not_cover(extra: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match="privacy") as info:
        _spec(privacy={"epsilon": 1}, **extra)
    assert words in str(info.value)


def test_gates_need_what_they_measure() -> None:
    with pytest.raises(ValidationError, match="threshold on epsilon needs `privacy`"):
        _spec(evaluation={"thresholds": [{"metric": "epsilon", "max": 1}]})
    with pytest.raises(ValidationError, match="threshold on pgdAccuracy needs `robustness`"):
        _spec(evaluation={"thresholds": [{"metric": "pgdAccuracy", "min": 0.5}]})
    with pytest.raises(ValidationError, match="attack 'pgd'"):
        _spec(evaluation={"robustness": {"epsilon": 1, "attacks": ["fgsm"]},
                          "thresholds": [{"metric": "pgdAccuracy", "min": 0.5}]})
    with pytest.raises(ValidationError):
        _spec(privacy={"epsilon": 0})


def _trust_workflow(env: str = "local") -> dict[str, Any]:
    specs = load_or_raise([str(ROOT / "examples" / "trust")]).specs
    out = render(specs, RenderContext(specs.environment(env), revision="0123456789ab"))
    return out.workflows["digits-private"].manifest


def test_the_trust_example_renders_an_explain_step_after_evaluate() -> None:
    wf = _trust_workflow()
    steps = workflow_steps(wf)
    assert list(steps) == ["prepare-data", "train", "evaluate", "explain", "register"]
    tasks = {t["name"]: t for t in wf["spec"]["templates"][0]["dag"]["tasks"]}
    assert tasks["explain"]["depends"] == "evaluate.Succeeded && prepare-data.Succeeded"
    assert "explain.Succeeded" in tasks["register"]["depends"]
    assert steps["train"]["config"]["spec"]["privacy"] == {"epsilon": 4.0, "delta": 1e-5, "maxGradNorm": 1.0}
    assert steps["evaluate"]["config"]["robustness"]["epsilon"] == 1.0
    assert steps["explain"]["config"]["settings"]["mapsPerClass"] == 2
    explain = next(t for t in wf["spec"]["templates"] if t["name"] == "explain")
    assert explain["container"]["args"][0] == "explain"
    assert explain["outputs"]["parameters"][0]["valueFrom"]["path"].endswith("/explain/metrics.json")


def test_the_plan_shows_the_budget_the_attacks_and_the_gates() -> None:
    lines = export_reasons(workflow_steps(_trust_workflow("cluster")))
    assert lines[0] == "train with DP-SGD (Opacus): privacy budget ε ≤ 4 at δ 1e-05, per-sample gradients clipped to 1"
    assert "evaluate under attack: FGSM, PGD at L∞ ε 1 (1000 test rows)" in lines
    assert "gate: epsilon ≤ 4" in lines and "gate: pgdAccuracy ≥ 0.4" in lines
    assert any(line.startswith("explain: integratedGradients, saliency on 200 test rows") for line in lines)


def test_models_without_trust_fields_render_as_before() -> None:
    specs = load_or_raise([str(ROOT / "examples" / "quickstart")]).specs
    out = render(specs, RenderContext(specs.environment(None)))
    steps = workflow_steps(out.workflows["digits-mlp"].manifest)
    assert "explain" not in steps and "robustness" not in steps["evaluate"]["config"]
    assert not any(line.startswith(("train with DP-SGD", "evaluate under attack", "explain:"))
                   for line in export_reasons(steps))


PRIVACY = {"mechanism": "DP-SGD (Opacus)", "accountant": "rdp", "epsilonTarget": 4.0, "epsilonSpent": 3.99, "delta": 1e-5,
           "maxGradNorm": 1.0, "noiseMultiplier": 1.3, "sampleRate": 0.05, "steps": 300}
ROBUST = {"epsilon": 1.0, "norm": "Linf", "attacks": ["fgsm", "pgd"], "pgdSteps": 10, "stepSize": 0.25, "rows": 359,
          "cleanAccuracy": 0.85, "fgsmAccuracy": 0.58, "pgdAccuracy": 0.56}
EXPLAINED = {"methods": ["integratedGradients", "saliency"], "primary": "integratedGradients", "rows": 200,
             "sanityRankCorrelation": 0.36, "sanityBound": 0.5, "sanityPassed": True, "agreement": {"saliency": 0.77},
             "maps": 40, "folder": "models/digits-private/v/explain"}


def _record() -> Record:
    evaluation = {"accuracy": 0.85, "epsilon": 3.99, "fgsmAccuracy": 0.58, "pgdAccuracy": 0.56, "passed": True,
                  "privacy": PRIVACY, "robustness": ROBUST}
    registry = {"model": "digits-private", "version": "v1", "variants": {"base": {"kind": "state_dict", "sizeBytes": 1000,
                                                                               "metrics": {"accuracy": 0.86}}}}
    return build_record(_trust_workflow(), registry, evaluation, 0.0, "local", EXPLAINED)


def test_the_registry_records_privacy_robustness_and_explanations() -> None:
    record = _record()
    assert record.privacy == PRIVACY and record.robustness == ROBUST and record.explanations == EXPLAINED
    assert record.evaluation["epsilon"] == 3.99 and record.evaluation["pgdAccuracy"] == 0.56
    plain = build_record(_trust_workflow(), {"variants": {}}, {"accuracy": 0.9}, 0.0, "local")
    assert not {"privacy", "robustness", "explanations"} & set(plain.to_json())


def test_models_show_and_the_leaderboard_use_them() -> None:
    record = _record()
    lines = trust_lines(record)
    assert lines[0].startswith("privacy       DP-SGD ε 3.99 spent of 4 at δ 1e-05 (rdp accountant")
    assert lines[1].startswith("robustness    L∞ ε 1: FGSM 58.00 %, PGD 56.00 % (clean 85.00 %")
    assert "rank correlation 0.36 (passed, < 0.5)" in lines[2] and "40 PNG maps in models/digits-private/v/explain" in lines[2]
    assert [r.metric for r in rows([record], "pgdAccuracy")] == [0.56]
    assert [r.metric for r in rows([record], "accuracy")] == [0.86]


def test_auto_labeling_is_omitted_unset_and_stays_inside_the_root() -> None:
    from specs.dataset import DatasetSpec

    base = {"source": {"uri": "file://d.csv", "format": "csv"}, "version": "1", "digest": "sha256:" + "0" * 64,
            "labeling": {"column": "y"}}
    assert "auto" not in DatasetSpec.model_validate(base).model_dump(mode="json", by_alias=True)["labeling"]
    auto = {"modelRef": "m", "confidence": 0.9, "unlabelled": "file://u.csv"}
    dumped = DatasetSpec.model_validate({**base, "labeling": {"column": "y", "auto": auto}}).model_dump(mode="json", by_alias=True)
    assert dumped["labeling"]["auto"] == {**auto, "topK": 3, "heldBackColumn": None, "reviewFormat": "csv"}
    for bad in ("file://../u.csv", "file:///etc/passwd", "s3://bucket/u.csv", "file://{{x}}.csv"):
        with pytest.raises(ValidationError):
            DatasetSpec.model_validate({**base, "labeling": {"column": "y", "auto": {**auto, "unlabelled": bad}}})
    with pytest.raises(ValidationError):
        DatasetSpec.model_validate({**base, "labeling": {"column": "y", "auto": {**auto, "confidence": 1.5}}})
