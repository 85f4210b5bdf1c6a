"""`forgectl plan --base`: the plan of a pull request.

The manifest-level diff between two git revisions needs no cluster; it is reviewed against the
base (spec changes, risk flags, cost, blockers). When the environment is a cluster, the live plan
is added — read-only, and reached only as the *base* revision's Environment says (see
:func:`pull_request_plan`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from reconciler.diagnostics import ForgeError
from reconciler.errors import TargetError
from reconciler.load.environments import load_environment
from reconciler.load.sources import project_root, revision_of
from reconciler.plan.review import live_risks, registry_records, reviewed_git_plan
from reconciler.plan.session import TargetOptions, make_plan, namespace_of, open_target
from specs import Environment


def pull_request_plan(paths: list[str] | None, base: str, head: str | None, env_name: str | None,
                      overrides: TargetOptions | None = None) -> dict[str, Any]:
    """The plan JSON of the change from ``base`` to ``head`` (None: the working tree) of the specs
    under ``paths``, with `base`, `head` and notes saying whether and how the live diff was made.

    ``overrides`` are the runner's own target flags (`--kubeconfig`, `--context`, `--namespace`).
    Pull-request mode is inert: the cluster is reached only with the runner's credential (never a
    kubeconfig a spec names or one inside the checkout), at the coordinates the base revision's
    Environment gives (reviewed already), and with read verbs only. A cluster that does not answer
    is a note, not an error."""
    start = (paths or ["."])[0]
    old, old_env = load_environment(paths, base, env_name)
    new, new_env = load_environment(paths, head, env_name)
    the_plan = reviewed_git_plan(old, old_env, new, new_env, base=base, head=head,
                                 revision=revision_of(paths or ["."], head), start=start)
    plan_json = the_plan.to_json()
    plan_json["base"] = base
    plan_json["head"] = head or "working tree"
    if new_env.spec.target != "kubernetes":
        plan_json["notes"].append("no live diff: the environment's target is not a cluster")
        return plan_json
    reviewed = old.specs.get(Environment, new_env.name)
    if reviewed is None or reviewed.spec.kubernetes is None:
        plan_json["notes"].append(f"no live diff: environment `{new_env.name}` is not a cluster environment at "
                                  f"{base}; a pull request cannot choose where its plan reads from")
        return plan_json
    if reviewed.spec.kubernetes != new_env.spec.kubernetes:
        plan_json["notes"].append(f"environment `{new_env.name}` changes its cluster settings; the live diff "
                                  f"uses those at {base}")
    k8s = reviewed.spec.kubernetes
    overrides = overrides or TargetOptions()
    options = replace(overrides, context=overrides.context or k8s.context, namespace=overrides.namespace or k8s.namespace,
                      untrusted_root=project_root(Path(start)))
    try:
        target = open_target(reviewed, options)
        live_plan, _ = make_plan(new.specs, new_env, target, namespace_of(reviewed, options), None, dry_run=False)
        plan_json["live"] = live_plan.to_json()
        known = {(r["flag"], r["message"]) for r in plan_json["risks"]}
        plan_json["risks"] += [r.to_json() for r in live_risks(live_plan, new, old, registry_records(live_plan, target))
                               if (r.flag, r.message) not in known]
        plan_json["notes"].append(f"live: {live_plan.counts()} against the cluster (read-only: not settled by "
                                  "server-side dry runs)")
    except (TargetError, ForgeError) as exc:
        plan_json["notes"].append(f"no live diff: {str(exc).splitlines()[0]}")
    return plan_json
