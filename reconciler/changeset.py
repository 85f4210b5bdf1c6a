"""What an apply did: every object's outcome, in the order it was handled (Flux's `ssa.ChangeSet`).

A ground-floor value beside :mod:`reconciler.resources`: :class:`reconciler.errors.ApplyFailed`
carries one, and the errors sit below every room, so the type cannot live with the applier
(:mod:`reconciler.plan.apply`, which builds it and re-exports these names).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from reconciler.resources import ObjectRef


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
