"""The rollouts a plan starts: for each endpoint whose SeldonDeployment the plan changes to add a
canary of a new version, the rollout the controller will walk from there
(:func:`reconciler.rollout.preview.planned_rollout`, which asks the controller's own functions)."""

from __future__ import annotations

from collections.abc import Iterable

from reconciler.load.endpoints import desired_endpoints
from reconciler.plan.change import Action, Change
from reconciler.rollout.preview import PlannedRollout, planned_rollout
from reconciler.traffic.serving import serving_states
from renderers.labels import ENDPOINT
from specs import Environment, SpecSet


def planned_rollouts(changes: Iterable[Change], specs: SpecSet, env: Environment) -> tuple[PlannedRollout, ...]:
    """The rollouts applying ``changes`` (rendered from ``specs`` for ``env``) starts, by endpoint:
    a SeldonDeployment updated so that it serves the specs' new version as a canary. What serves
    before is the change's `before` (the live object, or the base revision's in a pull request)."""
    updated = [c for c in changes if c.ref.kind == "SeldonDeployment" and c.action is Action.UPDATE
               and c.before is not None and c.after is not None]
    if not updated:
        return ()  # nothing to ask of the specs (a blocked plan's model may not even schedule)
    wanted = {d.endpoint.name: d for d in desired_endpoints(specs, env)}
    found = []
    for change in updated:
        assert change.before is not None and change.after is not None
        endpoint = (change.after.get("metadata", {}).get("labels") or {}).get(ENDPOINT)
        desired = wanted.get(endpoint or "")
        after = serving_states([change.after]).get(endpoint or "")
        if desired is None or after is None or after.canary != desired.version:
            continue  # no canary of the specs' version rendered (a rolled-back one stays out until `rollout retry`)
        planned = planned_rollout(desired, serving_states([change.before]).get(desired.endpoint.name))
        if planned is not None:
            found.append(planned)
    return tuple(sorted(found, key=lambda r: r.endpoint))
