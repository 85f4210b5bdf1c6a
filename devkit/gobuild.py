"""Go: etcd and kube-apiserver built from the Go module proxy by ``scripts/cluster/build.sh`` into
``${FORGE_CACHE:-~/.cache/forge}/bin/<name>-<version>/`` (once per pinned version), and
``go mod download`` into the same cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devkit.common import SCRIPTS, ClusterError, Log, cache_dir, stderr_log, versions


def binary_path(name: str) -> Path:
    v = versions()
    version = {"etcd": v["ETCD_VERSION"], "kube-apiserver": v["KUBERNETES_VERSION"]}[name]
    return cache_dir() / "bin" / f"{name}-{version}" / name


def ensure_binaries(log: Log = stderr_log) -> dict[str, Path]:
    """Build etcd and kube-apiserver unless the pinned versions are already in the cache."""
    paths = {n: binary_path(n) for n in ("etcd", "kube-apiserver")}
    missing = [n for n, p in paths.items() if not os.access(p, os.X_OK)]
    if missing:
        if shutil.which("go") is None:
            raise ClusterError("Go is needed to build " + ", ".join(missing) + " (not on PATH)")
        log(f"building {', '.join(missing)} (first time only; kube-apiserver takes about 6 min on 2 idle cores)")
        t0 = time.monotonic()
        for name in missing:
            proc = subprocess.run([str(SCRIPTS / "build.sh"), name], stdout=sys.stderr, stderr=sys.stderr)
            if proc.returncode != 0:
                raise ClusterError(f"scripts/cluster/build.sh {name} failed (exit {proc.returncode})")
        log(f"built in {time.monotonic() - t0:.0f} s")
    return paths


def go_env() -> dict[str, str]:
    """This process's environment with the module and build caches of the forge cache."""
    c = cache_dir()
    env = dict(os.environ)
    env.update(
        GOMODCACHE=str(c / "go" / "mod"),
        GOCACHE=str(c / "go" / "build"),
        GOFLAGS="-modcacherw",
        GOTOOLCHAIN=os.environ.get("GOTOOLCHAIN", "local"),
    )
    return env


def go_mod_download(module: str, version: str) -> Path:
    """``go mod download -json module@version`` into the forge cache; returns the module dir."""
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True, text=True, env=go_env(), cwd=tempfile.gettempdir(),
    )
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise ClusterError(f"go mod download {module}@{version}: {proc.stderr.strip()}") from None
    if info.get("Error") or not info.get("Dir"):
        raise ClusterError(f"go mod download {module}@{version}: {info.get('Error') or proc.stderr.strip()}")
    return Path(info["Dir"])
