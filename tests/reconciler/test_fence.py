"""The Lease fence on its own, with a clock moved by hand (the API server's side: test_lease.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from reconciler.errors import LeaseLost, TargetError
from reconciler.targets.kubernetes.lease import LeaseFence
from reconciler.targets.local.target import HeldByProcess


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def stored(duration: int = 30, version: str = "7") -> dict[str, Any]:
    return {"metadata": {"resourceVersion": version}, "spec": {"holderIdentity": "alice", "leaseDurationSeconds": duration}}


def test_the_deadline_is_the_confirmed_duration_from_when_it_was_sent_less_the_margin() -> None:
    clock = Clock()
    fence = LeaseFence("Lease ns/forgectl-e", "alice", margin=5.0, clock=clock)
    assert not fence.held and fence.lost == "not taken yet"  # nothing confirmed yet: not held, not lost either
    fence.confirmed(stored(30), sent_at=90.0)
    assert fence.deadline == 115.0 and fence.held and fence.stored["metadata"]["resourceVersion"] == "7"
    clock.now = 114.9
    fence.check("patch ConfigMap ns/a")  # still held: nothing raised
    fence.confirmed(stored(30, "8"), sent_at=110.0)  # renewed: the deadline moves on
    clock.now = 130.0
    assert fence.held and fence.deadline == 135.0


def test_a_deadline_passed_is_lost_for_good() -> None:
    clock = Clock()
    fence = LeaseFence("Lease ns/forgectl-e", "alice", margin=5.0, clock=clock)
    fence.confirmed(stored(30), sent_at=100.0)
    clock.now = 125.0  # paused past it
    with pytest.raises(LeaseLost, match=r"patch ConfigMap ns/a: not sent: the environment's Lease ns/forgectl-e is no longer held by alice "
                                        r"\(not renewed in time") as err:
        fence.check("patch ConfigMap ns/a")
    assert isinstance(err.value, TargetError)
    fence.confirmed(stored(30, "9"), sent_at=125.0)  # a renewal that would still succeed changes nothing
    assert not fence.held and fence.lost is not None and "not renewed in time" in fence.lost


def test_the_first_reason_it_was_lost_is_kept() -> None:
    fence = LeaseFence("Lease ns/forgectl-e", "alice", margin=5.0, clock=Clock())
    fence.confirmed(stored(30), sent_at=100.0)
    fence.lose("taken over by bob")
    fence.lose("the Lease was deleted")
    with pytest.raises(LeaseLost, match="taken over by bob"):
        fence.check("delete Workflow ns/w")


def test_seen_takes_the_new_version_without_moving_the_deadline() -> None:
    fence = LeaseFence("Lease ns/forgectl-e", "alice", margin=5.0, clock=Clock())
    fence.confirmed(stored(30), sent_at=100.0)
    fence.seen(stored(30, "12"))
    assert fence.stored["metadata"]["resourceVersion"] == "12" and fence.deadline == 125.0


def test_the_local_lock_cannot_be_lost_while_the_process_lives() -> None:
    fence = HeldByProcess()
    assert fence.held and fence.deadline is None
    fence.check("anything")  # never raises
