"""What the runtime benches (bench/train.py, train_gpu.py, compress.py, prepare.py, serve.py) share:
run inside the cached runtime environment (re-exec there when torch is missing) and run a step
in-process. Bench tooling, not part of the runtimes package (it shipped in the wheel as
runtimes/benchsupport.py until issue 27). Imports nothing heavy at module level."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ensure_runtime_env() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        python = subprocess.run(["bash", str(ROOT / "scripts" / "runtime-env"), "main"], check=True, capture_output=True, text=True).stdout.strip()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
        os.execve(python, [python, *sys.argv], env)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def step(module: str, config: dict) -> int:
    """Run a runtime step in this process, as ``python -m runtimes <step> --config-json``."""
    import importlib
    import json

    return importlib.import_module(module).run(["--config-json", json.dumps(config)])
