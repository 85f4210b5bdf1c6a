"""bench/train_gpu: a GPT-style LM (~124M parameters) on one NVIDIA GPU (made for an H200):
bf16 autocast + ``torch.compile`` + fused SDPA attention vs an eager fp32 baseline with unfused
(explicit softmax) attention. Synthetic tokens: nothing is downloaded.

    python bench/train_gpu.py [--steps 30] [--batch 16] [--ctx 1024] [--peak-tflops 989]

Reports tokens/s and model FLOPs utilisation (MFU = achieved model FLOPs / peak dense bf16 FLOPs;
model FLOPs per token = 6·N + 12·layers·ctx·d_model). ``--peak-tflops`` defaults to the H200's
dense BF16 figure (989). The last line is
``{"tokens_per_s_fp32_eager", "tokens_per_s_bf16_compiled", "speedup", "mfu_fp32_eager", "mfu_bf16_compiled", "params", "gpu"}``.
Exits 2 with a message when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from runtimes.benchsupport import ensure_runtime_env  # noqa: E402


def build(fused: bool, layers: int = 12, d: int = 768, heads: int = 12, ctx: int = 1024, vocab: int = 50304):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)), persistent=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            if fused:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) / math.sqrt(d // heads)
                att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
                y = att @ v
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2, self.attn = nn.LayerNorm(d), nn.LayerNorm(d), Attn()
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    return GPT()


def run(mode: str, args) -> tuple[float, int]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    fused = mode == "bf16_compiled"
    model = build(fused, ctx=args.ctx).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    step_model = torch.compile(model) if fused else model
    torch.backends.cuda.matmul.allow_tf32 = False  # the baseline is true fp32
    x = torch.randint(0, 50304, (args.batch, args.ctx + 1), device="cuda")

    def one_step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=fused):
            logits = step_model(x[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        one_step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        one_step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    del model, opt, step_model
    torch.cuda.empty_cache()
    return args.batch * args.ctx * args.steps / elapsed, params


def main() -> None:
    ensure_runtime_env()
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench/train_gpu: no CUDA device here; run it on the GPU machine", file=sys.stderr)
        sys.exit(2)
    results = {}
    params = 0
    for mode in ("fp32_eager", "bf16_compiled"):
        tps, params = run(mode, args)
        results[mode] = tps
        print(f"{mode:14}: {tps:,.0f} tokens/s", file=sys.stderr)
    layers, d = 12, 768
    flops_per_token = 6 * params + 12 * layers * args.ctx * d
    peak = args.peak_tflops * 1e12
    print(json.dumps({
        "tokens_per_s_fp32_eager": round(results["fp32_eager"], 1),
        "tokens_per_s_bf16_compiled": round(results["bf16_compiled"], 1),
        "speedup": round(results["bf16_compiled"] / results["fp32_eager"], 2),
        "mfu_fp32_eager": round(results["fp32_eager"] * flops_per_token / peak, 4),
        "mfu_bf16_compiled": round(results["bf16_compiled"] * flops_per_token / peak, 4),
        "params": params,
        "gpu": torch.cuda.get_device_name(0),
    }))


if __name__ == "__main__":
    main()
