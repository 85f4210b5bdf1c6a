"""Differential privacy for the train step: DP-SGD with Opacus (`Model.spec.privacy`).

Opacus computes per-sample gradients, clips each to ``maxGradNorm`` (L2), adds Gaussian noise
to their sum and keeps a privacy accountant (RDP) over the run. ``make_private_with_epsilon``
picks the noise multiplier so that ``epochs`` passes of Poisson-sampled batches (each row joins a
batch with probability batch size / rows) spend at most the spec's ε at its δ; the step records
what the accountant says was spent (``metrics.json`` → ``privacy``, and ``epsilon`` at the top
level, which the evaluate step gates on).

What is refused, before any training, and why:

- layers Opacus cannot make private, named by their path in the model (``blocks.0.1``:
  BatchNorm mixes the samples of a batch, so a per-sample gradient does not exist); the spec
  validator already refuses DDP/DeepSpeed, mixed precision, ``compile`` and gradient
  accumulation with privacy.

Limits: the noise comes from PyTorch's generator seeded by the spec (reproducible runs), not a
cryptographically secure one (Opacus's ``secure_mode`` needs torchcsprng); a DP run does not
checkpoint (a retry trains again from the start, spending a fresh budget on the same data —
the accountant of the finished run is the one recorded). Compression variants fine-tuned on the
training data (pruning, distillation, QAT) are not covered by the budget; only ``base`` is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from runtimes._step import emit, write_json
from runtimes.errors import StepFailed
from specs.model import Privacy

log = logging.getLogger("forge.privacy")

ACCOUNTANT = "rdp"


def unsupported_layers(model: Any) -> list[str]:
    """``"path (Type): why"`` for every layer Opacus's ModuleValidator refuses."""
    from opacus.validators import ModuleValidator

    found = []
    for name, module in model.named_modules():
        validator = ModuleValidator.VALIDATORS.get(type(module))
        if validator is None:
            continue
        for error in validator(module):
            why = str(error).split(". ")[0].strip()
            found.append(f"`{name or '<root>'}` ({type(module).__name__}): {why}")
    if not found:  # whatever the validator sees that the per-layer table does not
        found = [str(e).split(". ")[0] for e in ModuleValidator.validate(model, strict=False)]
    return found


def refuse_unsupported(model: Any, arch: str) -> None:
    layers = unsupported_layers(model)
    if layers:
        hint = " (the `cnn` architecture normalises with BatchNorm: use `mlp`, or a `custom` model with GroupNorm)" \
            if arch == "cnn" else ""
        raise StepFailed("privacy: Opacus cannot train this model with differential privacy — "
                         + "; ".join(layers[:5]) + (f"; and {len(layers) - 5} more" if len(layers) > 5 else "") + hint)


def train_private(trainer: Any, model: Any, optimizer: Any, scheduler: Any, criterion: Any, x: Any, y: Any,
                  total: int, meter_type: Callable[[Any, int | None], Any]
                  ) -> tuple[dict[str, Any], dict[str, int], float, int, dict[str, Any], dict[str, Any]]:
    """Train ``model`` with DP-SGD. Returns (final fp32 CPU weights, state, seconds, samples,
    throughput, privacy report). ``meter_type`` is the train step's `StepMeter` (passed in, so
    this module does not import the one that imports it)."""
    config, hp = trainer.config, trainer.hp
    privacy = config.spec.privacy
    assert privacy is not None
    refuse_unsupported(model, config.spec.architecture.type)
    if privacy.delta >= 1.0 / len(x):
        log.warning("privacy: delta %g is not below 1/rows (%g): the guarantee is weak", privacy.delta, 1.0 / len(x))
    engine, private_model, private_optimizer, private_loader = _make_private(trainer, model, optimizer, x, y)
    noise = float(private_optimizer.noise_multiplier)
    sample_rate = 1.0 / len(private_loader)
    log.info("privacy: DP-SGD to ε %.3g at δ %.3g: noise multiplier %.4f, sample rate %.4f, clip %.3g",
             privacy.epsilon, privacy.delta, noise, sample_rate, privacy.max_grad_norm)
    device = trainer.device
    meter = meter_type(device, None)
    state = {"step": 0, "epoch": 0, "micro": 0, "total": total}
    report_every = max(1, total // 50)
    samples = 0
    start = time.perf_counter()
    private_model.train()
    for epoch in range(hp.epochs):
        running, count = 0.0, 0
        for xb, yb in private_loader:
            if state["step"] >= total:
                break
            if len(xb) == 0:  # Poisson sampling may draw an empty batch (probability ≈ e^-batch)
                continue
            meter.begin()
            xb, yb = xb.to(device), yb.to(device)
            loss = criterion(private_model(xb), yb)
            loss.backward()
            private_optimizer.step()
            private_optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            meter.end(len(xb))
            state["step"] += 1
            samples += len(xb)
            running += float(loss.detach()) * len(xb)
            count += len(xb)
            if state["step"] % report_every == 0 or state["step"] == total:
                event = {"step": state["step"], "total": total, "epoch": epoch + 1, "loss": round(running / max(1, count), 6),
                         "lr": private_optimizer.param_groups[0]["lr"],
                         "epsilon": round(engine.get_epsilon(privacy.delta), 4)}
                emit("progress", **event)
                write_json(trainer.out / "progress.json", {"event": "progress", **event})
        state["epoch"] = epoch + 1
        if count:
            log.info("epoch %d/%d: loss %.4f", epoch + 1, hp.epochs, running / count)
        if state["step"] >= total:
            break
    elapsed = time.perf_counter() - start
    spent = float(engine.get_epsilon(privacy.delta))
    report = _report(privacy, spent, noise, sample_rate, state["step"])
    log.info("privacy: spent ε %.4f of %.4g at δ %g over %d steps", spent, privacy.epsilon, privacy.delta, state["step"])
    final = {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}
    return final, state, elapsed, samples, meter.summary(), report


def _make_private(trainer: Any, model: Any, optimizer: Any, x: Any, y: Any) -> tuple[Any, Any, Any, Any]:
    """Opacus's engine and its private model, optimizer and Poisson-sampling loader, with the
    noise calibrated so that the whole run (``epochs`` at this sample rate) spends the target ε
    at δ: (engine, model, optimizer, loader)."""
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    hp, privacy = trainer.hp, trainer.config.spec.privacy
    loader = DataLoader(TensorDataset(x, y), batch_size=hp.batch_size,
                        generator=torch.Generator().manual_seed(hp.seed))
    engine = PrivacyEngine(accountant=ACCOUNTANT)
    private_model, private_optimizer, private_loader = engine.make_private_with_epsilon(
        module=model, optimizer=optimizer, data_loader=loader, target_epsilon=privacy.epsilon,
        target_delta=privacy.delta, epochs=hp.epochs, max_grad_norm=privacy.max_grad_norm, poisson_sampling=True)
    return engine, private_model, private_optimizer, private_loader


def _report(privacy: Privacy, spent: float, noise: float, sample_rate: float, steps: int) -> dict[str, Any]:
    """``metrics.json``'s ``privacy``: the guarantee the run got (ε spent at δ, by the accountant)
    and what it was made of, which the evaluate step's ε gate and the registry read."""
    return {
        "mechanism": "DP-SGD (Opacus)",
        "accountant": ACCOUNTANT,
        "epsilonTarget": privacy.epsilon,
        "epsilonSpent": round(spent, 6),
        "delta": privacy.delta,
        "maxGradNorm": privacy.max_grad_norm,
        "noiseMultiplier": round(noise, 6),
        "sampleRate": round(sample_rate, 6),
        "steps": steps,
        "poissonSampling": True,
        "secureRng": False,
    }
