"""Load specs for a command and pick the Environment it works in."""

from __future__ import annotations

from reconciler.diagnostics import ForgeError
from reconciler.load.loader import LoadResult, load_or_raise
from reconciler.load.parsecache import ParseCache
from specs import Environment


def load_environment(paths: list[str] | None, rev: str | None, name: str | None,
                     cache: ParseCache | None = None) -> tuple[LoadResult, Environment]:
    """The specs under ``paths`` (the current folder by default; at git revision ``rev`` when
    given), raising :class:`~reconciler.diagnostics.SpecError` on any problem, and the Environment
    named ``name`` — else the one the specs mark default, else `local`. Raises
    :class:`ForgeError` naming the environments there are when none fits. ``cache``: a parse cache
    shared with other loads (:func:`reconciler.load.loader.load`)."""
    result = load_or_raise(paths or ["."], rev, cache)
    env = result.specs.environment(name)
    if env is None:
        names = ", ".join(e.name for e in result.specs.of(Environment)) or "none defined"
        wanted = f"environment {name!r}" if name else "a default environment"
        raise ForgeError(f"no {wanted} in the specs (environments: {names}); pass --env NAME")
    return result, env
