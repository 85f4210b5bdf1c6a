"""The Target interface: where manifests become live. Two implement it — `kubernetes` (a real
cluster) and `local` (this machine) — and the planner, the applier, the rollout commands and
`forgectl status` see only this.

Everything a target does is declared here: read what is live, apply and delete (prune), hold the
environment's lock, what it records of its runs (status), logs, the address of an endpoint, the
rollout state (read through ``rollout_states``, read and written through ``rollout_backend``), its
own metrics source, the steps it runs here (``follow_steps``), the cluster API it reads for the
prerequisite checks (``cluster_api``), and teardown. A capability a target does not have is
answered, not left out: an empty record, False, None, or a
:class:`~reconciler.errors.TargetNotAvailable` that says what to use instead, so a caller never
asks which target it holds (and `forgectl` never branches on the Environment's `target`: a layer
rule, tests/foundation/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from reconciler.registry.records import Record
from reconciler.resources import ObjectRef, Resource
from reconciler.rollout.controller import Backend, RolloutState
from specs import Environment, SpecSet


@dataclass(frozen=True)
class StepRun:
    """One step of a workflow run, as the target recorded it (`forgectl status` shows it)."""

    step: str
    status: str
    attempts: int | None
    started: float | None
    finished: float | None
    exit_code: int | None
    message: str | None


@dataclass(frozen=True)
class WorkflowRun:
    """One workflow run: its phase (`Running`, `Succeeded`, `Failed`) and last message."""

    name: str
    phase: str
    message: str | None


@dataclass(frozen=True)
class RunDetails:
    """What a target records beyond its live objects, for `forgectl status`. A cluster's steps
    are in its Workflows' status; the rest it keeps in its own tools (Argo's UI, `kubectl logs`)."""

    #: Workflow name → its steps, for the live Workflows the target ran itself.
    steps: Mapping[str, list[StepRun]] = field(default_factory=dict)
    #: Runs in progress whose Workflow is not live yet (the local target makes it live at the end).
    running: list[WorkflowRun] = field(default_factory=list)
    #: Registered model versions: `{model, version, variants, evaluation[, privacy]}` each.
    models: list[dict[str, Any]] = field(default_factory=list)
    #: Endpoint → the address the target serves it at (None while not served), for the endpoints
    #: whose address the target knows; absent endpoints have none to show.
    endpoint_urls: Mapping[str, str | None] = field(default_factory=dict)


class RolloutBackend(Backend, Protocol):
    """The rollout controller's view of a target (:class:`reconciler.rollout.controller.Backend`: serving,
    rollout state read/write, offline gate, events) and what the rollout commands read of it."""

    def refresh(self) -> None:
        """Read the target once per controller pass (a cluster: one LIST per kind)."""
        ...

    def stable_revision(self, model: str, version: str) -> str | None:
        """The git revision the version's Workflow was rendered from (the write-back needs it)."""
        ...

    def shadow_stats(self, endpoint: str) -> dict[str, Any] | None:
        """The mirror figures of the endpoint's shadow (agreement, distance, latency), where the
        target measures them; None elsewhere."""
        ...


class ClusterAPI(Protocol):
    """Read-only access to a cluster's API beyond the objects Forge owns: discovery and
    cluster-scoped objects (what `forgectl doctor` and the plan's prerequisite notes check)."""

    def read_path(self, path: str, *, what: str) -> Any | None:
        """GET an API path; None on 404. A 403 raises :class:`~reconciler.errors.ForbiddenError`,
        so a caller can tell "absent" from "not allowed" (``what`` names it in errors)."""
        ...


#: A callback for the events of the workflow steps a target runs (`{"event": "step", …}`).
StepEvents = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Precondition:
    """What a write requires of the object's live state, enforced where the object is stored (by
    the API server for a cluster), so a write based on what was read cannot land on something that
    changed since: ``absent`` — create only, refused when the object exists; ``resource_version``
    — the version that was read, refused once the object moved on (HTTP 409,
    :class:`~reconciler.errors.ConflictError`)."""

    absent: bool = False
    resource_version: str | None = None


@dataclass(frozen=True)
class LeaseTiming:
    """How a target's lock is held where it is a Lease (client-go's leader election names the same
    three): others may take it ``duration`` seconds after its last renewal; the holder renews every
    ``renew`` seconds and stops writing ``margin`` seconds before the duration runs out as the
    server last confirmed it (so ``duration - margin`` is client-go's renew deadline)."""

    duration: float
    renew: float
    margin: float


class ControllerAPI(Protocol):
    """What the in-cluster controller (reconciler/controller/) writes besides the objects it
    applies: its own status objects and their Events, in any namespace; and what `forgectl
    install`/`uninstall` write: the controller's own objects. Fenced like every write of the
    target while its lock is held."""

    def apply_object(self, resource: Resource, obj: Mapping[str, Any], *, manager: str,
                     subresource: str | None = None, dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply ``obj`` (forced, field manager ``manager``), or its ``subresource``
        (`status`); the object as stored (as it would be, with ``dry_run``: nothing written)."""
        ...

    def delete_object(self, resource: Resource, namespace: str, name: str, *, uid: str | None = None) -> bool:
        """Delete one object (while its uid is ``uid``, when given); False when it was not there."""
        ...

    def create_object(self, resource: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` into its own namespace (an Event)."""
        ...

    def get_object(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """One object, or None."""
        ...


class PodAPI(Protocol):
    """One-off pods in the environment's namespace, each answering by its log (what `forgectl
    labels` runs on a cluster: renderers/labelpods.py): create, watch, read the log, delete."""

    namespace: str

    def create_object(self, resource: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` into its own namespace; the object as stored (its uid)."""
        ...

    def get_object(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """One object, or None."""
        ...

    def delete_object(self, resource: Resource, namespace: str, name: str, *, uid: str | None = None) -> bool:
        """Delete one object; False when it was not there."""
        ...

    def read_log(self, pod: str) -> str:
        """The log of the one container of ``pod`` in :attr:`namespace`."""
        ...


class Fence(Protocol):
    """The environment's lock as its holder sees it while writing: whether it is still held and
    until when it surely is. Every write of a target that holds its lock checks it just before it
    is sent; the :class:`Precondition` of the write covers the moment between check and arrival."""

    @property
    def held(self) -> bool:
        """Whether the lock is still this writer's."""
        ...

    @property
    def deadline(self) -> float | None:
        """The ``time.monotonic()`` after which nothing may be sent under this lock, or None where
        it cannot expire while the process lives."""
        ...

    def check(self, what: str) -> None:
        """Raise :class:`~reconciler.errors.LeaseLost` (naming ``what`` was not sent) unless held."""
        ...


@dataclass(frozen=True)
class LiveRead:
    """What a plan reads of the live state first: every object Forge owns, those named in
    ``partial`` as their identity and metadata only (`managedFields` left out), the rest whole."""

    objects: list[dict[str, Any]]
    partial: frozenset[ObjectRef] = frozenset()


class Target(Protocol):
    """Everything a target does (see module docstring)."""

    name: str
    """`kubernetes` or `local`."""
    environment: str
    """The Environment's name."""
    namespace: str
    """The namespace its objects live in."""
    apply_parallelism: int
    """How many objects of one apply wave it takes at once (1: one after another)."""

    def read_live(self) -> list[dict[str, Any]]:
        """Every live object Forge owns in this environment (one LIST per kind)."""
        ...

    def read_live_metadata(self, whole: Collection[str]) -> LiveRead:
        """Every live object Forge owns, the kinds in ``whole`` whole and, where the target has a
        cheaper read of metadata alone, the others as metadata only (named in ``partial``). A
        target without one answers :meth:`read_live` with nothing partial."""
        ...

    def read_whole(self, refs: Collection[ObjectRef]) -> list[dict[str, Any]]:
        """These live objects whole; one gone since is left out."""
        ...

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False,
              precondition: Precondition | None = None) -> dict[str, Any]:
        """Server-side apply ``obj`` (field manager `forgectl`); return the object as stored. A
        write that ``precondition`` refuses raises :class:`~reconciler.errors.ConflictError`;
        one sent while this target's lock is lost raises :class:`~reconciler.errors.LeaseLost`."""
        ...

    def delete(self, ref: ObjectRef, *, uid: str | None = None) -> None:
        """Delete one object (only if its uid still matches, when given)."""
        ...

    def lock(self, holder: str | None = None) -> AbstractContextManager[Fence]:
        """Hold the environment's lock for the duration of an apply (``holder`` defaults to
        user@host:pid); a second holder is refused with :class:`~reconciler.errors.LockHeldError`.
        While held, every write of the target is fenced by it (:class:`Fence`)."""
        ...

    def rollout_states(self, live: list[dict[str, Any]]) -> dict[str, RolloutState]:
        """Endpoint → saved rollout state (where the target keeps it), so a plan does not
        re-add a canary that was rolled back."""
        ...

    def rollout_backend(self, specs: SpecSet, env: Environment, revision: str | None) -> RolloutBackend:
        """The rollout controller's backend for this target (``revision``: the specs' git
        revision, recorded on what the backend renders)."""
        ...

    def prometheus_url(self) -> str | None:
        """The metrics source the target runs itself (started on first use), or None when the
        Environment's `prometheus.url` is the only one."""
        ...

    def model_records(self, live: list[dict[str, Any]], model: str | None = None, *,
                      backfill: bool = True) -> list[Record]:
        """The registered model versions the target knows (of one model, or all), oldest first,
        as :func:`reconciler.registry.records.build_record` makes them (without `servedBy`). A target with
        a registry of its own records a version whose Workflow in ``live`` succeeded before it was
        registered, unless ``backfill`` is false (a plan reads, never writes)."""
        ...

    def run_details(self, live: list[dict[str, Any]]) -> RunDetails:
        """What the target records of its runs, models and endpoints (see :class:`RunDetails`)."""
        ...

    def endpoint_url(self, endpoint: str) -> str | None:
        """The address clients reach ``endpoint`` at from this machine (what `forgectl load`
        sends to), or None while it is not served; raises
        :class:`~reconciler.errors.TargetNotAvailable` where clients reach it some other way
        (a cluster's ingress), saying what to use instead."""
        ...

    def follow_steps(self, events: StepEvents) -> bool:
        """Send the events of the workflow steps the target runs on this machine to ``events``
        (`apply`'s progress bars); False where the steps run elsewhere (a cluster's Argo), and
        ``events`` is never called."""
        ...

    def cluster_api(self) -> ClusterAPI | None:
        """The cluster's API for read-only prerequisite checks, or None where there is no
        cluster (the local target)."""
        ...

    def controller_api(self) -> ControllerAPI | None:
        """Where the in-cluster controller writes its status objects and Events, or None where
        there is no cluster (the local target)."""
        ...

    def watching(self, resources: Collection[Resource]) -> AbstractContextManager[None]:
        """While inside, the rollout backend reads ``resources`` from caches its watches keep
        rather than a LIST each pass (the in-cluster controller, as leader); a target whose reads
        cost little keeps reading them as it does."""
        ...

    def pod_api(self) -> PodAPI | None:
        """Where one-off pods run (reading and writing the claims of the cluster), or None where
        there is no cluster (the local target: :meth:`workspace_files` reads its workspace)."""
        ...

    def workspace_files(self, folder: str) -> dict[str, bytes] | None:
        """The files of a workspace folder (not its sub-folders), by name, where the workspace is
        on this machine (the local target); None where it is a claim of a cluster (read it by a pod,
        :meth:`pod_api`) or the folder does not exist."""
        ...

    def log_files(self, name: str) -> list[Path]:
        """Log files of a step (`WORKFLOW/STEP` or `STEP`), a workflow, or an endpoint's servers;
        raises :class:`~reconciler.errors.TargetNotAvailable` where logs live elsewhere."""
        ...

    def down(self) -> list[str] | None:
        """Stop every process the target started for the environment on this machine and forget
        what they served; the stopped processes, named. None where nothing runs on this machine:
        there `forgectl down` deletes what Forge owns instead, as a plan shown and confirmed first
        (:func:`reconciler.plan.live.teardown_plan`)."""
        ...
