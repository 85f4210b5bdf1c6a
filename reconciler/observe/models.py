"""The model registry as `forgectl models` shows it: every registered version the target knows,
with the endpoints that serve it — read through the Target protocol alone."""

from __future__ import annotations

from reconciler.registry.records import Record, attach_serving, serving
from reconciler.targets.base import Target


def collect(target: Target, model: str | None = None) -> list[Record]:
    """Every registered version the target knows (of one model, or all; see
    :meth:`Target.model_records`), oldest first, with `servedBy`."""
    live = target.read_live()
    records = target.model_records(live, model)
    try:
        rollouts = target.rollout_states(live)
    except Exception:  # noqa: BLE001 - the registry is readable without rollout state
        rollouts = {}
    return attach_serving(records, serving(live, rollouts))
