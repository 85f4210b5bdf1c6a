"""What Forge's Debian-based images share (the runtime image, :mod:`devkit.node.runtime_image`, and
the controller image, :mod:`devkit.node.controller_image`): deterministic layer tars cached by a
key of their inputs, a Debian root filesystem made by ``mmdebstrap``, a layer of files from this
checkout, and the OCI archive that holds the layers once and names one or more images.

A layer is a tar made by GNU tar with :data:`TAR_FLAGS` (sorted, mtime 0, owner 0:0, no
atime/ctime), so the same inputs give the same digest. Its digest is recorded next to it
(``<layer>.digest``): a big layer may be dropped after packing and is then known by its digest
alone until an archive needs its bytes again.

Python's byte-code in a layer is hash-based (PEP 552, unchecked): a timestamp-based ``.pyc``
records its source's mtime, which is 0 for every file of a layer, so it never matches there and
Python compiles each module it imports again in every container — the root filesystem is read-only
and ``PYTHONDONTWRITEBYTECODE`` set, so nothing is kept. Importing numpy, pandas, torch and
``runtimes.train`` took 5.6 s of CPU that way against 2.5 s with valid byte-code (a quiet 2-core
machine): some 3 s in each of a workflow's pods.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devkit.node import paths

TAR_FLAGS = ["--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "--format=posix",
             "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime"]


#: What a ``.pyc`` of this Python is called in a ``__pycache__`` folder: ``<module>`` + this.
PYC_SUFFIX = f".{sys.implementation.cache_tag}.pyc"
#: PEP 552 flags of an unchecked hash-based ``.pyc``: hash-based (bit 0), source not checked (bit 1 clear).
_UNCHECKED_HASH = (1).to_bytes(4, "little")


def compile_tree(top: Path) -> None:
    """Unchecked hash-based ``.pyc`` next to the sources under ``top`` (an image's files never
    change, and their mtimes are 0 in the layer: see the module's docstring)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
                    str(top)], check=True)


def hash_based_pycs(site: Path, dest: Path) -> list[Path]:
    """The timestamp-based ``.pyc`` files pip wrote under ``site``, written again under ``dest`` at
    the same relative paths with an unchecked hash-based header (PEP 552: the flags, then the
    source's hash) before the same byte-code: what a layer of ``site`` holds instead of pip's, which
    never match a source whose mtime is 0. Pip's byte-code is kept as it is, so the layer stays
    reproducible from the same environment (compiling again need not give the same bytes), and
    Python sets each code object's file name from where it loads the module. A ``.pyc`` of another
    Python (its magic number), of an optimisation level, or whose source is gone is left out.
    Returns the paths written, relative to ``dest``: each ``__pycache__`` folder before its files,
    sorted."""
    written: list[Path] = []
    for pyc in sorted(site.rglob("__pycache__/*" + PYC_SUFFIX)):
        source = pyc.parent.parent / (pyc.name[: -len(PYC_SUFFIX)] + ".py")
        data = pyc.read_bytes()
        if data[:4] != importlib.util.MAGIC_NUMBER or not source.is_file():
            continue
        rel = pyc.relative_to(site)
        out = dest / rel
        if not out.parent.is_dir():
            out.parent.mkdir(parents=True)
            out.parent.chmod(0o755)  # the layer's modes, whatever this process's umask
            written.append(rel.parent)
        out.write_bytes(data[:4] + _UNCHECKED_HASH + importlib.util.source_hash(source.read_bytes()) + data[16:])
        out.chmod(0o644)
        written.append(rel)
    return written


def key(fmt: str, *parts: str | bytes) -> str:
    """A cache key: 16 hex digits of the sha256 of ``fmt`` (the recipe's version) and ``parts``."""
    h = hashlib.sha256(fmt.encode())
    for p in parts:
        h.update(b"\0")
        h.update(p.encode() if isinstance(p, str) else p)
    return h.hexdigest()[:16]


def layers_dir(name: str) -> Path:
    """``<cache>/images/<name>``, where one image family's layers are cached."""
    d = paths.cache_dir() / "images" / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def finish_layer(tmp: Path, dest: Path) -> Path:
    """Record the layer's digest next to it and move it into place."""
    digest = sha256_file(tmp)
    Path(str(tmp) + ".digest").write_text(digest + "\n")
    os.replace(str(tmp) + ".digest", str(dest) + ".digest")
    os.replace(tmp, dest)
    return dest


def cached(layer: Path) -> bool:
    """A layer whose digest is recorded: its file may have been dropped after packing."""
    return Path(str(layer) + ".digest").is_file()


def digest_of(layer: Path) -> str:
    return Path(str(layer) + ".digest").read_text().strip()


def host_suite() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip().strip('"')
    raise RuntimeError("no VERSION_CODENAME in /etc/os-release (the base layer uses the host's Debian suite)")


def _ensure_mmdebstrap(log: Callable[[str], None]) -> None:
    if shutil.which("mmdebstrap"):
        return
    log("installing Debian's mmdebstrap")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(sudo + ["apt-get", "install", "-y", "-q", "mmdebstrap"], env=env).returncode != 0:
        subprocess.run(sudo + ["apt-get", "update", "-q"], env=env, check=True)
        subprocess.run(sudo + ["apt-get", "install", "-y", "-q", "mmdebstrap"], env=env, check=True)


def debian_layer(dest: Path, suite: str, packages: Sequence[str], hook: str, log: Callable[[str], None]) -> Path:
    """A Debian ``suite`` root filesystem (``mmdebstrap --variant=minbase`` with ``packages``, then
    ``hook`` run as a customize hook with the root as ``$1``), from the host's own apt sources for
    that suite, written to ``dest`` as a layer."""
    _ensure_mmdebstrap(log)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    # the host's apt sources (its mirror, the security suite) for the same suite
    sources = subprocess.run(["apt-get", "indextargets", "--format", "$(REPO_URI) $(RELEASE) $(COMPONENT)"],
                             capture_output=True, text=True).stdout
    lines = sorted({f"deb {ln.split()[0]} {ln.split()[1]} {ln.split()[2]}" for ln in sources.splitlines()
                    if len(ln.split()) == 3 and ln.split()[1].startswith(suite)})
    try:
        subprocess.run(["nice", "-n", "10", "mmdebstrap", "--mode=root", "--variant=minbase", "--format=tar",
                        f"--include={','.join(packages)}",
                        "--dpkgopt=path-exclude=/usr/share/locale/*",
                        f"--customize-hook={hook}", suite, str(tmp), "-"],
                       input="\n".join(lines) + "\n", text=True, check=True,
                       env=dict(os.environ, SOURCE_DATE_EPOCH="0"))
        return finish_layer(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def debian_base(family: str, fmt: str, packages: Sequence[str], hook: str, log: Callable[[str], None],
                need_file: bool = False) -> Path:
    """The base layer of an image family (``<cache>/images/<family>/base-<suite>-<key>.tar``):
    :func:`debian_layer` of the host's suite, built unless cached (``need_file``: its bytes are
    wanted, not only its digest). Key: ``fmt``, the suite, the packages, the hook."""
    suite = host_suite()
    dest = layers_dir(family) / f"base-{suite}-{key(fmt, suite, ' '.join(packages), hook)}.tar"
    if dest.is_file() or (not need_file and cached(dest)):
        return dest
    log(f"building the base layer: Debian {suite} minbase + {' '.join(packages)} (mmdebstrap)")
    return debian_layer(dest, suite, packages, hook, log)


def checkout_layer(family: str, fmt: str, dirs: Sequence[str], *key_parts: str, need_file: bool = False,
                   after: Callable[[Path], None] | None = None) -> Path:
    """This checkout's ``dirs`` at ``/opt/forge`` (``after`` run on the copy, see :func:`files_layer`),
    built unless cached. Key: ``fmt``, the files' paths and contents, ``key_parts``."""
    files = sorted(p for d in dirs for p in (paths.REPO_ROOT / d).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts)
    dest = layers_dir(family) / f"forge-{key(fmt, tree_digest(paths.REPO_ROOT, files), *key_parts)}.tar"
    if dest.is_file() or (not need_file and cached(dest)):
        return dest
    return files_layer(dest, paths.REPO_ROOT, files, "opt/forge", after=after)


def tree_digest(root: Path, files: Iterable[Path]) -> str:
    """The sha256 of ``files``' paths (relative to ``root``) and contents: a layer's key part."""
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def files_layer(dest: Path, root: Path, files: Iterable[Path], prefix: str,
                after: Callable[[Path], None] | None = None) -> Path:
    """``files`` (under ``root``) copied to ``prefix`` in the image (``opt/forge``: /opt/forge/...)
    as a layer at ``dest``; ``after`` gets the copy's top folder before it is packed."""
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    with tempfile.TemporaryDirectory(prefix="forge-layer-") as td:
        top = Path(td) / prefix
        for p in files:
            out = top / p.relative_to(root)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, out)
        if after is not None:
            after(top)
        subprocess.run(["tar", *TAR_FLAGS, "-cf", str(tmp), "-C", td, prefix.split("/", 1)[0]], check=True)
    try:
        return finish_layer(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def timed_layers(steps: Sequence[tuple[str, Callable[[], Path]]], times: dict[str, Any]) -> tuple[list[Path], list[str]]:
    """Each (name, build) in order: the layers and their digests; ``times[<name>_s]`` the seconds each took."""
    built = []
    for name, fn in steps:
        t = time.monotonic()
        built.append(fn())
        times[f"{name}_s"] = round(time.monotonic() - t, 1)
    return built, [digest_of(p) for p in built]


def canon(doc: Any) -> bytes:
    """JSON as digests are taken of it: sorted keys, no spaces."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _add_bytes(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    out.addfile(info, io.BytesIO(data))


def pack(dest: Path, layers: Sequence[Path], digests: Sequence[str], configs: Mapping[str, dict[str, Any]],
         supersedes: str) -> Path:
    """Write the OCI image layout tar ``dest`` (atomically): the ``layers`` (their recorded
    ``digests``) once, and for each ``{ref: image config}`` its config and manifest, named in the
    index by ``io.containerd.image.name`` (what ``ctr images import`` names it). A sidecar
    ``<dest>.refs.json`` says {ref: manifest digest}. The other archives in its folder matching the
    glob ``supersedes`` (the same images from older inputs) are deleted then."""
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    try:
        with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as out:
            for p, d in zip(layers, digests):
                info = tarfile.TarInfo("blobs/sha256/" + d.split(":", 1)[1])
                info.size, info.mode, info.mtime = p.stat().st_size, 0o644, 0
                with open(p, "rb") as f:
                    out.addfile(info, f)
            manifests: list[dict[str, Any]] = []
            for ref, cfg in sorted(configs.items()):
                cb = canon(cfg)
                cd = "sha256:" + hashlib.sha256(cb).hexdigest()
                man = canon({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
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
            _add_bytes(out, "index.json", canon({"schemaVersion": 2, "manifests": manifests,
                                                 "mediaType": "application/vnd.oci.image.index.v1+json"}))
        os.replace(tmp, dest)
        dest.with_suffix(".refs.json").write_text(json.dumps(
            {m["annotations"]["io.containerd.image.name"]: m["digest"] for m in manifests}, indent=2) + "\n")
        for old in dest.parent.glob(supersedes):
            if old != dest:
                old.unlink(missing_ok=True)
                old.with_suffix(".refs.json").unlink(missing_ok=True)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def archive_refs(archive: str | os.PathLike[str]) -> dict[str, str]:
    """{image ref: manifest digest} of an OCI archive (its sidecar when there is one)."""
    side = Path(archive).with_suffix(".refs.json")
    if side.is_file():
        refs: dict[str, str] = json.loads(side.read_text())
        return refs
    with tarfile.open(archive) as t:
        f = t.extractfile("index.json")
        index: dict[str, Any] = json.loads(f.read()) if f else {}
    return {m["annotations"]["io.containerd.image.name"]: m["digest"] for m in index.get("manifests", [])
            if "io.containerd.image.name" in (m.get("annotations") or {})}
