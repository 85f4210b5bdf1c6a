"""apply_plan: waves in dependency order, bounded concurrency inside a wave, per-object errors."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from reconciler.errors import ApplyFailed, ConflictError, LeaseLost
from reconciler.plan.apply import Outcome, apply_plan, waves
from reconciler.plan.plan import Action, Change, Plan
from reconciler.resources import ObjectRef
from reconciler.targets.base import Precondition


def obj(kind: str, name: str, api: str = "v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": "ns"}}


def change(kind: str, name: str, action: Action = Action.CREATE, api: str = "v1") -> Change:
    o = obj(kind, name, api)
    before = o if action in (Action.DELETE, Action.NOOP) else None
    after = None if action is Action.DELETE else o
    return Change(ObjectRef.of(o), action, before, after)


def plan_of(*changes: Change) -> Plan:
    return Plan("env", "kubernetes", tuple(changes), "fp", None)


#: How long a group of writes that must meet waits for its last member: only a broken applier waits it out.
MEET_TIMEOUT = 30.0


class FakeTarget:
    """Records what was written, how many writes overlapped, and fails the names it is told to.

    ``meet=(prefix, n)``: the writes of names starting with ``prefix`` wait for each other in groups
    of ``n`` (a cyclic barrier) before they finish, so that ``n`` of them are in flight together for
    certain — not because a sleep happened to be long enough on a loaded machine. A group that never
    fills (an applier that writes fewer at once) breaks the barrier after MEET_TIMEOUT s, and that
    write fails with BrokenBarrierError."""

    name = "fake"

    def __init__(self, parallelism: int, fail: frozenset[str] = frozenset(), meet: tuple[str, int] | None = None,
                 lose_lease_after: int | None = None) -> None:
        self.apply_parallelism = parallelism
        self.fail = fail
        #: After this many writes the Lease is lost: every later write is refused before it is sent,
        #: as the kubernetes target's fence refuses it.
        self.lose_lease_after = lose_lease_after
        self.asked: list[str] = []
        self.preconditions: dict[str, Precondition | None] = {}
        self.meet_prefix, parties = meet or ("", 0)
        self.barrier = threading.Barrier(parties, timeout=MEET_TIMEOUT) if parties else None
        self.written: list[str] = []
        self.in_flight = self.peak = 0
        self._lock = threading.Lock()

    def _write(self, name: str) -> None:
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            if self.barrier is not None and name.startswith(self.meet_prefix):
                self.barrier.wait()
            if name in self.fail:
                raise ConflictError(f"{name}: refused")
            with self._lock:
                self.written.append(name)
        finally:
            with self._lock:
                self.in_flight -= 1

    def apply(self, o: dict[str, Any], *, dry_run: bool = False, precondition: Precondition | None = None) -> dict[str, Any]:
        name = o["metadata"]["name"]
        with self._lock:
            self.asked.append(name)
            self.preconditions[name] = precondition
            if self.lose_lease_after is not None and len(self.written) >= self.lose_lease_after:
                raise LeaseLost(f"patch {name}: not sent: the Lease is no longer held by alice (taken over by bob)")
        self._write(name)
        return o

    def delete(self, ref: ObjectRef, *, uid: str | None = None) -> None:
        self._write(ref.name)


WF = "argoproj.io/v1alpha1"


def test_waves_follow_kind_and_keep_deletions_apart() -> None:
    changes = [change("ServiceAccount", "a"), change("Workflow", "w1", api=WF), change("Workflow", "w2", api=WF),
               change("ConfigMap", "c", Action.NOOP), change("ConfigMap", "d"), change("ConfigMap", "old", Action.DELETE)]
    assert waves(changes) == [[0], [1, 2], [4], [5]]


def test_a_wave_is_written_concurrently_within_the_bound_and_in_order_across_waves() -> None:
    sa = [change("ServiceAccount", f"sa-{i}") for i in range(3)]
    wfs = [change("Workflow", f"wf-{i}", api=WF) for i in range(12)]
    target = FakeTarget(parallelism=4, meet=("wf-", 4))  # the 12 Workflows finish 4 by 4, together
    result = apply_plan(plan_of(*sa, *wfs), target)
    assert result.count(Outcome.CREATED) == 15  # every group of 4 met: 4 were in flight at once, three times
    assert target.peak == 4  # bounded, and really concurrent
    assert set(target.written[:3]) == {"sa-0", "sa-1", "sa-2"}  # the first wave finished before the second
    assert [e.ref.name for e in result.entries] == [c.ref.name for c in (*sa, *wfs)]  # the plan's order


def test_one_at_a_time_unless_the_target_says_otherwise() -> None:
    target = FakeTarget(parallelism=1)
    apply_plan(plan_of(*[change("Workflow", f"wf-{i}", api=WF) for i in range(5)]), target)
    assert target.peak == 1


def test_failures_in_a_wave_are_all_named_and_later_waves_are_not_attempted() -> None:
    wfs = [change("Workflow", f"wf-{i}", api=WF) for i in range(6)]
    later = change("SeldonDeployment", "sd", api="machinelearning.seldon.io/v1")
    target = FakeTarget(parallelism=3, fail=frozenset({"wf-1", "wf-4"}))
    with pytest.raises(ApplyFailed) as err:
        apply_plan(plan_of(*wfs, later), target)
    cs = err.value.changeset
    assert cs.count(Outcome.FAILED) == 2 and cs.count(Outcome.CREATED) == 4  # the rest of the wave finished
    assert cs.count(Outcome.NOT_ATTEMPTED) == 1 and "sd" not in target.written
    message = str(err.value)
    assert "wf-1" in message and "wf-4: refused" in message
    assert isinstance(err.value.__cause__, ConflictError)


def test_each_write_carries_what_the_plan_read() -> None:
    """A create is create-only, an update is at the resourceVersion the plan compared with: the
    target refuses either once the object moved (the API server enforces both: test_lease.py)."""
    new = change("ConfigMap", "new")
    o = obj("ConfigMap", "old")
    updated = Change(ObjectRef.of(o), Action.UPDATE, {**o, "metadata": {**o["metadata"], "resourceVersion": "41"}}, o,
                     live_version="41")
    target = FakeTarget(parallelism=1)
    apply_plan(plan_of(new, updated), target)
    assert target.preconditions == {"new": Precondition(absent=True), "old": Precondition(resource_version="41")}


def test_a_lost_lease_stops_the_apply_at_once() -> None:
    """Two writes, then the Lease is lost: the third is refused before it is sent, the rest of its
    wave and every later wave are never attempted, and the error is LeaseLost itself."""
    wfs = [change("Workflow", f"wf-{i}", api=WF) for i in range(5)]
    later = change("SeldonDeployment", "sd", api="machinelearning.seldon.io/v1")
    target = FakeTarget(parallelism=1, lose_lease_after=2)
    with pytest.raises(LeaseLost) as err:
        apply_plan(plan_of(*wfs, later), target)
    assert target.written == ["wf-0", "wf-1"] and target.asked == ["wf-0", "wf-1", "wf-2"]
    message = str(err.value)
    assert "taken over by bob" in message and "2 change(s) were applied before, 3 not attempted" in message
    assert isinstance(err.value.__cause__, LeaseLost)
