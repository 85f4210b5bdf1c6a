"""Accuracy under adversarial attack (`Model.spec.evaluation.robustness`), for the evaluate step.

Both attacks are white-box, untargeted and bounded in L∞ by ε around each input, in the model's
input space (the prepared features: after the Dataset's clipping and standardisation), with no
box constraint beyond the ball:

- FGSM (Goodfellow et al., 2015): one step ``x + ε · sign(∇ₓ loss)``.
- PGD (Madry et al., 2018): a uniform random start in the ball, then ``pgdSteps`` steps of
  ``stepSize · sign(∇ₓ loss)``, each projected back into the ball (the default step,
  2.5 · ε / steps, lets PGD reach the ball's boundary from anywhere in it).

The model is in eval mode (BatchNorm's running statistics, no dropout); the random start is
seeded, so a figure repeats. A PGD accuracy above the FGSM one at the same ε would mean the
attack is weak, and the evaluate step logs a warning.
"""

from __future__ import annotations

import logging
from typing import Any

from runtimes.errors import StepFailed

log = logging.getLogger("forge.robustness")


def _loss_grad(model: Any, x: Any, y: Any) -> Any:
    import torch
    import torch.nn.functional as F

    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = F.cross_entropy(model(x).float(), y, reduction="sum")
        (grad,) = torch.autograd.grad(loss, x)
    return grad


def fgsm(model: Any, x: Any, y: Any, epsilon: float) -> Any:
    return (x + epsilon * _loss_grad(model, x, y).sign()).detach()


def pgd(model: Any, x: Any, y: Any, epsilon: float, steps: int, step_size: float, generator: Any) -> Any:
    import torch

    noise = (torch.rand(x.shape, generator=generator, dtype=x.dtype) * 2 - 1).to(x.device) * epsilon
    adv = x + noise
    for _ in range(steps):
        adv = adv + step_size * _loss_grad(model, adv, y).sign()
        adv = torch.max(torch.min(adv, x + epsilon), x - epsilon).detach()
    return adv


def adversarial_metrics(model: Any, x: Any, y: Any, task: str, settings: Any, seed: int = 0,
                        batch_size: int = 256) -> dict[str, Any]:
    """``fgsmAccuracy`` / ``pgdAccuracy`` on the first ``settings.samples`` rows, and the settings."""
    import torch

    if task != "classification" or not x.is_floating_point():
        raise StepFailed(f"robustness: FGSM/PGD need a classifier with float inputs (this model's task is {task})")
    from runtimes.learn import device_of

    model.eval()
    device = device_of(model)
    x, y = x[: settings.samples], y[: settings.samples]
    step = settings.step_size if settings.step_size is not None else 2.5 * settings.epsilon / settings.pgd_steps
    generator = torch.Generator().manual_seed(seed)
    correct = {attack: 0 for attack in settings.attacks}
    clean = 0
    for i in range(0, len(x), batch_size):
        xb, yb = x[i : i + batch_size].to(device), y[i : i + batch_size].to(device)
        with torch.no_grad():
            clean += int((model(xb).argmax(-1) == yb).sum())
        for attack in settings.attacks:
            adv = fgsm(model, xb, yb, settings.epsilon) if attack == "fgsm" else \
                pgd(model, xb, yb, settings.epsilon, settings.pgd_steps, step, generator)
            with torch.no_grad():
                correct[attack] += int((model(adv).argmax(-1) == yb).sum())
    n = max(1, len(x))
    out: dict[str, Any] = {f"{a}Accuracy": correct[a] / n for a in settings.attacks}
    if "fgsm" in correct and "pgd" in correct and correct["pgd"] > correct["fgsm"]:
        log.warning("robustness: PGD accuracy above FGSM's at ε %g: the PGD attack is weak (more steps?)", settings.epsilon)
    out["robustness"] = {"epsilon": settings.epsilon, "norm": "Linf", "attacks": list(settings.attacks),
                         "pgdSteps": settings.pgd_steps, "stepSize": step, "rows": len(x),
                         "cleanAccuracy": clean / n, **{f"{a}Accuracy": correct[a] / n for a in settings.attacks}}
    return out
