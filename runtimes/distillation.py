"""Knowledge distillation: the student learns the teacher's temperature-softened outputs."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def distillation_loss(teacher: nn.Module, temperature: float, alpha: float, hard: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """``alpha · T² · KL(student_T ‖ teacher_T) + (1 − alpha) · label loss``."""
    teacher.eval()

    def loss(out: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t = teacher(x).float()
        soft = F.kl_div(
            F.log_softmax(out.float() / temperature, dim=-1), F.softmax(t / temperature, dim=-1), reduction="batchmean"
        ) * (temperature**2)
        return alpha * soft + (1 - alpha) * hard(out, y)

    return loss
