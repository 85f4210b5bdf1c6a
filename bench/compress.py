"""bench/compress: fp32 vs structured-pruned vs INT8 (PyTorch) vs ONNX and ONNX Runtime INT8, on
the digits MLP and a small CNN.

    python bench/compress.py            # re-execs itself in the cached runtime env if needed

Runs the real steps (prepare → train → compress → export → benchmark) in a temporary workspace,
then prints a table and, as its last line, a JSON object of the digits-MLP figures (ratios are
variant / PyTorch fp32): ``{"int8_size_ratio", "int8_acc_drop_pt", "pruned_param_ratio",
"pruned_acc_drop_pt", "int8_latency_speedup", "onnx_max_abs_diff", "onnx_int8_size_ratio",
"onnx_int8_acc_drop_pt", "onnx_latency_speedup", "onnx_int8_latency_speedup", ...}`` plus the same
for the CNN under ``cnn_*`` keys.

The compress rows' latency is the compress step's own (batch 1, the variant against fp32 in
alternating rounds); the ONNX rows' comes from the `benchmark` step, which measures all five
variants of a model in alternating rounds (1 thread each), so the ONNX speed-ups compare like with
like (`bench_p50_ms` holds its batch-1 p50 of every variant).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.runtime_env import ensure_runtime_env, step  # noqa: E402

DIGITS = {
    "source": {"uri": "sklearn://digits", "format": "sklearn"},
    "version": "1.0",
    "digest": "sha256:4eca0a80f7990df18560bf7c80f03e0893a8868820f1ee4405e0402527902353",
    "splits": {"train": 0.7, "validation": 0.1, "test": 0.2, "seed": 7},
    "cleaning": [{"op": "deduplicate"}, {"op": "clip", "min": 0, "max": 16}],
}
MODELS = {
    "mlp": {"architecture": {"type": "mlp", "hiddenSizes": [256, 128]},
            "hyperparameters": {"learningRate": 0.002, "batchSize": 64, "epochs": 30, "weightDecay": 0.0001, "seed": 7}},
    "cnn": {"architecture": {"type": "cnn", "channels": [32, 64], "imageSize": 8, "inChannels": 1},
            "hyperparameters": {"learningRate": 0.005, "batchSize": 64, "epochs": 15, "weightDecay": 0.0001, "seed": 7}},
}
VARIANTS = {
    "pruned": [{"type": "prune", "sparsity": 0.5, "fineTuneEpochs": 5}],
    "int8": [{"type": "quantize", "mode": "ptq", "calibrationSamples": 256}],
}


def main() -> None:
    ensure_runtime_env()
    ws = tempfile.mkdtemp(prefix="forge-bench-compress-")
    os.environ["FORGE_WORKSPACE"] = ws
    assert step("runtimes.prepare", {"step": "prepare", "dataset": "digits", "spec": DIGITS, "output": "data"}) == 0
    figures: dict[str, float] = {}
    rows = []
    for arch, model in MODELS.items():
        spec = {"datasetRef": "digits", **model}
        assert step("runtimes.train", {"step": "train", "model": f"digits-{arch}", "version": "b", "spec": spec, "data": "data", "output": f"{arch}/base"}) == 0
        for name, stages in VARIANTS.items():
            code = step("runtimes.compress", {"step": "compress", "model": f"digits-{arch}", "variant": {"name": name, "stages": stages},
                                               "modelDir": f"{arch}/base", "data": "data", "hardwareTarget": "x86-avx2",
                                               "maxAccuracyDrop": 100.0, "output": f"{arch}/{name}"})
            assert code == 0
            report = json.load(open(os.path.join(ws, arch, name, "report.json")))
            before, after, ratios = report["before"], report["after"], report["ratios"]
            prefix = "" if arch == "mlp" else "cnn_"
            if name == "int8":
                figures[f"{prefix}int8_size_ratio"] = round(ratios["size"], 4)
                figures[f"{prefix}int8_acc_drop_pt"] = round(report["accuracyDropPt"], 3)
                figures[f"{prefix}int8_latency_speedup"] = round(ratios["latencySpeedup"], 3)
                figures[f"{prefix}int8_backend"] = report["stages"][0]["backend"]
            else:
                figures[f"{prefix}pruned_param_ratio"] = round(ratios["parameters"], 4)
                figures[f"{prefix}pruned_acc_drop_pt"] = round(report["accuracyDropPt"], 3)
                figures[f"{prefix}pruned_latency_speedup"] = round(ratios["latencySpeedup"], 3)
            figures[f"{prefix}fp32_accuracy"] = round(before["accuracy"], 4)
            rows.append((arch, name, before, after, ratios, report["accuracyDropPt"]))
        prefix = "" if arch == "mlp" else "cnn_"
        assert step("runtimes.export", {"step": "export", "model": f"digits-{arch}", "source": "base", "modelDir": f"{arch}/base",
                                        "data": "data", "hardwareTarget": "x86-avx2", "maxAbsDiff": 1e-4,
                                        "int8": {"calibrationSamples": 256}, "maxAccuracyDrop": 100.0, "output": f"{arch}/exports"}) == 0
        export = json.load(open(os.path.join(ws, arch, "exports", "report.json")))
        # the benchmark step in its own process, as the workflow runs it (it forks its memory probes)
        variants = {"base": f"{arch}/base", "pruned": f"{arch}/pruned", "int8": f"{arch}/int8",
                    "onnx": f"{arch}/exports/onnx", "onnx-int8": f"{arch}/exports/onnx-int8"}
        config = {"step": "benchmark", "model": f"digits-{arch}", "version": "b", "variants": variants, "data": "data",
                  "hardwareTarget": "x86-avx2", "settings": {"batchSizes": [1, 64], "seconds": 1.0, "threads": 1}, "output": f"{arch}/bench"}
        subprocess.run([sys.executable, "-m", "runtimes", "benchmark", "--config-json", json.dumps(config)], check=True,
                       env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        bench = json.load(open(os.path.join(ws, arch, "bench", "benchmark.json")))["variants"]
        p50 = {name: bench[name]["batches"]["1"]["p50Ms"] for name in variants}
        fp32 = bench["base"]
        figures[f"{prefix}onnx_max_abs_diff"] = export["onnx"]["verification"]["maxAbsDiff"]
        figures[f"{prefix}onnx_size_ratio"] = round(bench["onnx"]["sizeBytes"] / fp32["sizeBytes"], 4)
        figures[f"{prefix}onnx_int8_size_ratio"] = round(bench["onnx-int8"]["sizeBytes"] / fp32["sizeBytes"], 4)
        figures[f"{prefix}onnx_int8_acc_drop_pt"] = round(100 * (fp32["accuracy"] - bench["onnx-int8"]["accuracy"]), 3)
        figures[f"{prefix}onnx_latency_speedup"] = round(p50["base"] / p50["onnx"], 3)
        figures[f"{prefix}onnx_int8_latency_speedup"] = round(p50["base"] / p50["onnx-int8"], 3)
        figures[f"{prefix}bench_p50_ms"] = p50
        for name in ("onnx", "onnx-int8"):
            b = bench[name]
            rows.append((arch, name, {"sizeBytes": fp32["sizeBytes"], "parameters": fp32["parameters"], "accuracy": fp32["accuracy"],
                                      "latencyMsP50": p50["base"]},
                         {"sizeBytes": b["sizeBytes"], "parameters": b["parameters"], "accuracy": b["accuracy"], "latencyMsP50": p50[name]},
                         {}, 100 * (fp32["accuracy"] - b["accuracy"])))
    print(f"\n{'model':6} {'variant':9} {'size fp32→var (B)':>22} {'params':>16} {'acc fp32→var':>16} {'p50 ms fp32→var':>18}", file=sys.stderr)
    for arch, name, b, a, _ratios, _drop in rows:
        print(f"{arch:6} {name:9} {b['sizeBytes']:>10}→{a['sizeBytes']:<10} {b['parameters']:>7}→{a['parameters']:<7} "
              f"{b['accuracy']:.4f}→{a['accuracy']:.4f} {b['latencyMsP50']:>8.3f}→{a['latencyMsP50']:<8.3f}", file=sys.stderr)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
