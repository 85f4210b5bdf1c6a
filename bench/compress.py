"""bench/compress: fp32 vs structured-pruned vs INT8 on the digits MLP and a small CNN.

    python bench/compress.py            # re-execs itself in the cached runtime env if needed

Runs the real steps (prepare → train → compress) in a temporary workspace, then prints a table
and, as its last line, a JSON object of the digits-MLP figures (ratios are compressed / fp32):
``{"int8_size_ratio", "int8_acc_drop_pt", "pruned_param_ratio", "pruned_acc_drop_pt",
"int8_latency_speedup", ...}`` plus the same for the CNN under ``cnn_*`` keys.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from runtimes.benchsupport import ensure_runtime_env, step  # noqa: E402

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
    print(f"\n{'model':6} {'variant':8} {'size fp32→var (B)':>22} {'params':>16} {'acc fp32→var':>16} {'p50 ms fp32→var':>18}", file=sys.stderr)
    for arch, name, b, a, r, drop in rows:
        print(f"{arch:6} {name:8} {b['sizeBytes']:>10}→{a['sizeBytes']:<10} {b['parameters']:>7}→{a['parameters']:<7} "
              f"{b['accuracy']:.4f}→{a['accuracy']:.4f} {b['latencyMsP50']:>8.3f}→{a['latencyMsP50']:<8.3f}", file=sys.stderr)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
