"""ONNX export, ONNX Runtime INT8, the TensorRT engine step and the benchmark, run as the rendered
steps run them (subprocesses of the runtime environment), on the quick-start MLP and on a CNN like
the edge-vision student."""

from __future__ import annotations

import json
import subprocess

import pytest

from devkit.digits import DIGITS_MODEL, train_config
from devkit.runtime_steps import Runner

pytestmark = pytest.mark.runtime

CNN_MODEL = {**DIGITS_MODEL, "architecture": {"type": "cnn", "channels": [16, 32], "imageSize": 8},
             "hyperparameters": {**DIGITS_MODEL["hyperparameters"], "epochs": 6}}


def export_config(model_dir: str, output: str, target: str = "x86-avx2", int8: bool = True, **extra: object) -> dict:
    return {"step": "export", "model": "digits-mlp", "source": "base", "modelDir": model_dir, "data": "data/digits",
            "hardwareTarget": target, "maxAbsDiff": 1e-4, "maxAccuracyDrop": 1.0, "output": output,
            **({"int8": {"calibrationSamples": 256}} if int8 else {}), **extra}


@pytest.fixture(scope="module")
def exported(digits: Runner) -> Runner:
    digits.run("export", export_config("models/base", "exports/mlp"), timeout=600)
    return digits


def onnxruntime_predicts(runner: Runner, folder: str) -> dict:
    """Run the exported graph with ONNX Runtime in the runtime environment, on a fresh process."""
    code = (
        "import json, numpy as np, onnxruntime as ort, sys\n"
        f"s = ort.InferenceSession('{runner.workspace / folder / 'model.onnx'}', providers=['CPUExecutionProvider'])\n"
        f"d = np.load('{runner.workspace / 'data/digits/test.npz'}')\n"
        "x = d['x'].astype(np.float32); y = d['y']\n"
        "out = s.run(None, {s.get_inputs()[0].name: x})[0]\n"
        "one = s.run(None, {s.get_inputs()[0].name: x[:1]})[0]\n"
        "print(json.dumps({'rows': len(x), 'accuracy': float((out.argmax(1) == y).mean()), 'shape1': list(one.shape)}))\n")
    proc = subprocess.run([runner.python, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_mlp_export_matches_pytorch_and_runs_under_onnxruntime(exported: Runner) -> None:
    report = exported.read("exports/mlp/report.json")
    check = report["onnx"]["verification"]
    assert check["passed"] and check["maxAbsDiff"] <= 1e-4 and check["rows"] > 300
    assert check["agreement"] == 1.0 and check["accuracy"] == check["accuracyReference"] >= 0.95
    info = exported.read("exports/mlp/onnx/model.json")
    assert info["kind"] == "onnx" and info["file"] == "model.onnx" and info["classes"] == [str(i) for i in range(10)]
    # an independent ONNX Runtime process: any batch size, the same accuracy
    ran = onnxruntime_predicts(exported, "exports/mlp/onnx")
    assert ran["shape1"] == [1, 10] and ran["accuracy"] == pytest.approx(check["accuracy"])


def test_onnxruntime_static_int8_is_smaller_within_the_bound(exported: Runner) -> None:
    int8 = exported.read("exports/mlp/report.json")["onnxInt8"]
    assert int8["accepted"] and int8["accuracyDropPt"] <= 1.0
    assert int8["sizeRatio"] < 0.35  # int8 weights, QDQ scales and zero points
    assert int8["quantization"]["format"] == "QDQ" and int8["quantization"]["reduceRange"]  # x86-avx2: 7-bit weights
    ran = onnxruntime_predicts(exported, "exports/mlp/onnx-int8")
    assert ran["accuracy"] == pytest.approx(int8["accuracy"])
    graph = (exported.workspace / "exports/mlp/onnx-int8/model.onnx").read_bytes()
    assert b"QuantizeLinear" in graph and b"DequantizeLinear" in graph


def test_an_export_outside_the_tolerance_is_rejected(digits: Runner) -> None:
    # a bound below zero, which no export meets: ONNX Runtime can match PyTorch exactly on the MLP
    # (a max |Δp| of 0.0 was seen), so a tiny positive bound made this test a coin toss
    # A verdict, not a failure: the step ends 0 (the version's other variants go on) and leaves
    # the verdict where the bundle would have been, for the benchmark and register steps.
    digits.run("export", export_config("models/base", "exports/strict", maxAbsDiff=-1.0))
    report = digits.read("exports/strict/report.json")
    assert "differs from PyTorch" in report["reason"] and report["onnx"]["accepted"] is False
    for graph in ("onnx", "onnx-int8"):  # the INT8 graph is never built from a rejected fp32 one
        folder = digits.workspace / "exports/strict" / graph
        assert sorted(p.name for p in folder.iterdir()) == ["rejected.json"]
        assert "differs from PyTorch" in digits.read(f"exports/strict/{graph}/rejected.json")["reason"]


def test_a_quantized_bundle_is_not_exported(digits: Runner) -> None:
    digits.run("compress", {"step": "compress", "model": "digits-mlp", "variant": {"name": "q", "stages": [{"type": "quantize"}]},
                            "modelDir": "models/base", "data": "data/digits", "hardwareTarget": "x86-avx2",
                            "maxAccuracyDrop": 2.0, "output": "variants/q"}, timeout=600)
    proc = digits.run("export", export_config("variants/q", "exports/q"), check=False)
    assert proc.returncode == 1 and "export a float variant" in proc.stderr


def test_cnn_export_for_jetson_and_the_engine_step_without_tensorrt(digits: Runner) -> None:
    digits.run("train", train_config("models/cnn", CNN_MODEL), timeout=900)
    digits.run("export", export_config("models/cnn", "exports/cnn", target="jetson-orin", int8=False), timeout=600)
    report = digits.read("exports/cnn/report.json")
    assert report["onnx"]["verification"]["passed"] and "onnxInt8" not in report  # Jetson: TensorRT builds it
    assert not (digits.workspace / "exports/cnn/onnx-int8").exists()
    ran = onnxruntime_predicts(digits, "exports/cnn/onnx")
    assert ran["accuracy"] == pytest.approx(report["onnx"]["verification"]["accuracy"]) and ran["accuracy"] > 0.8
    engine = {"step": "build-engine", "model": "digits-cnn", "source": "base", "onnxDir": "exports/cnn/onnx",
              "hardwareTarget": "jetson-orin", "tensorrt": {"precision": "fp16"}, "output": "exports/cnn/tensorrt"}
    # a machine without TensorRT: recorded as not built, the workflow goes on …
    proc = digits.run("build-engine", {**engine, "required": False})
    built = digits.read("exports/cnn/tensorrt/report.json")
    assert built["built"] is False and ("trtexec" in built["reason"] or "GPU" in built["reason"])
    # … unless the step runs where an engine must be built (a cluster's Jetson node)
    proc = digits.run("build-engine", {**engine, "required": True}, check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("error: build-engine:")


def test_benchmark_measures_every_variant_and_register_records_it(exported: Runner) -> None:
    # One more export, rejected (no graph meets a bound below zero): measured and registered by
    # neither step, named by both — the others go on.
    exported.run("export", export_config("models/base", "exports/never", int8=False, source="never", maxAbsDiff=-1.0))
    built = {"base": "models/base", "base-onnx": "exports/mlp/onnx", "base-onnx-int8": "exports/mlp/onnx-int8"}
    variants = {**built, "never-onnx": "exports/never/onnx"}
    exported.run("benchmark", {"step": "benchmark", "model": "digits-mlp", "version": "v1", "variants": variants,
                               "data": "data/digits", "hardwareTarget": "x86-avx2",
                               "settings": {"batchSizes": [1, 16], "seconds": 0.2, "threads": 1}, "output": "bench"}, timeout=600)
    bench = exported.read("bench/benchmark.json")
    assert bench["hardware"]["threads"] == 1 and bench["hardware"]["versions"]["onnxruntime"]
    assert set(bench["variants"]) == set(built) and bench["rejected"] == ["never-onnx"]
    for name, figures in bench["variants"].items():
        assert set(figures["batches"]) == {"1", "16"}, name
        for point in figures["batches"].values():
            assert 0 < point["p50Ms"] <= point["p99Ms"] and point["throughput"] > 0 and point["calls"] >= 15
        assert figures["memoryBytes"] > 0 and figures["peakRssBytes"] > figures["memoryBytes"], (name, figures)
        assert "error" not in figures
    assert bench["variants"]["base"]["runtime"] == "pytorch" and bench["variants"]["base-onnx"]["runtime"] == "onnxruntime"
    # the ONNX graph computes what PyTorch does: the same accuracy on the same rows
    assert bench["variants"]["base-onnx"]["accuracy"] == pytest.approx(bench["variants"]["base"]["accuracy"])

    exported.run("build-engine", {"step": "build-engine", "model": "digits-mlp", "source": "base", "onnxDir": "exports/mlp/onnx",
                                  "hardwareTarget": "nvidia-gpu", "tensorrt": {}, "required": False, "output": "exports/mlp/tensorrt"})
    exported.run("register", {"step": "register", "model": "digits-mlp", "version": "v1", "variants": variants,
                              "output": "registry/digits-mlp/v1", "benchmark": "bench",
                              "artifacts": {"base-tensorrt": "exports/mlp/tensorrt"}})
    registry = exported.read("registry/digits-mlp/v1/registry.json")
    assert registry["variants"]["base-onnx-int8"]["kind"] == "onnx-int8"
    assert (exported.workspace / "registry/digits-mlp/v1/base-onnx-int8/model.onnx").is_file()
    assert registry["variants"]["base-onnx"]["benchmark"]["batches"]["16"]["p50Ms"] > 0
    assert registry["hardware"]["hardwareTarget"] == "x86-avx2"
    assert registry["artifacts"]["base-tensorrt"]["built"] is False
    summary = exported.read("registry/digits-mlp/v1/metrics.json")  # the Workflow's output parameter on a cluster
    assert summary["registry"]["base-onnx"]["latency"]["1"]["p50Ms"] > 0 and len(json.dumps(summary)) < 16_000
    assert "never-onnx" not in registry["variants"] and not (exported.workspace / "registry/digits-mlp/v1/never-onnx").exists()
    assert "differs from PyTorch" in registry["rejected"]["never-onnx"]["reason"]
    assert summary["rejected"] == {"never-onnx": registry["rejected"]["never-onnx"]["reason"]}
    # A folder with neither a bundle nor a verdict: its step never finished — register fails on it.
    proc = exported.run("register", {"step": "register", "model": "digits-mlp", "version": "v2",
                                     "variants": {**variants, "lost": "exports/lost/onnx"}, "output": "registry/digits-mlp/v2"},
                        check=False)
    assert proc.returncode == 1 and "variant lost: neither a bundle nor a verdict" in proc.stderr
