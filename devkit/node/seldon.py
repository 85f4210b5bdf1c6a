"""Seldon Core v1 on the node: the real operator (v1.17.1, the ``manager`` binary of upstream's
``operator/Dockerfile``) as a host process against the node's cluster, as Argo's controller runs.

:func:`ensure_binary` builds it with ``judges/seldon/build-operator.sh`` (the module proxy refuses
the operator module, so from the vendored upstream copy in ``../shared/vendor-src``; cached by
version and source digest). :func:`start` installs, from upstream's own manifests in that copy
(``operator/config``, as ``config/default``'s kustomization names them: namespace
``seldon-system``, name prefix ``seldon-``): the namespace, the ``seldon-manager`` ServiceAccount
and the ``seldon-config`` ConfigMap (``config/manager``), and the ClusterRoles, Role and bindings
of ``config/rbac``. The operator runs as ``system:serviceaccount:seldon-system:seldon-manager`` (a
client certificate, so upstream's RBAC is what authorises it) with the environment of upstream's
``config/manager/manager.yaml``, Istio and Ambassador off, watching every namespace.

Admission webhooks are off the way upstream's own ``--create-resources=false`` (its default) leaves
them: no ValidatingWebhookConfiguration is registered, so the API server never calls the operator.
``main.go`` still registers the webhook handlers with controller-runtime unconditionally, whose
webhook server refuses to start without a serving certificate in
``$TMPDIR/k8s-webhook-server/serving-certs``; it gets a self-signed one for 127.0.0.1 there. That
server binds every address (``main.go`` sets no host), so the node drops what reaches its port from
anywhere but loopback (chain ``FORGE-NODE-SELDON-WEBHOOK``, which ``Node.stop`` removes with the
node's other chains). Leader election is off (one operator); metrics on a free loopback port;
controller-runtime 0.11's health probes are off unless asked for, and ``main.go`` never asks.

The executor (the service orchestrator, ``executor/cmd/executor``) is built too,
:func:`ensure_executor` with ``judges/seldon/build-executor.sh`` (from the same vendored copy, in a
temporary folder with the operator copied in as ``_operator``, as upstream's Makefile does), and
``tests/cluster/test_seldon_executor.py`` runs it on the host in front of a v2 server. It is not
used on the node: Forge renders every predictor with the annotation ``seldon.io/no-engine: "true"``
(which the controller reads per predictor), so the operator adds no executor container (it would
add a second port named ``http``, 8000, and point the predictor Service at it; see judges/seldon's
tests).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from devkit.node import paths
from devkit.node.controllers import (
    HostController,
    apply_docs,
    kustomized,
    loopback_only,
    manifest_docs,
    service_account_kubeconfig,
    serving_cert,
    spawn,
)
from devkit.node.node import Node, NodeError, _stderr_log

NAMESPACE = "seldon-system"  # config/default/kustomization.yaml: namespace
NAME_PREFIX = "seldon-"  # ... and namePrefix
ACCOUNT = NAME_PREFIX + "manager"  # config/manager/serviceaccount.yaml, prefixed
WEBHOOK_CHAIN = "FORGE-NODE-SELDON-WEBHOOK"
REPO = Path(__file__).resolve().parents[2]
BUILD_SH = REPO / "judges" / "seldon" / "build-operator.sh"
EXECUTOR_BUILD_SH = REPO / "judges" / "seldon" / "build-executor.sh"
# The controller-runtime log line that says the SeldonDeployment controller's workers run.
READY_LINE = "Starting workers"
WEBHOOK_LINE = "Serving webhook server"


def source_dir() -> Path:
    """The operator's source (``operator/``): ``FORGE_SELDON_OPERATOR_SRC`` or the vendored copy
    beside the checkout, as the build script takes it (which also checks its module and version)."""
    ver = paths.versions()["SELDON_OPERATOR_VERSION"]
    src = Path(os.environ.get("FORGE_SELDON_OPERATOR_SRC")
               or REPO.parent / "shared" / "vendor-src" / f"seldon-core-{ver}" / "operator")
    if not (src / "config" / "manager" / "manager.yaml").is_file():
        raise NodeError(f"no Seldon Core operator source (with config/) at {src}")
    return src


def _build(script: Path, what: str, log: Callable[[str], None]) -> Path:
    """Run one of judges/seldon's build scripts (niced), pass its progress to ``log`` and return
    the binary's path (its last line on stdout); a failed build raises :class:`NodeError`."""
    t0 = time.monotonic()
    proc = subprocess.run(["nice", "-n", "10", str(script)], capture_output=True, text=True)
    for line in proc.stderr.splitlines():
        log(line)
    if proc.returncode != 0:
        raise NodeError(f"judges/seldon/{script.name} failed:\n{proc.stderr.strip()}")
    if "[build]" in proc.stderr:
        log(f"{what} built in {time.monotonic() - t0:.0f} s")
    return Path(proc.stdout.strip().splitlines()[-1])


def ensure_binary(log: Callable[[str], None] = _stderr_log) -> Path:
    """The operator's ``manager`` binary, built the first time (``judges/seldon/build-operator.sh``)."""
    return _build(BUILD_SH, "Seldon operator", log)


def ensure_executor(log: Callable[[str], None] = _stderr_log) -> Path:
    """The executor's binary (Seldon Core's service orchestrator, upstream's ``executor`` image's
    entry point), built the first time (``judges/seldon/build-executor.sh``; cached by version and
    source digest, so later calls only find it). Not started on the node: Forge renders
    ``seldon.io/no-engine``; ``tests/cluster/test_seldon_executor.py`` runs it on the host."""
    return _build(EXECUTOR_BUILD_SH, "Seldon executor", log)


def install_docs(src: Path) -> list[dict[str, Any]]:
    """Upstream's install objects for the operator, less its Deployment and webhook objects."""
    docs: list[dict[str, Any]] = []
    for f in ("serviceaccount.yaml", "configmap.yaml"):
        docs += manifest_docs(src / "config" / "manager" / f)
    rbac = src / "config" / "rbac"
    kust = yaml.safe_load((rbac / "kustomization.yaml").read_text())
    for f in kust["resources"]:  # the auth proxy's files are commented out there, as upstream installs
        docs += manifest_docs(rbac / f)
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}] + kustomized(docs, NAMESPACE, NAME_PREFIX)


def manager_env(src: Path) -> dict[str, str]:
    """The environment of upstream's ``config/manager/manager.yaml`` (its literal values; the pod's
    namespace for ``POD_NAMESPACE``), with Istio and Ambassador off: the node runs neither."""
    env: dict[str, str] = {}
    for d in yaml.safe_load_all((src / "config" / "manager" / "manager.yaml").read_text()):
        if d and d["kind"] == "Deployment":
            for e in d["spec"]["template"]["spec"]["containers"][0]["env"]:
                if "value" in e:
                    env[e["name"]] = str(e["value"])
    env["POD_NAMESPACE"] = NAMESPACE
    env["ISTIO_ENABLED"] = "false"
    env["AMBASSADOR_ENABLED"] = "false"
    return env


def _webhook_cert(tmpdir: Path) -> None:
    """A self-signed serving certificate where controller-runtime's webhook server looks for it."""
    serving_cert(tmpdir / "k8s-webhook-server" / "serving-certs")


def start(cluster: Any, node: Node, *, die_with_parent: bool = False, log=_stderr_log) -> HostController:
    """Install the operator's namespace, identity and RBAC (upstream's manifests) and start it for
    ``node``'s cluster; returns once its SeldonDeployment controller's workers have started."""
    t0 = time.monotonic()
    binary = ensure_binary(log)
    t_bin = time.monotonic() - t0
    src = source_dir()
    apply_docs(node, install_docs(src))
    t_install = time.monotonic() - t0 - t_bin
    kubeconfig = service_account_kubeconfig(cluster, node, NAMESPACE, ACCOUNT, "seldon-operator")
    sd = kubeconfig.parent
    tmpdir = sd / "tmp"
    _webhook_cert(tmpdir)
    webhook_port = paths.free_port()
    loopback_only(webhook_port, WEBHOOK_CHAIN)
    env = dict(os.environ, **manager_env(src), TMPDIR=str(tmpdir), KUBECONFIG=str(kubeconfig))
    argv = [
        str(binary), f"--kubeconfig={kubeconfig}",
        f"--metrics-addr=127.0.0.1:{paths.free_port()}",
        f"--webhook-port={webhook_port}",
        "--create-resources=false",  # upstream's default: no webhook configurations, CRD or certs made
        f"--log-level={env.get('MANAGER_LOG_LEVEL', 'INFO')}",
        # no --enable-leader-election: one operator, and no Lease to wait for at start
    ]

    def ready(ctl: HostController) -> bool:
        text = ctl.log_tail()
        return READY_LINE in text and WEBHOOK_LINE in text

    ctl = spawn(node, "seldon-operator", argv, env=env, ready=ready, timeout=120,
                die_with_parent=die_with_parent, log=log)
    log(f"Seldon Core {paths.versions()['SELDON_OPERATOR_VERSION']} operator running (pid {ctl.pid}) "
        f"after {time.monotonic() - t0:.1f} s (binary {t_bin:.1f} s, install {t_install:.1f} s, "
        f"the process {ctl.start_seconds:.1f} s)")
    return ctl

