"""Where the runtimes run on this machine: the checkout's root (what a step's `PYTHONPATH` names)
and the cached runtime environments `scripts/runtime-env` builds — for the local target's steps
and for a command that runs one step here (`forgectl labels merge` of a sharded source)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from reconciler.errors import TargetNotAvailable

FORGE_ROOT = Path(__file__).resolve().parents[1]  # the checkout: reconciler/runtimeenv.py → ../..


def runtime_python(kind: str = "main") -> str:
    """Python of a runtime environment (`scripts/runtime-env main|seldon`, cached), or
    `$FORGE_RUNTIME_PYTHON` / `$FORGE_SELDON_PYTHON`."""
    explicit = os.environ.get("FORGE_RUNTIME_PYTHON" if kind == "main" else "FORGE_SELDON_PYTHON")
    if explicit:
        return explicit
    script = FORGE_ROOT / "scripts" / "runtime-env"
    proc = subprocess.run(["bash", str(script), kind], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise TargetNotAvailable(f"cannot set up the runtime environment ({script} {kind}):\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]
