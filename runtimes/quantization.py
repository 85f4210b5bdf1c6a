"""INT8 quantization: Intel Neural Compressor where it yields a real INT8 model, else torch.ao.

Which path runs (``FORGE_QUANT_BACKEND``: ``auto`` (default), ``inc`` or ``torch-ao``):

- **INC with IPEX** (``auto`` when ``intel_extension_for_pytorch`` imports): INC 3.x
  ``StaticQuantConfig`` → ``prepare`` → calibrate → ``convert``; IPEX supplies the INT8 kernels.
- **INC PT2E** (``inc``): INC's ``export`` → ``prepare``/``convert`` with the X86 Inductor
  quantizer, saved as a ``torch.export`` program (bundle kind ``pt2e``).
- **torch.ao eager** (the fallback): fused modules, ``x86``/``qnnpack`` observers, calibrate (PTQ)
  or fake-quantized training (QAT), ``convert`` to real INT8 modules (fbgemm/onednn kernels).
  Sequence models (gpt, custom) get dynamic INT8 (``quantize_dynamic`` of every Linear).

Why the fallback is the default here, measured on this machine (torch 2.15, INC 3.10, no IPEX
build exists for torch 2.15): INC's PT2E path calibrates fine and keeps accuracy, but what it
produces is a quantize/dequantize *reference* graph that keeps fp32 weights; in eager mode it ran
the digits MLP ~30× slower than fp32 and its saved program was ~3× the fp32 file; even after
``torch.compile`` (23 s of compiling) it stayed slower. It only pays off when lowered by
Inductor on a serving stack built for that. So without IPEX the INC path is broken *for an
INT8 deployment on this CPU*, and the step says so in its log and in ``report.json``
(``backend``, ``fallbackReason``) — never silently.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from runtimes.errors import StepFailed

log = logging.getLogger("forge.quantize")

INC_FALLBACK_REASON = (
    "Intel Neural Compressor's CPU static INT8 path needs intel_extension_for_pytorch, which has no "
    "build for this torch; its PT2E path yields a quantize/dequantize reference graph with fp32 "
    "weights (larger and slower than fp32 without Inductor lowering) — using torch.ao eager INT8"
)


def engine_for(target: str) -> str:
    if target in ("x86-avx2", "x86-avx512-vnni"):
        return "x86" if "x86" in torch.backends.quantized.supported_engines else "fbgemm"
    if target in ("arm64", "jetson-orin"):
        return "qnnpack"
    raise StepFailed(f"INT8 for hardware target {target!r} needs TensorRT, which this runtime does not ship")


def choose_backend() -> tuple[str, str | None]:
    """(backend, reason for not using INC or None)."""
    wanted = os.environ.get("FORGE_QUANT_BACKEND", "auto")
    if wanted not in ("auto", "inc", "torch-ao"):
        raise StepFailed(f"FORGE_QUANT_BACKEND={wanted!r}; expected auto, inc or torch-ao")
    if wanted == "inc":
        return "inc-pt2e", None
    if wanted == "torch-ao":
        return "torch-ao", "torch.ao asked for by FORGE_QUANT_BACKEND"
    if importlib.util.find_spec("intel_extension_for_pytorch") is not None:
        return "inc-ipex", None
    return "torch-ao", INC_FALLBACK_REASON


def _qconfig(engine: str, qat: bool) -> Any:
    """The engine's default activation observer; weights per-tensor symmetric INT8.

    Per-tensor weights: per-channel scales are stored as float64 plus int64 zero points, which
    on small models (the digits MLP) costs ~4 points of the size budget for no accuracy gain."""
    from torch.ao import quantization as tq

    base = tq.get_default_qat_qconfig(engine) if qat else tq.get_default_qconfig(engine)
    weight = tq.default_fused_wt_fake_quant if qat else tq.default_weight_observer
    return tq.QConfig(activation=base.activation, weight=weight)


def _fuse_groups(model: nn.Module, arch: dict[str, Any]) -> list[list[str]]:
    if arch["type"] == "mlp":
        return [[f"blocks.{i}.0", f"blocks.{i}.1"] for i in range(len(model.blocks))]
    if arch["type"] == "cnn":
        return [[f"blocks.{i}.0", f"blocks.{i}.1", f"blocks.{i}.2"] for i in range(len(model.blocks))]
    return []


def quantize(
    model: nn.Module,
    arch: dict[str, Any],
    mode: str,
    target: str,
    calibration: torch.Tensor,
    train: Callable[[nn.Module], nn.Module] | None = None,
) -> tuple[nn.Module, str, dict[str, Any]]:
    """Return (quantized module, bundle kind, report details)."""
    backend, reason = choose_backend()
    if reason and backend == "torch-ao":
        log.warning("quantize: %s", reason)
    details: dict[str, Any] = {"backend": backend, "fallbackReason": reason, "mode": mode}
    model = copy.deepcopy(model).eval()
    if backend == "inc-pt2e":
        return _inc_pt2e(model, calibration, mode, details)
    if backend == "inc-ipex":
        return _inc_ipex(model, calibration, mode, details)
    engine = engine_for(target)
    torch.backends.quantized.engine = engine
    details["engine"] = engine
    from torch.ao import quantization as tq

    if arch["type"] not in ("mlp", "cnn"):
        details["scheme"] = "dynamic (int8 weights, activations quantized per batch at run time)"
        if mode == "qat":
            log.warning("quantize: QAT of %s models is not supported by torch.ao eager; using dynamic INT8", arch["type"])
            details["note"] = "qat → dynamic: sequence models are quantized dynamically"
        details["recipe"] = "dynamic"
        return tq.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8), "int8", details

    details["scheme"] = "static (int8 weights and activations)"
    wrapped = tq.QuantWrapper(model)
    groups = _fuse_groups(model, arch)
    if mode == "qat":
        wrapped.train()
        fused = tq.fuse_modules_qat(wrapped, [[f"module.{n}" for n in g] for g in groups]) if groups else wrapped
        fused.qconfig = _qconfig(engine, qat=True)
        prepared = tq.prepare_qat(fused)
        if train is None:
            raise StepFailed("QAT needs training data")
        prepared = train(prepared)
        prepared.eval()
    else:
        wrapped.eval()
        fused = tq.fuse_modules(wrapped, [[f"module.{n}" for n in g] for g in groups]) if groups else wrapped
        fused.qconfig = _qconfig(engine, qat=False)
        prepared = tq.prepare(fused)
        with torch.no_grad():
            for i in range(0, len(calibration), 64):
                prepared(calibration[i : i + 64])
    converted = tq.convert(prepared.eval())
    details["recipe"] = "static"
    return converted, "int8", details


def int8_skeleton(model: nn.Module, arch: dict[str, Any], details: dict[str, Any]) -> nn.Module:
    """The quantized module structure of a torch.ao recipe, to load an INT8 state dict into.

    INT8 bundles store only tensors (``weights_only`` loading, and ~4x smaller than fp32 even for
    small models, where a pickled module's overhead would dominate)."""
    from torch.ao import quantization as tq

    engine = details.get("engine") or "x86"
    if engine in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = engine
    model.eval()
    if details.get("recipe") == "dynamic":
        return tq.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    wrapped = tq.QuantWrapper(model).eval()
    groups = _fuse_groups(model, arch)
    fused = tq.fuse_modules(wrapped, [[f"module.{n}" for n in g] for g in groups]) if groups else wrapped
    fused.qconfig = _qconfig(engine, qat=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # observers warn when converted without calibration data
        return tq.convert(tq.prepare(fused).eval())


def _inc_calibrate(calibration: torch.Tensor) -> Callable[[nn.Module], None]:
    def run_fn(m: nn.Module) -> None:
        with torch.no_grad():
            for i in range(0, len(calibration), 64):
                m(calibration[i : i + 64])

    return run_fn


def _inc_pt2e(model: nn.Module, calibration: torch.Tensor, mode: str, details: dict[str, Any]):
    from neural_compressor.torch.export import export
    from neural_compressor.torch.quantization import StaticQuantConfig, convert, prepare

    if mode == "qat":
        raise StepFailed("INC's PT2E path has no QAT here; use FORGE_QUANT_BACKEND=auto or torch-ao for qat")
    batch = torch.export.Dim("batch")
    example = (calibration[:8],)
    exported = export(model, example, dynamic_shapes=({0: batch},))
    prepared = prepare(exported, StaticQuantConfig())
    _inc_calibrate(calibration)(prepared)
    converted = convert(prepared)
    program = torch.export.export(converted, example, dynamic_shapes=({0: batch},))
    details["scheme"] = "static PT2E (X86InductorQuantizer), q/dq graph"
    return program, "pt2e", details


def _inc_ipex(model: nn.Module, calibration: torch.Tensor, mode: str, details: dict[str, Any]):  # pragma: no cover - needs IPEX
    from neural_compressor.torch.quantization import StaticQuantConfig, convert, prepare

    if mode == "qat":
        raise StepFailed("INC's IPEX path has no QAT; use FORGE_QUANT_BACKEND=torch-ao for qat")
    prepared = prepare(model, StaticQuantConfig(), example_inputs=calibration[:8])
    _inc_calibrate(calibration)(prepared)
    details["scheme"] = "static (INC + IPEX)"
    return convert(prepared), "pickle", details
