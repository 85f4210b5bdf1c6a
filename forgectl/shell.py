"""What every `forgectl` command group shares: the two consoles, printing user text safely, and
the few calls that turn command-line values into library objects: the specs with their
Environment and its target (:func:`open_environment`, every command's prologue), the rollout
controllers. `models_cli` and `experiment_cli` import this module, never `forgectl.cli`, so
`forgectl.cli` can add their command groups without a cycle.

Library imports stay inside the functions: a command pays only for what it uses (`validate` and
`plan --base` never load a target).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from forgectl.options import NO_OVERRIDES, TargetFlags

if TYPE_CHECKING:
    from reconciler.controller.watch import Controllers
    from reconciler.load.endpoints import DesiredEndpoint
    from reconciler.load.loader import LoadResult
    from reconciler.plan.session import TargetOptions
    from reconciler.targets.base import LeaseTiming, Target
    from specs import Environment

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def safe(text: str) -> str:
    """A message for the terminal: each line's control characters shown as escapes, rich markup
    escaped (messages quote user input: file names, revisions, values)."""
    from rich.markup import escape

    from reconciler.diagnostics import log_safe

    return "\n".join(escape(log_safe(line)) for line in text.split("\n"))


def json_bytes(value: Any, *, default: Callable[[Any], Any] | None = None) -> bytes:
    """``value`` as indented JSON (two spaces, UTF-8): by orjson, which writes a 10,000-endpoint
    plan (hundreds of MB) about ten times faster than the standard library's indenting encoder, a
    pure-Python one; a value orjson refuses (an integer past 64 bits, a key that is no string)
    by the standard library."""
    import orjson

    try:
        return orjson.dumps(value, default=default, option=orjson.OPT_INDENT_2)
    except TypeError:
        import json

        return json.dumps(value, indent=2, default=default, ensure_ascii=False).encode()


def print_json(value: Any, *, default: Callable[[Any], Any] | None = None) -> None:
    """Write ``value`` to standard output as :func:`json_bytes` makes it, and a newline."""
    import sys

    data = json_bytes(value, default=default)
    sys.stdout.flush()
    stream = getattr(sys.stdout, "buffer", None)
    if stream is None:  # a text-only stream (some test harnesses)
        sys.stdout.write(data.decode() + "\n")
    else:
        stream.write(data + b"\n")
        stream.flush()


def load_for(paths: list[str] | None, rev: str | None, env_name: str | None) -> tuple[LoadResult, Environment]:
    """Load specs (raising on any problem) and pick the environment."""
    from reconciler.load.environments import load_environment

    return load_environment(paths, rev, env_name)


def target_options(flags: TargetFlags) -> TargetOptions:
    """The library's target options from the command line's target flags."""
    from reconciler.plan.session import TargetOptions

    return TargetOptions(flags.kubeconfig, flags.context, flags.namespace)


@dataclass(frozen=True)
class Opened:
    """What most commands start from: the specs, their environment, and its target (with the
    command line's overrides) and namespace."""

    result: LoadResult
    environment: Environment
    target: Target
    namespace: str


def open_environment(paths: list[str] | None, rev: str | None, env_name: str | None,
                     flags: TargetFlags = NO_OVERRIDES, lease: LeaseTiming | None = None) -> Opened:
    """Load the specs under ``paths`` (at ``rev``), pick the environment ``env_name`` names and
    open its target with the command line's overrides (see :class:`Opened`); its lock held as
    ``lease`` says (None: as an apply holds it)."""
    import dataclasses

    from reconciler.plan.session import namespace_of, open_target

    result, environment = load_for(paths, rev, env_name)
    options = dataclasses.replace(target_options(flags), lease=lease)
    return Opened(result, environment, open_target(environment, options), namespace_of(environment, options))


def controllers_of(ctx: Opened, paths: list[str] | None, flags: TargetFlags) -> Controllers:
    """The rollout and experiment controllers of an environment already opened, on its target's
    rollout backend, measuring with the Prometheus that
    :func:`reconciler.controller.watch.prometheus_for` chooses (``--prometheus-url`` first)."""
    from reconciler.controller.watch import controllers_for, prometheus_for
    from reconciler.load.sources import revision_of

    backend = ctx.target.rollout_backend(ctx.result.specs, ctx.environment, revision_of(paths or ["."], None))
    url = prometheus_for(ctx.environment, ctx.target, flags.prometheus_url)
    return controllers_for(ctx.result, ctx.environment, backend, url, ctx.namespace)


def one_endpoint(paths: list[str] | None, env_name: str | None, flags: TargetFlags,
                 endpoint: str) -> tuple[Controllers, DesiredEndpoint]:
    """The controllers (their backend freshly read) and the Endpoint named ``endpoint`` with
    what the specs want it to serve; :class:`ForgeError` when the specs have no such Endpoint."""
    return endpoint_in(open_environment(paths, None, env_name, flags), paths, flags, endpoint)


def endpoint_in(ctx: Opened, paths: list[str] | None, flags: TargetFlags,
                endpoint: str) -> tuple[Controllers, DesiredEndpoint]:
    """:func:`one_endpoint` of an environment already opened."""
    from reconciler.load.endpoints import find_endpoint

    controllers = controllers_of(ctx, paths, flags)
    controllers.backend.refresh()
    return controllers, find_endpoint(ctx.result.specs, ctx.environment, endpoint)


def one_line_summaries(app: typer.Typer) -> None:
    """Give every command of ``app`` and of its groups, where none is set, a summary for the command
    list: its help's first sentence, on one line (like `kubectl`'s list; the rest is in the command's
    own `--help`). Typer's rich list would show the whole first paragraph with the docstring's line
    breaks, which wrap mid-sentence in the terminal's width."""
    import inspect
    import re

    for command in app.registered_commands:
        doc = command.help or inspect.getdoc(command.callback) or ""
        if command.short_help is None and doc:
            paragraph = " ".join(doc.split("\n\n")[0].split())
            command.short_help = re.split(r"(?<=\.) (?=[A-Z])", paragraph, maxsplit=1)[0]
    for group in app.registered_groups:
        if group.typer_instance is not None:
            one_line_summaries(group.typer_instance)
