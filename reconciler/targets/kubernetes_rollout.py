"""The rollout controller's view of a cluster: serving state and rollout state from each endpoint's
SeldonDeployment (the state is its `forge.dev/rollout` annotation, written with the field
manager `forgectl-rollout`), the offline gate from the model version's Workflow, and Events."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

from reconciler.errors import TargetError
from reconciler.resources import BY_KIND, EVENT, ObjectRef
from reconciler.rollout import STATE_ANNOTATION, RolloutState
from reconciler.targets.kubernetes import KubernetesTarget
from renderers.labels import ENDPOINT, MODEL_VERSION, NAME, owner_selector
from renderers.seldon import ServingState, render_seldon
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


class KubernetesRolloutBackend:
    """Backend of :class:`reconciler.rollout.Controller` for the `kubernetes` target."""

    def __init__(self, target: KubernetesTarget, specs: SpecSet, env: Environment, revision: str | None) -> None:
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
        from reconciler.session import serving_states

        obj = self.deployments.get(endpoint)
        return serving_states([obj]).get(endpoint) if obj else None

    def load_state(self, endpoint: str) -> RolloutState | None:
        obj = self.deployments.get(endpoint)
        return rollout_state_of(obj) if obj else None

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        ref = ObjectRef("SeldonDeployment", self.target.namespace, self.deployments[endpoint]["metadata"]["name"])
        body = {"metadata": {"annotations": {STATE_ANNOTATION: json.dumps(state.to_json(), separators=(",", ":"))}}}
        stored = self.target.merge_patch(ref, body, ROLLOUT_MANAGER)
        if stored:
            self.deployments[endpoint] = stored

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        from reconciler.session import _with_namespace

        env = _with_namespace(self.env, self.target.namespace)
        obj = render_seldon(self.specs, endpoint, env, self.target.namespace, self.revision, state)
        self.deployments[endpoint.name] = self.target.apply(obj)

    def model_gate(self, model: str, version: str) -> tuple[bool, bool, str]:
        for wf in self.workflows:
            labels = wf["metadata"].get("labels") or {}
            if labels.get(NAME) == model and labels.get(MODEL_VERSION) == version:
                phase = (wf.get("status") or {}).get("phase") or "Pending"
                name = wf["metadata"]["name"]
                if phase == "Succeeded":
                    return True, True, f"Workflow {name} succeeded: evaluation thresholds met, version registered"
                if phase in ("Failed", "Error"):
                    message = (wf.get("status") or {}).get("message") or phase
                    return True, False, f"Workflow {name} {phase.lower()}: {message}"
                return False, False, f"Workflow {name} is {phase}"
        return False, False, f"no Workflow for version {version} of model `{model}` (not applied yet?)"

    def event(self, endpoint: str, kind: str, reason: str, message: str) -> None:
        obj = self.deployments.get(endpoint)
        if obj is None:
            return
        now = datetime.now(timezone.utc)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{obj['metadata']['name']}.{time.time_ns():x}", "namespace": self.target.namespace},
            "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
                               "namespace": self.target.namespace, "uid": obj["metadata"].get("uid")},
            "reason": reason, "message": message[:1000], "type": kind,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "source": {"component": "forgectl-rollout"},
            "reportingComponent": "forgectl-rollout", "reportingInstance": "forgectl",
        }
        try:
            self.target.create(EVENT, body)
        except TargetError:
            pass  # an event is a courtesy; the state annotation holds the record

    def stable_revision(self, model: str, version: str) -> str | None:
        """The git revision the stable version's Workflow was rendered from."""
        for wf in self.workflows:
            labels = wf["metadata"].get("labels") or {}
            if labels.get(NAME) == model and labels.get(MODEL_VERSION) == version:
                return (wf["metadata"].get("annotations") or {}).get("forge.dev/git-revision")
        return None
