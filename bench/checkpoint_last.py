"""bench/checkpoint_last: what running the last checkpointed segment plainly would save, beside the
product's checkpointing (every segment checkpointed), in one process.

    python bench/checkpoint_last.py [--layers 4 8 16 32 64] [--modes sqrt per-block] [--repeats 15]
                                    [--device cpu|cuda] [--out FILE]

``torch.utils.checkpoint.checkpoint_sequential`` runs its last segment plainly: the backward pass
starts there, so recomputing it saves nothing at the recomputation's own peak. The product keeps
it checkpointed (runtimes/models.py) because a model's output head runs after the blocks: a plain
last segment's activations are held through the head's forward and backward — for a language
model, its logits, the step's peak. This bench measures what that choice costs in time.

The product's GPT (width 128, 4 heads, context 128, vocabulary 512, batch 8, fp32) at each depth,
with ``gradientCheckpointing`` ``sqrt`` (the segment count from ``ModelSpec.checkpoint_segments``)
or per block: one forward and backward pass is timed for three variants — no checkpointing
(``off``), the product's ``_run_blocks`` (``product``) and the same cut with its last segment run
plainly (``last_plain``, defined here; where the blocks do not divide evenly its short segment comes
first, so the plain one is whole) — in a rotating order, ``--repeats`` times each after two warm-up
passes each; a variant's time is its median. Both variants' gradients are checked to be the same.
Timings interleaved in one process are what a 2-core machine can compare: separate train-step
processes of one configuration differed by up to 1.5×.

The last line printed is a JSON object: per depth and mode the three medians, ``last_plain``'s
time against the product's (``last_plain_vs_product``) and each variant's overhead against ``off``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from types import MethodType
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bench.cli import command_line, emit, ladder_parser
from runtimes.models import GPT, _run_segment
from specs.checkpointing import segment_length
from specs.model import ModelSpec


def _last_plain_run_blocks(self: Any, x: torch.Tensor) -> torch.Tensor:
    """The product's cut into ``checkpoint_segments`` segments, the short one first, with the last
    segment run plainly (as ``checkpoint_sequential`` does)."""
    blocks: list[nn.Module] = list(self.blocks)
    length = segment_length(len(blocks), self.checkpoint_segments or len(blocks))
    first = len(blocks) - length * (-(-len(blocks) // length) - 1)
    segments = [blocks[:first]] + [blocks[i:i + length] for i in range(first, len(blocks), length)]
    for segment in segments[:-1]:
        x = checkpoint(_run_segment, x, segment, use_reentrant=False, preserve_rng_state=False)
    return _run_segment(x, segments[-1])


def _step(model: GPT, tokens: torch.Tensor, device: torch.device) -> Callable[[], float]:
    """One timed forward and backward pass of ``model`` on ``tokens`` (next-token loss)."""

    def run() -> float:
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    return run


def measure(layers: int, mode: str, repeats: int, device: torch.device) -> dict[str, Any]:
    """The three variants of one depth and mode, interleaved."""
    torch.manual_seed(0)
    model = GPT(layers, 128, 4, 128, 512).to(device).train()
    tokens = torch.randint(0, 512, (8, 129), device=device)
    setting: bool | str = "sqrt" if mode == "sqrt" else True
    segments = ModelSpec.model_construct(gradient_checkpointing=setting).checkpoint_segments(layers)
    product_run_blocks = model._run_blocks
    last_plain_run_blocks = MethodType(_last_plain_run_blocks, model)

    def variant(name: str) -> None:
        model.gradient_checkpointing = name != "off"
        model.checkpoint_segments = segments
        model._run_blocks = last_plain_run_blocks if name == "last_plain" else product_run_blocks  # type: ignore[method-assign]

    step = _step(model, tokens, device)
    names = ("off", "product", "last_plain")
    grads: dict[str, list[torch.Tensor]] = {}
    for name in names:  # warm-up, and the gradients to compare
        variant(name)
        step()
        step()
        grads[name] = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        for name in names[i % 3:] + names[:i % 3]:  # a rotating order: no variant always first
            variant(name)
            times[name].append(step())
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    same = all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(grads["product"], grads["last_plain"]))
    return {
        "layers": layers, "mode": mode, "segments": segments,
        "step_s": {name: round(v, 5) for name, v in medians.items()},
        "last_plain_vs_product": round(medians["last_plain"] / medians["product"], 3),
        "overhead_vs_off": {name: round(medians[name] / medians["off"] - 1, 3) for name in ("product", "last_plain")},
        "same_gradients": same,
    }


def main() -> None:
    parser = ladder_parser(__doc__)
    parser.add_argument("--modes", nargs="+", choices=("sqrt", "per-block"), default=["sqrt", "per-block"])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    device = torch.device(args.device)
    started = time.monotonic()
    rows = []
    for layers in args.layers:
        for mode in args.modes:
            row = measure(layers, mode, args.repeats, device)
            rows.append(row)
            over = row["overhead_vs_off"]
            print(f"[checkpoint_last] {layers:>3} layers, {mode:<9} ({row['segments']} segments): "
                  f"off {row['step_s']['off']:.3f} s, product {row['step_s']['product']:.3f} s (+{over['product']:.0%}), "
                  f"last plain {row['step_s']['last_plain']:.3f} s (+{over['last_plain']:.0%}): "
                  f"{row['last_plain_vs_product']:.3f}× the product's", flush=True)
    result = {"bench": "checkpoint_last", "device": args.device, "torch": torch.__version__, "repeats": args.repeats,
              "command": command_line("checkpoint_last.py", args),
              "runs": rows, "last_plain_vs_product_median": statistics.median(r["last_plain_vs_product"] for r in rows),
              "product_overhead_max": max(r["overhead_vs_off"]["product"] for r in rows),
              "last_plain_overhead_max": max(r["overhead_vs_off"]["last_plain"] for r in rows),
              "all_gradients_same": all(r["same_gradients"] for r in rows),
              "elapsed_s": round(time.monotonic() - started, 1)}
    emit(result, args.out)


if __name__ == "__main__":
    main()
