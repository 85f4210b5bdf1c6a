"""The training benchmark's CPU mode (bench/train_gpu.py --device cpu --smoke): one training path —
the product's own train step, with configs rendered by ``plan_steps`` — and a JSON of finite,
positive figures. Without a GPU, the GPU parts say so and exit 0. No assertion is on time."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.runtimes.helpers import run_json

pytestmark = pytest.mark.runtime

RUN_KEYS = ("tokens_per_s", "step_s_median", "warmup_s", "peak_memory_bytes", "activation_memory_bytes", "saved_tensor_bytes",
            "parameters", "flops_per_token", "subprocess_wall_s")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_the_training_bench_runs_on_cpu_through_the_train_step(runtime_python: str, tmp_path: Path) -> None:
    out = tmp_path / "train.json"
    result = run_json(runtime_python, "bench/train_gpu.py", "--device", "cpu", "--smoke", "--out", str(out),
                  "--workspace", str(tmp_path / "ws"))
    assert json.loads(out.read_text()) == result
    assert result["device"] == "cpu" and result["configs_rendered_by"] == "renderers.workflow.plan_steps"

    ladder = result["ladder"]
    for rung in ("fp32_eager", "bf16_autocast", "bf16_fused_attention"):
        figures = ladder[rung]
        assert "error" not in figures, figures
        for key in RUN_KEYS:
            assert _positive(figures[key]), (rung, key, figures[key])
        assert figures["memory_source"] == "autograd-saved-tensors" and figures["timed_steps"] >= 1
    assert "skipped" in ladder["bf16_fused_compile"]
    for key in ("bf16_vs_fp32", "fused_vs_unfused_bf16", "best_vs_fp32_eager"):
        assert _positive(ladder["ratios"][key]), key
    # The explicit attention saves its [batch, heads, T, T] scores for backward; the fused kernel does not.
    assert ladder["bf16_fused_attention"]["saved_tensor_bytes"] < ladder["bf16_autocast"]["saved_tensor_bytes"]
    assert "skipped" in result["ddp"]

    ck = result["checkpointing"]
    assert ck["layers"] == [2, 4]
    for run in ck["runs"].values():
        assert "error" not in run, run
        for key in RUN_KEYS:
            assert _positive(run[key]), (key, run)
    for mode in ("full", "checkpointed"):
        assert math.isfinite(ck[mode]["growth_exponent"]) and _positive(ck[mode]["bytes_per_layer"])
    # Checkpointing keeps only each block's input for backward: fewer bytes at every depth, and
    # fewer more per added layer.
    assert all(0 < ratio < 1 for ratio in ck["memory_ratio_checkpointed_vs_full"].values())
    assert ck["checkpointed"]["bytes_per_layer"] < ck["full"]["bytes_per_layer"]
    assert all(math.isfinite(v) for v in ck["step_time_overhead"].values())
    assert set(result["targets"]) >= {"mfu_bf16_fused_compile", "checkpointed_growth_exponent", "checkpointing_overhead_max"}


def test_without_a_gpu_the_gpu_parts_say_so_and_exit_0(runtime_python: str, tmp_path: Path) -> None:
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""}
    train = run_json(runtime_python, "bench/train_gpu.py", "--device", "cuda", env=no_gpu, timeout=300)
    assert train["skipped"] == "no CUDA device on this machine" and "ladder" not in train
    serve = run_json(runtime_python, "bench/serve.py", "--device", "cuda", env=no_gpu, timeout=300)
    assert serve["skipped"] == "no CUDA device on this machine" and "models" not in serve


def test_the_last_segment_bench_times_both_cuts_and_their_gradients_agree(runtime_python: str) -> None:
    """bench/checkpoint_last.py: the product's checkpointing beside a plain last segment, in one
    process; a check of the path and its JSON (no assertion on time)."""
    result = run_json(runtime_python, "bench/checkpoint_last.py", "--layers", "4", "--modes", "sqrt", "--repeats", "2", timeout=300)
    [row] = result["runs"]
    assert (row["layers"], row["mode"], row["segments"]) == (4, "sqrt", 2)
    assert all(_positive(row["step_s"][name]) for name in ("off", "product", "last_plain")), row
    assert row["same_gradients"] and result["all_gradients_same"], row
    assert _positive(result["last_plain_vs_product_median"]), result


def test_the_checkpointing_ladder_runs_auto_when_asked_and_records_its_cut(runtime_python: str) -> None:
    """`--ckpt-modes full,auto` (what `CKPT_MODES` hands bench/device-run.sh for a lent GPU): each
    `auto` run is the train step's, with the segments it chose; a check of the path, on the CPU."""
    result = run_json(runtime_python, "bench/train_gpu.py", "--device", "cpu", "--smoke", "--parts", "checkpointing",
                      "--ckpt-modes", "full,auto", timeout=600)
    ck = result["checkpointing"]
    assert set(ck["runs"]) == {f"{n}_layers_{mode}" for n in (2, 4) for mode in ("full", "auto")}, ck["runs"]
    for layers in (2, 4):
        auto = ck["runs"][f"{layers}_layers_auto"]
        assert 1 <= auto["checkpoint_segments"] <= layers, auto
        assert auto["activation_memory_bytes"] < ck["runs"][f"{layers}_layers_full"]["activation_memory_bytes"]
    assert set(ck["auto_step_time_overhead"]) == {"2", "4"} and "sqrt" not in ck
