"""Where gradient checkpointing's activation peak lies, and the cut of a block stack that makes it
least (``gradientCheckpointing: auto``).

A checkpointed segment keeps only its input across the forward pass; the backward pass recomputes
one segment at a time, from the last to the first. Every cut recomputes every block exactly once,
so the number of segments does not change the FLOPs of a step: it only moves the activation peak,
which is what the step holds throughout (the model's output) plus the larger of

* the head's peak (the output layer and the loss, at the end of the forward pass and the start of
  the backward one) with every segment input kept, and
* a segment's recomputation: the inputs of that segment and of the ones before it, and the
  activations of its blocks.

Few long segments keep few inputs but recompute much at once; many short ones the reverse. For
``n`` equal blocks whose activations are ``r`` times their input and a small head, the least peak
is at segments of about √(n ÷ r) blocks — √n (``sqrt``) only when a block saves no more than its
input. A large head (a language model's logits) lets segments grow until their recomputation
reaches it. Pure arithmetic: the train step measures the costs on its first batch
(runtimes/models.py), the plan estimates them from the architecture (renderers/scheduling.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockCosts:
    """Activation bytes of a stack of blocks, block by block, and of what follows it.

    ``inputs[i]`` is what a segment starting at block ``i`` keeps (that block's input);
    ``activations[i]`` what block ``i`` saves for its backward pass when run plainly;
    ``head`` what the output layer and the loss hold at their peak beyond ``held``, what the step
    holds from its forward pass to the end of its backward one (the model's output). What precedes
    the stack (an embedding) is held by every cut alike and left out."""

    inputs: tuple[int, ...]
    activations: tuple[int, ...]
    head: int = 0
    held: int = 0

    def __post_init__(self) -> None:
        if not self.inputs or len(self.inputs) != len(self.activations):
            raise ValueError(f"costs of {len(self.inputs)} block inputs and {len(self.activations)} "
                             "block activations: expected one of each per block, at least one block")

    @classmethod
    def uniform(cls, blocks: int, input_bytes: int, activation_bytes: int, head: int = 0, held: int = 0) -> BlockCosts:
        """``blocks`` equal blocks (a transformer's layers)."""
        return cls((input_bytes,) * blocks, (activation_bytes,) * blocks, head, held)

    @property
    def blocks(self) -> int:
        """The number of blocks in the stack."""
        return len(self.inputs)


def segment_length(blocks: int, segments: int) -> int:
    """Blocks per segment when ``blocks`` are cut into ``segments``: ⌈blocks ÷ segments⌉, the last
    segment taking the remainder (as runtimes/models.py cuts them)."""
    return -(-blocks // max(1, min(segments, blocks)))


def peak_bytes(costs: BlockCosts, segments: int) -> int:
    """The activation peak of one step with the stack cut into ``segments`` checkpointed segments
    (the module docstring says where it lies), above what precedes the stack."""
    n = costs.blocks
    length = segment_length(n, segments)
    kept = peak = 0
    for start in range(0, n, length):
        kept += costs.inputs[start]
        peak = max(peak, kept + sum(costs.activations[start:start + length]))
    return costs.held + max(peak, kept + costs.head)


def least_peak_segments(costs: BlockCosts) -> int:
    """The number of segments whose cut has the least :func:`peak_bytes`; of equal peaks the
    fewest segments (fewer checkpoint boundaries to cross, the recomputation being the same)."""
    n = costs.blocks
    # Distinct cuts only: k segments and the k' with the same ⌈n ÷ k⌉ cut the same way.
    counts = sorted({-(-n // segment_length(n, k)) for k in range(1, n + 1)})
    return min(counts, key=lambda k: (peak_bytes(costs, k), k))
