"""The hardware half of a Model's Workflow (pure): ONNX export, the target's build (ONNX Runtime
INT8 for CPU/ARM, a TensorRT engine for Jetson/NVIDIA GPUs) and the `benchmark` step that
measures every variant on one node.

`plan_steps` (renderers/workflow.py) calls `hardware_steps` after the compress steps and adds what
it returns; the register step then records the exported variants, the engines (built or not) and
the benchmark. Which export a target gets:

| hardware target | after `export-<variant>` (ONNX, verified against PyTorch) |
| --- | --- |
| `x86-avx2`, `x86-avx512-vnni`, `arm64` | `<variant>-onnx-int8`: ONNX Runtime static INT8 in the same step |
| `jetson-orin`, `nvidia-gpu` | `build-engine-<variant>`: a TensorRT engine, built on the device |

A TensorRT engine is specific to the GPU and TensorRT version it is built on, so it is built by a
step scheduled on the target's nodes. The local target has no such device: there the step runs
with `required: false` and records the engine as not built (and the plan says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specs import Compression, Environment
from specs.compression import TENSORRT_TARGETS, Benchmark, export_variant
from specs.stepconfig import BenchmarkConfig, EngineConfig, ExportConfig

#: Step kinds of this module (the local executor runs them like any other step).
KINDS = ("export", "build-engine", "benchmark")
TENSORRT_IMAGE = "forge-tensorrt"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass
class HardwareSteps:
    """What `hardware_steps` adds to a Workflow."""

    steps: list[tuple[str, str, Any, str, tuple[str, ...]]] = field(default_factory=list)
    """(name, kind, config, image, depends) in order, for `plan_steps`' `add`."""
    variants: dict[str, str] = field(default_factory=dict)
    """Exported variants (`<variant>-onnx`, `<variant>-onnx-int8`) → bundle folder."""
    artifacts: dict[str, str] = field(default_factory=dict)
    """Built artifacts that are not bundles (`<variant>-tensorrt`) → folder."""
    benchmark: str | None = None
    """Folder of `benchmark.json`."""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s[0] for s in self.steps)


def export_dir(vdir: str, source: str) -> str:
    """Workspace folder of one variant's exports."""
    return f"{vdir}/exports/{source}"


def hardware_steps(compression: Compression | None, model: str, version: str, vdir: str, data: str,
                   variants: dict[str, str], env: Environment, compress_image: str, engine_image: str,
                   compress_steps: tuple[str, ...]) -> HardwareSteps:
    """Export, build and benchmark steps of one model version (none without a Compression)."""
    out = HardwareSteps()
    if compression is None:
        return out
    spec = compression.spec
    target = spec.hardware_target
    export = spec.export
    measured = dict(variants)
    exported = spec.exported_variants()
    if export is not None:
        for source in export.variants:
            folder = export_dir(vdir, source)
            after = ("prepare-data",) + ((f"compress-{source}",) if source != "base" else ("evaluate",))
            int8 = export.int8 if export_variant(source, "onnx-int8") in exported else None
            bound = export.int8.max_accuracy_drop if export.int8.max_accuracy_drop is not None else spec.max_accuracy_drop
            out.steps.append((f"export-{source}"[:63], "export", ExportConfig(
                model=model, source=source, model_dir=variants[source], data=data, hardware_target=target,
                opset=export.opset, max_abs_diff=export.max_abs_diff, int8=int8, max_accuracy_drop=bound,
                output=folder), compress_image, after))
            measured.update({name: f"{folder}/{kind}" for name, (of, kind) in exported.items() if of == source})
            if target in TENSORRT_TARGETS:
                engine = f"{folder}/tensorrt"
                out.steps.append((f"build-engine-{source}"[:63], "build-engine", EngineConfig(
                    model=model, source=source, onnx_dir=f"{folder}/onnx", hardware_target=target,
                    tensorrt=export.tensorrt, required=env.spec.target == "kubernetes", output=engine),
                    engine_image, (f"export-{source}"[:63],)))
                out.artifacts[f"{source}-tensorrt"] = engine
    out.variants = {k: v for k, v in measured.items() if k not in variants}
    exports = tuple(n for n, kind, *_ in out.steps if kind == "export")
    out.benchmark = f"{vdir}/benchmark"
    out.steps.append(("benchmark", "benchmark", BenchmarkConfig(
        model=model, version=version, variants=measured, data=data, hardware_target=target,
        settings=spec.benchmark or Benchmark(), output=out.benchmark), compress_image,
        ("evaluate", "prepare-data", *compress_steps, *exports)))
    return out


def placement(kind: str, config: dict[str, Any]) -> dict[str, Any]:
    """Scheduling of a hardware step on a cluster: `nodeSelector`, `tolerations` and the
    container's extra `resources` (merged into the template by the renderer). A TensorRT engine
    is built on one GPU of the target's kind; the benchmark of an ARM target runs on an arm64 node
    with the CPUs its threads use."""
    target = config.get("hardwareTarget")
    selector: dict[str, str] = {}
    if target in ("arm64", "jetson-orin"):
        selector["kubernetes.io/arch"] = "arm64"
    if kind == "build-engine":
        return {"nodeSelector": selector, "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                "resources": {"requests": {GPU_RESOURCE: "1"}, "limits": {GPU_RESOURCE: "1"}}}
    if kind == "benchmark":
        threads = str((config.get("settings") or {}).get("threads", 1))
        return {"nodeSelector": selector, "resources": {"requests": {"cpu": threads}}}
    return {}


def apply_placement(template: dict[str, Any], kind: str, config: dict[str, Any]) -> None:
    """Merge `placement` into a rendered template whose container is set."""
    extra = placement(kind, config)
    if not extra:
        return
    if extra.get("nodeSelector"):
        template["nodeSelector"] = dict(sorted(extra["nodeSelector"].items()))
    if extra.get("tolerations"):
        template["tolerations"] = extra["tolerations"]
    resources = dict(template["container"]["resources"])  # a copy: templates share their resources dicts
    for part, values in extra["resources"].items():
        resources[part] = {**resources.get(part, {}), **values}
    template["container"] = {**template["container"], "resources": resources}


def export_reasons(steps: dict[str, dict[str, Any]]) -> list[str]:
    """Plan lines naming which export each target gets (from a Workflow's step configs), after
    the trust lines (privacy budget, robustness, explanations: renderers/trust.py)."""
    from renderers.trust import trust_reasons

    lines = trust_reasons(steps)
    for name, step in steps.items():
        config = step.get("config") or {}
        if config.get("step") == "export":
            target = config.get("hardwareTarget")
            what = f"export `{config.get('source')}` → ONNX (opset {config.get('opset')}, verified against PyTorch, " \
                   f"max |Δp| ≤ {config.get('maxAbsDiff'):g})"
            if config.get("int8"):
                what += f" → ONNX Runtime static INT8 for {target}"
            lines.append(what)
        elif config.get("step") == "build-engine":
            trt = config.get("tensorrt") or {}
            line = f"{name}: TensorRT engine ({trt.get('precision')}) for {config.get('hardwareTarget')}"
            lines.append(line + (" on a GPU node" if config.get("required") else
                                 " — cannot run on the local target (no TensorRT/GPU here): rendered for the cluster, recorded as not built"))
    return lines
