"""The rollout controller's view of the local target: state in the state DB, traffic through the
local router, the offline gate from the local workflow runs, the canary's readiness from its
server, events in `events.jsonl`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reconciler.registry.records import succeeded_gate
from reconciler.resources import ObjectRef
from reconciler.rollout.controller import Readiness, RolloutState
from reconciler.targets.base import Target
from reconciler.targets.local.state import StateDB
from reconciler.traffic.serving import apply_serving, serving_states
from renderers.labels import GIT_REVISION, MODEL_VERSION, NAME
from renderers.seldon import ServingState
from specs import Endpoint, Environment, SpecSet


class LocalRolloutBackend:
    """Backend of :class:`reconciler.rollout.controller.Controller` for the `local` target.

    It is given the target's pieces rather than the target itself (the target's module imports
    this one): the target to apply through, its state DB, its events file, how to read the
    router's shadow figures and how to ask a server whether it is ready
    (``ready(endpoint, role, version)``: :meth:`~reconciler.targets.local.serving.LocalServing.ready`)."""

    def __init__(self, target: Target, db: StateDB, events: Path, mirror_stats: Callable[[str], dict[str, Any] | None],
                 ready: Callable[[str, str, str], Readiness], specs: SpecSet, env: Environment, revision: str | None) -> None:
        self.target = target
        self.db = db
        self.events = events
        self.mirror_stats = mirror_stats
        self.ready = ready
        self.specs = specs
        self.env = env
        self.revision = revision

    def refresh(self) -> None:
        """Nothing to cache: the state DB is local."""

    def _deployment(self, endpoint: str) -> dict[str, Any] | None:
        return self.db.get(ObjectRef("SeldonDeployment", self.target.namespace, endpoint))

    def serving(self, endpoint: str) -> ServingState | None:
        """What the endpoint's stored SeldonDeployment serves."""
        obj = self._deployment(endpoint)
        return serving_states([obj]).get(endpoint) if obj else None

    def load_state(self, endpoint: str) -> RolloutState | None:
        """The rollout state in the state DB."""
        data = self.db.rollout(endpoint)
        return RolloutState.from_json(data) if data else None

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        """Store the rollout state in the state DB."""
        self.db.set_rollout(endpoint, state.to_json())

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        """Move the endpoint's traffic (see :func:`reconciler.traffic.serving.apply_serving`)."""
        apply_serving(self.target, self.specs, self.env, self.revision, endpoint, state)

    def model_gate(self, model: str, version: str, variant: str | None) -> tuple[bool, bool, str]:
        """The offline gate: the version's Workflow once live (it succeeded, and registered
        ``variant``), else its run."""
        for obj in self.db.objects():
            labels = obj["metadata"].get("labels") or {}
            if obj["kind"] == "Workflow" and labels.get(NAME) == model and labels.get(MODEL_VERSION) == version:
                phase = (obj.get("status") or {}).get("phase")
                if phase == "Succeeded":
                    record = next((r for r in self.db.model_versions(model) if r.version == version), None)
                    return succeeded_gate(obj["metadata"]["name"], record, variant)
        for run in self.db.workflow_runs(name_like=f"{model[:50]}-{version[:10]}"):
            if run.phase == "Failed":
                return True, False, f"Workflow {run.name} failed: {run.message}"
            return False, False, f"Workflow {run.name} is {run.phase}"
        return False, False, f"no run of version {version} of model `{model}` yet"

    def canary_ready(self, endpoint: str, version: str) -> Readiness:
        """Ready when the endpoint's canary server runs ``version`` and answers its readiness path."""
        return self.ready(endpoint, "canary", version)

    def registered(self, model: str, version: str) -> dict[str, Any] | None:
        """The registry record of a model version (the regression gate compares two of them)."""
        # As JSON: the gate (reconciler/rollout/regression.py) reads the record's JSON form.
        return next((r.to_json() for r in self.db.model_versions(model) if r.version == version), None)

    def shadow_stats(self, endpoint: str) -> dict[str, Any] | None:
        """The router's mirror figures for the endpoint's shadow (agreement, distance, latency)."""
        return self.mirror_stats(endpoint)

    def event(self, endpoint: str, kind: str, reason: str, message: str) -> None:
        """Append the event to `events.jsonl`."""
        with open(self.events, "a") as fh:
            fh.write(json.dumps({"at": time.time(), "endpoint": endpoint, "type": kind, "reason": reason, "message": message}) + "\n")

    def stable_revision(self, model: str, version: str) -> str | None:
        """The git revision recorded on the version's Workflow."""
        for obj in self.db.objects():
            labels = obj["metadata"].get("labels") or {}
            if obj["kind"] == "Workflow" and labels.get(NAME) == model and labels.get(MODEL_VERSION) == version:
                return (obj["metadata"].get("annotations") or {}).get(GIT_REVISION)
        return None
