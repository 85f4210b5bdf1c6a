"""What the plan says of each Endpoint whose experiment has ended (pure): the rollout state keeps
the decision — a winner serving all traffic, or control kept after a stop or an inconclusive end —
while the specs still name the arms, so git and what serves disagree until someone edits the
Endpoint. The plan says which arm serves, why, and what edit makes the spec say so."""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.experiment.controller import DECIDED, ExperimentState, ended
from reconciler.experiment.specedit import winner_edit
from reconciler.rollout.machine import RolloutState
from specs import Endpoint, SpecSet


def experiment_notes(specs: SpecSet, rollouts: Mapping[str, RolloutState], versions: Mapping[str, str]) -> list[str]:
    """A note per Endpoint of ``specs`` whose experiment ended for the arms its spec names now
    (``rollouts``: the saved rollout states, by endpoint; ``versions``: each Model's version as
    rendered)."""
    notes = []
    for endpoint in specs.of(Endpoint):
        rollout = rollouts.get(endpoint.name)
        if endpoint.spec.experiment is None or rollout is None or not rollout.experiment:
            continue
        version = versions.get(endpoint.spec.model_ref)
        state = ended(endpoint, version, rollout.experiment) if version is not None else None
        if state is not None:
            notes.append(_note(endpoint, version or "", state))
    return notes


def _note(endpoint: Endpoint, version: str, state: ExperimentState) -> str:
    kept = state.arm(state.winner or state.control)
    serving = f"arm {kept.name} (version {kept.version}, variant {kept.variant}) serves all traffic"
    if state.phase != DECIDED:
        return (f"endpoint {endpoint.name}: its experiment ended {state.phase} — {state.reason}; {serving} until the "
                f"experiment's spec changes (`forgectl experiment status {endpoint.name}`)")
    edit = winner_edit(endpoint, version, state).describe()
    done = f" (its write-back: {state.writeback})" if state.writeback else ""
    return (f"endpoint {endpoint.name}: its experiment decided — {state.reason}; {serving}, while the spec still "
            f"names the arms: to make git say what serves, {edit}{done}")
