"""Training features: resume after a kill, DeepSpeed ZeRO-2 on CPU, DDP under torchrun, mixed
precision with gradient checkpointing and accumulation, a GPT on text."""

from __future__ import annotations

import copy
import json
import signal
import subprocess

import pytest

from devkit.digits import DIGITS_MODEL, train_config
from devkit.runtime_steps import Runner
from tests.runtimes.helpers import ROOT, events

pytestmark = pytest.mark.runtime

COMPARE = """
import sys, torch
a, b = (torch.load(p, weights_only=True) for p in sys.argv[1:3])
print(max(float((a[k] - b[k]).abs().max()) for k in a))
"""


def test_a_killed_run_resumes_from_its_checkpoint_and_ends_identical(digits: Runner) -> None:
    config = train_config("models/resumed", checkpointEvery=25)
    proc = subprocess.Popen(digits.command("train", config), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=digits.env(), cwd=ROOT)
    assert proc.stdout is not None
    killed_at = None
    for line in proc.stdout:
        event = json.loads(line) if line.startswith("{") else {}
        if event.get("event") == "progress" and event["step"] >= 110:
            killed_at = event["step"]
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert killed_at is not None and proc.returncode == -signal.SIGKILL
    assert not (digits.workspace / "models/resumed/model.json").exists()

    again = digits.run("train", config, timeout=600)
    resumed = [e for e in events(again.stdout) if e["event"] == "resume"]
    assert resumed and 100 <= resumed[0]["step"] <= killed_at
    metrics = digits.read("models/resumed/metrics.json")
    assert metrics["resumedFromStep"] == resumed[0]["step"] and metrics["steps"] == 600
    # Deterministic: the resumed run ends with the weights of the run that never stopped.
    diff = subprocess.run([digits.python, "-c", COMPARE, str(digits.workspace / "models/resumed/model.pt"), str(digits.workspace / "models/base/model.pt")],
                          capture_output=True, text=True, check=True)
    assert float(diff.stdout) == 0.0


def _short(model: dict, **hyper: object) -> dict:
    spec = copy.deepcopy(model)
    spec["hyperparameters"].update(hyper)
    return spec


def test_deepspeed_zero2_on_cpu(digits: Runner) -> None:
    spec = _short(DIGITS_MODEL, maxSteps=12, epochs=1)
    spec["distributed"] = {"strategy": "deepspeed", "zeroStage": 2}
    spec["precision"] = "bf16"
    config = train_config("models/zero2", spec, deepspeed={"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0}, checkpointEvery=6)
    proc = digits.run("train", config, timeout=600)
    metrics = digits.read("models/zero2/metrics.json")
    assert metrics["strategy"] == "deepspeed" and metrics["zeroStage"] == 2 and metrics["steps"] == 12
    assert metrics["accuracy"] > 0.5
    assert (digits.workspace / "models/zero2/checkpoints/deepspeed/latest").exists()
    assert [e for e in events(proc.stdout) if e["event"] == "done"]


def test_ddp_under_torchrun_with_two_processes(digits: Runner) -> None:
    spec = _short(DIGITS_MODEL, maxSteps=15, epochs=2)  # 10 steps per epoch on each of 2 ranks
    spec["distributed"] = {"strategy": "ddp"}
    config = train_config("models/ddp", spec)
    cmd = [digits.python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "runtimes", "train", "--config-json", json.dumps(config)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=digits.env(), cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = digits.read("models/ddp/metrics.json")
    assert metrics["worldSize"] == 2 and metrics["steps"] == 15 and metrics["accuracy"] > 0.5


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_cnn_with_checkpointing_and_accumulation(digits: Runner, precision: str) -> None:
    spec = _short(DIGITS_MODEL, maxSteps=40, epochs=5, gradientAccumulationSteps=2, batchSize=32, learningRate=0.01)
    spec["architecture"] = {"type": "cnn", "channels": [16, 32], "imageSize": 8, "inChannels": 1}
    spec["precision"] = precision
    spec["gradientCheckpointing"] = True
    digits.run("train", train_config(f"models/cnn-{precision}", spec), timeout=600)
    metrics = digits.read(f"models/cnn-{precision}/metrics.json")
    assert metrics["precision"] == precision and metrics["steps"] == 40
    assert metrics["accuracy"] > 0.6, metrics


def test_gpt_on_text_tokenised_as_bytes(runtime_python: str, tmp_path) -> None:
    runner = Runner(runtime_python, tmp_path)
    text = ("the quick brown fox jumps over the lazy dog. " * 400).encode()
    (tmp_path / "corpus.txt").write_bytes(text)
    import hashlib

    spec = {"source": {"uri": "text://corpus.txt", "format": "text"}, "version": "1", "digest": "sha256:" + hashlib.sha256(text).hexdigest(),
            "splits": {"train": 0.8, "validation": 0.1, "test": 0.1}}
    runner.run("prepare", {"step": "prepare", "dataset": "corpus", "spec": spec, "output": "data/corpus"})
    model = {"datasetRef": "corpus", "architecture": {"type": "gpt", "layers": 2, "dModel": 64, "heads": 4, "contextLength": 32, "vocabSize": 256},
             "hyperparameters": {"learningRate": 0.003, "batchSize": 16, "epochs": 1, "maxSteps": 30, "seed": 1}, "precision": "bf16", "gradientCheckpointing": "auto"}
    # `auto` measures the blocks on a first batch under bf16 autocast and cuts by their costs.
    proc = runner.run("train", {"step": "train", "model": "tiny-lm", "version": "v1", "spec": model, "data": "data/corpus", "output": "models/lm"}, timeout=600)
    assert "2 blocks in " in proc.stderr and "auto: an estimated activation peak of" in proc.stderr, proc.stderr[-2000:]
    runner.run("evaluate", {"step": "evaluate", "model": "tiny-lm", "modelDir": "models/lm", "data": "data/corpus",
                            "thresholds": [{"metric": "perplexity", "max": 40}], "output": "eval/lm"})
    assert runner.read("eval/lm/metrics.json")["perplexity"] < 40
