"""OCI images built without any registry: a root filesystem packed by a small packer.

The node's images are made here from files on this machine, never pulled:

- ``pause``: Kubernetes' own ``build/pause/linux/pause.c`` from the pinned ``k8s.io/kubernetes``
  module (the same source as registry.k8s.io/pause), compiled static with the compiler flags of
  upstream's ``build/pause/Makefile``; ``USER 65535:65535``, ``ENTRYPOINT ["/pause"]`` as its
  Dockerfile says. containerd's sandbox image points at it.
- ``busybox``: Debian's ``busybox-static`` package (``apt-get download``, never installed on the
  host), with one symlink per applet, as ``busybox --install -s`` would make.

An image is an OCI image layout in a tar (``oci-layout``, ``index.json``, ``blobs/sha256/...``)
whose index names it with ``io.containerd.image.name``, which ``ctr images import`` uses as the
image's name. Layers are uncompressed and deterministic (sorted, mtime 0, owner 0:0), so the
same inputs give the same digests. Archives are cached under
``<cache>/images/<name>-<tag>-<key>.tar``, key = the inputs' digest and :data:`PACKER_FORMAT`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from devkit.debs import debian_package
from devkit.node import paths

PACKER_FORMAT = "1"  # bump when the packing changes: every cached image is rebuilt

PAUSE_IMAGE = "forge.local/pause"
BUSYBOX_IMAGE = "forge.local/busybox"


@dataclass
class Entry:
    """One file of a layer: a regular file (``data``), a directory, or a symlink (``link``)."""

    path: str  # absolute path in the image
    mode: int = 0o755
    data: bytes | None = None
    link: str | None = None
    uid: int = 0
    gid: int = 0


@dataclass
class ImageSpec:
    name: str  # e.g. forge.local/busybox
    tag: str
    entries: list[Entry]
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    user: str = ""
    env: list[str] = field(default_factory=lambda: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    workdir: str = ""

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.tag}"


def _layer_tar(entries: list[Entry]) -> bytes:
    """An uncompressed, deterministic tar of ``entries`` (parents added as directories)."""
    by_path: dict[str, Entry] = {}
    for e in entries:
        p = e.path.strip("/")
        parts = p.split("/")
        for i in range(1, len(parts)):
            by_path.setdefault("/".join(parts[:i]), Entry(path="/".join(parts[:i]), mode=0o755))
        by_path[p] = e
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(by_path):
            e = by_path[p]
            info = tarfile.TarInfo(p)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, e.uid, e.gid, "", ""
            if e.link is not None:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, e.link, 0o777
                tar.addfile(info)
            elif e.data is not None:
                info.type, info.size, info.mode = tarfile.REGTYPE, len(e.data), e.mode
                tar.addfile(info, io.BytesIO(e.data))
            else:
                info.type, info.mode = tarfile.DIRTYPE, e.mode
                tar.addfile(info)
    return buf.getvalue()


def _blob(out: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo("blobs/sha256/" + digest.split(":", 1)[1])
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    out.addfile(info, io.BytesIO(data))
    return digest, len(data)


def pack_oci_archive(spec: ImageSpec, dest: Path) -> Path:
    """Write ``spec`` as an OCI image layout tar at ``dest`` (atomically)."""
    layer = _layer_tar(spec.entries)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    cfg: dict = {"Env": spec.env}
    if spec.entrypoint is not None:
        cfg["Entrypoint"] = spec.entrypoint
    if spec.cmd is not None:
        cfg["Cmd"] = spec.cmd
    if spec.user:
        cfg["User"] = spec.user
    if spec.workdir:
        cfg["WorkingDir"] = spec.workdir
    config = {
        "architecture": "amd64", "os": "linux", "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "forge devkit.node.images (packer format " + PACKER_FORMAT + ")"}],
    }
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as out:
            layer_d, layer_n = _blob(out, layer)
            cfg_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
            cfg_d, cfg_n = _blob(out, cfg_bytes)
            manifest = {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_d, "size": cfg_n},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_d, "size": layer_n}],
            }
            man_d, man_n = _blob(out, json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
            index = {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": [{
                    "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": man_d, "size": man_n,
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {"io.containerd.image.name": spec.ref, "org.opencontainers.image.ref.name": spec.tag},
                }],
            }
            for name, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                               ("index.json", json.dumps(index, sort_keys=True, separators=(",", ":")).encode())):
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                out.addfile(info, io.BytesIO(data))
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def _key(*parts: bytes | str) -> str:
    h = hashlib.sha256(PACKER_FORMAT.encode())
    for p in parts:
        h.update(b"\0")
        h.update(p.encode() if isinstance(p, str) else p)
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# the images
# --------------------------------------------------------------------------------------------


def pause_source() -> tuple[Path, str]:
    """(pause.c, its upstream TAG) from the pinned k8s.io/kubernetes module (downloaded if needed)."""
    moddir = paths.go_mod_download("k8s.io/kubernetes", paths.versions()["KUBERNETES_VERSION"])
    src = moddir / "build" / "pause" / "linux" / "pause.c"
    tag = ""
    for line in (moddir / "build" / "pause" / "Makefile").read_text().splitlines():
        if line.replace(" ", "").startswith("TAG?="):
            tag = line.split("=", 1)[1].strip()
    if not src.is_file() or not tag:
        raise RuntimeError(f"no build/pause/linux/pause.c or TAG in {moddir}")
    return src, tag


def build_pause(log=print) -> tuple[Path, str]:
    """(archive, ref) of the pause image, building it when not cached."""
    src, tag = pause_source()
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise RuntimeError("no C compiler (gcc) for pause.c: apt-get install gcc libc6-dev")
    ccver = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    key = _key(src.read_bytes(), tag, ccver)
    dest = paths.cache_dir() / "images" / f"pause-{tag}-{key}.tar"
    ref = f"{PAUSE_IMAGE}:{tag}"
    if dest.is_file():
        return dest, ref
    log(f"building the pause image {ref} from {src} ({ccver})")
    with tempfile.TemporaryDirectory(prefix="forge-pause-") as td:
        out = Path(td) / "pause"
        # upstream build/pause/Makefile: CFLAGS = -Os -Wall -Werror -static -DVERSION=v$(TAG)-$(REV)
        subprocess.run([cc, "-Os", "-Wall", "-Werror", "-static", f'-DVERSION=v{tag}-forge', "-o", str(out), str(src)],
                       check=True)
        subprocess.run(["strip", str(out)], check=False)
        data = out.read_bytes()
    spec = ImageSpec(PAUSE_IMAGE, tag, [Entry("/pause", 0o755, data)], entrypoint=["/pause"],
                     user="65535:65535", env=[])
    pack_oci_archive(spec, dest)
    return dest, ref


def build_busybox(log=print) -> tuple[Path, str]:
    """(archive, ref) of a busybox image from Debian's busybox-static package."""
    root, debver = debian_package("busybox-static", log)
    bb = root / "bin" / "busybox"
    upstream = debver.split(":", 1)[-1].split("-", 1)[0]  # 1:1.35.0-4+deb12u1+b1 -> 1.35.0
    data = bb.read_bytes()
    key = _key(data, debver)
    dest = paths.cache_dir() / "images" / f"busybox-{upstream}-{key}.tar"
    ref = f"{BUSYBOX_IMAGE}:{upstream}"
    if dest.is_file():
        return dest, ref
    log(f"building the busybox image {ref} from busybox-static {debver}")
    applets = subprocess.run([str(bb), "--list-full"], capture_output=True, text=True, check=True).stdout.split()
    entries = [Entry("/bin/busybox", 0o755, data)]
    for a in applets:
        if a != "bin/busybox":
            entries.append(Entry("/" + a, link="/bin/busybox"))
    entries += [
        Entry("/tmp", 0o1777), Entry("/root", 0o700), Entry("/www", 0o755),
        Entry("/etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"),
        Entry("/etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n"),
    ]
    spec = ImageSpec(BUSYBOX_IMAGE, upstream, entries, cmd=["sh"])
    pack_oci_archive(spec, dest)
    return dest, ref


def build_argoexec(argoexec: Path, version: str, log=print) -> tuple[Path, str]:
    """(archive, ref) of Argo's executor image, as upstream's Dockerfile makes it (target
    ``argoexec``: distroless/static + /etc/mime.types, hack/ssh_known_hosts, hack/nsswitch.conf,
    /bin/argoexec, ENTRYPOINT ["argoexec"]): the distroless parts from Debian's files here
    (``/etc/passwd`` and ``/etc/group`` with root and nonroot, the CA bundle, /tmp)."""
    moddir = paths.go_mod_download(paths.versions()["ARGO_WORKFLOWS_MODULE"], version)
    data = argoexec.read_bytes()
    files = {
        "/etc/nsswitch.conf": (moddir / "hack" / "nsswitch.conf").read_bytes(),
        "/etc/ssh/ssh_known_hosts": (moddir / "hack" / "ssh_known_hosts").read_bytes(),
        "/etc/mime.types": Path("/etc/mime.types").read_bytes() if Path("/etc/mime.types").exists() else b"",
        "/etc/ssl/certs/ca-certificates.crt": Path("/etc/ssl/certs/ca-certificates.crt").read_bytes(),
        "/etc/passwd": b"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
                       b"argo:x:8737:8737:argo:/home/argo:/sbin/nologin\n",
        "/etc/group": b"root:x:0:\nnonroot:x:65532:\nargo:x:8737:\n",
    }
    key = _key(data, version, *(k.encode() + v for k, v in sorted(files.items())))
    dest = paths.cache_dir() / "images" / f"argoexec-{version}-{key}.tar"
    ref = f"forge.local/argoexec:{version}"
    if dest.is_file():
        return dest, ref
    log(f"building the executor image {ref}")
    entries = [Entry("/bin/argoexec", 0o755, data), Entry("/tmp", 0o1777), Entry("/root", 0o700),
               Entry("/home/nonroot", 0o755, uid=65532, gid=65532), Entry("/home/argo", 0o755, uid=8737, gid=8737)]
    entries += [Entry(p, 0o644, b) for p, b in files.items()]
    spec = ImageSpec("forge.local/argoexec", version, entries, entrypoint=["argoexec"],
                     env=["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                          "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"])
    pack_oci_archive(spec, dest)
    return dest, ref
