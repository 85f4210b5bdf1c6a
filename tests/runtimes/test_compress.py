"""compress: structured pruning, INT8 PTQ/QAT, distillation and the accuracy bound."""

from __future__ import annotations

import pytest

from devkit.runtime_steps import Runner

pytestmark = pytest.mark.runtime


def _config(name: str, stages: list[dict], **extra: object) -> dict:
    return {"step": "compress", "model": "digits-mlp", "variant": {"name": name, "stages": stages, **extra}, "modelDir": "models/base",
            "data": "data/digits", "hardwareTarget": "x86-avx2", "maxAccuracyDrop": 2.0, "output": f"variants/{name}", "teachers": {"digits-mlp": "models/base"}}


def test_pruning_removes_half_the_parameters_within_two_points(digits: Runner) -> None:
    digits.run("compress", _config("pruned", [{"type": "prune", "sparsity": 0.5, "fineTuneEpochs": 5}]))
    report = digits.read("variants/pruned/report.json")
    assert report["accepted"] and report["ratios"]["parameters"] <= 0.5
    assert report["accuracyDropPt"] <= 2.0
    assert digits.read("variants/pruned/model.json")["architecture"]["hiddenSizes"] == [128, 64]


def test_int8_ptq_is_under_30_percent_of_fp32_within_one_point(digits: Runner) -> None:
    proc = digits.run("compress", _config("int8", [{"type": "quantize", "mode": "ptq", "calibrationSamples": 256}], maxAccuracyDrop=1.0))
    report = digits.read("variants/int8/report.json")
    assert report["accepted"] and report["ratios"]["size"] <= 0.30 and report["accuracyDropPt"] <= 1.0
    stage = report["stages"][0]
    # Which backend ran is never silent: the report and the log both say it.
    assert stage["backend"] in ("torch-ao", "inc-ipex", "inc-pt2e")
    if stage["backend"] == "torch-ao":
        assert stage["fallbackReason"] and "Neural Compressor" in proc.stderr


def test_prune_distill_then_qat(digits: Runner) -> None:
    stages = [{"type": "prune", "sparsity": 0.5, "fineTuneEpochs": 1},
              {"type": "distill", "teacherRef": "digits-mlp", "epochs": 2},
              {"type": "quantize", "mode": "qat", "qatEpochs": 1}]
    digits.run("compress", _config("small-int8", stages))
    report = digits.read("variants/small-int8/report.json")
    assert [s["type"] for s in report["stages"]] == ["prune", "distill", "quantize"]
    assert report["accepted"] and report["after"]["accuracy"] > 0.9
    assert digits.read("variants/small-int8/model.json")["kind"] in ("int8", "pickle", "pt2e")


def test_a_variant_beyond_the_accuracy_bound_is_rejected(digits: Runner) -> None:
    config = _config("gutted", [{"type": "prune", "sparsity": 0.97, "fineTuneEpochs": 0}], maxAccuracyDrop=0.5)
    # A verdict, not a failure: the step ends 0 so that the version's other variants are still
    # benchmarked and registered; the verdict stays where the bundle would have been.
    proc = digits.run("compress", config)
    assert "variant gutted rejected: accuracy dropped" in proc.stderr
    report = digits.read("variants/gutted/report.json")
    assert report["accepted"] is False and "more than the allowed 0.5" in report["reason"]
    assert sorted(p.name for p in (digits.workspace / "variants/gutted").iterdir()) == ["rejected.json", "report.json"]
    assert digits.read("variants/gutted/rejected.json") == {
        "variant": "gutted", "reason": report["reason"], "report": "variants/gutted/report.json"}
    # Its export step (rendered after it) builds nothing from it and says why, for each graph.
    digits.run("export", {"step": "export", "model": "digits-mlp", "source": "gutted", "modelDir": "variants/gutted",
                          "data": "data/digits", "hardwareTarget": "x86-avx2", "maxAbsDiff": 1e-4, "maxAccuracyDrop": 1.0,
                          "output": "exports/gutted", "int8": {"calibrationSamples": 256}})
    for graph in ("onnx", "onnx-int8"):
        rejected = digits.read(f"exports/gutted/{graph}/rejected.json")
        assert rejected["variant"] == f"gutted-{graph}" and rejected["reason"].startswith("its source variant gutted was rejected")
