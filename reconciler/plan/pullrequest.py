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
from reconciler.heap import gc_paused
from reconciler.load.environments import load_environment
from reconciler.load.parsecache import ParseCache
from reconciler.load.sources import project_root, revision_of
from reconciler.plan.plan import Plan
from reconciler.plan.rendercache import RenderCache
from reconciler.plan.review import live_risks, registry_records, reviewed_git_plan
from reconciler.plan.session import TargetOptions, make_plan, namespace_of, open_target
from specs import Environment


def pull_request_plan(paths: list[str] | None, base: str, head: str | None, env_name: str | None,
                      overrides: TargetOptions | None = None) -> dict[str, Any]:
    """The plan JSON of the change from ``base`` to ``head`` (None: the working tree) of the specs
    under ``paths``, with `base`, `head` and notes saying whether and how the live diff was made
    (the plan's own :meth:`Plan.to_json`, the one author of a plan's JSON).

    ``overrides`` are the runner's own target flags (`--kubeconfig`, `--context`, `--namespace`).
    Pull-request mode is inert: the cluster is reached only with the runner's credential (never a
    kubeconfig a spec names or one inside the checkout), at the coordinates the base revision's
    Environment gives (reviewed already), and with read verbs only. A cluster that does not answer
    is a note, not an error.

    Runs with the cyclic garbage collector paused, like the live plan (:func:`reconciler.heap.gc_paused`:
    two revisions loaded, rendered and compared are millions of acyclic objects, all alive until
    the plan is printed; the collector's rescans of them were most of a 10,000-endpoint review),
    frozen after (a one-shot command: no full collection over all of it once the plan is made)."""
    with gc_paused(freeze=True):
        return _pull_request_plan(paths, base, head, env_name, overrides)


def _pull_request_plan(paths: list[str] | None, base: str, head: str | None, env_name: str | None,
                       overrides: TargetOptions | None) -> dict[str, Any]:
    start = (paths or ["."])[0]
    # One parse cache for both revisions (a file the pull request leaves alone is one entry), one
    # render cache pack for the base's, the head's and the live render (reconciler.plan.rendercache).
    parses = ParseCache(paths or ["."])
    old, old_env = load_environment(paths, base, env_name, parses)
    new, new_env = load_environment(paths, head, env_name, parses)
    parses.save()
    renders = RenderCache(new_env, namespace_of(new_env, TargetOptions()))
    the_plan = replace(reviewed_git_plan(old, old_env, new, new_env, base=base, head=head,
                                         revision=revision_of(paths or ["."], head), cache=renders),
                       base=base, head=head or "working tree")
    if new_env.spec.target != "kubernetes":
        return _noted(the_plan, "no live diff: the environment's target is not a cluster").to_json()
    reviewed = old.specs.get(Environment, new_env.name)
    if reviewed is None or reviewed.spec.kubernetes is None:
        return _noted(the_plan, f"no live diff: environment `{new_env.name}` is not a cluster environment at "
                                f"{base}; a pull request cannot choose where its plan reads from").to_json()
    if reviewed.spec.kubernetes != new_env.spec.kubernetes:
        the_plan = _noted(the_plan, f"environment `{new_env.name}` changes its cluster settings; the live diff "
                                    f"uses those at {base}")
    k8s = reviewed.spec.kubernetes
    overrides = overrides or TargetOptions()
    options = replace(overrides, context=overrides.context or k8s.context, namespace=overrides.namespace or k8s.namespace,
                      untrusted_root=project_root(Path(start)))
    try:
        target = open_target(reviewed, options)
        namespace = namespace_of(reviewed, options)
        live_plan, _ = make_plan(new.specs, new_env, target, namespace, None, dry_run=False,
                                 memo=renders.another(new_env, namespace))
        the_plan = replace(the_plan, live=live_plan)
        known = {(r.flag, r.message) for r in the_plan.risks}
        the_plan = replace(the_plan, risks=(*the_plan.risks, *(
            r for r in live_risks(live_plan, new, old, registry_records(live_plan, target)) if (r.flag, r.message) not in known)))
        the_plan = _noted(the_plan, f"live: {live_plan.counts()} against the cluster (read-only: not settled by "
                                    "server-side dry runs)")
    except (TargetError, ForgeError) as exc:
        the_plan = _noted(the_plan, f"no live diff: {str(exc).splitlines()[0]}")
    return the_plan.to_json()


def _noted(plan: Plan, note: str) -> Plan:
    return replace(plan, notes=(*plan.notes, note))
