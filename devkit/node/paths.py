"""What the node takes from the rest of the harness, in one place: the cache, the pins, Go
module downloads, certificates, the start-up HTTPS client and the process layer.

The API server's start-up is :class:`devkit.cluster.Cluster` (it moved there from
``tests/clusterkit.py``); the node joins a running one.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from devkit.apiclient import RawClient  # noqa: F401
from devkit.certs import issue_cert, write_kubeconfig  # noqa: F401
from devkit.common import cache_dir, versions  # noqa: F401
from devkit.gobuild import go_mod_download  # noqa: F401
from reconciler.targets.local.processes import free_port, log_tail, running, spawn, start_ticks, stop_pid  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SH = REPO_ROOT / "scripts" / "cluster" / "build.sh"


def binary(name: str) -> Path:
    """Path of a component built by ``scripts/cluster/build.sh node`` (may not exist yet)."""
    return cache_dir() / "bin" / f"{name}-{versions()['KUBERNETES_VERSION']}" / name


def argo_binary(name: str) -> Path:
    """workflow-controller or argoexec, built by ``scripts/cluster/build.sh argo``."""
    return cache_dir() / "bin" / f"argo-workflows-{versions()['ARGO_WORKFLOWS_VERSION']}" / name


def ensure_built(target: str, path: Path, what: str, log: Callable[[str], None],
                 error: type[Exception] = RuntimeError) -> Path:
    """``path``, built by ``scripts/cluster/build.sh <target>`` (niced) when it is not there yet;
    ``error`` when the build fails."""
    if not os.access(path, os.X_OK):
        log(f"building {what} (first time only: a long build)")
        t0 = time.monotonic()
        if subprocess.run(["nice", "-n", "10", str(BUILD_SH), target]).returncode != 0:
            raise error(f"scripts/cluster/build.sh {target} failed")
        log(f"{what} built in {time.monotonic() - t0:.0f} s")
    return path
