"""What every part of the harness shares: the repository's paths, the pins in
``scripts/cluster/versions.env``, the cache folder, the log callback and the error type."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts" / "cluster"

Log = Callable[[str], None]


def stderr_log(msg: str) -> None:
    print(f"[dev-cluster] {msg}", file=sys.stderr, flush=True)


class ClusterError(RuntimeError):
    """The test cluster (or its Prometheus) could not be built, started or stopped."""


def cache_dir() -> Path:
    return Path(os.environ.get("FORGE_CACHE") or Path.home() / ".cache" / "forge")


def versions() -> dict[str, str]:
    """The pins in scripts/cluster/versions.env."""
    out: dict[str, str] = {}
    for line in (SCRIPTS / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def stop_group(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """Stop a process started with ``start_new_session=True`` and everything it started: SIGTERM to
    its process group, SIGKILL after ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
