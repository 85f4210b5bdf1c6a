"""One sync of one git source: the revision fetched is loaded, planned and applied through exactly
the path `forgectl apply --rev REV` takes (`load` → `plan.review.reviewed_live_plan` →
`plan.live.ensure_runnable` → `plan.apply.apply_plan`), on a target whose environment Lease the
caller holds. An invalid revision is not applied: nothing is written to the environment, and the
outcome names file:line.

The specs are read from the source's cache repository as any revision is
(:mod:`reconciler.load.gitrepo`: blobs by id, nothing checked out, nothing in them executed), with
the working directory set to that repository while they are loaded and planned: the loader and the
planner read the repository of the working directory, as the CLI's do. The controller runs one
sync at a time, so the process-wide working directory is this sync's alone (:func:`inside`).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from reconciler.controller.config import Source
from reconciler.diagnostics import ForgeError, SpecError
from reconciler.errors import ApplyFailed, LeaseLost, TargetError
from reconciler.load.endpoints import DesiredEndpoint, desired_endpoints
from reconciler.load.loader import LoadResult, load
from reconciler.plan.apply import apply_plan
from reconciler.plan.live import ensure_runnable
from reconciler.plan.review import reviewed_live_plan
from reconciler.targets.base import Target
from specs import Environment

#: Diagnostics quoted in a status message (the rest are counted).
QUOTED = 5
_cwd_guard = threading.Lock()


@contextmanager
def inside(folder: Path) -> Iterator[None]:
    """Run the block with ``folder`` as the working directory (one block at a time)."""
    with _cwd_guard:
        before = os.getcwd()
        os.chdir(folder)
        try:
            yield
        finally:
            os.chdir(before)


@dataclass(frozen=True)
class Loaded:
    """A revision's specs and the environment the source applies them to."""

    revision: str
    result: LoadResult
    environment: Environment

    @functools.cached_property
    def endpoints(self) -> list[DesiredEndpoint]:
        """Each Endpoint with the model version its specs want and its policy: the revision's alone
        (model versions are digests of specs), so computed once, not at every walk of the rollouts."""
        return desired_endpoints(self.result.specs, self.environment)


@dataclass(frozen=True)
class Outcome:
    """What one sync did: ``reason`` is a Sync status reason (:mod:`.syncstatus`)."""

    reason: str
    message: str
    revision: str
    loaded: Loaded | None = None
    summary: dict[str, int] | None = None

    @property
    def applied(self) -> bool:
        return self.reason == "Succeeded"


def diagnostics_message(error: SpecError, revision: str) -> str:
    """The first diagnostics as `file:line:col: message` lines, for a status and an Event."""
    lines = [d.text().split("\n")[0] for d in error.diagnostics[:QUOTED]]
    more = len(error.diagnostics) - QUOTED
    tail = f"\n(and {more} more)" if more > 0 else ""
    return f"revision {revision[:12]} not applied: {len(error.diagnostics)} problem(s) in the specs:\n" + "\n".join(lines) + tail


def load_revision(source: Source, cache: Path, revision: str) -> Loaded:
    """The specs under the source's path at ``revision`` of the cache repository, and the
    Environment the source names. :class:`SpecError` (file:line) or :class:`ForgeError`."""
    with inside(cache):
        result = load([source.path], revision)
    if not result.ok:
        raise SpecError(result.diagnostics)
    environment = result.specs.environment(source.environment)
    if environment is None or environment.name != source.environment:
        raise ForgeError(f"revision {revision[:12]}: no Environment {source.environment!r} under {source.path!r} "
                         "(the source's `environment`)")
    return Loaded(revision, result, environment)


def apply_revision(source: Source, cache: Path, loaded: Loaded, target: Target, *, refresh: bool = False) -> Outcome:
    """Plan ``loaded`` against what ``target`` has live and apply it, as `forgectl apply` does;
    the caller holds the environment's Lease (``target.lock``), so every write is fenced by it.
    ``refresh``: the full compare (`apply --refresh`: every live object read whole, so an edit made
    outside Forge, which keeps the recorded digest, is found and taken back — what `selfHeal` is).
    A lost Lease is raised (:class:`LeaseLost`): whoever holds it now carries on."""
    revision = loaded.revision
    with inside(cache):
        plan = reviewed_live_plan(loaded.result, loaded.environment, target, source.namespace, revision[:12], rev=revision,
                                  refresh=refresh)
    try:
        ensure_runnable(plan)
    except ForgeError as exc:
        return Outcome("Blocked", f"revision {revision[:12]} not applied: {exc}", revision, loaded)
    try:
        changeset = apply_plan(plan, target)
    except LeaseLost:
        raise
    except (ApplyFailed, TargetError) as exc:
        return Outcome("ApplyFailed", f"revision {revision[:12]}: {exc}", revision, loaded)
    summary = {k: int(v) for k, v in changeset.to_json()["summary"].items()}
    message = (f"applied revision {revision[:12]}: {summary.get('created', 0)} created, {summary.get('configured', 0)} "
               f"configured, {summary.get('deleted', 0)} deleted, {summary.get('unchanged', 0)} unchanged")
    return Outcome("Succeeded", message, revision, loaded, summary)
