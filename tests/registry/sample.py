"""Sample registrations for the registry tests: the real renderer's Workflows for the quick-start
specs, and `registry.json` files in the format the `register` step writes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from forgectl.cli import app
from reconciler.load.loader import load_or_raise
from renderers import RenderContext, render

ROOT = Path(__file__).resolve().parents[2]
DIGITS_DIGEST = "sha256:4eca0a80f7990df18560bf7c80f03e0893a8868820f1ee4405e0402527902353"

#: variant → (kind, accuracy, size, p50 ms, p99 ms, rows/s): base is dominated by base-onnx-int8
#: (same accuracy, smaller, faster); the other four each win on something.
V1 = {"base": ("state_dict", 0.9638, 205_821, 0.037, 0.16, 13_700),
      "pruned": ("state_dict", 0.9554, 60_000, 0.030, 0.11, 30_000),
      "int8": ("int8", 0.9666, 57_553, 0.070, 2.05, 8_400),
      "base-onnx": ("onnx", 0.9638, 211_107, 0.010, 0.017, 61_000),
      "base-onnx-int8": ("onnx-int8", 0.9638, 66_119, 0.012, 0.022, 51_000)}
#: v2 (learning rate 0.003): every variant one point better, same sizes and speed.
V2 = {k: (kind, acc + 0.01, size, p50, p99, thr) for k, (kind, acc, size, p50, p99, thr) in V1.items()}


def project(tmp: Path, learning_rate: str = "0.002") -> Path:
    """A copy of the quick-start specs with the given learning rate."""
    specs = tmp / "specs"
    if specs.exists():
        shutil.rmtree(specs)
    shutil.copytree(ROOT / "examples" / "quickstart", specs)
    model = specs / "model.yaml"
    model.write_text(model.read_text().replace("learningRate: 0.002", f"learningRate: {learning_rate}"))
    return specs


def rendered(specs: Path, revision: str) -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
    result = load_or_raise([str(specs)])
    env = result.specs.environment(None)
    out = render(result.specs, RenderContext(env, revision))
    return out.workflows["digits-mlp"].manifest, out.manifests, env


def registration(model: str, version: str, figures: dict[str, tuple]) -> dict[str, Any]:
    """registry.json as the register step writes it (benchmark figures per variant)."""
    variants = {}
    for name, (kind, acc, size, p50, p99, thr) in figures.items():
        runtime = "onnxruntime" if kind.startswith("onnx") else "pytorch"
        variants[name] = {"path": f"registry/{model}/{version}/{name}", "sha256": "0" * 64, "sizeBytes": size, "kind": kind,
                          "parameters": 50_000, "metrics": {"accuracy": acc},
                          "benchmark": {"runtime": runtime, "kind": kind, "accuracy": acc, "sizeBytes": size, "memoryBytes": 2 << 20,
                                        "batches": {"1": {"p50Ms": p50, "p99Ms": p99, "meanMs": p50, "throughput": thr, "calls": 500},
                                                    "64": {"p50Ms": p50 * 4, "p99Ms": p99 * 4, "meanMs": p50 * 4, "throughput": thr * 16, "calls": 100}}}}
    return {"model": model, "version": version, "variants": variants,
            "hardware": {"cpu": "Test CPU", "machine": "x86_64", "cores": 2, "threads": 1, "hardwareTarget": "x86-avx2"}}


def write_run(workspace: Path, manifest: dict[str, Any], figures: dict[str, tuple], accuracy: float) -> None:
    """The files a finished run leaves in the workspace: the registration and the evaluation."""
    labels = manifest["metadata"]["labels"]
    model, version = labels["forge.dev/name"], labels["forge.dev/model-version"]
    reg = workspace / "registry" / model / version / "registry.json"
    reg.parent.mkdir(parents=True, exist_ok=True)
    reg.write_text(json.dumps(registration(model, version, figures)))
    ev = workspace / "models" / model / version / "evaluate" / "metrics.json"
    ev.parent.mkdir(parents=True, exist_ok=True)
    ev.write_text(json.dumps({"accuracy": accuracy, "f1": accuracy - 0.001, "passed": True, "thresholds": []}))


def cli(*args: str) -> Any:
    """`forgectl` in this process, with a wide terminal and no colour."""
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "220", "NO_COLOR": "1"})
