"""Structured L1 pruning that physically removes neurons and channels.

For each prunable layer the output units (rows of a Linear, filters of a Conv2d) with the
smallest L1 norm are dropped and the next layer loses the matching inputs, so the result is a
smaller dense model (fewer parameters, less compute) described by a smaller architecture — not
a mask over the old one.

- ``mlp``: every hidden layer's neurons;
- ``cnn``: every conv block's channels (its BatchNorm follows);
- ``gpt``: every block's MLP hidden neurons (attention heads stay whole).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from runtimes.errors import StepFailed


def _keep(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    units = weight.shape[0]
    k = max(1, int(round(units * (1.0 - sparsity))))
    norms = weight.detach().abs().reshape(units, -1).sum(dim=1)
    return torch.sort(torch.topk(norms, k).indices).values


def _linear(old: nn.Linear, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> nn.Linear:
    w = old.weight.detach()
    b = old.bias.detach() if old.bias is not None else None
    if rows is not None:
        w = w[rows]
        b = b[rows] if b is not None else None
    if cols is not None:
        w = w[:, cols]
    new = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
    new.weight.data.copy_(w)
    if b is not None:
        new.bias.data.copy_(b)
    return new


def _conv(old: nn.Conv2d, out_keep: torch.Tensor | None, in_keep: torch.Tensor | None) -> nn.Conv2d:
    w = old.weight.detach()
    b = old.bias.detach() if old.bias is not None else None
    if out_keep is not None:
        w = w[out_keep]
        b = b[out_keep] if b is not None else None
    if in_keep is not None:
        w = w[:, in_keep]
    new = nn.Conv2d(w.shape[1], w.shape[0], old.kernel_size, old.stride, old.padding, bias=b is not None)
    new.weight.data.copy_(w)
    if b is not None:
        new.bias.data.copy_(b)
    return new


def _bn(old: nn.BatchNorm2d, keep: torch.Tensor) -> nn.BatchNorm2d:
    new = nn.BatchNorm2d(len(keep))
    for name in ("weight", "bias"):
        getattr(new, name).data.copy_(getattr(old, name).detach()[keep])
    for name in ("running_mean", "running_var"):
        getattr(new, name).copy_(getattr(old, name)[keep])
    new.num_batches_tracked.copy_(old.num_batches_tracked)
    return new


def prune(model: nn.Module, arch: dict[str, Any], sparsity: float) -> tuple[nn.Module, dict[str, Any]]:
    """Prune in place; return the model and its new (smaller) resolved architecture."""
    kind = arch["type"]
    arch = dict(arch)
    if kind == "mlp":
        prev: torch.Tensor | None = None
        sizes = []
        for block in model.blocks:
            lin = block[0]
            lin = _linear(lin, cols=prev)
            keep = _keep(lin.weight, sparsity)
            block[0] = _linear(lin, rows=keep)
            sizes.append(len(keep))
            prev = keep
        model.head = _linear(model.head, cols=prev)
        arch["hiddenSizes"] = sizes
    elif kind == "cnn":
        prev = None
        channels = []
        for block in model.blocks:
            conv = _conv(block[0], None, prev)
            keep = _keep(conv.weight, sparsity)
            block[0] = _conv(conv, keep, None)
            block[1] = _bn(block[1], keep)
            channels.append(len(keep))
            prev = keep
        model.head = _linear(model.head, cols=prev)
        arch["channels"] = channels
    elif kind == "gpt":
        hidden = []
        for block in model.blocks:
            keep = _keep(block.fc1.weight, sparsity)
            block.fc1 = _linear(block.fc1, rows=keep)
            block.fc2 = _linear(block.fc2, cols=keep)
            hidden.append(len(keep))
        arch["mlpHidden"] = hidden
    else:
        raise StepFailed(f"structured pruning supports mlp, cnn and gpt architectures, not {kind!r}")
    return model, arch
