"""The collector's pause around bulk phases (reconciler/heap.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from reconciler.heap import gc_paused


@pytest.fixture(autouse=True)
def _collector() -> Iterator[None]:
    """Each test starts with the collector on and nothing frozen, and leaves it so."""
    gc.enable()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.enable()


def test_a_pause_turns_the_collector_off_and_back_on_freezing_nothing() -> None:
    with gc_paused():
        assert not gc.isenabled()
        kept = [{"n": i} for i in range(1000)]
    assert gc.isenabled() and gc.get_freeze_count() == 0 and len(kept) == 1000


def test_a_frozen_pause_moves_what_it_built_out_of_the_collectors_rescans() -> None:
    with gc_paused(freeze=True):
        kept = [{"n": i} for i in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(kept)  # the dicts (and the list) are in the permanent generation


def test_a_nested_pause_leaves_the_collector_to_the_outer_one() -> None:
    with gc_paused():
        with gc_paused(freeze=True):
            pass
        assert not gc.isenabled() and gc.get_freeze_count() == 0  # the inner one neither enabled nor froze
    assert gc.isenabled()
