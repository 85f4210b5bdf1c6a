"""Forge's controller image (``forgectl controller run``, docs/controller.md), built here without
any registry, as the runtime image is (:mod:`devkit.node.runtime_image`; the shared machinery in
:mod:`devkit.node.layers`): control plane only, so small — no torch, no compiler.

Three layers, so that a change to Forge's code rebuilds only the last, small one:

1. **base**: a Debian root filesystem (``mmdebstrap --variant=minbase``, the host's suite) with
   ``python3.11``, ``git`` (the controller fetches with Debian's git) and ``ca-certificates``; user
   ``forge`` with uid/gid 65532 (what the Deployment runs as) and home :data:`STATE`. Key: the
   suite, the package list, the hook, :data:`FORMAT`.
2. **requirements**: Forge's own runtime dependencies (pyproject's ``[project] dependencies``
   and what they require, evaluated for this Python: never the dev or runtime extras), pinned to
   the versions installed in the environment that runs this build (the checkout's ``.venv``: what
   the tests run with), installed from PyPI's wheels (``pip install --target --no-deps
   --only-binary=:all:``) into ``/usr/local/lib/python3.11/dist-packages`` (Debian's python3.11
   reads it), byte-compiled with hash-based ``.pyc`` (valid whatever the files' mtimes, and the
   root filesystem is read-only at run time). Key: the pinned set and the Python minor version.
3. **forge**: ``forgectl/``, ``reconciler/``, ``renderers/``, ``specs/`` and ``schema/`` at
   ``/opt/forge`` (``PYTHONPATH``), byte-compiled the same way. Key: their files.

The entrypoint is ``python3.11 -m forgectl`` (pyproject's ``forgectl`` script); the command
``controller run --config /etc/forge/config.yaml``, as the Deployment of
:mod:`reconciler.controller.install` says. The working directory and ``HOME`` are
:data:`STATE`, the Deployment's cache ``emptyDir``: the root filesystem is read-only there, so a
relative ``cacheDir`` (the configuration's default ``.forge/controller``) lands on that volume.

The image is named :attr:`InstallOptions.image <reconciler.controller.install.InstallOptions>`
(``forge-controller:0.1.0``) in containerd's normalized form (``docker.io/library/…``), the name
the kubelet asks the CRI for when a pod names the short one; the Deployment's ``IfNotPresent``
then never pulls. The archive is ``<cache>/images/forge-controller-<tag>-<key>.tar``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devkit.node import layers, paths
from reconciler.controller.install import CACHE_PATH, CONFIG_PATH, PORT, InstallOptions

FORMAT = "1"  # bump when the layers' recipe changes
PYTHON = "python3.11"
BASE_PACKAGES = ("python3.11", "git", "ca-certificates")
UID = 65532  # the Deployment's runAsUser / runAsGroup
#: Writable at run time (the Deployment's cache emptyDir): the working directory and HOME.
STATE = CACHE_PATH
BASE_HOOK = (f'chroot "$1" groupadd --gid {UID} forge && '
             f'chroot "$1" useradd --uid {UID} --gid {UID} --no-create-home --home-dir {STATE} '
             '--shell /usr/sbin/nologin forge && '
             f'mkdir -p "$1"{STATE} && chown {UID}:{UID} "$1"{STATE} && '
             # git's perl (and its manual): only git's perl commands use them (send-email, svn, …),
             # never a fetch; 45 MB of a small image. The image is rebuilt, never upgraded by apt.
             'chroot "$1" dpkg --purge --force-depends perl liberror-perl git-man '
             '$(chroot "$1" dpkg-query -W -f "\\${Package} " "perl-modules-*" "libperl5*") && '
             'rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/usr/share/doc/* "$1"/usr/share/man/* '
             '"$1"/usr/share/info/* "$1"/var/log/*.log "$1"/var/cache/ldconfig/aux-cache')
#: What ``forgectl controller run`` imports (``runtimes/`` it never does), and the committed JSON Schema.
FORGE_DIRS = ("forgectl", "reconciler", "renderers", "specs", "schema")
SITE = f"usr/local/lib/{PYTHON}/dist-packages"
ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH=/opt/forge",
       "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1", f"HOME={STATE}"]


def _log(msg: str) -> None:
    print(f"[controller-image] {msg}", flush=True)


def normalized_ref(ref: str) -> str:
    """``ref`` as containerd's CRI names it (Docker's normalization): a first path component
    without ``.`` or ``:`` (and not ``localhost``) is on ``docker.io``, a bare name in its ``library/``."""
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return ref
    return f"docker.io/{ref}" if rest else f"docker.io/library/{ref}"


def pinned_requirements(pyproject: Path = paths.REPO_ROOT / "pyproject.toml") -> list[str]:
    """``name==version`` of every distribution Forge's ``[project] dependencies`` need, with the
    versions installed in the running environment (markers evaluated for it: this Python, Linux)."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    versions: dict[str, str] = {}
    done: set[tuple[str, str]] = set()
    todo = [(Requirement(r), "") for r in deps]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise RuntimeError(f"{req.name} (needed by Forge's dependencies) is not installed in {sys.prefix}: "
                               "run scripts/bootstrap") from None
        if not req.specifier.contains(dist.version, prereleases=True):
            raise RuntimeError(f"{name} {dist.version} in {sys.prefix} does not satisfy {req}: run scripts/bootstrap")
        versions[name] = dist.version
        for wanted in ("", *sorted(req.extras)):
            if (name, wanted) not in done:
                done.add((name, wanted))
                todo.extend((Requirement(r), wanted) for r in dist.requires or ())
    return [f"{n}=={v}" for n, v in sorted(versions.items())]


def _python_minor() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}"


def base_layer() -> Path:
    return layers.debian_base("controller-layers", FORMAT, BASE_PACKAGES, BASE_HOOK, _log, need_file=True)


def requirements_layer() -> Path:
    if _python_minor() != PYTHON:
        raise RuntimeError(f"{sys.executable} is {_python_minor()}; the image's Python is Debian's {PYTHON} "
                           "(the wheels are chosen for the Python that builds the layer)")
    pinned = pinned_requirements()
    dest = layers.layers_dir("controller-layers") / f"requirements-{layers.key(FORMAT, chr(10).join(pinned), PYTHON)}.tar"
    if dest.is_file() and layers.cached(dest):
        return dest
    _log(f"building the requirements layer: {len(pinned)} distributions from PyPI's wheels")
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    with tempfile.TemporaryDirectory(prefix="forge-ctl-req-") as td:
        site = Path(td) / SITE
        (Path(td) / "requirements.txt").write_text("\n".join(pinned) + "\n")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--only-binary=:all:", "--no-compile", "--target", str(site),
                        "-r", str(Path(td) / "requirements.txt")], check=True)
        # console scripts (their #! names this machine's Python): the image runs `python3.11 -m forgectl`
        shutil.rmtree(site / "bin", ignore_errors=True)
        layers.compile_tree(site)
        subprocess.run(["tar", *layers.TAR_FLAGS, "-cf", str(tmp), "-C", td, "usr"], check=True)
    try:
        return layers.finish_layer(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def forge_layer() -> Path:
    return layers.checkout_layer("controller-layers", FORMAT, FORGE_DIRS, PYTHON, need_file=True, after=layers.compile_tree)


def image_config(digests: list[str]) -> dict[str, Any]:
    """The OCI image config: entrypoint, user, environment, the layers' diff ids."""
    return {
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ENV, "Entrypoint": [PYTHON, "-m", "forgectl"],
                   "Cmd": ["controller", "run", "--config", CONFIG_PATH],
                   "User": f"{UID}:{UID}", "WorkingDir": STATE, "ExposedPorts": {f"{PORT}/tcp": {}}},
        "rootfs": {"type": "layers", "diff_ids": digests},
        "history": [{"created_by": f"forge devkit.node.controller_image (format {FORMAT}): {n}"}
                    for n in ("base", "requirements", "forge")],
    }


def build(log=_log, ref: str = InstallOptions().image) -> tuple[Path, str, dict[str, Any]]:
    """(archive, image ref as containerd names it, timings/sizes) of the controller image named
    ``ref``, building what is not cached."""
    t0 = time.monotonic()
    times: dict[str, Any] = {}
    built, digests = layers.timed_layers((("base", base_layer), ("requirements", requirements_layer),
                                          ("forge", forge_layer)), times)
    full = normalized_ref(ref)
    configs = {full: image_config(digests)}
    tag = full.rsplit(":", 1)[1]
    dest = paths.cache_dir() / "images" / f"forge-controller-{tag}-{layers.key(FORMAT, layers.canon(configs), *digests)}.tar"
    if not dest.is_file():
        log(f"packing {full} into {dest.name}")
        t = time.monotonic()
        layers.pack(dest, built, digests, configs, supersedes=f"forge-controller-{tag}-*.tar")
        times["pack_s"] = round(time.monotonic() - t, 1)
    times["total_s"] = round(time.monotonic() - t0, 1)
    times["archive_bytes"] = dest.stat().st_size
    times["layer_bytes"] = {n: p.stat().st_size for n, p in zip(("base", "requirements", "forge"), built)}
    return dest, full, times


if __name__ == "__main__":
    archive, name, info = build()
    print(json.dumps({"archive": str(archive), "image": name, **info}, indent=2))
