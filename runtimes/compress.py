"""``python -m runtimes compress``: build one compressed variant of an evaluated model.

Stages run in order on the base model: ``prune`` (structured L1, then a short fine-tune),
``distill`` (from the teacher Model's trained weights) and ``quantize`` (INT8, PTQ or QAT; see
``runtimes.quantization`` for which backend runs and why). The variant is measured before and
after on the held-out test split — size of the weights file, parameters, accuracy, CPU latency at
batch 1, the lowest median of alternating rounds of base and variant — after loading it back through the same loader the servers use.

Writes ``output/report.json`` always; when accepted also the bundle (``model.json`` +
``model.pt``/``model.pt2``) and ``metrics.json``. A variant that loses more accuracy than its bound
(the variant's ``maxAccuracyDrop``, else the Compression's) is rejected: no model is written,
``report.json`` says why (``accepted: false``, ``reason``) and the step exits 4.
"""

from __future__ import annotations

import copy
import logging
import sys
from typing import Any

from runtimes._step import in_workspace, parse_config, run_step, write_json
from runtimes.errors import StepFailed, VariantRejected
from specs.compression import Distill, Prune, Quantize
from specs.stepconfig import CompressConfig

log = logging.getLogger("forge.compress")


def _figures(model: Any, folder_size: int, params: int | None, x: Any, y: Any, task: str) -> dict[str, Any]:
    from runtimes.learn import measure

    m = measure(model, x, y, task)
    return {"sizeBytes": folder_size, "parameters": params, "accuracy": m.get("accuracy"), "loss": m.get("loss")}


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(CompressConfig, argv, "python -m runtimes compress")
    import torch

    from runtimes import distillation, pruning, quantization
    from runtimes.data import load_prepared
    from runtimes.learn import compare_latency, fit, loss_fn, seed_everything, split_tensors
    from runtimes.models import count_parameters, file_size, load_bundle, read_info, save_bundle

    base_dir = in_workspace(config.model_dir)
    base, info = load_bundle(base_dir)
    if info["kind"] != "state_dict":
        raise StepFailed(f"{config.model_dir} is already compressed ({info['kind']}); compress the trained base model")
    task = info["task"]
    seed = int(info.get("seed", 0))
    seed_everything(seed)
    data = load_prepared(in_workspace(config.data), ("train", "test"))
    ctx = info["architecture"].get("contextLength")
    xtr, ytr = split_tensors(data.split("train"), data.meta, ctx)
    xte, yte = split_tensors(data.split("test"), data.meta, ctx)
    hard = loss_fn(task)
    lr = float(info.get("learningRate") or 1e-3)
    batch = 64
    torch.set_num_threads(max(1, torch.get_num_threads()))

    before = _figures(base, file_size(base_dir), count_parameters(base), xte, yte, task)
    log.info("base %s: %s", config.model, before)
    model, arch = copy.deepcopy(base), dict(info["architecture"])
    stages: list[dict[str, Any]] = []
    kind = "state_dict"
    qdetails: dict[str, Any] | None = None
    for stage in config.variant.stages:
        if isinstance(stage, Prune):
            n0 = count_parameters(model)
            model, arch = pruning.prune(model, arch, stage.sparsity)
            n1 = count_parameters(model)
            log.info("prune: %d → %d parameters (%.0f%% fewer); fine-tuning %d epochs", n0, n1, 100 * (1 - n1 / n0), stage.fine_tune_epochs)
            if stage.fine_tune_epochs:
                fit(model, xtr, ytr, stage.fine_tune_epochs, lr * 0.5, batch, seed, lambda o, y, x: hard(o, y), log.info)
            stages.append({"type": "prune", "sparsity": stage.sparsity, "parametersBefore": n0, "parametersAfter": n1, "architecture": arch})
        elif isinstance(stage, Distill):
            folder = config.teachers.get(stage.teacher_ref or "")
            if folder is None:
                raise StepFailed(f"distill: teacher {stage.teacher_ref!r} has no model folder in `teachers`")
            teacher, _ = load_bundle(in_workspace(folder))
            log.info("distill from %s: %d epochs, T=%g, alpha=%g", stage.teacher_ref, stage.epochs, stage.temperature, stage.alpha)
            fit(model, xtr, ytr, stage.epochs, lr * 0.5, batch, seed, distillation.distillation_loss(teacher, stage.temperature, stage.alpha, hard), log.info)
            stages.append({"type": "distill", "teacher": stage.teacher_ref, "epochs": stage.epochs})
        elif isinstance(stage, Quantize):
            calib = xtr[torch.randperm(len(xtr), generator=torch.Generator().manual_seed(seed))[: stage.calibration_samples]]

            def qat_train(m: Any, epochs: int = stage.qat_epochs) -> Any:
                return fit(m, xtr, ytr, epochs, lr * 0.1, batch, seed, lambda o, y, x: hard(o, y), log.info)

            model, kind, qdetails = quantization.quantize(model, arch, stage.mode, config.hardware_target, calib, qat_train)
            log.info("quantize (%s): backend %s, %s", stage.mode, qdetails["backend"], qdetails.get("scheme"))
            stages.append({"type": "quantize", **qdetails})

    out = in_workspace(config.output)
    out.mkdir(parents=True, exist_ok=True)
    new_info = {
        **{k: v for k, v in info.items() if k not in ("file", "sizeBytes", "kind", "format")},
        "architecture": arch,
        "variant": config.variant.name,
        "compression": stages,
        "parameters": count_parameters(model) if kind == "state_dict" else stages_params(stages, info),
        "hardwareTarget": config.hardware_target,
    }
    if qdetails:
        new_info["quantization"] = qdetails
    save_bundle(out, model, new_info, kind=kind)
    loaded, _ = load_bundle(out)  # measured as served: through the one loader
    after = _figures(loaded, file_size(out), new_info["parameters"], xte, yte, task)
    before["latencyMsP50"], after["latencyMsP50"] = compare_latency(base, loaded, xte)
    drop = round(100.0 * ((before["accuracy"] or 0.0) - (after["accuracy"] or 0.0)), 4)
    bound = config.variant.max_accuracy_drop if config.variant.max_accuracy_drop is not None else config.max_accuracy_drop
    accepted = drop <= bound
    report: dict[str, Any] = {
        "model": config.model,
        "variant": config.variant.name,
        "hardwareTarget": config.hardware_target,
        "stages": stages,
        "before": before,
        "after": after,
        "ratios": {
            "size": after["sizeBytes"] / before["sizeBytes"],
            "parameters": (after["parameters"] or 0) / before["parameters"] if before["parameters"] else None,
            "latencySpeedup": before["latencyMsP50"] / after["latencyMsP50"] if after["latencyMsP50"] else None,
        },
        "accuracyDropPt": drop,
        "maxAccuracyDrop": bound,
        "accepted": accepted,
        "reason": None if accepted else f"accuracy dropped {drop:.2f} points, more than the allowed {bound:g}",
    }
    write_json(out / "report.json", report)
    log.info("variant %s: size %.1f%%, accuracy %.4f → %.4f (drop %.2f pt, bound %g)", config.variant.name,
             100 * report["ratios"]["size"], before["accuracy"] or 0, after["accuracy"] or 0, drop, bound)
    if not accepted:
        for name in ("model.json", "model.pt", "model.pt2"):
            (out / name).unlink(missing_ok=True)
        raise VariantRejected(f"variant {config.variant.name} rejected: {report['reason']} (see {config.output}/report.json)")
    write_json(out / "metrics.json", {"variant": config.variant.name, "accuracy": after["accuracy"], "accuracyDropPt": drop, "accepted": True, **{f"{k}Ratio": v for k, v in report["ratios"].items()}})
    _ = read_info(out)
    return 0


def stages_params(stages: list[dict[str, Any]], info: dict[str, Any]) -> int | None:
    """Parameter count of a quantized model: that of the float model it was made from."""
    for stage in reversed(stages):
        if stage["type"] == "prune":
            return stage["parametersAfter"]
    return info.get("parameters")


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
