"""The architecture registry and the on-disk model bundle every later step loads.

Architectures: ``mlp``, ``cnn`` (conv → BN → ReLU blocks, global pooling, linear head), ``gpt``
(decoder-only LM, causal attention: fused SDPA, or the explicit ``math`` form; each block is one
gradient-checkpointing unit) and ``custom`` (``module:function`` returning an
``nn.Module``; called with the spec's options, plus ``num_features``/``num_classes`` when it takes
them). ``runtimes.models:transformer_classifier`` is a ready custom entrypoint (a small encoder
over byte tokens), used by the serving benchmark.

A model bundle is a folder:

- ``model.json``: ``format`` (``forge-model/v1``), ``kind`` (``state_dict`` | ``pt2e`` |
  ``int8`` | ``pickle``), the *resolved* architecture (after pruning, the smaller shapes), task, input kind,
  classes, the feature transform from prepare, parameter count, and what compression applied;
- ``model.pt``: the weights (``state_dict``), the INT8 state dict of a torch.ao recipe recorded
  in ``quantization`` (``int8``; the loader rebuilds the quantized skeleton), a whole pickled
  module (``pickle``, INC with IPEX) or, for ``pt2e``, ``model.pt2`` (a ``torch.export`` program, INC's PT2E INT8 path).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from runtimes.errors import StepFailed
from specs.checkpointing import BlockCosts, segment_length

FORMAT = "forge-model/v1"


def _run_segment(x: torch.Tensor, blocks: list[nn.Module]) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


class _Checkpointed(nn.Module):
    """Base with a gradient-checkpointing switch for the blocks of a model (``self.blocks``).

    ``checkpoint_segments`` cuts the blocks into that many segments of ⌈blocks ÷ segments⌉ each
    (0: one per block, the per-layer mode). Autograd then keeps only each segment's input across
    the forward pass and recomputes one segment at a time in the backward pass, so with ⌈√n⌉
    blocks a segment (``gradientCheckpointing: sqrt``) both the kept inputs and the recomputed
    segment grow as √n. Every segment is checkpointed, the last one too — unlike
    ``torch.utils.checkpoint.checkpoint_sequential``, which runs its last segment plainly (so its
    ``segments=1`` checkpoints nothing): here the kept activations are exactly the segments' inputs.
    """

    gradient_checkpointing = False
    checkpoint_segments = 0

    def _run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        blocks: list[nn.Module] = list(self.blocks)
        if not (self.gradient_checkpointing and self.training and torch.is_grad_enabled()):
            return _run_segment(x, blocks)
        length = segment_length(len(blocks), self.checkpoint_segments or len(blocks))
        for start in range(0, len(blocks), length):
            segment = blocks[start:start + length]
            # The RNG state is saved and restored around a segment only where its recomputation
            # draws random numbers (dropout): on a GPU that save reads the device's generator back
            # to the host, a synchronisation per segment per step that a deterministic block does not need.
            random = any(isinstance(m, nn.Dropout) and m.p > 0 for block in segment for m in block.modules())
            x = checkpoint(_run_segment, x, segment, use_reentrant=False, preserve_rng_state=random)
        return x


def storage_of(t: torch.Tensor) -> tuple[int, int] | None:
    """(address, bytes) of a tensor's storage; None for tensor subclasses without a plain one."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except Exception:
        return None


def parameter_storages(model: nn.Module) -> set[int]:
    """The storage addresses of ``model``'s parameters: what autograd saves of them is kept anyway,
    so counts of saved activations leave them out."""
    return {p.untyped_storage().data_ptr() for p in model.parameters()}


def block_costs(model: nn.Module, step: Callable[[], Any]) -> BlockCosts:
    """What ``model``'s block stack (``model.blocks``) costs in activation memory, measured in
    one forward pass ``step`` (the model and the loss on a batch): each block's input, what each
    block saves for backward run plainly, and the head's peak, estimated as the model's output
    (which the train step holds through its backward), what the layers after the stack and the
    loss save, and two gradients the size of the largest of those (a cross-entropy's backward
    holds the gradient of its fp32 log-probabilities and of the fp32 logits they came from).

    The pass keeps little: autograd's pack hook counts each saved tensor's storage once and holds
    it only while its block runs (a storage is told apart by its address only while it is alive),
    so the measurement holds one block's activations at a time, not the stack's. Parameters are
    not counted (kept by every cut), nor is what precedes the stack. The pass leaves no trace: the
    random-number state and the buffers (BatchNorm's running statistics) are restored, and
    checkpointing is off during it, so every block runs plainly."""
    blocks = list(model.blocks)
    n = len(blocks)
    inputs, activations, head, largest = [0] * n, [0] * n, [0], [0]
    params = parameter_storages(model)
    held: list[torch.Tensor] = []  # this region's saved tensors: their addresses stay theirs
    seen: set[int] = set()
    where = [-1]  # the region running: -1 before the stack, block i, n after the stack

    def pack(t: torch.Tensor) -> None:
        found = storage_of(t)
        if found is not None and found[0] not in params and found[0] not in seen:
            seen.add(found[0])
            held.append(t)
            if 0 <= where[0] < n:
                activations[where[0]] += found[1]
            elif where[0] == n:
                head[0] += found[1]
                largest[0] = max(largest[0], found[1])

    def unpack(_: None) -> torch.Tensor:
        raise RuntimeError("block_costs's measuring pass has no backward")

    def cross(region: int, boundary: Any) -> int:
        """Enter ``region``; the tensor passed across (alive on both sides) stays counted once."""
        found = storage_of(boundary) if isinstance(boundary, torch.Tensor) else None
        kept = found is not None and found[0] in seen
        held.clear()
        seen.clear()
        if kept and found is not None:
            seen.add(found[0])
        where[0] = region
        return found[1] if found else 0

    def entering(i: int) -> Callable[..., None]:
        def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
            inputs[i] = cross(i, args[0] if args else None)
        return hook

    def leaving(_module: nn.Module, _args: Any, out: Any) -> None:
        cross(n, out)  # the next block's hook moves on; after the last, the head runs

    def finished(_module: nn.Module, _args: Any, out: Any) -> None:
        found = storage_of(out) if isinstance(out, torch.Tensor) else None
        output[0] = found[1] if found else 0

    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    switch = getattr(model, "gradient_checkpointing", False)
    output = [0]
    with contextlib.ExitStack() as stack:
        stack.callback(model.register_forward_hook(finished).remove)
        for i, block in enumerate(blocks):
            stack.callback(block.register_forward_pre_hook(entering(i)).remove)
            stack.callback(block.register_forward_hook(leaving).remove)
        stack.enter_context(torch.random.fork_rng(devices=devices))
        stack.enter_context(torch.enable_grad())
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, unpack))
        model.gradient_checkpointing = False
        try:
            step()
        finally:
            held.clear()
            model.gradient_checkpointing = switch
            with torch.no_grad():
                for name, b in model.named_buffers():
                    b.copy_(buffers[name])
    # A language model's head: 12 bytes a logit beside the 2 (bf16) or 4 (fp32) of the logits held,
    # as the plan counts them (renderers/scheduling.py); the H200 measured 14.3 in bf16.
    return BlockCosts(tuple(inputs), tuple(activations), head[0] + 2 * largest[0], output[0])


class MLP(_Checkpointed):
    def __init__(self, num_features: int, hidden_sizes: list[int], num_classes: int, dropout: float = 0.0):
        super().__init__()
        sizes = [num_features, *hidden_sizes]
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Dropout(dropout)) for a, b in zip(sizes, sizes[1:])
        )
        self.head = nn.Linear(sizes[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        x = self._run_blocks(x)
        return self.head(x)


class CNN(_Checkpointed):
    def __init__(self, channels: list[int], num_classes: int, image_size: int = 8, in_channels: int = 1):
        super().__init__()
        self.in_channels, self.image_size = in_channels, image_size
        blocks, c_in, side = [], in_channels, image_size
        for c in channels:
            layers: list[nn.Module] = [nn.Conv2d(c_in, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU()]
            if side >= 4:
                layers.append(nn.MaxPool2d(2))
                side //= 2
            blocks.append(nn.Sequential(*layers))
            c_in = c
        self.blocks = nn.ModuleList(blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.view(-1, self.in_channels, self.image_size, self.image_size)
        x = self._run_blocks(x)
        return self.head(self.pool(x).flatten(1))


class Attention(nn.Module):
    """Multi-head self-attention. ``fused``: ``F.scaled_dot_product_attention`` (flash or
    memory-efficient kernels where the device has them); otherwise the explicit
    softmax(QKᵀ/√d)·V, which materialises the [batch, heads, T, T] scores."""

    def __init__(self, d_model: int, heads: int, causal: bool, fused: bool = True):
        super().__init__()
        self.heads, self.causal, self.fused = heads, causal, fused
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
            if self.causal:
                mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
                scores = scores.masked_fill(mask, float("-inf"))
            y = scores.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, mlp_hidden: int, causal: bool, fused: bool = True):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads, causal, fused)
        self.fc1, self.fc2 = nn.Linear(d_model, mlp_hidden), nn.Linear(mlp_hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(_Checkpointed):
    """A GPT-style decoder LM: token + position embeddings, pre-LN blocks, tied output head."""

    def __init__(self, layers: int, d_model: int, heads: int, context_length: int, vocab_size: int, mlp_hidden: list[int] | None = None,
                 attention: str = "fused"):
        super().__init__()
        mlp_hidden = mlp_hidden or [4 * d_model] * layers
        self.context_length = context_length
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(context_length, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, h, causal=True, fused=attention == "fused") for h in mlp_hidden)
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok.weight
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        x = self._run_blocks(x)
        return self.head(self.ln(x))


class TransformerClassifier(_Checkpointed):
    """An encoder over byte tokens, mean-pooled, then a linear head (a text classifier)."""

    def __init__(self, num_classes: int, layers: int = 4, d_model: int = 256, heads: int = 4, seq_len: int = 32, vocab_size: int = 256):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, 4 * d_model, causal=False) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.long()
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        x = self._run_blocks(x)
        return self.head(self.ln(x).mean(dim=1))


def transformer_classifier(num_classes: int = 2, layers: int = 4, dModel: int = 256, heads: int = 4, seqLen: int = 32, vocabSize: int = 256) -> nn.Module:
    """Custom-architecture entrypoint: ``runtimes.models:transformer_classifier``."""
    return TransformerClassifier(num_classes, layers, dModel, heads, seqLen, vocabSize)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


def resolve_architecture(arch_spec: Any) -> dict[str, Any]:
    """The spec's architecture as the plain dict a bundle records (camelCase, defaults filled)."""
    arch = arch_spec.model_dump(mode="json", by_alias=True)
    if arch["type"] == "gpt":
        arch["mlpHidden"] = [4 * arch["dModel"]] * arch["layers"]
    return arch


def build_model(arch: dict[str, Any], meta: dict[str, Any]) -> nn.Module:
    """Build an untrained module from a resolved architecture and the prepared data's meta."""
    kind = arch["type"]
    num_classes = int(meta.get("numClasses") or 1)
    if kind == "mlp":
        return MLP(int(meta["numFeatures"]), list(arch["hiddenSizes"]), num_classes, float(arch.get("dropout", 0.0)))
    if kind == "cnn":
        features = int(meta.get("numFeatures") or 0)
        side, cin = int(arch["imageSize"]), int(arch["inChannels"])
        if features and features != cin * side * side:
            raise StepFailed(f"cnn expects {cin}x{side}x{side} = {cin * side * side} input values per sample, the data has {features}")
        return CNN(list(arch["channels"]), num_classes, side, cin)
    if kind == "gpt":
        return GPT(arch["layers"], arch["dModel"], arch["heads"], arch["contextLength"], arch["vocabSize"], arch.get("mlpHidden"),
                   arch.get("attention", "fused"))
    if kind == "custom":
        module_name, _, fn_name = arch["entrypoint"].partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), fn_name)
        except (ImportError, AttributeError) as exc:
            raise StepFailed(f"custom architecture {arch['entrypoint']}: {exc}") from None
        kwargs = dict(arch.get("options", {}))
        params = inspect.signature(fn).parameters
        for key, value in (("num_features", meta.get("numFeatures")), ("num_classes", num_classes)):
            if key in params and key not in kwargs and value is not None:
                kwargs[key] = int(value)
        model = fn(**kwargs)
        if not isinstance(model, nn.Module):
            raise StepFailed(f"custom architecture {arch['entrypoint']} returned {type(model).__name__}, not a torch.nn.Module")
        return model
    raise StepFailed(f"unknown architecture type {kind!r}")


def count_parameters(model: nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def save_bundle(folder: Path, model: nn.Module, info: dict[str, Any], kind: str = "state_dict", example: torch.Tensor | None = None) -> Path:
    """Write ``model.json`` and the weights; return the weights file."""
    folder.mkdir(parents=True, exist_ok=True)
    info = {**info, "format": FORMAT, "kind": kind}
    if kind == "state_dict":
        path = folder / "model.pt"
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        torch.save(state, path)
        info.setdefault("parameters", count_parameters(model))
    elif kind == "int8":
        path = folder / "model.pt"
        torch.save(model.state_dict(), path)
    elif kind == "pickle":
        path = folder / "model.pt"
        torch.save(model, path)
    elif kind == "pt2e":
        path = folder / "model.pt2"
        torch.export.save(model, path)  # an ExportedProgram
    else:
        raise ValueError(kind)
    info["file"] = path.name
    info["sizeBytes"] = path.stat().st_size
    (folder / "model.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return path


def read_info(folder: Path) -> dict[str, Any]:
    path = folder / "model.json"
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise StepFailed(f"no model at {folder} (missing model.json)") from None
    if info.get("format") != FORMAT:
        raise StepFailed(f"{path}: not a Forge model bundle (format {info.get('format')!r})")
    return info


def load_bundle(folder: Path) -> tuple[nn.Module, dict[str, Any]]:
    """Load any bundle kind as an eval-mode module (the one model-loading core)."""
    info = read_info(folder)
    kind = info["kind"]
    path = folder / info.get("file", "model.pt")
    if kind == "state_dict":
        model = build_model(info["architecture"], info)
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    elif kind == "int8":
        from runtimes.quantization import int8_skeleton

        float_model = build_model(info["architecture"], info)
        model = int8_skeleton(float_model, info["architecture"], info.get("quantization") or {})
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    elif kind == "pickle":
        engine = (info.get("quantization") or {}).get("engine")
        if engine and engine in torch.backends.quantized.supported_engines:
            torch.backends.quantized.engine = engine
        # Quantized torch.ao modules: the whole module is pickled (our own file, never user input).
        model = torch.load(path, map_location="cpu", weights_only=False)
    elif kind == "pt2e":
        model = torch.export.load(path).module()
    else:
        raise StepFailed(f"{folder}: unknown model kind {kind!r}")
    if kind != "pt2e":
        model.eval()
    return model, info


def file_size(folder: Path) -> int:
    info = read_info(folder)
    return (folder / info.get("file", "model.pt")).stat().st_size
