"""bench/train_gpu: training speed and memory through the product's own train step.

    python bench/train_gpu.py [--device auto|cuda|cpu] [--smoke] [--parts ladder,ddp,checkpointing]
                              [--rungs R,R,...] [--out FILE] [--budget-s S] [--peak-tflops T] [--ckpt-steps N]
                              [--ckpt-modes full,checkpointed,sqrt,auto]

One training path: every figure comes from ``python -m runtimes train --config-json …`` run as a
subprocess, with the step configs that ``renderers.workflow.plan_steps`` renders from Model specs
(the same configs a Workflow's steps get), on data from the product's ``prepare`` step (a
synthetic corpus of random bytes; nothing is downloaded). The throughput and memory figures are
the train step's own (``metrics.json`` → ``throughput``: steps after a warm-up of 3, the device
synchronised at each step end, checkpoint writes excluded); the bench adds each subprocess's wall
time and derives MFU.

Parts:

- ``ladder``: a GPT of ~124M parameters (12 layers, d_model 768, 12 heads, context 1024,
  vocabulary 50304) at batch 16: fp32 eager with the explicit attention (``attention: math``),
  bf16 autocast (same attention), bf16 + fused attention (``F.scaled_dot_product_attention``, the
  default), bf16 + fused + ``torch.compile`` (``compile: true``; its warm-up, compilation
  included, is reported apart). Tokens/s and MFU = tokens/s × (6·N + 12·layers·ctx·d_model) /
  peak dense bf16 FLOP/s of the accelerator (a table keyed by the GPU's name; ``--peak-tflops``
  overrides). ``--rungs`` picks the rungs: also ``bf16_fused_compile_batch2x`` (twice the batch)
  and ``bf16_fused_compile_deterministic`` (``deterministic: true``).
- ``ddp``: the compiled bf16 rung over all GPUs under torchrun (``strategy: ddp``); skipped, and
  said so, with fewer than 2 GPUs.
- ``checkpointing``: the same width at 4, 8, 16, 32 and 64 layers (batch 8, bf16 + fused), in the
  modes of ``gradientCheckpointing`` ``--ckpt-modes`` names: ``false`` (``full``), ``true``
  (``checkpointed``: every block) and ``sqrt`` (segments of ⌈√layers⌉ blocks) by default, also
  ``auto`` (the cut of least peak; each run records its segments): activation memory (CUDA: the allocator's peak within
  a step above what stays allocated between steps; CPU: bytes autograd saved for backward), the
  growth exponent with depth fitted on log-log (the promise: ≤ 0.6 for ``sqrt``), bytes per
  layer, and each mode's step-time overhead against ``full``.

``--device cpu`` runs the same parts with a small model (CI runs it, see
tests/runtimes/test_bench_train.py); ``--device cuda`` on a machine without a GPU says so, writes
``{"skipped": …}`` and exits 0; ``auto`` (the default) picks cuda when there is one, else cpu.
Every part fails soft (its error goes into the JSON and the others run), and a time budget
(``--budget-s``) skips what would overrun. The last line printed is the JSON object of all
figures (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.cli import emit  # noqa: E402
from bench.runtime_env import ROOT, ensure_runtime_env  # noqa: E402

#: Peak dense bf16 tensor throughput (FLOP/s, without sparsity) by GPU name; the first key found
#: in the device name (upper case) wins, so the more specific names come first.
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("H200", 989e12),
    ("H100 PCIE", 756e12),
    ("H100", 989e12),  # SXM
    ("H800", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
]

WARMUP_STEPS = 3  # runtimes.train.StepMeter.WARMUP_STEPS
#: The ladder's rungs unless --rungs names others (bf16_fused_compile_batch2x and
#: bf16_fused_compile_deterministic are the two more there are).
DEFAULT_RUNGS = ("fp32_eager", "bf16_autocast", "bf16_fused_attention", "bf16_fused_compile")


# -- model shapes -------------------------------------------------------------------------------
def shapes(device: str, smoke: bool) -> dict[str, Any]:
    if device == "cuda" and not smoke:
        return {"layers": 12, "dModel": 768, "heads": 12, "contextLength": 1024, "vocabSize": 50304,
                "batch": 16, "steps": 10, "ckptLayers": [4, 8, 16, 32, 64], "ckptBatch": 8, "ckptSteps": 3}
    if device == "cuda":  # a quick check of the GPU path
        return {"layers": 2, "dModel": 128, "heads": 4, "contextLength": 256, "vocabSize": 1024,
                "batch": 8, "steps": 3, "ckptLayers": [2, 4], "ckptBatch": 8, "ckptSteps": 2}
    if smoke:
        return {"layers": 2, "dModel": 32, "heads": 2, "contextLength": 32, "vocabSize": 256,
                "batch": 4, "steps": 2, "ckptLayers": [2, 4], "ckptBatch": 4, "ckptSteps": 2}
    return {"layers": 4, "dModel": 128, "heads": 4, "contextLength": 128, "vocabSize": 512,
            "batch": 8, "steps": 5, "ckptLayers": [4, 8, 16, 32, 64], "ckptBatch": 8, "ckptSteps": 3}


def flops_per_token(params: int, layers: int, ctx: int, d_model: int) -> int:
    """Model FLOPs per trained token: 6·N (forward + backward of the weights) + 12·L·T·d (attention)."""
    return 6 * params + 12 * layers * ctx * d_model


def peak_flops(device_name: str, override_tflops: float | None) -> tuple[float | None, str]:
    if override_tflops:
        return override_tflops * 1e12, f"--peak-tflops {override_tflops:g}"
    name = device_name.upper()
    for key, value in PEAK_BF16_FLOPS:
        if key in name:
            return value, f"table: {key} dense bf16 = {value / 1e12:g} TFLOP/s"
    return None, f"no peak known for {device_name!r} (pass --peak-tflops)"


def fit_exponent(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(y) on log(x): y ∝ x^slope."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return round(sum((p[0] - mx) * (p[1] - my) for p in pts) / den, 3) if den else None


def fit_slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of y on x (bytes per layer)."""
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return round(sum((p[0] - mx) * (p[1] - my) for p in pts) / den, 1) if den else None


# -- specs and rendered step configs ------------------------------------------------------------
class Specs:
    """The bench's Dataset, Compute and Environment, and the step configs rendered for a Model."""

    def __init__(self, workspace: Path, device: str, gpus: int, device_name: str, sizes: dict[str, Any]):
        self.workspace = workspace
        self.sizes = sizes
        ctx = sizes["contextLength"]
        windows = 8 * max(sizes["batch"], sizes["ckptBatch"])  # whole batches only: no recompiles
        size = math.ceil((windows * ctx + 1 + ctx // 2) / 0.9)
        corpus = random.Random(0).randbytes(size)
        (workspace / "corpus.bin").write_bytes(corpus)
        self.dataset = {
            "apiVersion": "forge.dev/v1alpha1", "kind": "Dataset", "metadata": {"name": "synthetic-tokens"},
            "spec": {"source": {"uri": "text://corpus.bin", "format": "text"}, "version": "1",
                     "digest": "sha256:" + hashlib.sha256(corpus).hexdigest(),
                     "splits": {"train": 0.9, "validation": 0.05, "test": 0.05}},
        }
        accelerator = "cpu"
        if device == "cuda":
            upper = device_name.upper()
            accelerator = "nvidia-h200-141gb" if "H200" in upper else "nvidia-a100-80gb" if "A100" in upper else "nvidia-h100-80gb"
        compute_spec: dict[str, Any] = {"accelerator": {"type": accelerator}}
        if device == "cuda":
            compute_spec.update(gpusPerNode=max(1, gpus), minGpus=1, maxGpus=max(1, gpus))
        self.compute = {"apiVersion": "forge.dev/v1alpha1", "kind": "Compute", "metadata": {"name": "bench-pool"}, "spec": compute_spec}
        self.environment = {"apiVersion": "forge.dev/v1alpha1", "kind": "Environment", "metadata": {"name": "bench"},
                            "spec": {"target": "local", "default": True, "defaults": {"computeRef": "bench-pool"}}}

    def model(self, name: str, *, layers: int, batch: int, steps: int, precision: str, attention: str = "fused",
              compile: bool = False, checkpointing: bool | str = False, ddp: int = 0, deterministic: bool = False) -> dict[str, Any]:
        s = self.sizes
        arch: dict[str, Any] = {"type": "gpt", "layers": layers, "dModel": s["dModel"], "heads": s["heads"],
                                "contextLength": s["contextLength"], "vocabSize": s["vocabSize"]}
        if attention != "fused":
            arch["attention"] = attention
        spec: dict[str, Any] = {
            "datasetRef": "synthetic-tokens", "computeRef": "bench-pool", "architecture": arch,
            "hyperparameters": {"learningRate": 0.0003, "batchSize": batch, "epochs": 1000, "maxSteps": steps + WARMUP_STEPS,
                                "weightDecay": 0.1, "seed": 0},
            "precision": precision, "gradientCheckpointing": checkpointing,
        }
        if compile:
            spec["compile"] = True
        if deterministic:
            spec["deterministic"] = True
        if ddp:
            spec["distributed"] = {"strategy": "ddp", "dataParallel": ddp}
        return {"apiVersion": "forge.dev/v1alpha1", "kind": "Model", "metadata": {"name": name}, "spec": spec}

    def configs(self, model_doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
        """(prepare config, train config, how they were rendered) for one Model document."""
        from specs.documents import Compute, Dataset, Environment, Model

        model = Model.model_validate(model_doc)
        dataset = Dataset.model_validate(self.dataset)
        compute = Compute.model_validate(self.compute)
        env = Environment.model_validate(self.environment)
        try:
            from renderers.workflow import plan_steps
            from specs import SpecSet

            _, steps, _ = plan_steps(SpecSet((env, compute, dataset, model)), model, env)
            by_kind = {s.kind: s.config for s in steps}
            return by_kind["prepare"], by_kind["train"], "renderers.workflow.plan_steps"
        except Exception as exc:  # noqa: BLE001 - fall back to the configs plan_steps builds
            from specs.stepconfig import PrepareConfig, TrainConfig

            digest = dataset.spec.digest.removeprefix("sha256:")[:12]
            data = f"data/{dataset.name}/{digest}"
            prep = PrepareConfig(dataset=dataset.name, spec=dataset.spec, output=data)
            train = TrainConfig(model=model.name, version="bench", spec=model.spec, data=data, output=f"models/{model.name}/bench/train")
            dump = lambda c: c.model_dump(mode="json", by_alias=True, exclude_defaults=False)  # noqa: E731
            return dump(prep), dump(train), f"specs.stepconfig (plan_steps failed: {type(exc).__name__}: {exc})"


# -- running steps ------------------------------------------------------------------------------
class Budget:
    def __init__(self, seconds: float | None):
        self.start = time.monotonic()
        self.seconds = seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - self.elapsed()


_PRINT = threading.Lock()


def say(line: str) -> None:
    """One whole line on stderr (the output of several threads never interleaves within a line)."""
    with _PRINT:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def log(message: str) -> None:
    say(f"[train_gpu {time.strftime('%H:%M:%S')}] {message}")


def run_step(label: str, cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, list[dict[str, Any]], str, float]:
    """Run a step as a subprocess (its own process group), echo its output live with a prefix;
    return (exit code, its JSON events, the tail of its stderr, wall seconds)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True)
    events: list[dict[str, Any]] = []
    tail: list[str] = []

    def pump(stream: Any, is_stdout: bool) -> None:
        for line in stream:
            if is_stdout and line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
            else:
                tail.append(line)
                del tail[:-60]
            say(f"  {label}| {line.rstrip()}")

    threads = [threading.Thread(target=pump, args=(proc.stdout, True), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, False), daemon=True)]
    for t in threads:
        t.start()
    try:
        code = proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = 124
        tail.append(f"killed after {timeout:.0f} s (time budget)\n")
    for t in threads:
        t.join(timeout=5)
    return code, events, "".join(tail)[-3000:], time.monotonic() - start


class Bench:
    def __init__(self, args: argparse.Namespace, device: str, gpus: int, device_name: str):
        self.args, self.device, self.gpus, self.device_name = args, device, gpus, device_name
        self.sizes = shapes(device, args.smoke)
        if args.ckpt_steps:
            self.sizes["ckptSteps"] = args.ckpt_steps
        unknown = set(args.ckpt_modes.split(",")) - set(self.CHECKPOINT_MODES)
        if unknown:
            raise SystemExit(f"--ckpt-modes: unknown {', '.join(sorted(unknown))}; expected some of {', '.join(self.CHECKPOINT_MODES)}")
        self.ckpt_modes = {k: v for k, v in self.CHECKPOINT_MODES.items() if k in args.ckpt_modes.split(",")}
        self.workspace = Path(args.workspace or tempfile.mkdtemp(prefix="forge-bench-train-gpu-"))
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.specs = Specs(self.workspace, device, gpus, device_name, self.sizes)
        self.budget = Budget(args.budget_s)
        pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        self.env = dict(os.environ, FORGE_WORKSPACE=str(self.workspace), FORGE_SOURCE_ROOT=str(self.workspace),
                        PYTHONPATH=pythonpath, PYTHONUNBUFFERED="1", FORGE_LOG_LEVEL="INFO")
        if device == "cpu":
            self.env["CUDA_VISIBLE_DEVICES"] = ""
        self.prepared = False
        self.rendered_by: str | None = None

    def prepare(self, prep: dict[str, Any]) -> None:
        if self.prepared:
            return
        code, _, tail, _ = run_step("prepare", [sys.executable, "-m", "runtimes", "prepare", "--config-json", json.dumps(prep)], self.env, 300)
        if code != 0:
            raise RuntimeError(f"prepare exited {code}: {tail[-1500:]}")
        self.prepared = True

    def train(self, model_doc: dict[str, Any], *, needs_s: float, cap_s: float, nproc: int = 0) -> dict[str, Any]:
        """Run one train step; its figures, or an error / skip record."""
        name = model_doc["metadata"]["name"]
        left = self.budget.left()
        if left < needs_s:
            log(f"{name}: skipped, {left:.0f} s left of the time budget, it needs about {needs_s:.0f} s")
            return {"skipped": f"time budget: {left:.0f} s left, needs ~{needs_s:.0f} s"}
        try:
            prep, cfg, how = self.specs.configs(model_doc)
            self.rendered_by = self.rendered_by or how
            self.prepare(prep)
            if nproc:
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                       "-m", "runtimes", "train", "--config-json", json.dumps(cfg)]
            else:
                cmd = [sys.executable, "-m", "runtimes", "train", "--config-json", json.dumps(cfg)]
            log(f"{name}: start ({self.budget.left():.0f} s left of the budget)")
            code, events, tail, wall = run_step(name, cmd, self.env, min(cap_s, self.budget.left()))
            if code != 0:
                return {"error": f"train exited {code}", "log_tail": tail[-2000:], "wall_s": round(wall, 1)}
            metrics = json.loads((self.workspace / cfg["output"] / "metrics.json").read_text())
            if not self.args.keep:  # the weights and checkpoints of a 124M model take GBs
                shutil.rmtree(self.workspace / cfg["output"], ignore_errors=True)
            t = metrics["throughput"]
            arch = cfg["spec"]["architecture"]
            fpt = flops_per_token(metrics["parameters"], arch["layers"], arch["contextLength"], arch["dModel"])
            peak, _ = peak_flops(metrics.get("device", ""), self.args.peak_tflops)
            tps = t.get("tokensPerSecond")
            out = {
                "tokens_per_s": tps,
                "mfu": round(tps * fpt / (peak * (metrics.get("worldSize") or 1)), 4) if tps and peak else None,
                "step_s_median": t["stepSeconds"]["median"],
                "warmup_s": t["warmupSeconds"],
                "timed_steps": t["timedSteps"],
                "peak_memory_bytes": t["peakMemoryBytes"],
                "activation_memory_bytes": t["activationMemoryBytes"],
                "saved_tensor_bytes": t["savedTensorBytes"],
                "checkpoint_segments": metrics.get("checkpointSegments"),
                "memory_source": t["memorySource"],
                "parameters": metrics["parameters"],
                "flops_per_token": fpt,
                "world_size": metrics.get("worldSize"),
                "device": metrics.get("device"),
                "batch": cfg["spec"]["hyperparameters"]["batchSize"],
                "deterministic": bool(cfg["spec"].get("deterministic", False)),
                "subprocess_wall_s": round(wall, 1),
                "train_loss": round(metrics.get("train", {}).get("loss", float("nan")), 4),
            }
            log(f"{name}: {tps or 0:,.0f} tokens/s, MFU {out['mfu']}, step {out['step_s_median']} s, warm-up {out['warmup_s']} s, "
                f"peak {(out['peak_memory_bytes'] or 0) / 2**30:.2f} GiB, wall {wall:.0f} s")
            return out
        except Exception as exc:  # noqa: BLE001 - one broken run must not lose the others
            log(f"{name}: error {type(exc).__name__}: {exc}")
            return {"error": f"{type(exc).__name__}: {exc}"}

    # -- parts ----------------------------------------------------------------------------------
    def ladder(self) -> dict[str, Any]:
        s = self.sizes
        gpu_full = self.device == "cuda" and not self.args.smoke
        # (options, batch multiple, seconds it needs — the first H200 run's wall times plus a margin —, cap)
        table: dict[str, tuple[dict[str, Any], int, float, float]] = {
            "fp32_eager": (dict(precision="fp32", attention="math"), 1, 45, 240),
            "bf16_autocast": (dict(precision="bf16", attention="math"), 1, 35, 180),
            "bf16_fused_attention": (dict(precision="bf16"), 1, 30, 180),
            "bf16_fused_compile": (dict(precision="bf16", compile=True), 1, 60, 420),
            # The same step at twice the batch (what the GPU's memory allows): the per-step costs
            # (optimizer update, launches) spread over twice the tokens.
            "bf16_fused_compile_batch2x": (dict(precision="bf16", compile=True), 2, 70, 420),
            # The compiled rung with `deterministic: true`: what determinism costs.
            "bf16_fused_compile_deterministic": (dict(precision="bf16", compile=True, deterministic=True), 1, 60, 420),
        }
        names = [r.strip() for r in (self.args.rungs or ",".join(DEFAULT_RUNGS)).split(",") if r.strip()]
        unknown = [r for r in names if r not in table]
        if unknown:
            raise ValueError(f"unknown rung(s) {unknown}; known: {sorted(table)}")
        results: dict[str, Any] = {}
        for key in names:
            opts, times, needs, cap = table[key]
            if opts.get("compile") and self.device == "cpu" and not self.args.cpu_compile:
                # bf16 matmuls on a CPU without AMX are emulated; compile needs a C++ toolchain
                results[key] = {"skipped": "CPU mode (pass --cpu-compile to try torch.compile on the CPU)"}
                continue
            if opts.get("compile") and not gpu_full:
                needs = 60
            doc = self.specs.model(f"bench-{key.replace('_', '-')}", layers=s["layers"], batch=s["batch"] * times, steps=s["steps"], **opts)
            results[key] = self.train(doc, needs_s=needs, cap_s=cap)

        def tps(k: str) -> float | None:
            return (results.get(k) or {}).get("tokens_per_s")

        def ratio(a: str, b: str) -> float | None:
            return round(tps(a) / tps(b), 3) if tps(a) and tps(b) else None

        results["ratios"] = {
            "bf16_vs_fp32": ratio("bf16_autocast", "fp32_eager"),
            "fused_vs_unfused_bf16": ratio("bf16_fused_attention", "bf16_autocast"),
            "compile_vs_eager_bf16_fused": ratio("bf16_fused_compile", "bf16_fused_attention"),
            "best_vs_fp32_eager": ratio("bf16_fused_compile", "fp32_eager") or ratio("bf16_fused_attention", "fp32_eager"),
            "compile_batch2x_vs_batch1x": ratio("bf16_fused_compile_batch2x", "bf16_fused_compile"),
            "compile_nondeterministic_vs_deterministic": ratio("bf16_fused_compile", "bf16_fused_compile_deterministic"),
        }
        return results

    def ddp(self) -> dict[str, Any]:
        nproc = self.gpus if self.device == "cuda" else self.args.ddp_cpu
        if nproc < 2:
            what = f"{self.gpus} GPU" if self.device == "cuda" else "CPU mode"
            log(f"ddp: skipped ({what}; DDP needs 2 or more devices)")
            return {"skipped": f"{what}: DDP over all GPUs needs 2 or more", "gpus": self.gpus}
        s = self.sizes
        compile_ = self.device == "cuda"
        doc = self.specs.model("bench-ddp", layers=s["layers"], batch=s["batch"], steps=s["steps"],
                               precision="bf16" if self.device == "cuda" else "fp32", compile=compile_, ddp=nproc)
        out = self.train(doc, needs_s=150 if compile_ else 40, cap_s=420, nproc=nproc)
        out["processes"] = nproc
        return out

    #: The modes of the checkpointing part: its key in the JSON → the spec's `gradientCheckpointing`.
    CHECKPOINT_MODES: dict[str, bool | str] = {"full": False, "checkpointed": True, "sqrt": "sqrt", "auto": "auto"}

    def checkpointing(self) -> dict[str, Any]:
        s = self.sizes
        precision = "bf16" if self.device == "cuda" else "fp32"
        runs: dict[str, Any] = {}
        depths = sorted(s["ckptLayers"])
        order = depths[:1] + depths[-1:] + depths[1:-1]  # the widest span first: a cut budget still leaves a fit
        for layers in order:
            for mode, setting in self.ckpt_modes.items():
                key = f"{layers}_layers_{mode}"
                doc = self.specs.model(f"bench-ckpt-{layers}-{mode}", layers=layers, batch=s["ckptBatch"],
                                       steps=s["ckptSteps"], precision=precision, checkpointing=setting)
                runs[key] = self.train(doc, needs_s=25 if self.device == "cuda" else 8, cap_s=300)
        summary: dict[str, Any] = {"layers": depths, "batch": s["ckptBatch"], "precision": precision, "runs": runs}
        for mode in self.ckpt_modes:
            xs, act, saved, steps = [], [], [], []
            for layers in depths:
                r = runs.get(f"{layers}_layers_{mode}") or {}
                if r.get("step_s_median"):
                    xs.append(layers)
                    act.append(r.get("activation_memory_bytes"))
                    saved.append(r.get("saved_tensor_bytes"))
                    steps.append(r["step_s_median"])
            summary[mode] = {
                "activation_memory_bytes": dict(zip(map(str, xs), act)),
                "growth_exponent": fit_exponent(xs, act),
                "bytes_per_layer": fit_slope(xs, act),
                "saved_tensor_bytes": dict(zip(map(str, xs), saved)),
                "saved_tensor_growth_exponent": fit_exponent(xs, saved),
                "saved_tensor_bytes_per_layer": fit_slope(xs, saved),
                "step_s": dict(zip(map(str, xs), steps)),
            }
        full = (summary.get("full") or {}).get("activation_memory_bytes") or {}
        for mode, label in (("checkpointed", ""), ("sqrt", "sqrt_"), ("auto", "auto_")):
            if mode not in self.ckpt_modes:
                continue
            overhead = {}
            for layers in depths:
                a, b = runs.get(f"{layers}_layers_full") or {}, runs.get(f"{layers}_layers_{mode}") or {}
                if a.get("step_s_median") and b.get("step_s_median"):
                    overhead[str(layers)] = round(b["step_s_median"] / a["step_s_median"] - 1, 3)
            summary[f"{label}step_time_overhead"] = overhead
            ck = summary[mode]["activation_memory_bytes"]
            summary[f"memory_ratio_{mode}_vs_full"] = {k: round(ck[k] / full[k], 3) for k in full if full.get(k) and ck.get(k)}
        return summary

def main() -> None:
    ensure_runtime_env()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--smoke", action="store_true", help="tiny model, few steps (a check of the path, not figures)")
    parser.add_argument("--parts", default="ladder,ddp,checkpointing", help="comma-separated: ladder, ddp, checkpointing")
    parser.add_argument("--rungs", default=None, help="the ladder's rungs, comma-separated (default: " + ",".join(DEFAULT_RUNGS)
                        + "; also bf16_fused_compile_batch2x, bf16_fused_compile_deterministic)")
    parser.add_argument("--out", help="also write the JSON object to this file")
    parser.add_argument("--budget-s", type=float, default=None, help="skip runs that would end after this many seconds")
    parser.add_argument("--ckpt-steps", type=int, default=None,
                        help="the checkpointing part's timed steps per run (default 3: a wider ladder in the budget; more: steadier times)")
    parser.add_argument("--ckpt-modes", default="full,checkpointed,sqrt",
                        help="the checkpointing part's modes, comma-separated: full, checkpointed, sqrt, auto "
                        "(default full,checkpointed,sqrt)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak dense bf16 TFLOP/s (default: from the GPU's name)")
    parser.add_argument("--workspace", help="workspace folder (default: a new temporary one)")
    parser.add_argument("--ddp-cpu", type=int, default=0, help="CPU mode: run the ddp part with this many gloo processes")
    parser.add_argument("--cpu-compile", action="store_true", help="CPU mode: also run the torch.compile rung")
    parser.add_argument("--keep", action="store_true", help="keep each run's weights and checkpoints in the workspace")
    args = parser.parse_args()

    import torch

    started = time.time()
    cuda = torch.cuda.is_available()
    gpus = torch.cuda.device_count() if cuda else 0
    device = args.device if args.device != "auto" else ("cuda" if cuda else "cpu")
    result: dict[str, Any] = {"bench": "train_gpu", "device": device, "torch": torch.__version__, "python": sys.version.split()[0]}
    if device == "cuda" and not cuda:
        log("no CUDA device here: the GPU part is skipped (run with --device cpu for the CPU figures)")
        result.update(skipped="no CUDA device on this machine", gpus=0)
        emit(result, args.out)
        return
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    peak, peak_source = peak_flops(device_name, args.peak_tflops) if device == "cuda" else (
        (args.peak_tflops * 1e12, "--peak-tflops") if args.peak_tflops else (None, "CPU: no peak table (pass --peak-tflops for an MFU)"))
    bench = Bench(args, device, gpus, device_name)
    log(f"device {device_name} ({gpus} GPU), peak {peak_source}; workspace {bench.workspace}; sizes {bench.sizes}")
    result.update(gpu_name=device_name if device == "cuda" else None, gpus=gpus, peak_flops=peak, peak_source=peak_source,
                  model=bench.sizes, smoke=args.smoke, budget_s=args.budget_s)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    for part in ("ladder", "ddp", "checkpointing"):
        if part not in parts:
            continue
        log(f"part {part}: start at {bench.budget.elapsed():.0f} s")
        try:
            result[part] = getattr(bench, part)()
        except Exception as exc:  # noqa: BLE001 - fail soft: record and go on
            log(f"part {part}: error {type(exc).__name__}: {exc}")
            result[part] = {"error": f"{type(exc).__name__}: {exc}"}
    result["configs_rendered_by"] = bench.rendered_by
    ladder = result.get("ladder") or {}
    ck = result.get("checkpointing") or {}
    best = (ladder.get("bf16_fused_compile") or {}).get("mfu")
    mfus = {k: v["mfu"] for k, v in ladder.items() if k != "ratios" and isinstance(v, dict) and v.get("mfu") is not None}
    best_rung = max(mfus, key=mfus.get) if mfus else None
    exponent = (ck.get("checkpointed") or {}).get("growth_exponent")
    overheads = list((ck.get("step_time_overhead") or {}).values())
    sqrt_exponent = (ck.get("sqrt") or {}).get("growth_exponent")
    sqrt_overheads = list((ck.get("sqrt_step_time_overhead") or {}).values())
    result["targets"] = {
        "mfu_bf16_fused_compile": best,
        "mfu_best": mfus.get(best_rung) if best_rung else None,
        "mfu_best_rung": best_rung,
        "mfu_ge_0_40": mfus[best_rung] >= 0.40 if best_rung else None,
        "speedup_vs_fp32_eager": (ladder.get("ratios") or {}).get("best_vs_fp32_eager"),
        "speedup_ge_1_5": ((ladder.get("ratios") or {}).get("best_vs_fp32_eager") or 0) >= 1.5 if ladder.get("ratios") else None,
        "checkpointed_growth_exponent": exponent,
        "checkpointed_sublinear": exponent < 1 if exponent is not None else None,
        "checkpointing_overhead_max": max(overheads) if overheads else None,
        "checkpointing_overhead_le_0_35": max(overheads) <= 0.35 if overheads else None,
        # gradientCheckpointing: sqrt — the memory law over the ladder's depths (4 → 64 layers).
        "sqrt_growth_exponent": sqrt_exponent,
        "sqrt_exponent_le_0_6": sqrt_exponent <= 0.6 if sqrt_exponent is not None else None,
        "sqrt_overhead_max": max(sqrt_overheads) if sqrt_overheads else None,
        "sqrt_overhead_median": sorted(sqrt_overheads)[len(sqrt_overheads) // 2] if sqrt_overheads else None,
    }
    result["elapsed_s"] = round(time.time() - started, 1)
    emit(result, args.out)


if __name__ == "__main__":
    main()
