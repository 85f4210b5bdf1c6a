"""Controllers that run on the host against the node's cluster (Argo's, Seldon's, the Prometheus
Operator): their identity and their process, written once.

Each runs as a host process with a client certificate for the ServiceAccount its upstream install
manifest names, so upstream's RBAC is what authorises it, and records its PID in
``<node state>/controllers/<name>.json``, which :meth:`Node.stop` reads to stop it before the pods.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from devkit.node import paths
from devkit.node.kubectl import apply_list
from devkit.node.kubectl import kubectl as kubectl_as_admin
from devkit.node.node import Node, NodeError, _tail


@dataclass
class HostController:
    """A controller process started by :func:`spawn` (its record is what ``Node.stop`` reads)."""

    name: str
    state_dir: str
    pid: int = 0
    start_ticks: int = -1
    start_seconds: float = 0.0

    @property
    def log_path(self) -> Path:
        return Path(self.state_dir) / f"{self.name}.log"

    def running(self) -> bool:
        return paths.running(self.pid, self.start_ticks)

    def stop(self) -> None:
        if self.pid:
            paths.stop_pid(self.pid, self.start_ticks, timeout=5)

    def log_tail(self, limit: int = 200000) -> str:
        return paths.log_tail(self.log_path, limit=limit)


def ensure_built(target: str, path: Path, what: str, log: Callable[[str], None]) -> Path:
    """``path``, built by ``scripts/cluster/build.sh <target>`` (niced) when it is not there yet;
    :class:`NodeError` when the build fails."""
    return paths.ensure_built(target, path, what, log, error=NodeError)


@dataclass(frozen=True)
class PinnedBuild:
    """A controller built from a Go module pinned in versions.env by ``build.sh <target>``, into
    ``bin/<target>-<version>/<target>`` of the cache."""

    target: str  # build.sh's target and the binary's name
    module_key: str  # versions.env's name of the module, e.g. KUEUE_MODULE
    version_key: str  # ... and of its version
    what: str  # e.g. "Kueue", for the log

    def version(self) -> str:
        return paths.versions()[self.version_key]

    def module_dir(self) -> Path:
        """The module at the pinned version (``go mod download``): its manifests are what is installed."""
        return paths.go_mod_download(paths.versions()[self.module_key], self.version())

    def binary_path(self) -> Path:
        """Where the build puts the binary (may not exist yet)."""
        return paths.cache_dir() / "bin" / f"{self.target}-{self.version()}" / self.target

    def ensure(self, log: Callable[[str], None]) -> Path:
        """The binary, built when missing (docs/test-cluster.md says how long the first build takes)."""
        return ensure_built(self.target, self.binary_path(), f"{self.what} {self.version()}", log)


def answers_ok(url: str) -> bool:
    """Whether ``url`` answers 200 within 2 s (a controller's readiness or health probe)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def service_account_kubeconfig(cluster: Any, node: Node, namespace: str, account: str, name: str) -> Path:
    """A kubeconfig for ``system:serviceaccount:<namespace>:<account>`` (a client certificate of the
    cluster's client CA, groups as the token authenticator would give), in ``<node>/<name>/``."""
    sd = Path(node.state_dir) / name
    sd.mkdir(parents=True, exist_ok=True)
    pki = Path(node.state_dir) / "pki"
    user = f"system:serviceaccount:{namespace}:{account}"
    subprocess.run(["cp", str(Path(cluster.pki) / "client-ca.key"), str(pki / "client-ca.key")], check=True)
    try:
        paths.issue_cert(pki, "client-ca", name,
                         f"/O=system:serviceaccounts/O=system:serviceaccounts:{namespace}/CN={user}")
    finally:
        (pki / "client-ca.key").unlink()
    return paths.write_kubeconfig(sd / "kubeconfig", node.server, pki / "serving-ca.crt",
                                  pki / f"{name}.crt", pki / f"{name}.key", user, namespace)


def spawn(node: Node, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
          ready: Callable[[HostController], bool], timeout: float = 90.0, die_with_parent: bool = False,
          log: Callable[[str], None] = lambda m: None) -> HostController:
    """Start ``argv`` as controller ``name`` and wait until ``ready(ctl)``; :class:`NodeError` with
    its log's tail when it exits or is not ready in ``timeout`` seconds (then it is stopped)."""
    t0 = time.monotonic()
    sd = Path(node.state_dir) / name
    sd.mkdir(parents=True, exist_ok=True)
    ctl = HostController(name=name, state_dir=str(sd))
    rec = paths.spawn(name, "forge-node", list(argv), env=env, log=ctl.log_path, die_with_parent=die_with_parent)
    ctl.pid, ctl.start_ticks = rec.pid, rec.start_ticks
    records = Path(node.state_dir) / "controllers"
    records.mkdir(exist_ok=True)
    (records / f"{name}.json").write_text(json.dumps(asdict(ctl), indent=2) + "\n")
    deadline = t0 + timeout
    while not ready(ctl):
        if not ctl.running():
            raise NodeError(f"{name} exited:\n{_tail(ctl.log_path)}")
        if time.monotonic() > deadline:
            ctl.stop()
            raise NodeError(f"{name} not ready after {timeout:.0f} s:\n{_tail(ctl.log_path)}")
        time.sleep(0.3)
    ctl.start_seconds = round(time.monotonic() - t0, 2)
    (records / f"{name}.json").write_text(json.dumps(asdict(ctl), indent=2) + "\n")
    log(f"{name} running (pid {ctl.pid}) after {ctl.start_seconds:.1f} s")
    return ctl


#: Kinds kustomize's ``namespace:`` leaves without a namespace (cluster-scoped).
CLUSTER_KINDS = ("Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                 "ValidatingWebhookConfiguration", "CustomResourceDefinition")


def kustomized(docs: list[dict[str, Any]], namespace: str, prefix: str) -> list[dict[str, Any]]:
    """What an upstream kustomization's ``namespace:`` and ``namePrefix:`` do to ``docs`` (in place):
    ``prefix`` on names and on the names they refer to (roleRef, ServiceAccount subjects), ``namespace``
    on namespaced objects and ServiceAccount subjects."""
    for d in docs:
        md = d["metadata"]
        md["name"] = prefix + md["name"]
        if d["kind"] in CLUSTER_KINDS:
            md.pop("namespace", None)
        else:
            md["namespace"] = namespace
        if "roleRef" in d:
            d["roleRef"]["name"] = prefix + d["roleRef"]["name"]
        for s in d.get("subjects") or []:
            if s.get("kind") == "ServiceAccount":
                s["name"] = prefix + s["name"]
                s["namespace"] = namespace
    return docs


def serving_cert(directory: Path) -> Path:
    """A self-signed serving certificate for 127.0.0.1 (``tls.crt``, ``tls.key``, where controller-runtime's
    webhook server looks for them) in ``directory``; returns the certificate's path (its own CA)."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(directory / "tls.key"), "-out", str(directory / "tls.crt")],
                   check=True, capture_output=True)
    return directory / "tls.crt"


def loopback_only(port: int, chain: str) -> None:
    """Drop connections to ``port`` that do not come from loopback, for a server that binds every
    address (an upstream webhook server with no host setting), in iptables chain ``chain`` (named
    ``FORGE-NODE-*``: ``Node.stop`` removes it and the jump). Idempotent: the chain is emptied and
    refilled."""
    for ipt in ("iptables", "ip6tables"):
        if not shutil.which(ipt):
            continue
        subprocess.run([ipt, "-N", chain], capture_output=True)  # exists already: fine
        subprocess.run([ipt, "-F", chain], check=True, capture_output=True)
        subprocess.run([ipt, "-A", chain, "-p", "tcp", "--dport", str(port), "!", "-i", "lo", "-j", "DROP"],
                       check=True, capture_output=True)
        if subprocess.run([ipt, "-C", "INPUT", "-j", chain], capture_output=True).returncode != 0:
            subprocess.run([ipt, "-I", "INPUT", "-j", chain], check=True, capture_output=True)


def kubectl(node: Node, *args: str, stdin: str | None = None) -> str:
    """``kubectl`` as the cluster's admin; :class:`NodeError` with its stderr on failure."""
    return kubectl_as_admin(node, *args, stdin=stdin, error=NodeError)


def wait_established(node: Node, crds: list[str], timeout: float = 60.0) -> None:
    """Wait until ``crds`` (``crd/<name>``) are Established. `kubectl wait` fails at once
    (".status.conditions accessor error: <nil>") on a CRD the API server has not given any
    condition yet, so that error means "ask again" until the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            kubectl(node, "wait", "--for=condition=Established", f"--timeout={int(timeout)}s", *crds)
            return
        except NodeError as e:
            if "accessor error" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def apply_docs(node: Node, docs: list[dict[str, Any]]) -> None:
    """Server-side apply ``docs`` as one List."""
    apply_list(node, docs, error=NodeError)


def manifest_docs(path: Path, namespace: str | None = None) -> list[dict[str, Any]]:
    """The documents of an upstream manifest; with ``namespace``, the ServiceAccount subjects of its
    bindings get that namespace when they name none (what kustomize's ``namespace:`` adds)."""
    out = []
    for d in yaml.safe_load_all(path.read_text()):
        if not d:
            continue
        if namespace and d["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            for s in d.get("subjects") or []:
                if s.get("kind") == "ServiceAccount":
                    s.setdefault("namespace", namespace)
        out.append(d)
    return out
