"""What the rollout controller will run when a plan is applied: the rollout a reviewer reads in a
plan (`forgectl plan`, `plan --base` in a pull request) before it starts.

A rollout starts where the controller's pass starts it: :func:`reconciler.rollout.machine.observe`
turns a new version of an endpoint's model into a canary in `WaitingForModel`; the steps are the
policy's (:func:`~reconciler.rollout.machine.policy_steps`). This module asks those two functions,
with no saved state (the plan's "before" is what serves), so the plan shows the rollout the
controller — in the cluster or `reconcile --watch` — will walk, never a second opinion of it.
Pure: values in, a :class:`PlannedRollout` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.load.endpoints import DesiredEndpoint
from reconciler.rollout.machine import Phase, observe, policy_steps
from renderers.seldon import ServingState
from specs import RolloutPolicy


@dataclass(frozen=True)
class PlannedStep:
    """One step of a planned rollout: the canary's weight, the pause before its analysis, and the
    metrics it is gated on with their thresholds (`success-rate ≥ 0.99`)."""

    weight: int
    pause_seconds: float
    gates: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """Plain data (the plan's JSON)."""
        return {"weight": self.weight, "pauseSeconds": self.pause_seconds, "gates": list(self.gates)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlannedStep:
        """Inverse of :meth:`to_json`."""
        return cls(int(data["weight"]), float(data["pauseSeconds"]), tuple(data["gates"]))


@dataclass(frozen=True)
class PlannedRollout:
    """The rollout applying a plan starts on one endpoint."""

    endpoint: str
    model: str
    stable: str
    canary: str
    #: `canary`, `blueGreen`, or `none` (no RolloutPolicy: the canary takes all traffic once ready).
    strategy: str
    policy: str | None
    steps: tuple[PlannedStep, ...]
    #: Blue-green: switch once the preview's analysis passes (else wait for `rollout promote`).
    auto_promote: bool
    #: What a gate does while Prometheus does not answer (`hold` or `rollback`).
    on_unreachable: str | None
    #: The state the controller's first pass records (`WaitingForModel`) and its reason.
    first_phase: str
    first_reason: str

    def summary(self) -> str:
        """One line: `canary of B (stable A) by policy P: 10 → 50 → 100 %`."""
        by = f"by policy `{self.policy}`" if self.policy else "with no RolloutPolicy"
        if self.strategy == "blueGreen":
            [preview] = self.steps
            after = "then switch all traffic" if self.auto_promote else "then wait for `forgectl rollout promote`"
            return (f"blue-green of version {self.canary} (stable {self.stable}) {by}: preview at {preview.weight} %, "
                    f"{after}")
        weights = " → ".join(str(s.weight) for s in self.steps)
        return f"canary of version {self.canary} (stable {self.stable}) {by}: {weights} %"

    def lines(self) -> list[str]:
        """The summary, the offline gate, then one line per step with its pause and gates."""
        out = [self.summary(),
               f"first: {self.first_phase} — the version's Workflow must succeed (the offline gate) and the canary be ready "
               "before any traffic moves"]
        for number, step in enumerate(self.steps, 1):
            pause = f" after a {step.pause_seconds:g} s pause" if step.pause_seconds else ""
            gated = f"gated on {', '.join(step.gates)}" if step.gates else "no analysis"
            out.append(f"step {number}: {step.weight} %{pause}, {gated}")
        if self.on_unreachable:
            out.append(f"Prometheus unreachable: {self.on_unreachable}; a failed gate rolls back to {self.stable}")
        return out

    def to_json(self) -> dict[str, Any]:
        """Plain data (the plan's JSON, docs/plan-json.md): the fields, the summary and the lines."""
        return {"endpoint": self.endpoint, "model": self.model, "stable": self.stable, "canary": self.canary,
                "strategy": self.strategy, "policy": self.policy, "steps": [s.to_json() for s in self.steps],
                "autoPromote": self.auto_promote, "onPrometheusUnreachable": self.on_unreachable,
                "firstPhase": self.first_phase, "firstReason": self.first_reason, "summary": self.summary(),
                "lines": self.lines()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlannedRollout:
        """Inverse of :meth:`to_json` (a saved plan)."""
        return cls(data["endpoint"], data["model"], data["stable"], data["canary"], data["strategy"], data.get("policy"),
                   tuple(PlannedStep.from_json(s) for s in data["steps"]), bool(data["autoPromote"]),
                   data.get("onPrometheusUnreachable"), data["firstPhase"], data["firstReason"])


def _gates(policy: RolloutPolicy | None, names: tuple[str, ...]) -> tuple[str, ...]:
    """Each metric of a step with its threshold, as the policy writes it."""
    metrics = {m.name: m for m in (policy.spec.metrics if policy else [])}
    out = []
    for name in names:
        metric = metrics.get(name)
        bounds = []
        if metric is not None and metric.min is not None:
            bounds.append(f"≥ {metric.min:g}")
        if metric is not None and metric.max is not None:
            bounds.append(f"≤ {metric.max:g}")
        if metric is not None and metric.compare_to_stable is not None:
            bounds.append("compared with stable")
        out.append(f"{name} {' and '.join(bounds)}".rstrip())
    return tuple(out)


def planned_rollout(desired: DesiredEndpoint, serving: ServingState | None) -> PlannedRollout | None:
    """The rollout the controller starts when ``desired`` is applied over an endpoint serving
    ``serving`` (None: not served yet — the first version serves as stable, no rollout). None
    when its pass starts none (the specs serve the stable version) or an experiment decides what
    serves (docs/experiments.md)."""
    endpoint, model, version, policy = desired
    if serving is None or endpoint.spec.experiment is not None:
        return None
    state = observe(None, endpoint.name, serving, version, model, 0.0)
    if state.phase is not Phase.WAITING or state.canary is None:
        return None
    steps = tuple(PlannedStep(s.weight, s.pause, _gates(policy, s.analysis)) for s in policy_steps(policy))
    strategy = "none" if policy is None else policy.spec.strategy
    blue_green = policy.spec.blue_green if policy is not None else None
    return PlannedRollout(endpoint.name, model, state.stable, state.canary, strategy, policy.name if policy else None, steps,
                          blue_green.auto_promote if blue_green is not None else True,
                          policy.spec.on_prometheus_unreachable if policy is not None else None,
                          state.phase.value, state.reason)
