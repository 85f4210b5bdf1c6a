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


def test_auto_cuts_where_the_peak_the_allocator_measures_is_least(runtime_python: str) -> None:
    """The CPU ladder's GPT at 64 layers (a block saves 16× its input): `auto` cuts 32 segments of
    2, and the peak of a pass, measured from the allocator's events by bench/checkpoint_peak.py, is
    below both fixed cuts' (sqrt: 8 segments of 8 recomputed at once; per block: 64 inputs kept).
    The peak `auto` predicts from the train step's measured costs is within a tenth of each
    measured one (what precedes the stack, the embedding, is not in the prediction)."""
    result = run_json(runtime_python, "bench/checkpoint_peak.py", "--layers", "64", "--models", "gpt", timeout=600)
    modes = result["runs"][0]["modes"]
    assert result["same_gradients"], modes
    assert (modes["auto"]["segments"], modes["sqrt"]["segments"], modes["per-block"]["segments"]) == (32, 8, 64)
    assert modes["auto"]["peak_bytes"] < 0.9 * min(modes["sqrt"]["peak_bytes"], modes["per-block"]["peak_bytes"]), modes
    for mode in ("per-block", "sqrt", "auto"):
        assert modes[mode]["predicted_bytes"] == pytest.approx(modes[mode]["peak_bytes"], rel=0.1), (mode, modes)


# block_costs's measuring pass on a CNN (BatchNorm's running statistics) and an MLP with dropout
# (the random-number state): the figures, and what it leaves behind.
_MEASURE_COSTS = """
import json, torch
from runtimes.models import CNN, MLP, block_costs
torch.manual_seed(0)
mlp, x, y = MLP(8, [16] * 4, 3, dropout=0.5).train(), torch.randn(32, 8), torch.randint(0, 3, (32,))
cnn, images = CNN([4, 8], 3, image_size=8).train(), torch.randn(32, 1, 8, 8)
mlp.gradient_checkpointing = True
state, stats = torch.get_rng_state(), {k: v.clone() for k, v in cnn.state_dict().items()}
mlp_costs = block_costs(mlp, lambda: torch.nn.functional.cross_entropy(mlp(x), y))
cnn_costs = block_costs(cnn, lambda: torch.nn.functional.cross_entropy(cnn(images), y))
print(json.dumps({"mlp": [mlp_costs.inputs, mlp_costs.activations, mlp_costs.head], "cnn_inputs": cnn_costs.inputs,
                  "rng_kept": torch.equal(state, torch.get_rng_state()), "switch_kept": mlp.gradient_checkpointing,
                  "stats_kept": all(torch.equal(v, cnn.state_dict()[k]) for k, v in stats.items())}))
"""


def test_block_costs_measure_each_block_and_leave_no_trace(runtime_python: str) -> None:
    """The MLP's blocks take 32 × 8 then 32 × 16 float32 inputs (1,024 and 2,048 B); the CNN's
    32 × 1 × 8 × 8, then 32 × 4 × 4 × 4 after the first block's pooling (8,192 B each). A block saves more than its input
    (its ReLU's output and dropout's mask beside it). The pass leaves the random-number state,
    the running statistics and the checkpointing switch as they were."""
    result = run_json(runtime_python, "-c", _MEASURE_COSTS, timeout=120)
    inputs, activations, head = result["mlp"]
    assert inputs == [1024, 2048, 2048, 2048] and result["cnn_inputs"] == [8192, 8192], result
    assert all(a > i for a, i in zip(activations, inputs)) and head > 0, result
    assert result["rng_kept"] and result["stats_kept"] and result["switch_kept"], result


def test_auto_through_the_train_step_logs_and_records_its_cut(digits: Runner) -> None:
    out = "models/ckpt-auto"
    proc = digits.run("train", train_config(out, _spec(16, "auto", maxSteps=2, epochs=1)), timeout=300)
    metrics = digits.read(f"{out}/metrics.json")
    assert metrics["gradientCheckpointing"] == "auto" and metrics["steps"] == 2
    segments = metrics["checkpointSegments"]
    assert 1 <= segments <= 16 and f"16 blocks in {segments} segments" in proc.stderr, proc.stderr[-2000:]
    assert "auto: an estimated activation peak of" in proc.stderr and "(sqrt)" in proc.stderr
