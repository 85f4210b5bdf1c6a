"""``python -m runtimes export``: one float variant → ONNX, verified, and (CPU/ARM targets) INT8.

1. **Export** with ``torch.onnx.export`` (the ``torch.export``-based exporter, a dynamic batch
   dimension, the spec's opset) to ``output/onnx/model.onnx``.
2. **Verify** it under ONNX Runtime (CPU) against the PyTorch model on the whole held-out (test)
   split: the largest difference of any class probability (``maxAbsDiff``, the spec's bound),
   of any logit, the accuracy of both and how often their predictions agree. A graph outside the
   bound is rejected (``report.json`` says why, ``onnx/rejected.json`` records the verdict): an
   export that computes something else must never be registered.
3. **Quantize** (when the config carries ``int8``: the ``x86-*`` and ``arm64`` targets) with ONNX
   Runtime's static quantization: ``quant_pre_process`` (shape inference and graph optimisation),
   then ``quantize_static`` in the QDQ format with per-channel INT8 weights, activation ranges
   calibrated (MinMax) on ``calibrationSamples`` training rows. Activations are signed INT8
   (S8S8, ONNX Runtime's recommended default for QDQ); on ``x86-avx2``, which has no VNNI,
   weights use 7 bits (``reduce_range``) so that the u8×s8 multiply-add (VPMADDUBSW) cannot
   saturate. The INT8 graph is measured on the same split; losing more accuracy than its bound
   against the PyTorch source rejects it (``onnx-int8/rejected.json``; the fp32 graph stays).

Each result is a bundle (``model.json`` of kind ``onnx`` / ``onnx-int8`` naming ``model.onnx``,
with the source's task, classes and feature transform), so the benchmark and the registry treat
it like any other variant. ``report.json`` holds the verification figures of both.

A rejection is the step's verdict, not its failure (:mod:`runtimes.verdicts`): it ends 0, and the
benchmark and register steps go on with the version's other variants. A source variant its
compress step rejected is not exported: both graphs are recorded as rejected with its reason.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtimes._step import in_workspace, parse_config, run_step, write_json
from runtimes.errors import StepFailed
from runtimes.verdicts import reject, verdict
from specs.compression import export_variant
from specs.stepconfig import ExportConfig

if TYPE_CHECKING:  # runtimes.learn imports torch when imported; this module only when it runs
    from runtimes.learn import Rows

log = logging.getLogger("forge.export")
INPUT, OUTPUT = "input", "logits"
#: Largest batch the calibration reader feeds at once.
CALIBRATION_BATCH = 32


def onnx_session(path: Path, threads: int = 1) -> Any:
    """An ONNX Runtime CPU session (``threads`` intra-op threads, sequential execution)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def onnx_callable(session: Any) -> Callable[[Any], Any]:
    """The session as a torch-in, torch-out function (what `runtimes.learn.measure` calls)."""
    import numpy as np
    import torch

    name = session.get_inputs()[0].name

    def run(x: Any) -> Any:
        array = x.numpy() if hasattr(x, "numpy") else np.asarray(x)
        return torch.from_numpy(session.run(None, {name: array})[0])

    return run


def export_onnx(model: Any, example: Any, path: Path, opset: int) -> None:
    """``torch.onnx.export`` with a dynamic batch dimension (the exporter's own optimiser on)."""
    import warnings

    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    for noisy in ("torch.onnx", "onnxscript", "onnx_ir"):  # pass-by-pass INFO lines, torchvision notes
        logging.getLogger(noisy).setLevel(logging.ERROR)
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(model, (example,), dynamo=True, opset_version=opset, input_names=[INPUT],
                                        output_names=[OUTPUT], dynamic_shapes=({0: batch},), verbose=False)
        except Exception as exc:  # noqa: BLE001 - the exporter raises many types; the message is what helps
            raise StepFailed(f"torch.onnx.export failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    if program is None:
        raise StepFailed("torch.onnx.export returned no program")
    program.save(str(path))


def compare(reference: Any, candidate: Any, y: Any, task: str) -> dict[str, Any]:
    """Differences between two models' outputs on the same rows."""
    import torch

    out: dict[str, Any] = {"rows": int(len(y)), "maxAbsDiffLogits": float((reference - candidate).abs().max())}
    if task in ("classification", "lm"):
        p, q = torch.softmax(reference.float(), -1), torch.softmax(candidate.float(), -1)
        out["maxAbsDiff"] = float((p - q).abs().max())
        a, b = reference.argmax(-1), candidate.argmax(-1)
        out["accuracyReference"] = float((a == y).float().mean())
        out["accuracy"] = float((b == y).float().mean())
        out["agreement"] = float((a == b).float().mean())
    else:
        out["maxAbsDiff"] = out["maxAbsDiffLogits"]
    return out


def merge_compared(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two :func:`compare` results of disjoint rows as one: the largest differences stay the
    largest, the rates are weighted by rows."""
    rows = a["rows"] + b["rows"]
    return {"rows": rows, **{k: max(v, b[k]) if k.startswith("maxAbsDiff") else (v * a["rows"] + b[k] * b["rows"]) / rows
                              for k, v in a.items() if k != "rows"}}


def verify(model: Any, candidate: Callable[[Any], Any], test: Rows, task: str, reference: Any = None) -> dict[str, Any]:
    """:func:`compare` of ``candidate`` with the PyTorch ``model`` on the test split: in memory at
    once, against ``reference`` (the model's outputs on it, computed once for both graphs); a
    sharded split a batch at a time, the model's outputs computed per batch and the figures merged,
    so that neither model's outputs on the whole split are held."""
    from runtimes.learn import predict

    if not test.streamed:
        x, y = test.tensors()
        return compare(reference, predict(candidate, x), y, task)
    return functools.reduce(merge_compared, (compare(predict(model, xb), predict(candidate, xb), yb, task)
                                             for xb, yb in test.batches()))


def _bundle(folder: Path, info: dict[str, Any], kind: str, extra: dict[str, Any]) -> dict[str, Any]:
    path = folder / "model.onnx"
    bundle = {**{k: v for k, v in info.items() if k not in ("file", "sizeBytes", "kind")}, **extra,
              "kind": kind, "file": path.name, "sizeBytes": path.stat().st_size, "runtime": "onnxruntime"}
    (folder / "model.json").write_text(json.dumps(bundle, indent=2, sort_keys=True) + "\n")
    return bundle


def quantize_int8(fp32: Path, dst: Path, calibration: Any, target: str, workdir: Path) -> dict[str, Any]:
    """ONNX Runtime static INT8 (QDQ, per-channel weights, MinMax calibration); the scheme it used."""
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = [calibration[i : i + CALIBRATION_BATCH] for i in range(0, len(calibration), CALIBRATION_BATCH)]

        def get_next(self) -> dict[str, Any] | None:
            return {INPUT: self.batches.pop(0)} if self.batches else None

    pre = workdir / "preprocessed.onnx"
    quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)
    reduce_range = target == "x86-avx2"
    dst.parent.mkdir(parents=True, exist_ok=True)
    quantize_static(str(pre), str(dst), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, per_channel=True, reduce_range=reduce_range,
                    calibrate_method=CalibrationMethod.MinMax)
    pre.unlink(missing_ok=True)
    return {"backend": "onnxruntime", "format": "QDQ", "activations": "int8 (per-tensor, static)",
            "weights": f"int8 (per-channel{', 7-bit range' if reduce_range else ''})", "calibration": "MinMax",
            "calibrationSamples": int(len(calibration)), "reduceRange": reduce_range}


@dataclass
class _Inputs:
    """The float model an export is made from, and the data it is made and checked with: the
    test split to verify on, the training split to draw INT8 calibration rows from (with the
    model's own seed); a sharded data set's both streamed."""

    model: Any
    info: dict[str, Any]
    seed: int
    train: Rows
    test: Rows


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(ExportConfig, argv, "python -m runtimes export")
    out = in_workspace(config.output)
    if out.exists():
        shutil.rmtree(out)  # a retry starts clean
    source = verdict(config.source, in_workspace(config.model_dir))
    if source is not None:
        reason = f"its source variant {config.source} was rejected: {source.reason}"
        _reject_graphs(config, out, reason, source.report)
        write_json(out / "report.json", {"model": config.model, "source": config.source, "reason": reason})
        log.warning("not exported: %s", reason)
        return 0
    import onnxruntime  # noqa: F401 - loaded before torch, in the order this step always loaded them
    import torch  # noqa: F401

    inputs = _load(config)
    report, reference = _onnx_fp32(config, inputs, out)
    if not report["onnx"]["accepted"]:
        _reject_graphs(config, out, report["reason"], f"{config.output}/report.json")
        write_json(out / "report.json", report)
        log.warning("export of %s rejected: %s (see %s/report.json)", config.source, report["reason"], config.output)
        return 0
    if config.int8 is not None:
        _onnx_int8(config, inputs, reference, out, report)
    write_json(out / "report.json", report)
    write_json(out / "metrics.json", {"source": config.source, "onnxMaxAbsDiff": report["onnx"]["verification"]["maxAbsDiff"],
                                      "onnxAccuracy": report["onnx"]["accuracy"],
                                      **({"onnxInt8Accuracy": report["onnxInt8"]["accuracy"],
                                          "onnxInt8SizeRatio": report["onnxInt8"]["sizeRatio"]} if "onnxInt8" in report else {})})
    return 0


def _graphs(config: ExportConfig) -> tuple[str, ...]:
    """The graphs this export builds (folder names under its output, and the export kinds)."""
    return ("onnx", "onnx-int8") if config.int8 is not None else ("onnx",)


def _reject_graphs(config: ExportConfig, out: Path, reason: str, report: str | None) -> None:
    """Every graph of this export rejected for ``reason``: the fp32 graph failed its check, or the
    source variant it would be made from was itself rejected (the INT8 graph is made from the fp32
    one, so it goes with it)."""
    for graph in _graphs(config):
        reject(out / graph, export_variant(config.source, graph), reason, report)


def _load(config: ExportConfig) -> _Inputs:
    """The float variant and the splits, seeded with the model's seed; refused for a bundle that
    is not float weights (a quantized variant has no faithful ONNX graph to export) and for an
    empty test split (nothing to verify the export on)."""
    from runtimes.data import load_prepared
    from runtimes.learn import seed_everything, split_rows
    from runtimes.models import load_bundle

    model, info = load_bundle(in_workspace(config.model_dir))
    if info["kind"] != "state_dict":
        raise StepFailed(f"export: variant {config.source} is a {info['kind']} bundle; export a float variant")
    seed = int(info.get("seed", 0))
    seed_everything(seed)
    data = load_prepared(in_workspace(config.data), ("train", "test"))
    ctx = info["architecture"].get("contextLength")
    train, test = split_rows(data, "train", ctx), split_rows(data, "test", ctx)
    if len(test) == 0:
        raise StepFailed("export: the test split is empty; nothing to verify the export on")
    return _Inputs(model, info, seed, train, test)


def _onnx_fp32(config: ExportConfig, inputs: _Inputs, out: Path) -> tuple[dict[str, Any], Any]:
    """Export the fp32 graph into ``out/onnx`` and verify it against PyTorch on the test split;
    returns the report so far and PyTorch's outputs (the INT8 graph is checked against them too).
    a graph that differs by more than ``maxAbsDiff`` comes back with ``onnx.accepted`` false and
    the ``reason`` (the caller records the verdict)."""
    import onnxruntime
    import torch

    from runtimes.learn import measure_rows, predict

    model, info, test, task = inputs.model, inputs.info, inputs.test, inputs.info["task"]
    fp32_dir = out / "onnx"
    log.info("exporting %s (%s) to ONNX opset %d", config.source, info["architecture"].get("type"), config.opset)
    export_onnx(model, test.head(2)[0], fp32_dir / "model.onnx", config.opset)
    reference = None if test.streamed else predict(model, test.tensors()[0])
    session = onnx_session(fp32_dir / "model.onnx")
    fp32_check = verify(model, onnx_callable(session), test, task, reference)
    fp32_check["tolerance"] = config.max_abs_diff
    fp32_check["passed"] = fp32_check["maxAbsDiff"] <= config.max_abs_diff
    versions = {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__}
    report: dict[str, Any] = {"model": config.model, "source": config.source, "hardwareTarget": config.hardware_target,
                              "opset": config.opset, "versions": versions, "onnx": {"verification": fp32_check}}
    log.info("ONNX vs PyTorch on %d test rows: max |Δp| %.2e (bound %g), max |Δlogit| %.2e, agreement %.4f",
             fp32_check["rows"], fp32_check["maxAbsDiff"], config.max_abs_diff, fp32_check["maxAbsDiffLogits"],
             fp32_check.get("agreement", float("nan")))
    if not fp32_check["passed"]:
        report["onnx"]["accepted"] = False
        report["reason"] = (f"the ONNX graph differs from PyTorch by {fp32_check['maxAbsDiff']:.3g} "
                            f"(a class probability), more than the allowed {config.max_abs_diff:g}")
        return report, reference
    metrics = measure_rows(onnx_callable(session), test, task)
    bundle = _bundle(fp32_dir, info, "onnx", {"variant": export_variant(config.source, "onnx"), "source": config.source,
                                              "opset": config.opset, "hardwareTarget": config.hardware_target})
    report["onnx"].update({"accepted": True, "sizeBytes": bundle["sizeBytes"], "accuracy": metrics.get("accuracy")})
    write_json(fp32_dir / "metrics.json", {"variant": bundle["variant"], **metrics})
    write_json(fp32_dir / "report.json", {"verification": fp32_check, "after": {"accuracy": metrics.get("accuracy"), "sizeBytes": bundle["sizeBytes"]}})
    return report, reference


def _onnx_int8(config: ExportConfig, inputs: _Inputs, reference: Any, out: Path, report: dict[str, Any]) -> None:
    """ONNX Runtime static INT8 of the verified fp32 graph into ``out/onnx-int8``, calibrated on
    seeded training rows and checked against PyTorch's outputs (``reference``); recorded in
    ``report["onnxInt8"]``. Losing more accuracy than ``maxAccuracyDrop`` rejects it: the graph
    removed, ``onnx-int8/rejected.json`` and the report's ``onnxInt8.reason`` say why."""
    import numpy as np

    from runtimes.learn import measure_rows

    info, test, task = inputs.info, inputs.test, inputs.info["task"]
    assert config.int8 is not None
    fp32_dir, int8_dir = out / "onnx", out / "onnx-int8"
    fp32_size = report["onnx"]["sizeBytes"]
    rows = inputs.train.sample(config.int8.calibration_samples, inputs.seed)  # a sharded split's read bounded
    calibration = np.ascontiguousarray(rows.numpy())
    scheme = quantize_int8(fp32_dir / "model.onnx", int8_dir / "model.onnx", calibration, config.hardware_target, out)
    int8_session = onnx_session(int8_dir / "model.onnx")
    check = verify(inputs.model, onnx_callable(int8_session), test, task, reference)
    drop = round(100.0 * ((check.get("accuracyReference") or 0.0) - (check.get("accuracy") or 0.0)), 4)
    accepted = drop <= config.max_accuracy_drop
    size = (int8_dir / "model.onnx").stat().st_size
    report["onnxInt8"] = {"verification": check, "quantization": scheme, "sizeBytes": size,
                          "sizeRatio": size / fp32_size, "accuracy": check.get("accuracy"),
                          "accuracyDropPt": drop, "maxAccuracyDrop": config.max_accuracy_drop, "accepted": accepted}
    log.info("ONNX INT8: %.1f%% of the fp32 graph's size, accuracy %.4f → %.4f (drop %.2f pt, bound %g)",
             100 * size / fp32_size, check.get("accuracyReference") or 0, check.get("accuracy") or 0,
             drop, config.max_accuracy_drop)
    if not accepted:
        reason = f"ONNX INT8 lost {drop:.2f} accuracy points, more than the allowed {config.max_accuracy_drop:g}"
        report["onnxInt8"]["reason"] = reason
        reject(int8_dir, export_variant(config.source, "onnx-int8"), reason, f"{config.output}/report.json")
        log.warning("ONNX INT8 of %s rejected: %s; the fp32 graph stays", config.source, reason)
        return
    int8_bundle = _bundle(int8_dir, info, "onnx-int8", {"variant": export_variant(config.source, "onnx-int8"), "source": config.source,
                                                        "opset": config.opset, "hardwareTarget": config.hardware_target,
                                                        "quantization": scheme})
    int8_metrics = measure_rows(onnx_callable(int8_session), test, task)
    write_json(int8_dir / "metrics.json", {"variant": int8_bundle["variant"], "accuracyDropPt": drop, **int8_metrics})
    write_json(int8_dir / "report.json", {"verification": check, "quantization": scheme, "accuracyDropPt": drop,
                                          "after": {"accuracy": check.get("accuracy"), "sizeBytes": size}})


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
