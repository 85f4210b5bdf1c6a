"""Debian packages a test harness needs but must not install: ``apt-get download`` of the
candidate version, extracted under the cache (``debs/<name>-<version>``) once per version. Used for
the node's images (busybox) and the tests' sshd (devkit/gitserver.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from devkit.common import cache_dir


def debian_package(name: str, log=print) -> tuple[Path, str]:
    """(extracted tree, version) of Debian package ``name`` (``apt-get download``, cached by version)."""
    def candidate() -> str:
        ver = subprocess.run(["apt-cache", "policy", name], capture_output=True, text=True, check=True).stdout
        return next((ln.split(":", 1)[1].strip() for ln in ver.splitlines() if ln.strip().startswith("Candidate:")), "")

    cand = candidate()
    if not cand or cand == "(none)":  # a fresh machine whose package lists were never fetched
        log("apt-get update (no package lists yet)")
        subprocess.run((["sudo", "-n"] if os.geteuid() else []) + ["apt-get", "update", "-q"],
                       capture_output=True, check=False)
        cand = candidate()
    if not cand or cand == "(none)":
        raise RuntimeError(f"apt-cache knows no candidate for {name}")
    safe = cand.replace(":", "_")
    root = cache_dir() / "debs" / f"{name}-{safe}"
    if (root / ".done").is_file():
        return root, cand
    log(f"downloading Debian's {name} {cand}")
    with tempfile.TemporaryDirectory(prefix="forge-deb-") as td:
        os.chmod(td, 0o755)  # apt's _apt user writes the download here
        proc = subprocess.run(["apt-get", "download", "-q", f"{name}={cand}"], cwd=td,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"apt-get download {name}={cand}: {proc.stderr.strip()}")
        deb = next(Path(td).glob("*.deb"))
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = root.with_name(root.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True)
        shutil.copy2(deb, tmp / ".deb")
        (tmp / ".done").write_text(cand + "\n")
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
    return root, cand
