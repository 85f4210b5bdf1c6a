"""Rules that keep untrusted spec text from becoming code somewhere downstream, and paths from
leaving the project. Used by the loader (at validate time), the local target and the runtimes.

* **Evaluated text.** Forge copies spec strings into rendered objects: step configs travel as JSON
  in a Workflow container's `args`. Argo Workflows substitutes `{{…}}` tags in every field of a
  Workflow's templates and evaluates `{{=…}}` as an expression; the kubelet expands `$(VAR)` in a
  container's `command`, `args` and `env` values. Argo has no escape for `{{`, so such text is
  refused in every spec string (with its file:line), except where it never reaches those places.
* **Contained paths.** :func:`resolve_inside` resolves a relative path under a root and refuses it
  when it (or a symlink on the way) leads outside, or names something that is not a regular file or
  folder (a FIFO blocks a reader, a device never ends).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

#: Text that a controller evaluates in the fields spec strings are rendered into: who does it, and
#: the hint a diagnostic gives.
EVALUATED: dict[str, tuple[str, str]] = {
    "{{": ("Argo Workflows substitutes `{{…}}` tags and evaluates `{{=…}}` expressions in a Workflow's "
           "templates, where spec text is rendered", "write the text without `{{`: Argo has no escape for it"),
    "$(": ("the kubelet expands `$(VAR)` in a container's command and args, where spec text is rendered",
           "write the text without `$(`"),
}

#: (kind, path) of fields whose text never reaches a Workflow or a container: `*` matches any list
#: index. A metric's PromQL goes to Prometheus only (and is parsed there and at validate time).
EXEMPT: frozenset[tuple[str, tuple[str, ...]]] = frozenset({
    ("RolloutPolicy", ("spec", "metrics", "*", "query")),
})

Path_ = tuple[str | int, ...]


def _exempt(kind: str, path: Path_) -> bool:
    for exempt_kind, pattern in EXEMPT:
        if exempt_kind == kind and len(pattern) == len(path) and all(
            p == "*" and isinstance(q, int) or p == q for p, q in zip(pattern, path)
        ):
            return True
    return False


def _strings(value: Any, path: Path_) -> Iterator[tuple[Path_, str, bool]]:
    """Every string in ``value`` with its path, and whether it is a mapping key."""
    if isinstance(value, str):
        yield path, value, False
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                yield path + (key,), key, True
            yield from _strings(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, path + (i,))


def _may_hold_markers(data: Any) -> bool:
    """False only when no string of ``data`` (key or value) can hold a marker of :data:`EVALUATED`:
    its JSON has none. JSON writes every string verbatim but for quotes, backslashes and control
    characters, none of which is in a marker, and its own punctuation never forms one (an object
    opens with a quoted key, not a brace). So most documents skip the walk of every string by path,
    which took a third of the load of 10,000 endpoints. Data JSON cannot hold (YAML's binary, a
    key that is not a string or a number): True, so the walk decides."""
    try:
        text = orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return True
    return any(marker.encode() in text for marker in EVALUATED)


def evaluated_text(data: Any) -> list[tuple[Path_, bool, str, str]]:
    """(path, is-a-key, message, hint) for every string of a spec document that holds text a
    controller would evaluate (see :data:`EVALUATED`), outside the :data:`EXEMPT` fields."""
    return _walk_evaluated(data) if _may_hold_markers(data) else []


def _walk_evaluated(data: Any) -> list[tuple[Path_, bool, str, str]]:
    """:func:`evaluated_text` by walking every string with its path (what the JSON check spares)."""
    kind = data.get("kind") if isinstance(data, dict) else None
    problems = []
    for path, text, is_key in _strings(data, ()):
        for marker, (who, hint) in EVALUATED.items():
            if marker in text and not (isinstance(kind, str) and _exempt(kind, path)):
                problems.append((path, is_key, f"`{marker}` is not allowed in spec text: {who}", hint))
                break
    return problems


class OutsideRoot(ValueError):
    """A path leads outside its root, or names something that is not a regular file or folder."""


def _loop_reason(exc: BaseException) -> str:
    if isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP:
        return "a symlink loop (a link that leads back to itself)"
    return getattr(exc, "strerror", None) or type(exc).__name__


def resolve_inside(root: Path, relative: str, *, what: str = "path") -> Path:
    """``root / relative`` with every symlink resolved, refused unless it stays inside ``root``
    (itself resolved) and, if it exists, is a regular file or a folder. It need not exist."""
    if Path(relative).is_absolute() or ".." in Path(relative).parts:
        raise OutsideRoot(f"{what} {relative!r} must be relative to {root} and stay inside it")
    try:
        base = root.resolve()
        target = (base / relative).resolve()  # non-strict: a missing tail is fine
    except (RuntimeError, OSError) as exc:  # a symlink loop: RuntimeError before Python 3.13, OSError (ELOOP) after
        raise OutsideRoot(f"{what} {relative!r} cannot be resolved: {_loop_reason(exc)}") from None
    if target != base and base not in target.parents:
        raise OutsideRoot(f"{what} {relative!r} leads to {target}, outside {base} (through a symlink)")
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise OutsideRoot(f"{what} {relative!r}: {exc.strerror}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
        raise OutsideRoot(f"{what} {relative!r} is {kind}, not a regular file or folder")
    return target
