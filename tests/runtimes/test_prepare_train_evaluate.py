"""prepare → train → evaluate on scikit-learn's digits, plus pick-best and register."""

from __future__ import annotations

import json

import pytest

from devkit.digits import DIGITS_DATASET, DIGITS_DIGEST
from devkit.runtime_steps import Runner
from tests.runtimes.helpers import events

pytestmark = pytest.mark.runtime


def test_print_digest_is_the_pinned_digits_digest(digits: Runner) -> None:
    proc = digits.run("prepare", {"step": "prepare", "dataset": "digits", "spec": DIGITS_DATASET, "output": "data/x"}, "--print-digest")
    assert proc.stdout.strip() == DIGITS_DIGEST


def test_prepare_writes_splits_and_meta(digits: Runner) -> None:
    meta = digits.read("data/digits/meta.json")
    assert meta["digest"] == DIGITS_DIGEST
    assert meta["numFeatures"] == 64 and meta["numClasses"] == 10
    assert sum(meta["rows"].values()) == 1797  # digits has no exact duplicate rows
    for split in ("train", "validation", "test"):
        assert (digits.workspace / "data/digits" / f"{split}.npz").exists()


def test_prepare_fails_on_a_digest_mismatch(digits: Runner) -> None:
    spec = {**DIGITS_DATASET, "digest": "sha256:" + "0" * 64}
    proc = digits.run("prepare", {"step": "prepare", "dataset": "digits", "spec": spec, "output": "data/bad"}, check=False)
    assert proc.returncode == 2
    assert "differs from the Dataset's" in proc.stderr and "Traceback" not in proc.stderr


def test_prepare_reads_a_csv_file_with_a_label_column(digits: Runner) -> None:
    (digits.workspace / "table.csv").write_text("a,b,kind\n" + "".join(f"{i},{i % 3},{'x' if i % 2 else 'y'}\n" for i in range(40)))
    import hashlib

    digest = "sha256:" + hashlib.sha256((digits.workspace / "table.csv").read_bytes()).hexdigest()
    spec = {"source": {"uri": "file://table.csv", "format": "csv"}, "version": "1", "digest": digest,
            "labeling": {"column": "kind"}, "cleaning": [{"op": "standardize"}]}
    digits.run("prepare", {"step": "prepare", "dataset": "table", "spec": spec, "output": "data/table"})
    meta = digits.read("data/table/meta.json")
    assert meta["classes"] == ["x", "y"] and meta["numFeatures"] == 2 and "standardize" in meta["transform"]


def test_digits_classifier_reaches_95_percent(digits: Runner) -> None:
    metrics = digits.read("models/base/metrics.json")
    assert metrics["accuracy"] >= 0.95, metrics
    info = digits.read("models/base/model.json")
    assert info["kind"] == "state_dict" and info["architecture"]["hiddenSizes"] == [256, 128]


def test_train_prints_progress_lines(digits: Runner) -> None:
    progress = digits.read("models/base/progress.json")
    assert progress["event"] == "progress" and progress["step"] == progress["total"] == 600


def test_evaluate_passes_and_fails_against_thresholds(digits: Runner) -> None:
    ok = {"step": "evaluate", "model": "digits-mlp", "modelDir": "models/base", "data": "data/digits",
          "thresholds": [{"metric": "accuracy", "min": 0.95}], "output": "eval/ok"}
    digits.run("evaluate", ok)
    metrics = digits.read("eval/ok/metrics.json")
    assert metrics["passed"] is True and metrics["accuracy"] >= 0.95 and metrics["latencyP99Ms"] > 0

    bad = {**ok, "thresholds": [{"metric": "accuracy", "min": 0.999}, {"metric": "f1", "min": 0.5}], "output": "eval/bad"}
    proc = digits.run("evaluate", bad, check=False)
    assert proc.returncode == 3
    assert "accuracy ≥ 0.999" in proc.stderr
    verdicts = {t["metric"]: t["passed"] for t in digits.read("eval/bad/metrics.json")["thresholds"]}
    assert verdicts == {"accuracy": False, "f1": True}


def test_pick_best_and_register(digits: Runner) -> None:
    worse = digits.workspace / "trials/worse"
    worse.mkdir(parents=True)
    (worse / "metrics.json").write_text(json.dumps({"accuracy": 0.5}))
    digits.run("pick-best", {"step": "pick-best", "model": "digits-mlp", "trials": ["trials/worse", "models/base"],
                             "metric": "accuracy", "goal": "maximize", "output": "models/best"})
    assert digits.read("models/best/trials.json")["best"] == "models/base"
    digits.run("register", {"step": "register", "model": "digits-mlp", "version": "v1", "variants": {"base": "models/best"}, "output": "registry/digits-mlp/v1"})
    registry = digits.read("registry/digits-mlp/v1/registry.json")
    assert registry["variants"]["base"]["kind"] == "state_dict" and len(registry["variants"]["base"]["sha256"]) == 64


def test_bad_config_is_one_clear_message(digits: Runner) -> None:
    proc = digits.run("train", {"step": "train", "model": "digits-mlp"}, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: invalid TrainConfig") and "Traceback" not in proc.stderr
    assert events(proc.stdout) == []
