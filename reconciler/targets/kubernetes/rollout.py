"""The rollout controller's view of a cluster: serving state and rollout state from each endpoint's
SeldonDeployment (the state is its `forge.dev/rollout` annotation, written with the field
manager `forgectl-rollout`), the offline gate from the model version's Workflow, the canary's
readiness from its pods' `Ready` condition, and Events.

**Fencing.** Only the holder of the environment's Lease walks rollouts
(:mod:`reconciler.controller.leadership`), and its target checks the Lease's fencing deadline
before every request. That leaves the gap between that check and the request's arrival: a holder
paused there (SIGSTOP, a GC pause) past its Lease would land its write after another holder took
over. So every traffic move and rollout-state write is also refused by the API server itself once
it is stale, as Kubernetes controllers do it — optimistic concurrency plus a fencing token:

* each carries the `resourceVersion` of the object as this pass last read it (the
  SeldonDeployment's in its server-side apply or the state's merge patch, the HTTPRoute's in its
  apply): 409 once anyone wrote the object since;
* right before it, the Lease is read again (:meth:`ClusterAccess.confirm_lease`): still ours, in
  the same tenure, `renewTime` + duration not past — or the write is not sent;
* a new holder's first pass stamps its tenure (:class:`~reconciler.targets.kubernetes.lease.FenceToken`:
  the Lease's uid, `leaseTransitions`, holder) on the SeldonDeployment and HTTPRoute of every
  rollout in progress (`forge.dev/rollout-fence`, a fenced merge patch) before it decides anything.
  That write moves their `resourceVersion`s, so a delayed write of the previous holder — which
  carries a version read before the stamp — is refused even where the new holder has nothing to
  move yet. A token of a later tenure of the same Lease found on an object means this holder was
  deposed: it writes nothing more.

A refused write (409) is never sent again as it was: the pass stops, the Lease is read again (a
holder found deposed raises :class:`~reconciler.errors.LeaseLost` and follows from then on), and
the next pass reads the objects again and decides anew. The stamp costs one write per rollout in
progress (two with an HTTPRoute) per change of holder; rollouts at rest are not stamped (a late
write there can only start the rollout the specs ask for, which the new holder reads and carries on).
Writes a controller makes to objects others also write (Seldon's status) can be refused for that
reason too: such a pass is simply taken again.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, NoReturn, Protocol, TypeVar

from reconciler.errors import ConflictError, LeaseLost, TargetError
from reconciler.registry.records import succeeded_gate
from reconciler.resources import BY_KIND, EVENT, POD, ObjectRef, Resource
from reconciler.rollout.controller import ACTIVE, STATE_ANNOTATION, Readiness, RolloutState
from reconciler.targets.base import Precondition, Target
from reconciler.targets.kubernetes.lease import FenceToken
from reconciler.targets.kubernetes.records import records_from_workflows
from reconciler.targets.kubernetes.workflow_status import failure_of
from reconciler.traffic.serving import apply_serving, serving_states
from renderers.gateway import gateway_routing
from renderers.labels import ENDPOINT, MODEL_VERSION, NAME, ROLE, owner_selector
from renderers.seldon import AWAIT_CONTAINER, ServingState
from specs import Endpoint, Environment, SpecSet

ROLLOUT_MANAGER = "forgectl-rollout"
_T = TypeVar("_T")
#: The annotation carrying the tenure of the Lease holder that last fenced the object (its FenceToken).
FENCE_ANNOTATION = "forge.dev/rollout-fence"


def rollout_state_of(obj: dict[str, Any]) -> RolloutState | None:
    """The rollout state stored on a live SeldonDeployment, if any."""
    raw = (obj.get("metadata", {}).get("annotations") or {}).get(STATE_ANNOTATION)
    if not raw:
        return None
    try:
        return RolloutState.from_json(json.loads(raw))
    except (ValueError, TypeError, KeyError):
        return None


def fence_of(obj: Mapping[str, Any]) -> FenceToken | None:
    """The tenure stamped on a live object (None when none is)."""
    return FenceToken.from_text((obj.get("metadata", {}).get("annotations") or {}).get(FENCE_ANNOTATION))


#: How often a rollout state is written before its 409 ends the pass (see :meth:`save_state`).
SAVE_ATTEMPTS = 3


def _rollout_view(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """What only a rollout writes on a SeldonDeployment: its state, its fence and what it serves."""
    annotations = obj.get("metadata", {}).get("annotations") or {}
    return (annotations.get(STATE_ANNOTATION), annotations.get(FENCE_ANNOTATION),
            json.dumps(obj.get("spec", {}).get("predictors"), sort_keys=True))


def as_read(obj: Mapping[str, Any] | None) -> Precondition:
    """The precondition of a write based on ``obj`` as read: its `resourceVersion`, or create-only
    when it was not there."""
    if obj is None:
        return Precondition(absent=True)
    return Precondition(resource_version=obj["metadata"]["resourceVersion"])


class ClusterAccess(Target, Protocol):
    """What the backend needs of the `kubernetes` target beyond the Target protocol (declared here,
    so this module does not import the target that imports it)."""

    def list_kind(self, resource: Resource, selector: str) -> list[dict[str, Any]]:
        """LIST one kind with a label selector."""
        ...

    def list_current(self, resource: Resource, selector: str) -> list[dict[str, Any]]:
        """One kind with a label selector as it stands: a LIST, or a watch-fed cache of one."""
        ...

    def remember(self, obj: dict[str, Any]) -> None:
        """An object as this process wrote it, for the cache :meth:`list_current` may read."""
        ...

    def cache_mark(self, resource: Resource, selector: str) -> int | None:
        """A number that changes whenever what :meth:`list_current` returns for this kind and
        selector does; None when not known (a LIST each time)."""
        ...

    def merge_patch(self, ref: ObjectRef, body: Mapping[str, Any], manager: str, *,
                    resource_version: str | None = None) -> dict[str, Any]:
        """A JSON merge patch under field manager ``manager``, refused (409) unless the object is at
        ``resource_version`` when one is given."""
        ...

    def create(self, resource: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST one object into the target's namespace."""
        ...

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        """GET one object (None when absent): an HTTPRoute's status after a weight move."""
        ...

    @property
    def holder(self) -> str | None:
        """Who holds the environment's Lease through this target now (None outside its lock)."""
        ...

    @property
    def fence_token(self) -> FenceToken | None:
        """The tenure of the Lease held through this target now (None outside its lock)."""
        ...

    def confirm_lease(self, what: str) -> None:
        """Read the held Lease again: :class:`LeaseLost` (``what`` unsent) unless it is still ours."""
        ...


class _FencedWriter:
    """What :func:`~reconciler.traffic.serving.apply_serving` writes one traffic move through: the
    target, each object applied with the precondition of its version as last read
    (``preconditions``), what is stored or read back of each kept in ``seen``."""

    def __init__(self, target: ClusterAccess, preconditions: Mapping[ObjectRef, Precondition]) -> None:
        self.target = target
        self.preconditions = preconditions
        self.seen: dict[ObjectRef, dict[str, Any]] = {}

    @property
    def namespace(self) -> str:
        return self.target.namespace

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        ref = ObjectRef.of(obj)
        stored = self.target.apply(obj, dry_run=dry_run, precondition=None if dry_run else self.preconditions.get(ref))
        self.seen[ref] = stored
        if not dry_run:
            self.target.remember(stored)
        return stored

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        found = self.target.get(ref)
        if found is not None:
            self.seen[ref] = found  # the Gateway's status write moved its resourceVersion
            self.target.remember(found)
        return found


class KubernetesRolloutBackend:
    """Backend of :class:`reconciler.rollout.controller.Controller` for the `kubernetes` target."""

    def __init__(self, target: ClusterAccess, specs: SpecSet, env: Environment, revision: str | None) -> None:
        self.target = target
        self.specs = specs
        self.env = env
        self.revision = revision
        self.deployments: dict[str, dict[str, Any]] = {}
        #: Each endpoint's HTTPRoute as last read (only where one splits its traffic).
        self.routes: dict[str, dict[str, Any]] = {}
        #: Each model version's Workflow read this pass ((model, version) → it, None: none there).
        self.workflows: dict[tuple[str, str], dict[str, Any] | None] = {}
        #: The caches' marks and the Lease tenure of the last refresh that read and fenced them.
        self._refreshed: tuple[Any, ...] | None = None
        self._any_routed: bool | None = None

    def refresh(self) -> None:
        """The SeldonDeployments (and HTTPRoutes, where an Endpoint routes through a Gateway) as
        they stand, once per controller pass — a LIST each, or in the controller their watch-fed
        caches (:meth:`ClusterAccess.list_current`) — the Workflows read afresh as the pass asks for
        them (:meth:`workflow_of`); then, while this target holds the environment's Lease, the
        tenure stamped on every rollout in progress (:meth:`fence`)."""
        selector = owner_selector(self.env.name)
        self.workflows = {}
        # Taken before reading: a change landing meanwhile moves a mark, and the next pass reads again.
        kinds = [BY_KIND["SeldonDeployment"]] + ([BY_KIND["HTTPRoute"]] if self._routed() else [])
        marks = tuple(self.target.cache_mark(kind, selector) for kind in kinds)
        refreshed = (*marks, self.target.fence_token) if None not in marks else None
        if refreshed is not None and refreshed == self._refreshed:
            # The caches hold what the last pass read and fenced (this process's own writes move
            # a mark too): at 10,000 endpoints at rest, rebuilding the same maps was most of a walk.
            return
        self.deployments = {}
        for obj in self.target.list_current(BY_KIND["SeldonDeployment"], selector):
            endpoint = (obj["metadata"].get("labels") or {}).get(ENDPOINT)
            if endpoint:
                self.deployments[endpoint] = obj
        self.routes = {}
        if self._routed():
            for obj in self.target.list_current(BY_KIND["HTTPRoute"], selector):
                endpoint = (obj["metadata"].get("labels") or {}).get(ENDPOINT)
                if endpoint:
                    self.routes[endpoint] = obj
        self._refreshed = None
        self.fence()
        self._refreshed = refreshed

    def _routed(self) -> bool:
        """Whether an Endpoint of these specs routes through a Gateway (its HTTPRoutes are read)."""
        if self._any_routed is None:
            self._any_routed = any(gateway_routing(e, self.env) is not None for e in self.specs.of(Endpoint))
        return self._any_routed

    def observed(self, endpoint: str) -> object | None:
        """What :meth:`serving` and :meth:`load_state` read of ``endpoint``: its SeldonDeployment
        as last refreshed. Equal to what an earlier call returned only if both would answer the
        same (the rollout walk skips an endpoint at rest whose inputs are unchanged)."""
        return self.deployments.get(endpoint)

    def workflow_of(self, model: str, version: str) -> dict[str, Any] | None:
        """The Workflow of ``version`` of ``model``, as this pass first asked for it: a LIST by its
        labels, so a pass reads the Workflows of the versions its rollouts wait for (those in their
        offline gate, a write-back's stable one), not every Workflow of the environment — at
        thousands of endpoints at rest, a LIST of all of them was most of each pass's time."""
        key = (model, version)
        if key not in self.workflows:
            selector = f"{owner_selector(self.env.name)},{NAME}={model},{MODEL_VERSION}={version}"
            self.workflows[key] = next((wf for wf in self.target.list_kind(BY_KIND["Workflow"], selector)
                                        if (labels := wf["metadata"].get("labels") or {}).get(NAME) == model
                                        and labels.get(MODEL_VERSION) == version), None)
        return self.workflows[key]

    def fence(self) -> None:
        """Stamp this holder's tenure on each rollout in progress not stamped with it yet (see the
        module docstring): the first pass of a new holder moves their `resourceVersion`s before it
        decides anything. Nothing outside the Lease (a follower's pass, `rollout status`)."""
        token = self.target.fence_token
        if token is None:
            return
        for endpoint, obj in sorted(self.deployments.items()):
            state = rollout_state_of(obj)
            if state is None or state.phase not in ACTIVE:
                continue
            for objects in (self.deployments, self.routes):
                current = objects.get(endpoint)
                if current is None:
                    continue
                stamped = fence_of(current)
                if stamped == token:
                    continue
                ref = ObjectRef.of(current)
                if stamped is not None and stamped.supersedes(token):
                    raise LeaseLost(f"{ref} is fenced by {stamped.holder} (leaseTransitions {stamped.transitions}), a "
                                    f"later holder of the environment's Lease than this one ({token.transitions}): "
                                    "deposed, nothing written", ref=ref)
                objects[endpoint] = self._stamp(ref, current["metadata"]["resourceVersion"], token)

    def _stamp(self, ref: ObjectRef, version: str, token: FenceToken) -> dict[str, Any]:
        """Stamp ``token`` on ``ref`` if it is still at ``version``; the object as stored."""
        body = {"metadata": {"annotations": {FENCE_ANNOTATION: token.to_text()}}}
        stored = self._fenced_write(f"the fence on {ref}", lambda: self.target.merge_patch(
            ref, body, ROLLOUT_MANAGER, resource_version=version))
        self.target.remember(stored)
        return stored

    def serving(self, endpoint: str) -> ServingState | None:
        """What the endpoint's SeldonDeployment (as of the last refresh) serves."""
        obj = self.deployments.get(endpoint)
        return serving_states([obj]).get(endpoint) if obj else None

    def load_state(self, endpoint: str) -> RolloutState | None:
        """The state in the `forge.dev/rollout` annotation."""
        obj = self.deployments.get(endpoint)
        return rollout_state_of(obj) if obj else None

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        """Write the annotation alone, under its own field manager (a merge patch, so the
        SeldonDeployment's fields owned by `forgectl` are not touched), at the SeldonDeployment's
        `resourceVersion` as last read and with this holder's tenure (see the module docstring)."""
        current = self.deployments[endpoint]
        ref = ObjectRef("SeldonDeployment", self.target.namespace, current["metadata"]["name"])
        annotations = {STATE_ANNOTATION: json.dumps(state.to_json(), separators=(",", ":"))}
        token = self.target.fence_token
        if token is not None:
            annotations[FENCE_ANNOTATION] = token.to_text()
        body = {"metadata": {"annotations": annotations}}
        for attempt in range(1, SAVE_ATTEMPTS + 1):
            write = functools.partial(self.target.merge_patch, ref, body, ROLLOUT_MANAGER,
                                      resource_version=current["metadata"]["resourceVersion"])
            try:
                stored = self._fenced_write(f"the rollout state on {ref}", write)
                break
            except ConflictError:
                # Seldon's operator writes the SeldonDeployment's status after each traffic move,
                # which moves its resourceVersion too: the state of a move that landed would be
                # refused, and the next pass would find the traffic moved with no record of why.
                # Saved again at the new version only when no one else wrote what a rollout owns
                # (its state, its fence, what it serves); a new holder's stamp changes the fence.
                latest = self.target.get(ref)
                if attempt == SAVE_ATTEMPTS or latest is None or _rollout_view(latest) != _rollout_view(current):
                    raise
                current = latest
        if stored:
            self.deployments[endpoint] = stored
            self.target.remember(stored)

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        """Move the endpoint's traffic (see :func:`reconciler.traffic.serving.apply_serving`; with an
        HTTPRoute, the move counts once the Gateway reports it admitted, read back with GET): the
        SeldonDeployment and the HTTPRoute each applied at its `resourceVersion` as last read."""
        name = endpoint.name
        deployment = ObjectRef("SeldonDeployment", self.target.namespace, name)
        route = ObjectRef("HTTPRoute", self.target.namespace, name)
        writer = _FencedWriter(self.target, {deployment: as_read(self.deployments.get(name)),
                                             route: as_read(self.routes.get(name))})
        try:
            self._fenced_write(f"the traffic of {deployment}", lambda: apply_serving(
                writer, self.specs, self.env, self.revision, endpoint, state, current=self.serving(name),
                read_back=writer.get))
        finally:  # what was written stays known, though the move stopped half-way
            if deployment in writer.seen:
                self.deployments[name] = writer.seen[deployment]
            if route in writer.seen:
                self.routes[name] = writer.seen[route]

    def _fenced_write(self, what: str, write: Callable[[], _T]) -> _T:
        """Confirm the Lease, then ``write`` (whose requests carry their preconditions). A write the
        API server refuses as stale (409) is not sent again: the Lease is read once more — deposed,
        :class:`LeaseLost` — and otherwise the :class:`ConflictError` ends the pass, whose next one
        reads the objects again and decides anew."""
        self.target.confirm_lease(what)
        try:
            return write()
        except ConflictError as exc:
            self._refused(what, exc)

    def _refused(self, what: str, conflict: ConflictError) -> NoReturn:
        # the API server's own words (the target wraps them in what the precondition was)
        server = conflict.__cause__ if isinstance(conflict.__cause__, ConflictError) else conflict
        try:
            self.target.confirm_lease(f"{what} (after a 409)")
        except LeaseLost as lost:
            raise LeaseLost(f"{what}: refused by the API server as stale (409: {server}); then {lost}",
                            status=409, ref=conflict.ref) from conflict
        raise ConflictError(f"{what}: refused by the API server as stale (409: {server}); not sent again: the next "
                            "pass reads the objects again and decides anew", status=409, ref=conflict.ref) from conflict

    def model_gate(self, model: str, version: str, variant: str | None) -> tuple[bool, bool, str]:
        """The offline gate: the phase of the version's Workflow, and (once it succeeded) that its
        register node's record has ``variant``."""
        wf = self.workflow_of(model, version)
        if wf is None:
            return False, False, f"no Workflow for version {version} of model `{model}` (not applied yet?)"
        phase = (wf.get("status") or {}).get("phase") or "Pending"
        name = wf["metadata"]["name"]
        if phase == "Succeeded":
            return succeeded_gate(name, next(iter(records_from_workflows([wf], self.env.name)), None), variant)
        if phase in ("Failed", "Error"):
            return True, False, f"Workflow {name} {phase.lower()}: {failure_of(wf) or phase}"
        return False, False, f"Workflow {name} is {phase}"

    def registered(self, model: str, version: str) -> dict[str, Any] | None:
        """The registry record of a model version (the regression gate compares two of them): the
        one its succeeded Workflow carries in its status, as `models show` reads it."""
        wf = self.workflow_of(model, version)
        if wf is None or (wf.get("status") or {}).get("phase") != "Succeeded":
            return None
        record = next(iter(records_from_workflows([wf], self.env.name)), None)
        # As JSON: the gate (reconciler/rollout/regression.py) reads the record's JSON form.
        return record.to_json() if record is not None else None

    def canary_ready(self, endpoint: str, version: str) -> Readiness:
        """Ready when the canary's pods (labelled by Seldon from the predictor's labels: endpoint,
        role `canary`, model version) are there and each one not being deleted has its `Ready`
        condition True — what the kubelet reports from the container's state and readiness probe."""
        selector = f"{ENDPOINT}={endpoint},{ROLE}=canary,{MODEL_VERSION}={version}"
        try:
            pods = self.target.list_kind(POD, selector)
        except TargetError as exc:
            return Readiness(False, f"its pods could not be read: {exc}")
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        if not live:
            return Readiness(False, f"no pod of the canary ({selector}) in namespace {self.target.namespace}")
        unready = []
        for pod in live:
            ready = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
            if ready is None or ready.get("status") != "True":
                why = (ready or {}).get("reason") or (pod.get("status") or {}).get("phase") or "no Ready condition"
                unready.append(f"{pod['metadata']['name']} ({why})")
        if unready:
            return Readiness(False, f"{len(unready)} of {len(live)} canary pod(s) not Ready: {', '.join(sorted(unready)[:3])}")
        return Readiness(True, f"{len(live)} canary pod(s) Ready")

    def event(self, endpoint: str, kind: str, reason: str, message: str) -> None:
        """A Kubernetes Event on the endpoint's SeldonDeployment."""
        obj = self.deployments.get(endpoint)
        if obj is None:
            return
        now = datetime.now(UTC)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{obj['metadata']['name']}.{time.time_ns():x}", "namespace": self.target.namespace},
            "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
                               "namespace": self.target.namespace, "uid": obj["metadata"].get("uid")},
            "reason": reason, "message": message[:1000], "type": kind,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "source": {"component": "forgectl-rollout"},
            # who moved: the Lease's holder (one of several watches), as a controller names its replica
            "reportingComponent": "forgectl-rollout", "reportingInstance": (self.target.holder or "forgectl")[:128],
        }
        try:
            self.target.create(EVENT, body)
        except LeaseLost:
            raise  # not ours to write any more: the pass stops here
        except TargetError:
            pass  # an event is a courtesy; the state annotation holds the record

    def stable_revision(self, model: str, version: str) -> str | None:
        """The git revision the stable version's Workflow was rendered from."""
        wf = self.workflow_of(model, version)
        return (wf["metadata"].get("annotations") or {}).get("forge.dev/git-revision") if wf is not None else None

    def shadow_stats(self, endpoint: str) -> dict[str, Any] | None:
        """Why the shadow's server is held (``{"held": …}``), when its pod stopped in its init
        container — the variant it serves was rejected, or its version's run failed — as the
        kubelet reports that container's end. Else None: in a cluster the live servers count
        their copies to the shadow in Prometheus (reconciler/metrics/shadow.py, asked by the
        controllers), and Istio's mirror, under router `seldon`, keeps no figures Forge reads."""
        try:
            pods = self.target.list_kind(POD, f"{ENDPOINT}={endpoint},{ROLE}=shadow")
        except TargetError:
            return None
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                continue
            for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
                if status.get("name") != AWAIT_CONTAINER:
                    continue
                ended = [(status.get(part) or {}).get("terminated") or {} for part in ("state", "lastState")]
                failed = next((t for t in ended if t.get("exitCode") not in (None, 0)), None)
                if failed is not None:
                    why = (failed.get("message") or "").strip() or f"exit code {failed['exitCode']}"
                    return {"held": f"its pod {pod['metadata']['name']} stops in its {AWAIT_CONTAINER} container: {why}"}
        return None
