"""`forgectl rollout …`: what `rollout status` shows of an endpoint, and steering a rollout by
hand — promote, abort, retry — with the rules for when each is allowed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from reconciler.diagnostics import ForgeError
from reconciler.load.endpoints import DesiredEndpoint
from reconciler.rollout.controller import FINAL, Backend, Controller, Phase, RolloutState
from renderers.seldon import ServingState

#: Phases a rollout rests in: nothing left to promote or abort, and a watch may end there.
AT_REST = FINAL | {Phase.IDLE}
#: Phases a rollout failed in: `rollout retry` starts those again; `reconcile --until-settled`
#: exits non-zero on them.
FAILED = frozenset({Phase.ROLLED_BACK, Phase.ABORTED})


def status_data(desired: DesiredEndpoint, serving: ServingState | None, state: RolloutState | None,
                shadow_stats: Callable[[str], Mapping[str, Any] | None] | None = None) -> dict[str, Any]:
    """The JSON of `rollout status`: the model and version the specs want, what serves now with
    its weights, the rollout state, and the shadow's mirror figures — asked of ``shadow_stats``
    (where the target measures them) only when the endpoint has a shadow."""
    name = desired.endpoint.name
    return {
        "endpoint": name, "model": desired.model, "desiredVersion": desired.version,
        "serving": None if serving is None else {
            "stable": serving.stable, "canary": serving.canary,
            "weights": {"stable": 100 - serving.canary_weight, "canary": serving.canary_weight}},
        "rollout": state.to_json() if state else None,
        "shadow": shadow_stats(name) if shadow_stats is not None and desired.endpoint.spec.shadow is not None else None,
    }


def steer(controller: Controller, backend: Backend, desired: DesiredEndpoint, state: RolloutState | None, *,
          promote: bool) -> RolloutState:
    """Promote the canary now (skipping the remaining steps) or abort (all traffic to stable),
    and save the result. :class:`ForgeError` when no rollout is in progress."""
    name = desired.endpoint.name
    if state is None or state.canary is None or state.phase in AT_REST:
        raise ForgeError(f"endpoint {name!r} has no rollout in progress")
    state = controller.promote(desired.endpoint, state, "promoted by hand") if promote else controller.abort(desired.endpoint, state)
    controller.commit(name, state)
    return state


def retry(controller: Controller, backend: Backend, desired: DesiredEndpoint, state: RolloutState | None) -> RolloutState:
    """Start a rolled-back or aborted rollout again (the next reconcile pass proceeds), and save
    it. :class:`ForgeError` when there is none to retry."""
    name = desired.endpoint.name
    if state is None or state.phase not in FAILED:
        raise ForgeError(f"endpoint {name!r} has no rolled-back or aborted rollout to retry")
    state = controller.retry(state)
    backend.save_state(name, state)
    return state
