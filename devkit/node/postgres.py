"""A PostgreSQL server the cluster's pods reach, for the studies of hyperparameter searches on a
cluster (an Environment's ``kubernetes.studyDatabase``; runtimes/study.py): Debian's
``postgresql-15`` in an image built here (one layer: ``mmdebstrap`` of the host's suite, as the
runtime and controller images' bases are; :mod:`devkit.node.layers`), run as a pod on the node
with its data in an ``emptyDir``, and a Service in front of it.

The pod meets Pod Security ``restricted`` (a non-root user of its own, no privilege escalation,
every capability dropped, the runtime's seccomp profile), so it can stand in the namespace of the
Workflows it serves. It listens inside the cluster's network only; the host reads it at the pod's
IP over the pods' bridge (what the tests check the study against). The password is made per start
and reaches the trial pods only through the Secret whose ``url`` key the Environment names.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from devkit.common import stop_group
from devkit.node import layers, paths

FORMAT = "1"  # bump when the image's recipe changes
VERSION = "15"  # Debian 12's PostgreSQL
PACKAGES = (f"postgresql-{VERSION}",)
UID = 65533  # the pod's runAsUser: initdb and the server refuse root
USER = "forgedb"
BIN = f"/usr/lib/postgresql/{VERSION}/bin"
# The package's postinst makes a `main` cluster in the chroot: the pod makes its own in an emptyDir.
HOOK = (f'chroot "$1" groupadd --gid {UID} {USER} && '
        f'chroot "$1" useradd --uid {UID} --gid {UID} --no-create-home --home-dir /var/lib/forgedb '
        f'--shell /usr/sbin/nologin {USER} && '
        'rm -rf "$1"/var/lib/postgresql/*/main "$1"/etc/postgresql/*/main '
        '"$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/usr/share/doc/* "$1"/usr/share/man/* '
        '"$1"/var/log/*.log "$1"/var/cache/ldconfig/aux-cache')
REF = "docker.io/library/forge-postgres:15"
NAME = "studies-db"
PORT = 5432
DATABASE = "studies"
ROLE = "forge"
DATA = "/var/lib/forgedb"


def _log(msg: str) -> None:
    print(f"[postgres-image] {msg}", flush=True)


def image(log=_log) -> tuple[str, str]:
    """(archive, ref) of the PostgreSQL image, built the first time (a minute or two), then cached
    by the suite, the packages and the hook."""
    base = layers.debian_base("postgres-layers", FORMAT, PACKAGES, HOOK, log, need_file=True)
    digest = layers.digest_of(base)
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Env": [f"PATH={BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                 "LANG=C.UTF-8"],
                         "User": f"{UID}:{UID}", "WorkingDir": DATA},
              "rootfs": {"type": "layers", "diff_ids": [digest]},
              "history": [{"created_by": f"forge devkit.node.postgres (format {FORMAT}): Debian {' '.join(PACKAGES)}"}]}
    configs = {REF: config}
    dest = paths.cache_dir() / "images" / f"forge-postgres-{VERSION}-{layers.key(FORMAT, layers.canon(configs), digest)}.tar"
    if not dest.is_file():
        log(f"packing {REF} into {dest.name}")
        layers.pack(dest, [base], [digest], configs, supersedes=f"forge-postgres-{VERSION}-*.tar")
    return str(dest), REF


@dataclass(frozen=True)
class StudyDatabase:
    """A running server: ``url`` is what pods connect to (the Service's DNS name), ``host_url``
    what this machine connects to (the pod's IP); both SQLAlchemy URLs of the same database."""

    namespace: str
    url: str
    host_url: str


def _script(data: str = DATA, listen: str = "*", port: int = PORT) -> str:
    """initdb with the password from the environment (never on a command line), every address
    allowed by password (SCRAM), the server started, then the studies' database made; the file
    ``<data>/ready`` says so."""
    return (
        "set -eu\n"
        f"umask 077; printf '%s' \"$POSTGRES_PASSWORD\" > {data}/pw\n"
        f"initdb -D {data}/data -U {ROLE} --pwfile={data}/pw --auth-local=trust --auth-host=scram-sha-256 "
        "--locale=C.UTF-8 --encoding=UTF8 --no-sync >/dev/null\n"
        f"rm {data}/pw\n"
        f"echo 'host all all 0.0.0.0/0 scram-sha-256' >> {data}/data/pg_hba.conf\n"
        f"postgres -D {data}/data -c listen_addresses='{listen}' -c port={port} -c unix_socket_directories={data} "
        "-c fsync=off & pid=$!\n"
        f"trap 'kill -INT $pid' TERM INT\n"
        f"until pg_isready -q -h {data} -p {port}; do sleep 0.2; done\n"
        f"createdb -h {data} -p {port} -U {ROLE} {DATABASE} && touch {data}/ready\n"
        "wait $pid\n"
    )


def _root() -> Path:
    """The image's root filesystem, unpacked once under the cache (for :func:`on_host`)."""
    layer = layers.debian_base("postgres-layers", FORMAT, PACKAGES, HOOK, _log, need_file=True)
    root = paths.cache_dir() / "postgres-root" / layer.stem
    if not (root / ".done").is_file():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        subprocess.run(["tar", "-xf", str(layer), "-C", str(root)], check=True)
        (root / ".done").write_text(layer.name + "\n")
    return root


@contextlib.contextmanager
def on_host(timeout: float = 180.0) -> Iterator[str]:
    """The same server as a process of this machine, on 127.0.0.1 and a free port, chrooted into
    the image's root filesystem as its user (needs root, as the node does); yields the database's
    SQLAlchemy URL; stopped by its PID and its data removed on exit. For the runtimes' own tests of
    a study kept in PostgreSQL, without a cluster."""
    if os.geteuid() != 0:
        raise RuntimeError("PostgreSQL on the host runs chrooted into its image's root: it needs root")
    root = _root()
    port = paths.free_port()
    (root / DATA.lstrip("/")).mkdir(exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="run-", dir=root / DATA.lstrip("/")))
    os.chown(data, UID, UID)
    inside = f"{DATA}/{data.name}"
    password = secrets.token_hex(16)
    proc = subprocess.Popen([shutil.which("chroot") or "/usr/sbin/chroot", f"--userspec={UID}:{UID}", str(root), "/bin/sh", "-c", _script(inside, "127.0.0.1", port)],
                            env={"PATH": f"{BIN}:/usr/bin:/bin", "LANG": "C.UTF-8", "POSTGRES_PASSWORD": password},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not (data / "ready").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start: {(proc.stderr.read() if proc.stderr else b'').decode()[-2000:]}")
            time.sleep(0.2)
        yield f"postgresql+psycopg2://{ROLE}:{password}@127.0.0.1:{port}/{DATABASE}"
    finally:
        stop_group(proc, timeout=20)
        shutil.rmtree(data, ignore_errors=True)


def start(core: client.CoreV1Api, namespace: str, secret: str, timeout: float = 120.0) -> StudyDatabase:
    """The server's pod and Service in ``namespace`` (which exists), and the Secret ``secret`` there
    whose key ``url`` is the database's URL, once the database answers."""
    password = secrets.token_hex(16)
    labels = {"app.kubernetes.io/name": NAME}
    restricted = client.V1SecurityContext(
        run_as_non_root=True, run_as_user=UID, run_as_group=UID, allow_privilege_escalation=False,
        capabilities=client.V1Capabilities(drop=["ALL"]), seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"))
    ready = client.V1Probe(_exec=client.V1ExecAction(command=["test", "-f", f"{DATA}/ready"]),
                           period_seconds=1, failure_threshold=120)
    core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name=NAME, labels=labels),
        spec=client.V1PodSpec(termination_grace_period_seconds=2, containers=[client.V1Container(
            name="postgres", image=REF, image_pull_policy="Never", command=["/bin/sh", "-c", _script()],
            env=[client.V1EnvVar(name="POSTGRES_PASSWORD", value=password)],
            ports=[client.V1ContainerPort(container_port=PORT, name="postgres")],
            readiness_probe=ready, security_context=restricted,
            volume_mounts=[client.V1VolumeMount(name="data", mount_path=DATA)],
            resources=client.V1ResourceRequirements(requests={"cpu": "100m", "memory": "128Mi"},
                                                    limits={"memory": "512Mi"}))],
            volumes=[client.V1Volume(name="data", empty_dir=client.V1EmptyDirVolumeSource())])))
    core.create_namespaced_service(namespace, client.V1Service(
        metadata=client.V1ObjectMeta(name=NAME, labels=labels),
        spec=client.V1ServiceSpec(selector=labels, ports=[client.V1ServicePort(port=PORT, target_port=PORT, name="postgres")])))
    deadline = time.monotonic() + timeout
    pod: Any = None
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(NAME, namespace)
        if any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ()):
            break
        time.sleep(1)
    else:
        raise TimeoutError(f"PostgreSQL in {namespace} not ready in {timeout:.0f} s: {pod.status if pod else None}")
    url = f"postgresql+psycopg2://{ROLE}:{password}@{NAME}.{namespace}.svc:{PORT}/{DATABASE}"
    core.create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name=secret), type="Opaque",
        data={"url": base64.b64encode(url.encode()).decode()}))
    return StudyDatabase(namespace, url, f"postgresql+psycopg2://{ROLE}:{password}@{pod.status.pod_ip}:{PORT}/{DATABASE}")

