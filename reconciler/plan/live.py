"""The plan `forgectl plan` shows and `forgectl apply` carries out: the specs against the target's
live state, reviewed, with what a cluster lacks for it as notes; a saved plan read back; the
teardown `forgectl down` carries out in a cluster; and the rule that a blocked plan is never
applied."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from reconciler.diagnostics import ForgeError
from reconciler.heap import gc_paused
from reconciler.load.loader import LoadResult
from reconciler.load.sources import revision_of
from reconciler.plan.plan import Plan, build_plan
from reconciler.plan.prerequisites import check, missing_notes
from reconciler.plan.review import reviewed_live_plan
from reconciler.targets.base import Target
from renderers.prerequisites import cluster_requirements
from specs import Environment


def live_plan(result: LoadResult, environment: Environment, target: Target, namespace: str, paths: list[str] | None,
              rev: str | None, *, refresh: bool = False) -> Plan:
    """The reviewed plan of the specs under ``paths`` (at git revision ``rev``, else the working
    tree) against what ``target`` has live in ``namespace``; ``refresh``: every live object read
    whole and compared (the full compare), not only those whose recorded digest differs. Runs with
    the cyclic garbage collector paused (:func:`reconciler.heap.gc_paused`), the review included, and
    what it made frozen after (a command's: it lives until the command exits)."""
    with gc_paused(freeze=True):
        return reviewed_live_plan(result, environment, target, namespace, revision_of(paths or ["."], rev), rev=rev,
                                  refresh=refresh)


def plan_json(plan: Plan, environment: Environment, target: Target) -> dict[str, Any]:
    """The plan as shown and saved: its JSON (:meth:`Plan.to_json`, the one author of a plan's
    JSON), with, where the target has a cluster (:meth:`Target.cluster_api`), a note for each
    prerequisite the rendered objects need and the cluster lacks (checked read-only). The objects
    are the plan's own desired ones: rendering the specs a second time for this was a fifth of a
    10,000-endpoint plan. Runs with the cyclic garbage collector paused (a few dicts per change,
    tens of thousands of them at scale, all alive until the output is printed), frozen after."""
    with gc_paused(freeze=True):
        api = target.cluster_api()
        if api is not None:
            desired = [c.after for c in plan.changes if c.after is not None]
            plan = replace(plan, notes=(*plan.notes, *missing_notes(check(api, cluster_requirements(desired)))))
        return plan.to_json()


def saved_plan(paths: list[str] | None) -> Plan | None:
    """The saved plan ``paths`` names — one existing `.json` file — or None when they name specs.
    :class:`ForgeError` when that file is no saved Forge plan."""
    if not paths or len(paths) != 1 or not paths[0].endswith(".json") or not Path(paths[0]).is_file():
        return None
    try:
        return Plan.from_json(json.loads(Path(paths[0]).read_text()))
    except (ValueError, KeyError) as exc:
        raise ForgeError(f"{paths[0]}: not a saved Forge plan ({exc})") from exc


def teardown_plan(environment: Environment, target: Target) -> Plan:
    """`forgectl down` of a cluster environment: every object Forge owns there deleted, as
    applying an empty spec set would (what opts out with `forge.dev/prune: disabled` stays,
    named), the namespace last. Deleting the namespace is what stops the pods: the cluster's own
    controllers remove what the Seldon operator and Argo made in it."""
    return build_plan([], target.read_live(), environment=environment.name, target=target.name)


def ensure_runnable(plan: Plan) -> None:
    """Refuse a plan with blockers (what the target cannot run), naming the first."""
    if plan.blockers:
        raise ForgeError(f"the target cannot run this plan: {plan.blockers[0].message}"
                         + (f" (and {len(plan.blockers) - 1} more)" if len(plan.blockers) > 1 else ""))
