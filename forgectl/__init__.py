"""The `forgectl` command line.

Pull-request mode is inert, and that starts with imports: Forge's own packages have plain names
(`specs`, `renderers`, `reconciler`) that a repository of specs may well hold as folders. When
`forgectl` is started as `python -m forgectl` (or with `PYTHONPATH=.`), the working directory — the
checkout under review — is on `sys.path`, and a `specs/__init__.py` there would run instead of
Forge's. So the working directory is taken off `sys.path` here, before anything else is imported,
unless it is Forge's own source tree. (The `forgectl` console script never puts it there; a
`forgectl/` folder in the checkout would shadow this very package under `python -m`, which is why
docs/security.md says to run the console script.)
"""

from __future__ import annotations

import sys
from pathlib import Path

_FORGE_HOME = Path(__file__).resolve().parent.parent


def _drop_working_directory() -> None:
    try:
        cwd = Path.cwd().resolve()
    except OSError:  # the working directory was removed
        return
    if cwd == _FORGE_HOME:
        return
    kept = []
    for entry in sys.path:
        try:
            here = entry in ("", ".") or Path(entry).resolve() == cwd
        except (OSError, RuntimeError, ValueError):
            here = False
        if not here:
            kept.append(entry)
    sys.path[:] = kept


_drop_working_directory()
