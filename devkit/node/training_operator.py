"""The Kubeflow Training Operator on the node: the real manager (``TRAINING_OPERATOR_VERSION``, the v1
line whose webhook code already judges the PyTorchJobs Forge renders; upstream's
``cmd/training-operator.v1``) as a host process against the node's cluster, as Argo's, Seldon's and
Kueue's controllers run, running the multi-node training Forge renders as a ``PyTorchJob``.

:func:`ensure_binary` builds it with ``scripts/cluster/build.sh training-operator`` (upstream's
``go build ./cmd/training-operator.v1`` in the module's own tree, from the module proxy; cached by
version). :func:`start` installs, from the module's ``manifests/`` (as ``overlays/standalone``
names them: namespace ``kubeflow``): the namespace, the ServiceAccount ``training-operator`` with
its ClusterRole and binding (``base/rbac``), and the empty Secret ``training-operator-webhook-cert``
the standalone overlay generates. The PyTorchJob CRD is the cluster's already (devkit/crds.py
loads it from the same module). The manager runs as that ServiceAccount (a client certificate), so
upstream's RBAC authorises it, with only the ``pytorchjob`` scheme, metrics and probes on loopback
ports, no leader election (one manager), and the init container it adds to every Worker pod (it
waits until the Master's Service name resolves) from the template docs/cluster-prerequisites.md
gives (``renderers.prerequisites.PYTORCH_INIT_CONTAINER_TEMPLATE``), in an image the caller names:
upstream's built-in template has no security context (a namespace enforcing Pod Security
``restricted`` refuses the Workers) and waits with ``nslookup``, whose busybox 1.35 exits 1 when
any search domain answers NXDOMAIN although the first one resolved (seen on the node), and its
default image, ``alpine:3.10``, would be pulled.

Its certificates: ``pkg/cert`` (open-policy-agent's cert-controller) generates a CA and a serving
certificate into that Secret and waits — before it sets up any job controller — until the files in
``/tmp/k8s-webhook-server/serving-certs`` (a fixed path: upstream mounts the Secret there) match
it. No kubelet mounts anything for a host process, so the harness does the volume's part: once the
Secret holds the certificate, it writes the Secret's keys to that folder (:func:`_project`), the one
thing this leaves on the host outside the node's state. The certificate names the Service
``training-operator.kubeflow.svc``, which the host's API server cannot reach, so the operator's
ValidatingWebhookConfiguration is not installed: the API server never calls its webhook server (the
rendered PyTorchJobs meet the same validation in ``judges/``, ``tests/judges``). That server binds
every address, so the node drops what reaches its port from anywhere but loopback (chain
``FORGE-NODE-TRAINING-WEBHOOK``).
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devkit.node import paths
from devkit.node.controllers import (
    HostController,
    PinnedBuild,
    answers_ok,
    apply_docs,
    kustomized,
    loopback_only,
    manifest_docs,
    service_account_kubeconfig,
    spawn,
)
from devkit.node.node import Node, _stderr_log
from renderers.prerequisites import PYTORCH_INIT_CONTAINER_TEMPLATE

NAMESPACE = "kubeflow"  # overlays/standalone; also pkg/cert's default when no pod namespace file exists
ACCOUNT = "training-operator"  # base/rbac/service-account.yaml
SECRET = "training-operator-webhook-cert"  # overlays/standalone's secretGenerator; main.go's --webhook-secret-name
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # pkg/cert certDir, controller-runtime's default too
CERT_KEYS = ("ca.crt", "tls.crt", "tls.key")
RBAC_FILES = ("service-account.yaml", "role.yaml", "cluster-role-binding.yaml")
WEBHOOK_CHAIN = "FORGE-NODE-TRAINING-WEBHOOK"
SCHEMES = ("pytorchjob",)


#: The manager: ``build.sh training-operator`` (about a minute and a half the first time).
BUILD = PinnedBuild("training-operator", "TRAINING_OPERATOR_MODULE", "TRAINING_OPERATOR_VERSION", "Training Operator")
version, module_dir, binary_path = BUILD.version, BUILD.module_dir, BUILD.binary_path


def ensure_binary(log: Callable[[str], None] = _stderr_log) -> Path:
    """The manager, built by ``scripts/cluster/build.sh training-operator`` when missing."""
    return BUILD.ensure(log)


def install_docs(moddir: Path) -> list[dict[str, Any]]:
    """The namespace, the manager's ServiceAccount, ClusterRole and binding, and the empty Secret its
    certificates go to."""
    rbac = moddir / "manifests" / "base" / "rbac"
    docs = kustomized([d for f in RBAC_FILES for d in manifest_docs(rbac / f)], NAMESPACE, "")
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, *docs,
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NAMESPACE}, "type": "Opaque"}]


def _project(core: client.CoreV1Api) -> bool:
    """Write the Secret's certificate keys to :data:`CERT_DIR` when they differ (what the kubelet's
    Secret volume does for upstream's Deployment); True once the folder holds them."""
    try:
        data = core.read_namespaced_secret(SECRET, NAMESPACE).data or {}
    except ApiException:
        return False
    if not all(k in data for k in CERT_KEYS):
        return False  # the rotator has not written them yet
    CERT_DIR.mkdir(parents=True, exist_ok=True)
    for key in CERT_KEYS:
        value = base64.b64decode(data[key])
        path = CERT_DIR / key
        if not path.exists() or path.read_bytes() != value:
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(value)
            os.chmod(tmp, 0o600)
            tmp.replace(path)
    return True


def start(cluster: Any, node: Node, init_image: str, *, die_with_parent: bool = False,
          log: Callable[[str], None] = _stderr_log, timeout: float = 180.0) -> HostController:
    """Install the operator's namespace, identity, RBAC and certificate Secret (upstream's manifests)
    and start it for ``node``'s cluster, the Worker pods' init container from
    ``renderers.prerequisites.PYTORCH_INIT_CONTAINER_TEMPLATE`` in ``init_image`` (an image on the
    node with ``sh``, ``seq`` and ``getent``: glibc's); returns once its readiness probe answers
    (certificates in place, webhook server started, the job controllers being set up)."""
    t0 = time.monotonic()
    binary = ensure_binary(log)
    apply_docs(node, install_docs(module_dir()))
    kubeconfig = service_account_kubeconfig(cluster, node, NAMESPACE, ACCOUNT, "training-operator")
    # the init container the operator adds to every Worker pod: the template docs/cluster-prerequisites.md
    # gives a platform team (upstream's, with a security context meeting `restricted`, waiting with getent)
    template = kubeconfig.parent / "init-container.yaml"
    template.write_text(PYTORCH_INIT_CONTAINER_TEMPLATE)
    webhook_port, health_port, metrics_port = paths.free_port(), paths.free_port(), paths.free_port()
    loopback_only(webhook_port, WEBHOOK_CHAIN)
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))  # controller-runtime's GetConfigOrDie reads it
    argv = [str(binary), *[f"--enable-scheme={s}" for s in SCHEMES],
            f"--metrics-bind-address=127.0.0.1:{metrics_port}", f"--health-probe-bind-address=127.0.0.1:{health_port}",
            f"--webhook-server-port={webhook_port}",
            # the Worker pods' init container, which waits for the Master's name in DNS: the
            # template the docs give a platform team (a security context, getent), in ``init_image``
            f"--pytorch-init-container-template-file={template}", f"--pytorch-init-container-image={init_image}"]
    api = node.api()
    core = client.CoreV1Api(api)

    def ready(ctl: HostController) -> bool:
        return _project(core) and answers_ok(f"http://127.0.0.1:{health_port}/readyz")

    try:
        ctl = spawn(node, "training-operator", argv, env=env, ready=ready, timeout=timeout,
                    die_with_parent=die_with_parent, log=log)
    finally:
        api.close()
    log(f"Training Operator {version()} running (pid {ctl.pid}) after {time.monotonic() - t0:.1f} s; "
        f"schemes {', '.join(SCHEMES)}")
    return ctl
