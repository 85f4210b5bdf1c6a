"""The rollout controller's view of the local target: state in the state DB, traffic through the
local router, the offline gate from the local workflow runs, events in `events.jsonl`."""

from __future__ import annotations

import json
import time
from typing import Any

from reconciler.resources import ObjectRef
from reconciler.rollout import RolloutState
from renderers.labels import GIT_REVISION, MODEL_VERSION, NAME
from renderers.seldon import ServingState, render_seldon
from specs import Endpoint, Environment, SpecSet


class LocalRolloutBackend:
    """Backend of :class:`reconciler.rollout.Controller` for the `local` target."""

    def __init__(self, target: Any, specs: SpecSet, env: Environment, revision: str | None) -> None:
        self.target = target
        self.specs = specs
        self.env = env
        self.revision = revision

    def refresh(self) -> None:
        """Nothing to cache: the state DB is local."""

    def _deployment(self, endpoint: str) -> dict[str, Any] | None:
        return self.target.db.get(ObjectRef("SeldonDeployment", self.target.namespace, endpoint))

    def serving(self, endpoint: str) -> ServingState | None:
        from reconciler.session import serving_states

        obj = self._deployment(endpoint)
        return serving_states([obj]).get(endpoint) if obj else None

    def load_state(self, endpoint: str) -> RolloutState | None:
        data = self.target.db.rollout(endpoint)
        return RolloutState.from_json(data) if data else None

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        self.target.db.set_rollout(endpoint, state.to_json())

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        obj = render_seldon(self.specs, endpoint, self.env, self.target.namespace, self.revision, state)
        self.target.apply(obj)

    def model_gate(self, model: str, version: str) -> tuple[bool, bool, str]:
        for obj in self.target.db.objects():
            labels = obj["metadata"].get("labels") or {}
            if obj["kind"] == "Workflow" and labels.get(NAME) == model and labels.get(MODEL_VERSION) == version:
                phase = (obj.get("status") or {}).get("phase")
                if phase == "Succeeded":
                    return True, True, f"Workflow {obj['metadata']['name']} succeeded: evaluation thresholds met, version registered"
        rows = self.target.db.db.execute("SELECT name, phase, message FROM workflows WHERE name LIKE ?", (f"{model[:50]}-{version[:10]}",)).fetchall()
        for name, phase, message in rows:
            if phase == "Failed":
                return True, False, f"Workflow {name} failed: {message}"
            return False, False, f"Workflow {name} is {phase}"
        return False, False, f"no run of version {version} of model `{model}` yet"

    def registered(self, model: str, version: str) -> dict[str, Any] | None:
        """The registry record of a model version (the regression gate compares two of them)."""
        return next((r for r in self.target.db.model_versions(model) if r.get("version") == version), None)

    def shadow_stats(self, endpoint: str) -> dict[str, Any] | None:
        """The router's mirror figures for the endpoint's shadow (agreement, distance, latency)."""
        router = self.target.serving.router(endpoint)
        return router.shadow_stats() if router.running() else None

    def event(self, endpoint: str, kind: str, reason: str, message: str) -> None:
        path = self.target.state_dir / "events.jsonl"
        with open(path, "a") as fh:
            fh.write(json.dumps({"at": time.time(), "endpoint": endpoint, "type": kind, "reason": reason, "message": message}) + "\n")

    def stable_revision(self, model: str, version: str) -> str | None:
        for obj in self.target.db.objects():
            labels = obj["metadata"].get("labels") or {}
            if obj["kind"] == "Workflow" and labels.get(NAME) == model and labels.get(MODEL_VERSION) == version:
                return (obj["metadata"].get("annotations") or {}).get(GIT_REVISION)
        return None
