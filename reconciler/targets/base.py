"""The Target interface: where manifests become live. Two implement it — `kubernetes` (a real
cluster) and `local` (this machine) — and the planner and applier see only this."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Mapping, Protocol

from reconciler.resources import ObjectRef


class Target(Protocol):
    """Read what Forge owns, apply, delete, and hold the environment's lock."""

    name: str
    """`kubernetes` or `local`."""

    def read_live(self) -> list[dict[str, Any]]:
        """Every live object Forge owns in this environment (one LIST per kind)."""
        ...

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply ``obj`` (field manager `forgectl`); return the object as stored."""
        ...

    def delete(self, ref: ObjectRef, *, uid: str | None = None) -> None:
        """Delete one object (only if its uid still matches, when given)."""
        ...

    def rollout_states(self, live: list[dict[str, Any]]) -> dict[str, Any]:
        """Endpoint → saved rollout state (where the target keeps it), so a plan does not
        re-add a canary that was rolled back."""
        ...

    def lock(self, holder: str) -> AbstractContextManager[None]:
        """Hold the environment's lock for the duration of an apply."""
        ...
