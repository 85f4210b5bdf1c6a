"""bench/train: training throughput on CPU with the real train step.

    python bench/train.py

Trains the quickstart digits MLP (fp32; the "≥ 95 % in under a minute" target) and a small GPT
on byte-tokenised text in fp32 and bf16 autocast. Prints a summary, then as its last line
``{"digits_seconds", "digits_val_accuracy", "digits_samples_per_s", "gpt_fp32_tokens_per_s",
"gpt_bf16_tokens_per_s", "bf16_speedup"}``. For the GPU benchmark see ``bench/train_gpu.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.compress import DIGITS  # noqa: E402
from bench.runtime_env import ensure_runtime_env, step  # noqa: E402

CTX = 64


def main() -> None:
    ensure_runtime_env()
    ws = tempfile.mkdtemp(prefix="forge-bench-train-")
    os.environ["FORGE_WORKSPACE"] = ws
    os.environ["FORGE_SOURCE_ROOT"] = ws
    figures: dict[str, float] = {}
    assert step("runtimes.prepare", {"step": "prepare", "dataset": "digits", "spec": DIGITS, "output": "digits"}) == 0
    mlp = {"datasetRef": "digits", "architecture": {"type": "mlp", "hiddenSizes": [256, 128]},
           "hyperparameters": {"learningRate": 0.002, "batchSize": 64, "epochs": 30, "weightDecay": 0.0001, "seed": 7}}
    assert step("runtimes.train", {"step": "train", "model": "digits-mlp", "version": "b", "spec": mlp, "data": "digits", "output": "mlp"}) == 0
    m = json.load(open(os.path.join(ws, "mlp", "metrics.json")))
    figures.update(digits_seconds=m["seconds"], digits_val_accuracy=round(m["accuracy"], 4), digits_samples_per_s=m["samplesPerSecond"])

    text = (b"Forge turns specs into workflows; the workflows train, compress and serve models. " * 600)
    with open(os.path.join(ws, "corpus.txt"), "wb") as fh:
        fh.write(text)
    spec = {"source": {"uri": "text://corpus.txt", "format": "text"}, "version": "1", "digest": "sha256:" + hashlib.sha256(text).hexdigest(),
            "splits": {"train": 0.9, "validation": 0.05, "test": 0.05}}
    assert step("runtimes.prepare", {"step": "prepare", "dataset": "corpus", "spec": spec, "output": "corpus"}) == 0
    for precision in ("fp32", "bf16"):
        gpt = {"datasetRef": "corpus", "architecture": {"type": "gpt", "layers": 4, "dModel": 128, "heads": 4, "contextLength": CTX, "vocabSize": 256},
               "hyperparameters": {"learningRate": 0.003, "batchSize": 16, "epochs": 1, "maxSteps": 40, "seed": 1}, "precision": precision}
        assert step("runtimes.train", {"step": "train", "model": "lm", "version": precision, "spec": gpt, "data": "corpus", "output": f"gpt-{precision}"}) == 0
        g = json.load(open(os.path.join(ws, f"gpt-{precision}", "metrics.json")))
        figures[f"gpt_{precision}_tokens_per_s"] = round(g["samplesPerSecond"] * CTX, 1)
    figures["bf16_speedup"] = round(figures["gpt_bf16_tokens_per_s"] / figures["gpt_fp32_tokens_per_s"], 3)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
