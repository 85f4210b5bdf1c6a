"""Apply a Plan to a Target: in dependency order, skipping no-ops, returning a typed change set.

A failure part-way raises :class:`ApplyFailed` carrying what was applied and what was not; a rerun
plans again from the live state and converges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from reconciler.errors import ApplyFailed, TargetError
from reconciler.plan import Action, Change, Plan
from reconciler.resources import ObjectRef
from reconciler.targets.base import Target


class Outcome(str, Enum):
    """What happened to one object."""

    CREATED = "created"
    CONFIGURED = "configured"
    UNCHANGED = "unchanged"
    DELETED = "deleted"
    FAILED = "failed"
    NOT_ATTEMPTED = "not attempted"


@dataclass
class ChangeSetEntry:
    """One object's outcome."""

    ref: ObjectRef
    outcome: Outcome
    error: str = ""


@dataclass
class ChangeSet:
    """Every object's outcome, in the order they were handled."""

    entries: list[ChangeSetEntry] = field(default_factory=list)

    def count(self, outcome: Outcome) -> int:
        """How many objects had ``outcome``."""
        return sum(e.outcome is outcome for e in self.entries)

    def to_json(self) -> dict[str, Any]:
        """A plain dict for `--output json`."""
        return {
            "summary": {o.value: self.count(o) for o in Outcome},
            "entries": [{"ref": e.ref.to_json(), "outcome": e.outcome.value, "error": e.error} for e in self.entries],
        }


_OUTCOME = {Action.CREATE: Outcome.CREATED, Action.UPDATE: Outcome.CONFIGURED, Action.DELETE: Outcome.DELETED}


def apply_plan(plan: Plan, target: Target, *, progress: Callable[[Change, Outcome], None] | None = None) -> ChangeSet:
    """Make the plan's changes on ``target`` in the plan's order."""
    changeset = ChangeSet()
    pending = list(plan.changes)
    for index, change in enumerate(pending):
        if change.action is Action.NOOP:
            changeset.entries.append(ChangeSetEntry(change.ref, Outcome.UNCHANGED))
            continue
        try:
            if change.action is Action.DELETE:
                uid = (change.before or {}).get("metadata", {}).get("uid")
                target.delete(change.ref, uid=uid)
            else:
                assert change.after is not None
                target.apply(change.after)
        except TargetError as exc:
            changeset.entries.append(ChangeSetEntry(change.ref, Outcome.FAILED, str(exc)))
            for rest in pending[index + 1 :]:
                outcome = Outcome.UNCHANGED if rest.action is Action.NOOP else Outcome.NOT_ATTEMPTED
                changeset.entries.append(ChangeSetEntry(rest.ref, outcome))
            done = changeset.count(Outcome.CREATED) + changeset.count(Outcome.CONFIGURED) + changeset.count(Outcome.DELETED)
            raise ApplyFailed(
                f"apply stopped at {change.ref}: {exc}\n  {done} change(s) were applied, "
                f"{changeset.count(Outcome.NOT_ATTEMPTED)} not attempted; run `forgectl apply` again to converge",
                changeset,
            ) from exc
        outcome = _OUTCOME[change.action]
        changeset.entries.append(ChangeSetEntry(change.ref, outcome))
        if progress:
            progress(change, outcome)
    return changeset
