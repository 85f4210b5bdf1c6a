"""One object's change in a plan — create, update, delete or no-op — with its identity, before,
after, field-level diff and reasons. A plain value of its own module, so the planner
(`reconciler.plan.plan`) and the code that explains changes (`reasons`, `risks`) share it without
importing each other."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from reconciler.budgets import Spent
from reconciler.plan.diff import FieldChange
from reconciler.resources import ObjectRef
from renderers.labels import KIND, NAME


class Action(str, Enum):
    """What applying a change does to its object."""

    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    NOOP = "no-op"


@dataclass(frozen=True)
class Change:
    """One object's change."""

    ref: ObjectRef
    action: Action
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    diff: tuple[FieldChange, ...] = ()
    reasons: tuple[str, ...] = ()
    live_version: str | None = None

    @property
    def spec(self) -> tuple[str, str]:
        """(kind, name) of the spec this object was rendered from, or ("", "") for shared objects."""
        meta = (self.after or self.before or {}).get("metadata", {})
        labels = meta.get("labels") or {}
        return labels.get(KIND, ""), labels.get(NAME, "")

    def to_json(self, spent: Spent | None = None) -> dict[str, Any]:
        """A plain dict (for saved plans and `--output json`); ``spent``: the plan's budget for
        comparing long values (:func:`reconciler.plan.diff.value_diff`)."""
        return {
            "ref": self.ref.to_json(),
            "action": self.action.value,
            "spec": {"kind": self.spec[0], "name": self.spec[1]},
            "before": self.before,
            "after": self.after,
            "diff": [d.to_json(spent) for d in self.diff],
            "reasons": list(self.reasons),
            "liveVersion": self.live_version,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Change:
        """Inverse of :meth:`to_json`."""
        ref = data["ref"]
        return cls(
            ObjectRef(ref["kind"], ref["namespace"], ref["name"]),
            Action(data["action"]),
            data.get("before"),
            data.get("after"),
            tuple(FieldChange.from_json(d) for d in data.get("diff", [])),
            tuple(data.get("reasons", [])),
            data.get("liveVersion"),
        )
