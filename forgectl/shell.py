"""What every `forgectl` command group shares: the two consoles, printing user text safely, and
the few calls that turn command-line values into library objects (the specs with their
Environment, the target, the rollout controllers). `models_cli` and `experiment_cli` import this
module, never `forgectl.cli`, so `forgectl.cli` can add their command groups without a cycle.

Library imports stay inside the functions: a command pays only for what it uses (`validate` and
`plan --base` never load a target).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console

from forgectl.options import NO_OVERRIDES, TargetFlags

if TYPE_CHECKING:
    from reconciler.controller.watch import Controllers
    from reconciler.load.endpoints import DesiredEndpoint
    from reconciler.load.loader import LoadResult
    from reconciler.plan.session import TargetOptions
    from reconciler.targets.base import Target
    from specs import Environment

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def safe(text: str) -> str:
    """A message for the terminal: each line's control characters shown as escapes, rich markup
    escaped (messages quote user input: file names, revisions, values)."""
    from rich.markup import escape

    from reconciler.diagnostics import log_safe

    return "\n".join(escape(log_safe(line)) for line in text.split("\n"))


def load_for(paths: list[str] | None, rev: str | None, env_name: str | None) -> tuple[LoadResult, Environment]:
    """Load specs (raising on any problem) and pick the environment."""
    from reconciler.load.environments import load_environment

    return load_environment(paths, rev, env_name)


def target_options(flags: TargetFlags, progress: Any = None) -> TargetOptions:
    """The library's target options from the command line's target flags. ``progress``: the local
    target's callback for workflow step events (`apply`'s bars)."""
    from reconciler.plan.session import TargetOptions

    return TargetOptions(flags.kubeconfig, flags.context, flags.namespace, progress)


def open_target_for(environment: Environment, flags: TargetFlags = NO_OVERRIDES, progress: Any = None) -> tuple[Target, str]:
    """The environment's target with the command line's overrides, and its namespace."""
    from reconciler.plan.session import namespace_of, open_target

    options = target_options(flags, progress)
    return open_target(environment, options), namespace_of(environment, options)


def rollout_controllers(paths: list[str] | None, env_name: str | None,
                        flags: TargetFlags) -> tuple[LoadResult, Environment, Controllers]:
    """Specs, environment, and the rollout and experiment controllers on the target's rollout
    backend, measuring with the Prometheus of ``--prometheus-url``, else the Environment's, else the
    one the target runs."""
    from reconciler.controller.watch import controllers_for
    from reconciler.load.sources import revision_of

    result, environment = load_for(paths, None, env_name)
    target, namespace = open_target_for(environment, flags)
    backend = target.rollout_backend(result.specs, environment, revision_of(paths or ["."], None))
    url = flags.prometheus_url or environment.spec.prometheus.url or target.prometheus_url()
    return result, environment, controllers_for(result, environment, backend, url, namespace)


def one_endpoint(paths: list[str] | None, env_name: str | None, flags: TargetFlags,
                 endpoint: str) -> tuple[Controllers, DesiredEndpoint]:
    """The controllers (their backend freshly read) and the Endpoint named ``endpoint`` with
    what the specs want it to serve; :class:`ForgeError` when the specs have no such Endpoint."""
    from reconciler.load.endpoints import find_endpoint

    result, environment, controllers = rollout_controllers(paths, env_name, flags)
    controllers.backend.refresh()
    return controllers, find_endpoint(result.specs, environment, endpoint)
