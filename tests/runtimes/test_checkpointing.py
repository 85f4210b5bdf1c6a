"""`gradientCheckpointing: sqrt` through the product's train step: it trains, and what autograd keeps
for backward grows as √layers, where the per-layer mode (`true`) still grows linearly.

The figure is the train step's own (`metrics.json` → `throughput.savedTensorBytes`: the distinct
tensors autograd saved in the first forward pass, parameters excluded). The exponent is fitted on
log-log over 4 → 64 small MLP blocks; sqrt keeps ⌈layers ÷ ⌈√layers⌉⌉ segment inputs, so its
exponent is about ½ (below 0.75 here), while one input per block gives about 1."""

from __future__ import annotations

import copy
import math

import pytest

from devkit.digits import DIGITS_MODEL, train_config
from devkit.runtime_steps import Runner
from tests.runtimes.helpers import run_json

pytestmark = pytest.mark.runtime

DEPTHS = (4, 8, 16, 32, 64)


def _exponent(xs: list[int], ys: list[int]) -> float:
    """Least-squares slope of log(y) on log(x)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys)]
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def _spec(layers: int, mode: object, **hyper: object) -> dict:
    spec = copy.deepcopy(DIGITS_MODEL)
    spec["architecture"] = {"type": "mlp", "hiddenSizes": [32] * layers}
    spec["gradientCheckpointing"] = mode
    spec["hyperparameters"].update(hyper)
    return spec


def _saved_bytes(digits: Runner, layers: int, mode: object) -> int:
    out = f"models/saved-{str(mode).lower()}-{layers}"
    digits.run("train", train_config(out, _spec(layers, mode, maxSteps=2, epochs=1)), timeout=300)
    metrics = digits.read(f"{out}/metrics.json")
    assert metrics["gradientCheckpointing"] == mode and metrics["steps"] == 2
    saved = metrics["throughput"]["savedTensorBytes"]
    assert isinstance(saved, int) and saved > 0, (out, metrics["resumedFromStep"], metrics["throughput"])
    return saved


def test_sqrt_checkpointing_trains(digits: Runner) -> None:
    spec = _spec(4, "sqrt", maxSteps=150, epochs=10, learningRate=0.01)
    spec["architecture"]["hiddenSizes"] = [128] * 4
    proc = digits.run("train", train_config("models/ckpt-sqrt-trains", spec), timeout=600)
    metrics = digits.read("models/ckpt-sqrt-trains/metrics.json")
    assert metrics["gradientCheckpointing"] == "sqrt" and metrics["steps"] == 150
    assert metrics["accuracy"] > 0.8, metrics
    assert "4 blocks in 2 segments" in proc.stderr


def test_sqrt_saved_memory_grows_sublinearly_where_per_layer_grows_linearly(digits: Runner) -> None:
    sqrt = [_saved_bytes(digits, n, "sqrt") for n in DEPTHS]
    ends = (DEPTHS[0], DEPTHS[-1])  # the per-layer mode at both ends of the ladder only (each run costs seconds)
    per_layer = [_saved_bytes(digits, n, True) for n in ends]
    sqrt_exp, per_layer_exp = _exponent(list(DEPTHS), sqrt), _exponent(list(ends), per_layer)
    assert sqrt_exp < 0.75, (sqrt_exp, dict(zip(DEPTHS, sqrt)))
    assert per_layer_exp > 0.75, (per_layer_exp, dict(zip(ends, per_layer)))
    # At 64 blocks sqrt keeps 8 segment inputs where the per-layer mode keeps 64.
    assert sqrt[-1] < per_layer[-1] / 3, (sqrt[-1], per_layer[-1])


def test_a_segment_count_cuts_the_blocks_into_that_many_segments(digits: Runner) -> None:
    proc = digits.run("train", train_config("models/ckpt-segments", _spec(16, 2, maxSteps=2, epochs=1)), timeout=300)
    assert "16 blocks in 2 segments" in proc.stderr
    one = _saved_bytes(digits, 16, 1)
    two = digits.read("models/ckpt-segments/metrics.json")["throughput"]["savedTensorBytes"]
    per_layer = _saved_bytes(digits, 16, True)
    assert one < two < per_layer, (one, two, per_layer)


# One training step of a 10-block MLP in the runtime environment, checkpointed in the given number
# of segments: how often each block's forward began, and whether the gradients are a plain run's.
_COUNT_FORWARDS = """
import json, sys, torch
from runtimes.models import MLP
from specs.model import ModelSpec
torch.manual_seed(0)
model, x, y = MLP(8, [16] * 10, 3), torch.randn(32, 8), torch.randint(0, 3, (32,))
def grads(segments):
    model.zero_grad()
    model.gradient_checkpointing, model.checkpoint_segments = segments is not None, segments or 0
    calls = [0] * len(model.blocks)
    # on entry: a recomputation stops (inside the segment's last block) once it has what backward needs
    hooks = [b.register_forward_pre_hook(lambda m, i, k=k: calls.__setitem__(k, calls[k] + 1)) for k, b in enumerate(model.blocks)]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for h in hooks:
        h.remove()
    return calls, [p.grad.clone() for p in model.parameters()]
_, plain = grads(None)
mode = sys.argv[1]
segments = ModelSpec.model_construct(gradient_checkpointing=True if mode == "true" else mode if mode == "sqrt" else int(mode)
                                     ).checkpoint_segments(len(model.blocks))
calls, checkpointed = grads(segments)
print(json.dumps({"segments": segments, "calls": calls, "same": all(torch.equal(a, b) for a, b in zip(plain, checkpointed))}))
"""


@pytest.mark.parametrize(("mode", "segments"), [("sqrt", 3), ("true", 10), ("6", 5)])
def test_every_segment_is_recomputed_once_and_the_gradients_are_a_plain_runs(runtime_python: str, mode: str,
                                                                             segments: int) -> None:
    """Each block runs once more in the backward pass, whatever the cut — the last segment too: it
    stays checkpointed, so the output head's forward and backward (a language model's logits, the
    peak) run beside segment inputs alone (bench/checkpoint_last.py measures the alternative). The
    count is the spec's, as the train step logs it: 10 blocks asked in 6 are 5 segments of 2."""
    result = run_json(runtime_python, "-c", _COUNT_FORWARDS, mode, timeout=120)
    assert result["segments"] == segments and result["same"], result
    assert result["calls"] == [2] * 10, result
