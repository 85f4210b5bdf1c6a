"""Forge's runtime image, built here without any registry: what ``runtimes/Dockerfile`` describes
(targets ``train``, ``compress``, ``serve``), made from Debian's packages and the pinned runtime
requirements, packed as one OCI archive that names all three images.

Three layers, so that a change to Forge's code does not rebuild the big ones:

1. **base**: a Debian root filesystem (``mmdebstrap --variant=minbase``, the host's suite, from
   Debian's mirror) with ``python3.11`` and ``g++`` (DeepSpeed compiles its CPU op on first use),
   user ``forge`` (uid 1000) and ``/forge/{workspace,cache}`` as the Dockerfile makes them.
   Key: the suite, the package list, the hooks, :data:`FORMAT`.
2. **requirements**: ``runtimes/requirements.txt`` installed from PyPI. The packages come from the
   runtime environment ``scripts/runtime-env`` builds (keyed by the same requirements' hash;
   built first when missing, so nothing is downloaded twice): its ``site-packages`` go to
   ``/usr/local/lib/python3.11/dist-packages`` (Debian's python3.11 reads it), its console scripts
   (``torchrun``, ``deepspeed``, …) to ``/usr/local/bin`` with their ``#!`` pointing at
   ``/usr/bin/python3.11``. Key: the requirements file's sha256 and the Python minor version.
3. **forge**: ``specs/`` and ``runtimes/`` at ``/opt/forge`` (``PYTHONPATH``). Key: their files.

Each layer is a deterministic tar (GNU tar: sorted, mtime 0, owner 0:0, no atime/ctime) cached in
``<cache>/images/runtime-layers/``; the archive ``<cache>/images/forge-runtime-<tag>-<key>.tar``
(key: the three layers' digests and the image configs) holds the layers once and one manifest per
image. The image names are what the ``cluster`` Environment of ``examples/quickstart`` renders
(``renderers.workflow.image``: ``<imageRegistry>/forge-train:<imageTag>`` …), read from it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from devkit.node import layers, paths
from devkit.node.layers import TAR_FLAGS

FORMAT = "1"  # bump when the layers' recipe changes
#: A key part of the requirements and forge layers: their byte-code is hash-based (a change of
#: those two alone, which the base layer need not be built again for).
PYC = "pyc:unchecked-hash"
PYTHON = "python3.11"
BASE_PACKAGES = ("python3.11", "python3-venv", "g++", "ca-certificates", "libgomp1", "procps")
# what the Dockerfile's RUN useradd / mkdir do, after the packages are installed
BASE_HOOK = ('chroot "$1" useradd --uid 1000 --create-home forge && '
             'mkdir -p "$1"/forge/workspace "$1"/forge/cache && chroot "$1" chown -R forge /forge && '
             'ln -sf /usr/bin/python3.11 "$1"/usr/local/bin/python && ln -sf /usr/bin/python3.11 "$1"/usr/local/bin/python3 && '
             'rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/usr/share/doc/* "$1"/usr/share/man/* '
             '"$1"/var/log/*.log "$1"/var/cache/ldconfig/aux-cache')
TARGETS = {"train": ["train", "--help"], "compress": ["compress", "--help"],
           "serve": ["serve", "--config", "/forge/config/serve.json"]}
ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONDONTWRITEBYTECODE=1",
       "PYTHONUNBUFFERED=1", "PIP_DISABLE_PIP_VERSION_CHECK=1", "FORGE_WORKSPACE=/forge/workspace",
       "FORGE_CACHE=/forge/cache", "TORCH_EXTENSIONS_DIR=/forge/cache/torch_extensions", "PYTHONPATH=/opt/forge"]


def _log(msg: str) -> None:
    print(f"[runtime-image] {msg}", flush=True)


def base_layer(need_file: bool = False) -> Path:
    return layers.debian_base("runtime-layers", FORMAT, BASE_PACKAGES, BASE_HOOK, _log, need_file)


def runtime_env() -> Path:
    """The venv of ``scripts/runtime-env`` (built when missing): the requirements, from PyPI."""
    py = subprocess.run([str(paths.REPO_ROOT / "scripts" / "runtime-env"), "main"], capture_output=True,
                        text=True, check=True).stdout.strip()
    return Path(py).parent.parent


def requirements_layer(need_file: bool = False) -> Path:
    req = paths.REPO_ROOT / "runtimes" / "requirements.txt"
    venv = runtime_env()
    pyver = re.search(r"^version\s*=\s*(\d+\.\d+)", (venv / "pyvenv.cfg").read_text(), re.M)
    if not pyver or f"python{pyver.group(1)}" != PYTHON:
        raise RuntimeError(f"{venv} is not a {PYTHON} environment; the image's Python is Debian's {PYTHON}")
    dest = layers.layers_dir("runtime-layers") / f"requirements-{layers.key(FORMAT, req.read_bytes(), PYTHON, PYC)}.tar"
    if dest.is_file() or (not need_file and layers.cached(dest)):
        return dest
    _log(f"building the requirements layer from {venv} (installed from PyPI by scripts/runtime-env)")
    site = venv / "lib" / PYTHON / "site-packages"
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    with tempfile.TemporaryDirectory(prefix="forge-rt-bin-") as td:
        # the console scripts, their #! pointing at the image's Python
        bindir = Path(td) / "usr" / "local" / "bin"
        bindir.mkdir(parents=True)
        for f in sorted((venv / "bin").iterdir()):
            if f.name.startswith(("python", "activate", "Activate")) or f.is_symlink() or not f.is_file():
                continue
            data = f.read_bytes()
            if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
                data = b"#!/usr/bin/" + PYTHON.encode() + b"\n" + data.split(b"\n", 1)[1]
            (bindir / f.name).write_bytes(data)
            (bindir / f.name).chmod(0o755)
        # pip's byte-code, made hash-based (its timestamps never match in a layer: layers' docstring)
        pycs = Path(td) / "pyc"
        listed = [f"./{p}" for p in layers.hash_based_pycs(site, pycs)
                  if p.parts[0] != "pip" and not p.parts[0].startswith("pip-")]  # as the excludes below
        (Path(td) / "pycs.txt").write_text("\n".join(listed) + "\n")
        into_site = ["--transform", f"s,^\\./,usr/local/lib/{PYTHON}/dist-packages/,"]
        subprocess.run(["nice", "-n", "10", "tar", *TAR_FLAGS, "-cf", str(tmp), *into_site,
                        "--exclude=./pip", "--exclude=./pip-*", "--exclude=__pycache__", "-C", str(site), "."], check=True)
        subprocess.run(["tar", *TAR_FLAGS, "-rf", str(tmp), *into_site, "--no-recursion", "-C", str(pycs),
                        "-T", str(Path(td) / "pycs.txt")], check=True)
        subprocess.run(["tar", *TAR_FLAGS, "-rf", str(tmp), "-C", td, "usr/local/bin"], check=True)
    try:
        return layers.finish_layer(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def forge_layer(need_file: bool = False) -> Path:
    return layers.checkout_layer("runtime-layers", FORMAT, ("specs", "runtimes"), PYC, need_file=need_file,
                                 after=layers.compile_tree)


def image_refs(environment: str = "cluster", specs_dir: Path | None = None) -> dict[str, str]:
    """{target: image ref} as the Environment renders them (``renderers.workflow.image``)."""
    from reconciler.load.environments import load_environment
    from renderers.workflow import image

    _, env = load_environment([str(specs_dir or paths.REPO_ROOT / "examples" / "quickstart")], None, environment)
    return {t: image(env, f"forge-{t}") for t in TARGETS}


def build(log=_log, refs: dict[str, str] | None = None) -> tuple[Path, list[str], dict[str, Any]]:
    """(archive, image refs, timings/sizes) of the runtime images, building what is not cached."""
    t0 = time.monotonic()
    times: dict[str, Any] = {}
    refs = refs or image_refs()
    built, digests = layers.timed_layers((("base", base_layer), ("requirements", requirements_layer),
                                          ("forge", forge_layer)), times)
    configs = {}
    for target, ref in refs.items():
        configs[ref] = {
            "architecture": "amd64", "os": "linux",
            "config": {"Env": ENV, "Entrypoint": ["python", "-m", "runtimes"], "Cmd": TARGETS[target],
                       "User": "1000", "WorkingDir": "/forge/workspace",
                       **({"ExposedPorts": {"8080/tcp": {}}} if target == "serve" else {})},
            "rootfs": {"type": "layers", "diff_ids": digests},
            "history": [{"created_by": f"forge devkit.node.runtime_image (format {FORMAT}): {n}"}
                        for n in ("base", "requirements", "forge")],
        }
    key = layers.key(FORMAT, layers.canon(configs), *digests)
    tag = sorted(refs.values())[0].rsplit(":", 1)[1]
    dest = paths.cache_dir() / "images" / f"forge-runtime-{tag}-{key}.tar"
    if not dest.is_file():
        for i, (p, fn) in enumerate(zip(built, (base_layer, requirements_layer, forge_layer))):
            if not p.is_file():
                built[i] = fn(need_file=True)
                if layers.digest_of(built[i]) != digests[i]:
                    raise RuntimeError(f"{p.name} built again has another digest: the layer is not reproducible")
        log(f"packing {', '.join(sorted(refs.values()))} into {dest.name}")
        t = time.monotonic()
        # older archives of the same images (other code or requirements): several GB each
        layers.pack(dest, built, digests, configs, supersedes=f"forge-runtime-{tag}-*.tar")
        times["pack_s"] = round(time.monotonic() - t, 1)
        # the archive holds every layer: keep only the small layer files (the requirements layer,
        # several GB, is made again from the runtime environment in about a minute when needed)
        for p in built:
            if p.stat().st_size > 1 << 30:
                p.unlink()
    times["total_s"] = round(time.monotonic() - t0, 1)
    times["archive_bytes"] = dest.stat().st_size
    times["layer_bytes"] = {n: p.stat().st_size for n, p in zip(("base", "requirements", "forge"), built)
                            if p.exists()}
    return dest, sorted(refs.values()), times


#: {image ref: manifest digest} of an OCI archive (node.py imports it from here).
archive_refs = layers.archive_refs


if __name__ == "__main__":
    archive, names, info = build()
    print(json.dumps({"archive": str(archive), "images": names, **info}, indent=2))
