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

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from devkit.node import paths

FORMAT = "1"  # bump when the layers' recipe changes
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
TAR_FLAGS = ["--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "--format=posix",
             "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime"]


def _log(msg: str) -> None:
    print(f"[runtime-image] {msg}", flush=True)


def _key(*parts: str | bytes) -> str:
    h = hashlib.sha256(FORMAT.encode())
    for p in parts:
        h.update(b"\0")
        h.update(p.encode() if isinstance(p, str) else p)
    return h.hexdigest()[:16]


def _layers_dir() -> Path:
    d = paths.cache_dir() / "images" / "runtime-layers"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _finish_layer(tmp: Path, dest: Path) -> Path:
    """Record the layer's digest next to it and move it into place."""
    digest = _sha256_file(tmp)
    Path(str(tmp) + ".digest").write_text(digest + "\n")
    os.replace(str(tmp) + ".digest", str(dest) + ".digest")
    os.replace(tmp, dest)
    return dest


def _cached(layer: Path) -> bool:
    """A layer whose digest is recorded: its file may have been dropped after packing."""
    return Path(str(layer) + ".digest").is_file()


def _digest_of(layer: Path) -> str:
    return Path(str(layer) + ".digest").read_text().strip()


def host_suite() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip().strip('"')
    raise RuntimeError("no VERSION_CODENAME in /etc/os-release (the base layer uses the host's Debian suite)")


def _ensure_mmdebstrap() -> None:
    if shutil.which("mmdebstrap"):
        return
    _log("installing Debian's mmdebstrap")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(sudo + ["apt-get", "install", "-y", "-q", "mmdebstrap"], env=env).returncode != 0:
        subprocess.run(sudo + ["apt-get", "update", "-q"], env=env, check=True)
        subprocess.run(sudo + ["apt-get", "install", "-y", "-q", "mmdebstrap"], env=env, check=True)


def base_layer(need_file: bool = False) -> Path:
    suite = host_suite()
    dest = _layers_dir() / f"base-{suite}-{_key(suite, ' '.join(BASE_PACKAGES), BASE_HOOK)}.tar"
    if dest.is_file() or (not need_file and _cached(dest)):
        return dest
    _ensure_mmdebstrap()
    _log(f"building the base layer: Debian {suite} minbase + {' '.join(BASE_PACKAGES)} (mmdebstrap)")
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    # the host's apt sources (its mirror, the security suite) for the same suite
    sources = subprocess.run(["apt-get", "indextargets", "--format", "$(REPO_URI) $(RELEASE) $(COMPONENT)"],
                             capture_output=True, text=True).stdout
    lines = sorted({f"deb {ln.split()[0]} {ln.split()[1]} {ln.split()[2]}" for ln in sources.splitlines()
                    if len(ln.split()) == 3 and ln.split()[1].startswith(suite)})
    try:
        subprocess.run(["nice", "-n", "10", "mmdebstrap", "--mode=root", "--variant=minbase", "--format=tar",
                        f"--include={','.join(BASE_PACKAGES)}",
                        "--dpkgopt=path-exclude=/usr/share/locale/*",
                        f"--customize-hook={BASE_HOOK}", suite, str(tmp), "-"],
                       input="\n".join(lines) + "\n", text=True, check=True,
                       env=dict(os.environ, SOURCE_DATE_EPOCH="0"))
        return _finish_layer(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


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
    dest = _layers_dir() / f"requirements-{_key(req.read_bytes(), PYTHON)}.tar"
    if dest.is_file() or (not need_file and _cached(dest)):
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
        subprocess.run(["nice", "-n", "10", "tar", *TAR_FLAGS, "-cf", str(tmp),
                        "--transform", f"s,^\\./,usr/local/lib/{PYTHON}/dist-packages/,",
                        "--exclude=./pip", "--exclude=./pip-*", "-C", str(site), "."], check=True)
        subprocess.run(["tar", *TAR_FLAGS, "-rf", str(tmp), "-C", td, "usr/local/bin"], check=True)
    try:
        return _finish_layer(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def forge_layer(need_file: bool = False) -> Path:
    files = sorted(p for d in ("specs", "runtimes") for p in (paths.REPO_ROOT / d).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts)
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(paths.REPO_ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    dest = _layers_dir() / f"forge-{_key(h.hexdigest())}.tar"
    if dest.is_file() or (not need_file and _cached(dest)):
        return dest
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    with tempfile.TemporaryDirectory(prefix="forge-rt-src-") as td:
        root = Path(td) / "opt" / "forge"
        for p in files:
            out = root / p.relative_to(paths.REPO_ROOT)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, out)
        subprocess.run(["tar", *TAR_FLAGS, "-cf", str(tmp), "-C", td, "opt"], check=True)
    try:
        return _finish_layer(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def image_refs(environment: str = "cluster", specs_dir: Path | None = None) -> dict[str, str]:
    """{target: image ref} as the Environment renders them (``renderers.workflow.image``)."""
    from reconciler.load.environments import load_environment
    from renderers.workflow import image

    _, env = load_environment([str(specs_dir or paths.REPO_ROOT / "examples" / "quickstart")], None, environment)
    return {t: image(env, f"forge-{t}") for t in TARGETS}


def _add_bytes(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    out.addfile(info, io.BytesIO(data))


def _canon(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def build(log=_log, refs: dict[str, str] | None = None) -> tuple[Path, list[str], dict[str, Any]]:
    """(archive, image refs, timings/sizes) of the runtime images, building what is not cached."""
    t0 = time.monotonic()
    times: dict[str, Any] = {}
    refs = refs or image_refs()
    layers = []
    for name, fn in (("base", base_layer), ("requirements", requirements_layer), ("forge", forge_layer)):
        t = time.monotonic()
        layers.append(fn())
        times[f"{name}_s"] = round(time.monotonic() - t, 1)
    digests = [_digest_of(p) for p in layers]
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
    key = _key(_canon(configs), *digests)
    tag = sorted(refs.values())[0].rsplit(":", 1)[1]
    dest = paths.cache_dir() / "images" / f"forge-runtime-{tag}-{key}.tar"
    if not dest.is_file():
        for i, (p, fn) in enumerate(zip(layers, (base_layer, requirements_layer, forge_layer))):
            if not p.is_file():
                layers[i] = fn(need_file=True)
                if _digest_of(layers[i]) != digests[i]:
                    raise RuntimeError(f"{p.name} built again has another digest: the layer is not reproducible")
        log(f"packing {', '.join(sorted(refs.values()))} into {dest.name}")
        t = time.monotonic()
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        try:
            with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as out:
                for p, d in zip(layers, digests):
                    info = tarfile.TarInfo("blobs/sha256/" + d.split(":", 1)[1])
                    info.size, info.mode, info.mtime = p.stat().st_size, 0o644, 0
                    with open(p, "rb") as f:
                        out.addfile(info, f)
                manifests = []
                for ref, cfg in sorted(configs.items()):
                    cb = _canon(cfg)
                    cd = "sha256:" + hashlib.sha256(cb).hexdigest()
                    man = _canon({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                  "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                             "digest": cd, "size": len(cb)},
                                  "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d,
                                              "size": p.stat().st_size} for p, d in zip(layers, digests)]})
                    md = "sha256:" + hashlib.sha256(man).hexdigest()
                    _add_bytes(out, "blobs/sha256/" + cd.split(":", 1)[1], cb)
                    _add_bytes(out, "blobs/sha256/" + md.split(":", 1)[1], man)
                    manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md,
                                      "size": len(man), "platform": {"architecture": "amd64", "os": "linux"},
                                      "annotations": {"io.containerd.image.name": ref,
                                                      "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]}})
                _add_bytes(out, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
                _add_bytes(out, "index.json", _canon({"schemaVersion": 2, "manifests": manifests,
                                                      "mediaType": "application/vnd.oci.image.index.v1+json"}))
            os.replace(tmp, dest)
            # older archives of the same images (other code or requirements): several GB each
            for old in dest.parent.glob(f"forge-runtime-{tag}-*.tar"):
                if old != dest:
                    old.unlink(missing_ok=True)
                    old.with_suffix(".refs.json").unlink(missing_ok=True)
            (dest.with_suffix(".refs.json")).write_text(json.dumps(
                {m["annotations"]["io.containerd.image.name"]: m["digest"] for m in manifests}, indent=2) + "\n")
        finally:
            tmp.unlink(missing_ok=True)
        times["pack_s"] = round(time.monotonic() - t, 1)
        # the archive holds every layer: keep only the small layer files (the requirements layer,
        # several GB, is made again from the runtime environment in about a minute when needed)
        for p in layers:
            if p.stat().st_size > 1 << 30:
                p.unlink()
    times["total_s"] = round(time.monotonic() - t0, 1)
    times["archive_bytes"] = dest.stat().st_size
    times["layer_bytes"] = {n: p.stat().st_size for n, p in zip(("base", "requirements", "forge"), layers)
                            if p.exists()}
    return dest, sorted(refs.values()), times


def archive_refs(archive: str | os.PathLike[str]) -> dict[str, str]:
    """{image ref: manifest digest} of an OCI archive (its sidecar when there is one)."""
    side = Path(archive).with_suffix(".refs.json")
    if side.is_file():
        return json.loads(side.read_text())
    with tarfile.open(archive) as t:
        f = t.extractfile("index.json")
        index = json.loads(f.read()) if f else {}
    return {m["annotations"]["io.containerd.image.name"]: m["digest"] for m in index.get("manifests", [])
            if "io.containerd.image.name" in (m.get("annotations") or {})}


if __name__ == "__main__":
    archive, names, info = build()
    print(json.dumps({"archive": str(archive), "images": names, **info}, indent=2))
