"""``python -m runtimes compress``: build one compressed variant of an evaluated model.

Stages run in order on the base model: ``prune`` (structured L1, then a short fine-tune),
``distill`` (from the teacher Model's trained weights) and ``quantize`` (INT8, PTQ or QAT; see
``runtimes.quantization`` for which backend runs and why). The variant is measured before and
after on the held-out test split — size of the weights file, parameters, accuracy, CPU latency at
batch 1, the lowest median of alternating rounds of base and variant — after loading it back through the same loader the servers use.

Writes ``output/report.json`` always; when accepted also the bundle (``model.json`` +
``model.pt``/``model.pt2``) and ``metrics.json``. A variant that loses more accuracy than its bound
(the variant's ``maxAccuracyDrop``, else the Compression's) is rejected: no model is kept,
``report.json`` says why (``accepted: false``, ``reason``), ``rejected.json`` records the verdict
(:mod:`runtimes.verdicts`) and the step ends 0 — a verdict, not a failure: the version's other
variants are still benchmarked and registered, and the registry lists this one as rejected.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtimes._step import in_workspace, parse_config, run_step, write_json
from runtimes.errors import StepFailed
from runtimes.verdicts import reject
from specs.compression import Distill, Prune, Quantize
from specs.stepconfig import CompressConfig

if TYPE_CHECKING:  # runtimes.learn imports torch when imported; this module only when it runs
    from runtimes.learn import Rows

log = logging.getLogger("forge.compress")


def _figures(model: Any, folder_size: int, params: int | None, test: Rows, task: str) -> dict[str, Any]:
    """What the report compares before and after: size, parameters, accuracy and loss on ``test``
    (a sharded split streamed a batch at a time)."""
    from runtimes.learn import measure_rows

    m = measure_rows(model, test, task)
    return {"sizeBytes": folder_size, "parameters": params, "accuracy": m.get("accuracy"), "loss": m.get("loss")}


@dataclass
class _Tuning:
    """What the stages' fine-tuning shares: the training split (a sharded one streamed, a shuffle
    block at a time), the base run's learning rate and seed (each stage tunes at a fraction of that
    rate), the batch size and the label loss."""

    train: Rows
    lr: float
    batch: int
    seed: int
    hard: Callable[[Any, Any], Any]

    def label_loss(self, out: Any, y: Any, x: Any) -> Any:
        """The training loss on the labels alone (``fit``'s loss takes the inputs too, for distillation)."""
        return self.hard(out, y)

    def fit(self, model: Any, epochs: int, lr: float, loss: Callable[[Any, Any, Any], Any]) -> Any:
        from runtimes.learn import fit_rows

        return fit_rows(model, self.train, epochs, lr, self.batch, self.seed, loss, log.info)


@dataclass
class _Variant:
    """The variant as the stages leave it: the model, its architecture and bundle kind, what each
    stage did (the report's ``stages``) and the quantization details, if it was quantized."""

    model: Any
    arch: dict[str, Any]
    kind: str = "state_dict"
    stages: list[dict[str, Any]] = field(default_factory=list)
    quantization: dict[str, Any] | None = None


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(CompressConfig, argv, "python -m runtimes compress")
    import torch

    from runtimes.learn import compare_latency
    from runtimes.models import count_parameters, file_size, load_bundle, read_info

    base_dir = in_workspace(config.model_dir)
    base, info = _load_base(config)
    task = info["task"]
    tuning, test = _splits(config, info)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    before = _figures(base, file_size(base_dir), count_parameters(base), test, task)
    log.info("base %s: %s", config.model, before)
    variant = _Variant(copy.deepcopy(base), dict(info["architecture"]))
    for stage in config.variant.stages:
        _apply_stage(config, stage, variant, tuning)

    out = in_workspace(config.output)
    new_info = _save(config, info, variant)
    loaded, _ = load_bundle(out)  # measured as served: through the one loader
    after = _figures(loaded, file_size(out), new_info["parameters"], test, task)
    before["latencyMsP50"], after["latencyMsP50"] = compare_latency(base, loaded, test.head(1)[0])  # times one row
    report = _report(config, variant.stages, before, after)
    write_json(out / "report.json", report)
    log.info("variant %s: size %.1f%%, accuracy %.4f → %.4f (drop %.2f pt, bound %g)", config.variant.name,
             100 * report["ratios"]["size"], before["accuracy"] or 0, after["accuracy"] or 0, report["accuracyDropPt"],
             report["maxAccuracyDrop"])
    if not report["accepted"]:
        reject(out, config.variant.name, report["reason"], f"{config.output.rstrip('/')}/report.json")
        log.warning("variant %s rejected: %s (see %s/report.json); the other variants go on", config.variant.name,
                    report["reason"], config.output)
        return 0
    write_json(out / "metrics.json", {"variant": config.variant.name, "accuracy": after["accuracy"], "accuracyDropPt": report["accuracyDropPt"],
                                      "accepted": True, **{f"{k}Ratio": v for k, v in report["ratios"].items()}})
    _ = read_info(out)
    return 0


def _load_base(config: CompressConfig) -> tuple[Any, dict[str, Any]]:
    """The trained base model and its ``model.json``: a variant is always made from the float
    model, never from another variant (compressing twice would compound the accuracy loss
    unmeasured)."""
    from runtimes.models import load_bundle

    base, info = load_bundle(in_workspace(config.model_dir))
    if info["kind"] != "state_dict":
        raise StepFailed(f"{config.model_dir} is already compressed ({info['kind']}); compress the trained base model")
    return base, info


def _splits(config: CompressConfig, info: dict[str, Any]) -> tuple[_Tuning, Rows]:
    """Seeded with the base run's seed, the training split for the stages' fine-tuning and the
    held-out test split the variant is judged on (a sharded data set's both streamed)."""
    from runtimes.data import load_prepared
    from runtimes.learn import loss_fn, seed_everything, split_rows

    seed = int(info.get("seed", 0))
    seed_everything(seed)
    data = load_prepared(in_workspace(config.data), ("train", "test"))
    ctx = info["architecture"].get("contextLength")
    tuning = _Tuning(split_rows(data, "train", ctx), lr=float(info.get("learningRate") or 1e-3), batch=64, seed=seed,
                     hard=loss_fn(info["task"]))
    return tuning, split_rows(data, "test", ctx)


def _apply_stage(config: CompressConfig, stage: Prune | Distill | Quantize, variant: _Variant, tuning: _Tuning) -> None:
    """Run one stage on ``variant`` (in place), recording what it did in ``variant.stages``."""
    from runtimes import pruning
    from runtimes.models import count_parameters

    if isinstance(stage, Prune):
        n0 = count_parameters(variant.model)
        variant.model, variant.arch = pruning.prune(variant.model, variant.arch, stage.sparsity)
        n1 = count_parameters(variant.model)
        log.info("prune: %d → %d parameters (%.0f%% fewer); fine-tuning %d epochs", n0, n1, 100 * (1 - n1 / n0), stage.fine_tune_epochs)
        if stage.fine_tune_epochs:
            tuning.fit(variant.model, stage.fine_tune_epochs, tuning.lr * 0.5, tuning.label_loss)
        variant.stages.append({"type": "prune", "sparsity": stage.sparsity, "parametersBefore": n0, "parametersAfter": n1,
                               "architecture": variant.arch})
    elif isinstance(stage, Distill):
        _distill(config, stage, variant, tuning)
    elif isinstance(stage, Quantize):
        _quantize(config, stage, variant, tuning)


def _distill(config: CompressConfig, stage: Distill, variant: _Variant, tuning: _Tuning) -> None:
    """Train the variant towards the teacher's softened outputs (and the labels)."""
    from runtimes import distillation
    from runtimes.models import load_bundle

    folder = config.teachers.get(stage.teacher_ref or "")
    if folder is None:
        raise StepFailed(f"distill: teacher {stage.teacher_ref!r} has no model folder in `teachers`")
    teacher, _ = load_bundle(in_workspace(folder))
    log.info("distill from %s: %d epochs, T=%g, alpha=%g", stage.teacher_ref, stage.epochs, stage.temperature, stage.alpha)
    tuning.fit(variant.model, stage.epochs, tuning.lr * 0.5,
               distillation.distillation_loss(teacher, stage.temperature, stage.alpha, tuning.hard))
    variant.stages.append({"type": "distill", "teacher": stage.teacher_ref, "epochs": stage.epochs})


def _quantize(config: CompressConfig, stage: Quantize, variant: _Variant, tuning: _Tuning) -> None:
    """INT8: calibrated on a sample of the training split (seeded; a sharded split's read bounded,
    see Rows.sample); QAT fine-tunes at a tenth of the base learning rate. The backend (and so the
    bundle kind) is runtimes.quantization's choice."""
    from runtimes import quantization

    calib = tuning.train.sample(stage.calibration_samples, tuning.seed)

    def qat_train(m: Any, epochs: int = stage.qat_epochs) -> Any:
        return tuning.fit(m, epochs, tuning.lr * 0.1, tuning.label_loss)

    variant.model, variant.kind, qdetails = quantization.quantize(variant.model, variant.arch, stage.mode, config.hardware_target,
                                                                  calib, qat_train)
    variant.quantization = qdetails
    log.info("quantize (%s): backend %s, %s", stage.mode, qdetails["backend"], qdetails.get("scheme"))
    variant.stages.append({"type": "quantize", **qdetails})


def _save(config: CompressConfig, info: dict[str, Any], variant: _Variant) -> dict[str, Any]:
    """Write the variant's bundle into ``output``; returns its ``model.json`` (the base's, with the
    variant's architecture, stages and parameter count)."""
    from runtimes.models import count_parameters, save_bundle

    out = in_workspace(config.output)
    out.mkdir(parents=True, exist_ok=True)
    new_info = {
        **{k: v for k, v in info.items() if k not in ("file", "sizeBytes", "kind", "format")},
        "architecture": variant.arch,
        "variant": config.variant.name,
        "compression": variant.stages,
        "parameters": count_parameters(variant.model) if variant.kind == "state_dict" else stages_params(variant.stages, info),
        "hardwareTarget": config.hardware_target,
    }
    if variant.quantization:
        new_info["quantization"] = variant.quantization
    save_bundle(out, variant.model, new_info, kind=variant.kind)
    return new_info


def _report(config: CompressConfig, stages: list[dict[str, Any]], before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``report.json``: the figures before and after, their ratios, and the verdict against the
    accuracy bound (the variant's ``maxAccuracyDrop``, else the Compression's)."""
    drop = round(100.0 * ((before["accuracy"] or 0.0) - (after["accuracy"] or 0.0)), 4)
    bound = config.variant.max_accuracy_drop if config.variant.max_accuracy_drop is not None else config.max_accuracy_drop
    accepted = drop <= bound
    return {
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
