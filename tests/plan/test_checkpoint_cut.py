"""The cut `gradientCheckpointing: auto` makes (specs/checkpointing.py), on costs written out by
hand: where the activation peak of a checkpointed step lies, and the segment count of least peak."""

from __future__ import annotations

import pytest

from specs import Model
from specs.checkpointing import BlockCosts, least_peak_segments, peak_bytes


def _brute_force(costs: BlockCosts) -> int:
    """The least peak over every segment count, by trying each."""
    return min(peak_bytes(costs, k) for k in range(1, costs.blocks + 1))


def test_the_peak_is_a_segments_recomputation_or_the_head_with_every_input_kept() -> None:
    # 8 blocks keeping 1 B and saving 16 B; 2 segments of 4: kept 2, one segment 64 → 66.
    costs = BlockCosts.uniform(8, 1, 16)
    assert peak_bytes(costs, 2) == 2 + 4 * 16
    assert peak_bytes(costs, 8) == 8 + 16  # per block: every input, one block's activations
    assert peak_bytes(BlockCosts.uniform(8, 1, 16, head=100), 2) == 2 + 100  # the head is larger
    assert peak_bytes(BlockCosts.uniform(8, 1, 16, head=100, held=7), 2) == 7 + 2 + 100  # the logits, held throughout
    # The first segment's recomputation holds only the inputs before it: a large first block.
    assert peak_bytes(BlockCosts((1, 1, 1, 1), (50, 1, 1, 1)), 4) == 1 + 50


@pytest.mark.parametrize(("ratio", "segments", "peak"), [(1, 6, 16), (4, 13, 32), (16, 32, 64), (64, 64, 128)])
def test_equal_blocks_are_cut_in_segments_of_the_root_of_blocks_over_their_ratio(ratio: int, segments: int,
                                                                                  peak: int) -> None:
    """64 equal blocks keeping 1 kB and saving `ratio` kB: segments of about √(64 ÷ ratio) blocks.
    At a ratio of 1 that is sqrt's 8 segments of 8 (8 + 8 kB), tied by 6 segments of 11 (the 6th
    segment's recomputation: 6 + 9; the 5th: 5 + 11), and the fewer are taken; at 4, 16 segments of 4
    (16 + 4 × 4) tie 13 of 5 (the 12th: 12 + 5 × 4); at 16, 32 of 2 (32 + 2 × 16); at 64, per block."""
    costs = BlockCosts.uniform(64, 1000, 1000 * ratio)
    assert least_peak_segments(costs) == segments
    assert peak_bytes(costs, segments) == peak * 1000 == _brute_force(costs)


def test_a_large_head_lets_segments_grow_until_their_recomputation_reaches_it() -> None:
    """The logits of a language model: 64 blocks keeping 1 B and saving 16 B under a head of 320 B.
    Segments of 16 (4 of them) recompute 256 B beneath the head: 4 + 320; 3 segments of 22
    recompute 352 B, above it."""
    costs = BlockCosts.uniform(64, 1, 16, head=320)
    assert least_peak_segments(costs) == 4
    assert peak_bytes(costs, 4) == 324 == _brute_force(costs)


def test_of_equal_peaks_the_fewest_segments_are_taken() -> None:
    # 4 blocks saving what they keep: 1 segment peaks at 1 + 4, 2 at 2 + 2, 4 at 4 + 1.
    assert least_peak_segments(BlockCosts.uniform(4, 1, 1)) == 2
    # 16 such blocks: 3 segments of 6 (the 2nd's recomputation: 2 + 6), 4 of 4 (4 + 4) and 6 of 3
    # (the 5th: 5 + 3) all peak at 8: 3 segments.
    costs = BlockCosts.uniform(16, 1, 1)
    assert [peak_bytes(costs, k) for k in (2, 3, 4, 6, 8)] == [10, 8, 8, 8, 10]
    assert least_peak_segments(costs) == 3


def test_auto_needs_the_costs_and_the_spec_names_it() -> None:
    spec = Model.model_validate({"apiVersion": "forge.dev/v1alpha1", "kind": "Model", "metadata": {"name": "m"},
                                 "spec": {"datasetRef": "d", "architecture": {"type": "mlp"},
                                          "gradientCheckpointing": "auto"}}).spec
    with pytest.raises(ValueError, match="auto needs the costs of the 4 blocks"):
        spec.checkpoint_segments(4)
    assert spec.checkpoint_segments(4, BlockCosts.uniform(4, 1, 1)) == 2
    with pytest.raises(ValueError, match="costs of 2 block inputs and 1 block activations"):
        BlockCosts((1, 1), (1,))
