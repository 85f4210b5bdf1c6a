"""Apply a Plan to a Target: in dependency order, skipping no-ops, independent objects of one
wave written concurrently (bounded), returning a typed change set.

A failure part-way raises :class:`ApplyFailed` carrying what was applied and what was not; a rerun
plans again from the live state and converges.

Each write carries what the plan read, for the target to enforce as it stores it: an update the
`resourceVersion` it was planned against, a create that the object must not exist
(:class:`~reconciler.targets.base.Precondition`) — a write based on a read that went stale is
refused (:class:`~reconciler.errors.ConflictError`) — unless, read again, the object would still
change exactly as the plan showed (:func:`as_planned_now`: another writer touched only what Forge
does not render, such as an operator's status). A lost environment Lease
(:class:`~reconciler.errors.LeaseLost`: the target checks it before each write) stops the apply at
once: nothing more is attempted, not even the rest of the wave, and it is raised as such.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from reconciler.changeset import ChangeSet, ChangeSetEntry, Outcome
from reconciler.errors import ApplyFailed, ConflictError, LeaseLost, TargetError
from reconciler.plan.diff import field_diff
from reconciler.plan.plan import Action, Change, Plan
from reconciler.targets.base import Precondition, Target
from renderers.bundle import sort_key

_OUTCOME = {Action.CREATE: Outcome.CREATED, Action.UPDATE: Outcome.CONFIGURED, Action.DELETE: Outcome.DELETED}

def waves(changes: Sequence[Change]) -> list[list[int]]:
    """The plan's changes (indices) cut into waves that may each be applied all at once.

    The plan is already in dependency order (kinds in apply order, a distillation teacher's
    Workflow before its students', deletions last in reverse): consecutive changes that share a
    kind and a training stage depend on nothing among themselves, so they form one wave. A wave
    starts only when the one before it has finished, which keeps that order.
    """
    out: list[list[int]] = []
    last: tuple[Any, ...] | None = None
    for index, change in enumerate(changes):
        if change.action is Action.NOOP:
            continue
        obj = change.after or change.before or {}
        key = (change.action is Action.DELETE, *sort_key(obj)[:3])
        if key != last:
            out.append([])
            last = key
        out[-1].append(index)
    return out


class _NotAttempted:
    """What :func:`_attempt` returns for a change it did not write (the Lease was lost)."""


NOT_ATTEMPTED = _NotAttempted()


def precondition_of(change: Change) -> Precondition | None:
    """What the plan read of the object, for the target to enforce: absent for a create, the
    resourceVersion it was compared with for an update."""
    if change.action is Action.CREATE:
        return Precondition(absent=True)
    if change.action is Action.UPDATE and change.live_version:
        return Precondition(resource_version=change.live_version)
    return None


def as_planned_now(change: Change, target: Target) -> Precondition | None:
    """For an update the target refused as stale: a precondition at the object's new
    resourceVersion when, read again, applying it would still change exactly the fields the plan
    showed, from the same values; None when not (then the plan no longer holds: plan again).

    Operators write their objects' status right after Forge's writes (Seldon's operator, for a
    while after a promotion), which moves the resourceVersion without touching anything Forge
    renders; refusing such a write would fail applies at random while the plan shown is still
    exactly what gets written."""
    if change.action is not Action.UPDATE or change.after is None or not change.diff:
        return None
    live = next(iter(target.read_whole([change.ref])), None)
    version = (live or {}).get("metadata", {}).get("resourceVersion")
    if live is None or not version or version == change.live_version:
        return None
    if tuple(field_diff(change.after, live)) != change.diff:
        return None
    return Precondition(resource_version=version)


def _attempt(change: Change, target: Target, lost: threading.Event) -> TargetError | _NotAttempted | None:
    """Write one change; the target's error, if any, is returned (not raised) so that the rest
    of its wave still finishes — unless the Lease is lost (``lost``): then nothing more is written."""
    if lost.is_set():
        return NOT_ATTEMPTED
    try:
        if change.action is Action.DELETE:
            uid = (change.before or {}).get("metadata", {}).get("uid")
            target.delete(change.ref, uid=uid)
        else:
            assert change.after is not None
            try:
                target.apply(change.after, precondition=precondition_of(change))
            except ConflictError:
                again = as_planned_now(change, target)
                if again is None:
                    raise
                target.apply(change.after, precondition=again)
    except LeaseLost as exc:
        lost.set()
        return exc
    except TargetError as exc:
        return exc
    return None


def apply_plan(plan: Plan, target: Target, *, progress: Callable[[Change, Outcome], None] | None = None,
               parallelism: int | None = None) -> ChangeSet:
    """Make the plan's changes on ``target``: wave after wave (see :func:`waves`), up to
    ``parallelism`` objects at once within a wave (default: the target's ``apply_parallelism``).

    Every object's outcome is recorded in the plan's order. When objects of a wave fail, the rest
    of that wave still finishes (its writes are independent), later waves are not attempted, and
    :class:`ApplyFailed` names every failed object with its error. A lost Lease stops it at once
    and is raised as :class:`LeaseLost`, saying what was written before.
    """
    width = max(1, parallelism or target.apply_parallelism)
    changes = plan.changes
    outcomes: dict[int, ChangeSetEntry] = {}
    errors: dict[int, TargetError] = {}
    lost = threading.Event()
    pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="forge-apply") if width > 1 else None
    try:
        for wave in waves(changes):
            if errors:
                break
            # Lazily: each object is reported (``progress``) as it finishes, not once its wave has.
            if pool is None or len(wave) == 1:
                results = ((i, _attempt(changes[i], target, lost)) for i in wave)
            else:
                futures = {pool.submit(_attempt, changes[i], target, lost): i for i in wave}
                results = ((futures[f], f.result()) for f in as_completed(futures))
            for index, error in results:  # reported from this thread, as each object finishes
                change = changes[index]
                if isinstance(error, _NotAttempted):
                    continue
                if error is not None:
                    outcomes[index] = ChangeSetEntry(change.ref, Outcome.FAILED, str(error))
                    errors[index] = error
                    continue
                outcome = _OUTCOME[change.action]
                outcomes[index] = ChangeSetEntry(change.ref, outcome)
                if progress:
                    progress(change, outcome)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    changeset = ChangeSet()
    for index, change in enumerate(changes):
        entry = outcomes.get(index)
        if entry is None:
            entry = ChangeSetEntry(change.ref, Outcome.UNCHANGED if change.action is Action.NOOP else Outcome.NOT_ATTEMPTED)
        changeset.entries.append(entry)
    done = changeset.count(Outcome.CREATED) + changeset.count(Outcome.CONFIGURED) + changeset.count(Outcome.DELETED)
    lease = next((e for e in errors.values() if isinstance(e, LeaseLost)), None)
    if lease is not None:
        raise LeaseLost(f"{lease}\n  {done} change(s) were applied before, {changeset.count(Outcome.NOT_ATTEMPTED)} not "
                        f"attempted, nothing written after the Lease was lost", status=lease.status, ref=lease.ref) from lease
    if errors:
        failed = sorted(errors)
        first = changes[failed[0]]
        others = "".join(f"\n  also failed: {changes[i].ref}: {outcomes[i].error}" for i in failed[1:])
        raise ApplyFailed(
            f"apply stopped at {first.ref}: {outcomes[failed[0]].error}{others}\n  {done} change(s) were applied, "
            f"{changeset.count(Outcome.NOT_ATTEMPTED)} not attempted; run `forgectl apply` again to converge",
            changeset,
        ) from errors[failed[0]]
    return changeset
