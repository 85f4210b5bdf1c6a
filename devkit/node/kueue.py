"""Kueue on the node: the real controller manager (``KUEUE_VERSION``, upstream's ``cmd/kueue``) as a
host process against the node's cluster, as Argo's, Seldon's and Traefik's controllers run, admitting
what Forge renders for a queued pool (renderers/queues.py).

:func:`ensure_binary` builds it with ``scripts/cluster/build.sh kueue`` (upstream's ``go build
./cmd/kueue`` in the module's own tree, from the module proxy; cached by version). :func:`start`
installs, from the module's own ``config/`` (as ``config/default``'s kustomization names them:
namespace ``kueue-system``, name prefix ``kueue-``):

* the CRDs of ``config/components/crd/bases`` the cluster does not serve yet (devkit/crds.py loads
  six of them; the manager watches all eleven). Upstream's kustomization adds a conversion webhook
  (v1beta1 <-> v1beta2) to four of them; left out, as in devkit/crds.py: Forge and the manager
  speak v1beta2, the storage version;
* the ServiceAccount ``kueue-controller-manager``, the ClusterRole ``kueue-manager-role`` and the Role
  ``kueue-manager-secrets-role`` (Secrets in ``kueue-system``, which its MultiKueue controllers watch)
  with their bindings (``config/components/rbac``: :data:`RBAC_FILES`);
  the manager runs as that ServiceAccount (a client certificate), so upstream's RBAC authorises it.
  No leader election (one manager), so not its Role;
* the webhooks of ``config/components/webhook/manifests.yaml`` Kueue serves for what it runs here:
  its own kinds (``kueue.x-k8s.io``), pods, and PyTorchJobs when the Training Operator's CRD is
  served. Each points at the manager on the host (``clientConfig.url``, https://127.0.0.1:<port>)
  with the CA of the serving certificate the harness makes. The pod webhooks' ``namespaceSelector``
  is the same selector as the manager's ``managedJobsNamespaceSelector`` (:data:`MANAGED_NAMESPACES`),
  where upstream's kustomization puts "not kube-system, not kueue-system": on the shared node, other
  modules' pods never go through Kueue.

The manager's Configuration (``config.kueue.x-k8s.io/v1beta2``, :func:`configuration`): internal
certificate management off (no Secret, no Service: the harness gives the webhook server its
certificate), the webhook server on 127.0.0.1, health probes and metrics on free loopback ports, the
``pod`` integration (and ``kubeflow.org/pytorchjob`` when its CRD is there), only namespaces labelled
:data:`MANAGED_NAMESPACES` managed, ``waitForPodsReady`` on (an admitted workload whose pods are not
ready within :data:`PODS_READY_TIMEOUT` is evicted and requeued), and the on-demand visibility server
off (an aggregated API server the node's API server is not set up to delegate to).

With internal certificate management off, ``cmd/kueue/main.go`` reads the metrics server's
certificate from the fixed path ``/etc/kueue/metrics/certs`` (where upstream's cert-manager patch
mounts it) and exits when it is missing: the harness writes a self-signed one there when there is
none, the one thing this leaves on the host outside the node's state.
"""

from __future__ import annotations

import base64
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devkit.node import paths
from devkit.node.controllers import (
    HostController,
    PinnedBuild,
    answers_ok,
    apply_docs,
    kubectl,
    kustomized,
    manifest_docs,
    service_account_kubeconfig,
    serving_cert,
    spawn,
    wait_established,
)
from devkit.node.node import Node, NodeError, _stderr_log

NAMESPACE = "kueue-system"  # config/default/kustomization.yaml: namespace
NAME_PREFIX = "kueue-"  # ... and namePrefix
ACCOUNT = NAME_PREFIX + "controller-manager"  # config/components/rbac/service_account.yaml, prefixed
CONFIG_API = "config.kueue.x-k8s.io/v1beta2"
#: The label of the namespaces whose pods Kueue manages on the node (its ``managedJobsNamespaceSelector``
#: and the pod webhooks' ``namespaceSelector``): a node module that queues pods labels its namespace so.
MANAGED_NAMESPACES = {"forge.dev/kueue": "managed"}
PODS_READY_TIMEOUT = "5m"
PYTORCHJOBS_CRD = "pytorchjobs.kubeflow.org"
METRICS_CERTS = Path("/etc/kueue/metrics/certs")  # cmd/kueue/main.go: metricsCertPath
CRD_DIR = "config/components/crd/bases"
#: The manager's identity and what it may do (the multikueue controllers read Secrets in its namespace,
#: whether or not MultiKueue is used). Not the leader-election Role: one manager, no election.
RBAC_FILES = ("service_account.yaml", "role.yaml", "role_binding.yaml", "manager_secrets_role.yaml",
              "manager_secrets_role_binding.yaml")
WEBHOOKS = "config/components/webhook/manifests.yaml"


#: Kueue's manager: ``build.sh kueue`` (tens of minutes the first time on two loaded cores).
BUILD = PinnedBuild("kueue", "KUEUE_MODULE", "KUEUE_VERSION", "Kueue")
version, module_dir, binary_path = BUILD.version, BUILD.module_dir, BUILD.binary_path


def ensure_binary(log: Callable[[str], None] = _stderr_log) -> Path:
    """Kueue's manager, built by ``scripts/cluster/build.sh kueue`` when missing."""
    return BUILD.ensure(log)


def crd_docs(moddir: Path, served: set[str]) -> list[dict[str, Any]]:
    """Upstream's CRDs (``config/components/crd/bases``) whose names are not in ``served``."""
    docs = [d for f in sorted((moddir / CRD_DIR).glob("*.yaml")) for d in manifest_docs(f)]
    return [d for d in docs if d["metadata"]["name"] not in served]


def install_docs(moddir: Path) -> list[dict[str, Any]]:
    """The namespace, the manager's ServiceAccount and its ClusterRole and binding."""
    rbac = moddir / "config" / "components" / "rbac"
    docs = [d for f in RBAC_FILES for d in manifest_docs(rbac / f)]
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, *kustomized(docs, NAMESPACE, NAME_PREFIX)]


def _served(webhook: dict[str, Any], pytorchjobs: bool) -> bool:
    groups = {g for r in webhook["rules"] for g in r["apiGroups"]}
    resources = {x for r in webhook["rules"] for x in r["resources"]}
    return (groups == {"kueue.x-k8s.io"} or (groups == {""} and resources == {"pods"})
            or (pytorchjobs and groups == {"kubeflow.org"} and resources == {"pytorchjobs"}))


def webhook_docs(moddir: Path, url: str, ca_bundle: str, pytorchjobs: bool) -> list[dict[str, Any]]:
    """Upstream's webhook configurations, only the webhooks for what the manager runs here, each
    pointed at ``url`` (its path kept) with ``ca_bundle`` (base64 PEM); the pod webhooks' namespace
    selector is :data:`MANAGED_NAMESPACES`."""
    docs = kustomized(manifest_docs(moddir / WEBHOOKS), NAMESPACE, NAME_PREFIX)
    for d in docs:
        kept = []
        for w in d["webhooks"]:
            if not _served(w, pytorchjobs):
                continue
            path = w["clientConfig"]["service"]["path"]
            w["clientConfig"] = {"url": url + path, "caBundle": ca_bundle}
            if w["rules"][0]["apiGroups"] == [""]:
                w["namespaceSelector"] = {"matchLabels": dict(MANAGED_NAMESPACES)}
            kept.append(w)
        d["webhooks"] = kept
    return docs


def configuration(*, webhook_port: int, cert_dir: Path, health_port: int, metrics_port: int,
                  pytorchjobs: bool) -> dict[str, Any]:
    """The manager's Configuration on the node (see the module docstring)."""
    frameworks = ["pod", *(["kubeflow.org/pytorchjob"] if pytorchjobs else [])]
    return {
        "apiVersion": CONFIG_API, "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {"matchLabels": dict(MANAGED_NAMESPACES)},
        "waitForPodsReady": {"timeout": PODS_READY_TIMEOUT, "blockAdmission": False},
        "integrations": {"frameworks": frameworks},
        "featureGates": {"VisibilityOnDemand": False},
        "clientConnection": {"qps": 50, "burst": 100},  # upstream's controller_manager_config.yaml
    }


@dataclass
class KueueController:
    """Kueue's manager running for the node's cluster."""

    controller: HostController
    config_path: Path
    frameworks: list[str]


def _served_crds(node: Node) -> set[str]:
    return set(kubectl(node, "get", "crd", "-o", "name").replace("customresourcedefinition.apiextensions.k8s.io/", "")
               .split())


def start(cluster: Any, node: Node, *, die_with_parent: bool = False, log: Callable[[str], None] = _stderr_log,
          timeout: float = 120.0) -> KueueController:
    """Install Kueue's CRDs, identity, RBAC and webhooks (upstream's manifests) and start its manager
    for ``node``'s cluster; returns once its readiness probe (which waits for the webhook server)
    answers."""
    t0 = time.monotonic()
    binary = ensure_binary(log)
    moddir = module_dir()
    served = _served_crds(node)
    pytorchjobs = PYTORCHJOBS_CRD in served
    new_crds = crd_docs(moddir, served)
    if new_crds:
        apply_docs(node, new_crds)
        wait_established(node, [f"crd/{d['metadata']['name']}" for d in new_crds])
    apply_docs(node, install_docs(moddir))
    kubeconfig = service_account_kubeconfig(cluster, node, NAMESPACE, ACCOUNT, "kueue")
    sd = kubeconfig.parent
    cert_dir = sd / "serving-certs"
    crt = serving_cert(cert_dir)
    if not (METRICS_CERTS / "tls.crt").exists():
        serving_cert(METRICS_CERTS)
    webhook_port, health_port, metrics_port = paths.free_port(), paths.free_port(), paths.free_port()
    config = configuration(webhook_port=webhook_port, cert_dir=cert_dir, health_port=health_port,
                           metrics_port=metrics_port, pytorchjobs=pytorchjobs)
    config_path = sd / "configuration.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))  # controller-runtime's GetConfigOrDie reads it
    argv = [str(binary), f"--config={config_path}"]
    ctl = spawn(node, "kueue", argv, env=env, ready=lambda c: answers_ok(f"http://127.0.0.1:{health_port}/readyz"),
                timeout=timeout, die_with_parent=die_with_parent, log=log)
    ca = base64.b64encode(crt.read_bytes()).decode()
    apply_docs(node, webhook_docs(moddir, f"https://127.0.0.1:{webhook_port}", ca, pytorchjobs))
    _check_webhook(f"https://127.0.0.1:{webhook_port}", crt)
    log(f"Kueue {version()} running (pid {ctl.pid}) after {time.monotonic() - t0:.1f} s; integrations "
        f"{', '.join(config['integrations']['frameworks'])}")
    return KueueController(ctl, config_path, config["integrations"]["frameworks"])


def _check_webhook(url: str, crt: Path) -> None:
    """The webhook server answers TLS with the certificate the configurations name (a wrong one would
    make every queued pod's create fail)."""
    ctx = ssl.create_default_context(cafile=str(crt))
    try:
        urllib.request.urlopen(url + "/healthz-none", timeout=5, context=ctx)
    except urllib.error.HTTPError:
        return  # TLS held; the path is unknown: 404
    except OSError as e:
        raise NodeError(f"Kueue's webhook server at {url} does not answer with the harness's certificate: {e}") from e
