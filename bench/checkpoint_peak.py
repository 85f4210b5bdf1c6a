"""bench/checkpoint_peak: the activation peak of one training pass under each gradient-checkpointing
mode, measured by the allocator, beside the peak ``gradientCheckpointing: auto`` predicts.

    python bench/checkpoint_peak.py [--layers 4 8 16 32 64] [--models gpt gpt-wide-vocab mlp]
                                    [--device cpu|cuda] [--out FILE]

What ``savedTensorBytes`` (the train step's figure) counts is what autograd keeps between the
passes; the peak of a pass also holds the recomputation of one segment and the output head's
logits. This bench measures that peak: on the CPU, the largest sum of the PyTorch profiler's
allocation and free events within one forward and backward pass; on CUDA, the allocator's peak
above what was allocated before the pass. Each pass follows a warm-up pass, so the gradients are
allocated already and the figure is the activations'. Models, at each depth:

* ``gpt``: the product's GPT (width 128, 4 heads, context 128, vocabulary 512, batch 8, fp32) — a
  block saves 16× its input, and the head is small;
* ``gpt-wide-vocab``: the same with a vocabulary of 16,384 — the logits are the peak;
* ``mlp``: the product's MLP (64 features, blocks of width 64, batch 1024, 10 classes) — a block
  saves about its input.

Modes: off, per block (``true``), ``sqrt`` and ``auto``. For the checkpointed modes the bench also
prints the peak that ``specs.checkpointing.peak_bytes`` predicts from the costs
``runtimes.models.block_costs`` measured (``auto`` picks the cut of least predicted peak), and
checks that the gradients equal those without checkpointing.

The last line printed is a JSON object: per model and depth each mode's segments and measured
peak, the prediction, and ``auto``'s measured peak against the smaller of ``sqrt``'s and per
block's (``auto_vs_best_fixed``, at most 1 where ``auto`` is no worse than either).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from bench.cli import command_line, emit, ladder_parser
from runtimes.models import GPT, MLP, block_costs
from specs.checkpointing import peak_bytes
from specs.model import ModelSpec

MODES: dict[str, bool | str] = {"off": False, "per-block": True, "sqrt": "sqrt", "auto": "auto"}


def _case(name: str, layers: int, device: torch.device) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    """The model of ``name`` at ``layers`` blocks and its loss on a fixed batch."""
    torch.manual_seed(0)
    if name == "mlp":
        model: nn.Module = MLP(64, [64] * layers, 10)
        x, y = torch.randn(1024, 64, device=device), torch.randint(0, 10, (1024,), device=device)
    else:
        vocab = 16384 if name == "gpt-wide-vocab" else 512
        model = GPT(layers, 128, 4, 128, vocab)
        tokens = torch.randint(0, vocab, (8, 129), device=device)
        x, y = tokens[:, :-1], tokens[:, 1:]
    model.to(device).train()

    held: list[torch.Tensor] = []

    def loss() -> torch.Tensor:
        # The output is held through the backward pass, as the train step holds it.
        held[:] = [model(x)]
        return nn.functional.cross_entropy(held[0].reshape(-1, held[0].shape[-1]), y.reshape(-1))

    return model, loss


def _peak(loss: Callable[[], torch.Tensor], device: torch.device) -> int:
    """Bytes allocated at the peak of one forward and backward pass, above those before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        loss().backward()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss().backward()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = top = 0
    for event in events:
        live += event.nbytes()
        top = max(top, live)
    return top


def measure(name: str, layers: int, device: torch.device) -> dict[str, Any]:
    """Every mode's measured peak for one model and depth, and the predictions."""
    model, loss = _case(name, layers, device)
    costs = block_costs(model, loss)
    reference: list[torch.Tensor] = []
    row: dict[str, Any] = {"model": name, "layers": layers, "modes": {}}
    for mode, setting in MODES.items():
        segments = ModelSpec.model_construct(gradient_checkpointing=setting).checkpoint_segments(layers, costs)
        model.gradient_checkpointing, model.checkpoint_segments = setting is not False, segments
        model.zero_grad(set_to_none=True)
        loss().backward()  # warm-up: the gradients allocated, kept (zeroed) through the measured pass
        grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=False)
        peak = _peak(loss, device)
        if not reference:
            reference = grads
        row["modes"][mode] = {
            "segments": segments, "peak_bytes": peak,
            "predicted_bytes": peak_bytes(costs, segments) if segments else None,
            "same_gradients": all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(grads, reference)),
        }
    modes = row["modes"]
    row["auto_vs_best_fixed"] = round(modes["auto"]["peak_bytes"] / min(modes["sqrt"]["peak_bytes"],
                                                                     modes["per-block"]["peak_bytes"]), 3)
    return row


def main() -> None:
    parser = ladder_parser(__doc__)
    parser.add_argument("--models", nargs="+", choices=("gpt", "gpt-wide-vocab", "mlp"),
                        default=["gpt", "gpt-wide-vocab", "mlp"])
    args = parser.parse_args()
    device = torch.device(args.device)
    started = time.monotonic()
    rows = []
    for name in args.models:
        for layers in args.layers:
            row = measure(name, layers, device)
            rows.append(row)
            shown = ", ".join(f"{mode} {m['peak_bytes'] / 2**20:.1f} MiB ({m['segments']} seg)"
                              for mode, m in row["modes"].items())
            print(f"[checkpoint_peak] {name} {layers:>3} layers: {shown}; auto against the better of sqrt and "
                  f"per block: {row['auto_vs_best_fixed']:.3f}×", flush=True)
    result = {"bench": "checkpoint_peak", "device": args.device, "torch": torch.__version__,
              "command": command_line("checkpoint_peak.py", args),
              "runs": rows, "auto_vs_best_fixed_max": max(r["auto_vs_best_fixed"] for r in rows),
              "same_gradients": all(m["same_gradients"] for r in rows for m in r["modes"].values()),
              "seconds": round(time.monotonic() - started, 1)}
    emit(result, args.out)


if __name__ == "__main__":
    main()
