"""The rollout controller's view of a cluster: serving state and rollout state from each endpoint's
SeldonDeployment (the state is its `forge.dev/rollout` annotation, written with the field
manager `forgectl-rollout`), the offline gate from the model version's Workflow, the canary's
readiness from its pods' `Ready` condition, and Events."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from reconciler.errors import LeaseLost, TargetError
from reconciler.resources import BY_KIND, EVENT, POD, ObjectRef, Resource
from reconciler.rollout.controller import STATE_ANNOTATION, Readiness, RolloutState
from reconciler.targets.base import Target
from reconciler.targets.kubernetes.workflow_status import failure_of
from reconciler.traffic.serving import apply_serving, serving_states
from renderers.labels import ENDPOINT, MODEL_VERSION, NAME, ROLE, owner_selector
from renderers.seldon import ServingState
from specs import Endpoint, Environment, SpecSet

ROLLOUT_MANAGER = "forgectl-rollout"


def rollout_state_of(obj: dict[str, Any]) -> RolloutState | None:
    """The rollout state stored on a live SeldonDeployment, if any."""
    raw = (obj.get("metadata", {}).get("annotations") or {}).get(STATE_ANNOTATION)
    if not raw:
        return None
    try:
        return RolloutState.from_json(json.loads(raw))
    except (ValueError, TypeError, KeyError):
        return None


class ClusterAccess(Target, Protocol):
    """What the backend needs of the `kubernetes` target beyond the Target protocol (declared here,
    so this module does not import the target that imports it)."""

    def list_kind(self, resource: Resource, selector: str) -> list[dict[str, Any]]:
        """LIST one kind with a label selector."""
        ...

    def merge_patch(self, ref: ObjectRef, body: Mapping[str, Any], manager: str) -> dict[str, Any]:
        """A JSON merge patch under field manager ``manager``."""
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


class KubernetesRolloutBackend:
    """Backend of :class:`reconciler.rollout.controller.Controller` for the `kubernetes` target."""

    def __init__(self, target: ClusterAccess, specs: SpecSet, env: Environment, revision: str | None) -> None:
        self.target = target
        self.specs = specs
        self.env = env
        self.revision = revision
        self.deployments: dict[str, dict[str, Any]] = {}
        self.workflows: list[dict[str, Any]] = []

    def refresh(self) -> None:
        """One LIST of SeldonDeployments and one of Workflows per controller pass."""
        selector = owner_selector(self.env.name)
        self.deployments = {}
        for obj in self.target.list_kind(BY_KIND["SeldonDeployment"], selector):
            endpoint = (obj["metadata"].get("labels") or {}).get(ENDPOINT)
            if endpoint:
                self.deployments[endpoint] = obj
        self.workflows = self.target.list_kind(BY_KIND["Workflow"], selector)

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
        SeldonDeployment's fields owned by `forgectl` are not touched)."""
        ref = ObjectRef("SeldonDeployment", self.target.namespace, self.deployments[endpoint]["metadata"]["name"])
        body = {"metadata": {"annotations": {STATE_ANNOTATION: json.dumps(state.to_json(), separators=(",", ":"))}}}
        stored = self.target.merge_patch(ref, body, ROLLOUT_MANAGER)
        if stored:
            self.deployments[endpoint] = stored

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        """Move the endpoint's traffic (see :func:`reconciler.traffic.serving.apply_serving`; with an
        HTTPRoute, the move counts once the Gateway reports it admitted, read back with GET)."""
        self.deployments[endpoint.name] = apply_serving(self.target, self.specs, self.env, self.revision, endpoint, state,
                                                        current=self.serving(endpoint.name), read_back=self.target.get)

    def model_gate(self, model: str, version: str) -> tuple[bool, bool, str]:
        """The offline gate: the phase of the version's Workflow."""
        for wf in self.workflows:
            labels = wf["metadata"].get("labels") or {}
            if labels.get(NAME) == model and labels.get(MODEL_VERSION) == version:
                phase = (wf.get("status") or {}).get("phase") or "Pending"
                name = wf["metadata"]["name"]
                if phase == "Succeeded":
                    return True, True, f"Workflow {name} succeeded: evaluation thresholds met, version registered"
                if phase in ("Failed", "Error"):
                    message = failure_of(wf) or phase
                    return True, False, f"Workflow {name} {phase.lower()}: {message}"
                return False, False, f"Workflow {name} is {phase}"
        return False, False, f"no Workflow for version {version} of model `{model}` (not applied yet?)"

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
        for wf in self.workflows:
            labels = wf["metadata"].get("labels") or {}
            if labels.get(NAME) == model and labels.get(MODEL_VERSION) == version:
                return (wf["metadata"].get("annotations") or {}).get("forge.dev/git-revision")
        return None

    def shadow_stats(self, endpoint: str) -> dict[str, Any] | None:
        """None: in a cluster Seldon mirrors to the shadow through Istio, which keeps no figures
        Forge reads."""
        return None
