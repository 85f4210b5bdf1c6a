"""Argo Workflows on the node: the real workflow-controller (on the host) and argoexec (in every
step's pod), v4.0.5 from the module proxy (``scripts/cluster/build.sh argo``).

What :func:`start` installs, from upstream's own manifests in the pinned module
(``manifests/``): the Argo CRDs the test cluster does not already serve (WorkflowTaskResult,
WorkflowTaskSet, WorkflowArtifactGCTask, WorkflowEventBinding; ``base/crds/full``), the namespace
``argo`` with ``workflow-controller-configmap`` (plus the executor's security context Pod Security
``restricted`` asks for) and the ``argo`` ServiceAccount, the controller's
ClusterRoles and bindings (``cluster-install-no-crds/workflow-controller-rbac``), and for each
namespace that runs workflows the executor's Role and its binding to ``default``
(``quick-start/base/executor/emissary/executor-role.yaml``, ``executor-default-rolebinding.yaml``).

The controller runs as a host process with a client certificate for
``system:serviceaccount:argo:argo`` (so upstream's RBAC is what authorises it), leader election
off, ``--executor-image forge.local/argoexec:<version>`` (built by :func:`images.build_argoexec`,
imported into the node's containerd) with pull policy ``Never``.

The executor in the pods talks to the API server as an in-cluster client: the cluster's API
server certificate must name ``IP:10.0.0.1`` and its ``ServiceAccount`` admission plugin must be
on (see :func:`in_cluster_clients_supported`); otherwise :func:`start` refuses with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devkit.node import images, paths
from devkit.node.controllers import HostController, service_account_kubeconfig, spawn, wait_established
from devkit.node.controllers import kubectl as _kubectl
from devkit.node.controllers import manifest_docs as _docs
from devkit.node.node import KUBERNETES_SERVICE_IP, Node, NodeError, _stderr_log
from renderers.prerequisites import ARGO_EXECUTOR_SECURITY_CONTEXT

NAMESPACE = "argo"
EXTRA_CRDS = ("workflowtaskresults", "workflowtasksets", "workflowartifactgctasks", "workfloweventbindings")


def module_dir() -> Path:
    v = paths.versions()
    return paths.go_mod_download(v["ARGO_WORKFLOWS_MODULE"], v["ARGO_WORKFLOWS_VERSION"])


def ensure_binaries(log=_stderr_log) -> dict[str, Path]:
    bins = {n: paths.argo_binary(n) for n in ("workflow-controller", "argoexec")}
    if not all(os.access(p, os.X_OK) for p in bins.values()):
        log("building Argo's workflow-controller and argoexec (first time only)")
        if subprocess.run(["nice", "-n", "10", str(paths.BUILD_SH), "argo"]).returncode != 0:
            raise NodeError("scripts/cluster/build.sh argo failed")
    return bins


def executor_image(log=_stderr_log) -> tuple[str, str]:
    """(archive, ref) of the argoexec image; pass it to ``Node.start(extra_images=[...])``."""
    bins = ensure_binaries(log)
    arch, ref = images.build_argoexec(bins["argoexec"], paths.versions()["ARGO_WORKFLOWS_VERSION"], log)
    return str(arch), ref


def in_cluster_clients_supported(cluster: Any) -> list[str]:
    """What keeps a pod's in-cluster client (argoexec) from talking to ``cluster``: [] when nothing."""
    problems = []
    crt = Path(cluster.pki) / "apiserver.crt"
    text = subprocess.run(["openssl", "x509", "-in", str(crt), "-noout", "-ext", "subjectAltName"],
                          capture_output=True, text=True).stdout
    if f"IP Address:{KUBERNETES_SERVICE_IP}" not in text:
        problems.append(f"the API server's certificate does not name IP:{KUBERNETES_SERVICE_IP} (the `kubernetes` "
                        f"Service's IP, which in-cluster clients dial and verify); its SANs: {text.strip().splitlines()[-1:]}")
    args = Path(f"/proc/{cluster.pids.get('kube-apiserver', 0)}/cmdline")
    try:
        argv = args.read_bytes().split(b"\0")
    except OSError:
        argv = []
    if any(a.startswith(b"--disable-admission-plugins=") and b"ServiceAccount" in a for a in argv):
        problems.append("the API server runs with --disable-admission-plugins=ServiceAccount: pods get no "
                        "service-account token")
    return problems


@dataclass
class ArgoController(HostController):
    """The workflow-controller process, and what it runs with."""

    version: str = ""
    executor_image: str = ""
    namespaces: list[str] = field(default_factory=list)


def start(cluster: Any, node: Node, namespaces: list[str] = ("default",), *, die_with_parent: bool = False,
          log=_stderr_log) -> ArgoController:
    """Install Argo (upstream manifests) and start the workflow-controller for ``node``'s cluster.

    ``node`` must have been started with ``extra_images=[executor_image()]``.
    """
    problems = in_cluster_clients_supported(cluster)
    if problems:
        raise NodeError("Argo's executor cannot reach this API server from a pod:\n- " + "\n- ".join(problems))
    t0 = time.monotonic()
    bins = ensure_binaries(log)
    v = paths.versions()["ARGO_WORKFLOWS_VERSION"]
    ref = f"forge.local/argoexec:{v}"
    if ref not in node.images:
        raise NodeError(f"the node has no {ref}: start it with extra_images=[devkit.node.argo.executor_image()]")
    m = module_dir() / "manifests"
    for name in EXTRA_CRDS:
        _kubectl(node, "apply", "--server-side", "--force-conflicts", "-f", str(m / "base" / "crds" / "full" / f"argoproj.io_{name}.yaml"))
    wait_established(node, [f"crd/{n}.argoproj.io" for n in EXTRA_CRDS])
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}]
    for f in ("workflow-controller-configmap.yaml", "workflow-controller-sa.yaml"):
        docs += _docs(m / "base" / "workflow-controller" / f)
    rbac = m / "cluster-install-no-crds" / "workflow-controller-rbac"
    for f in sorted(rbac.glob("*.yaml")):
        if f.name != "kustomization.yaml":
            docs += _docs(f, NAMESPACE)
    for d in docs:
        if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            d["metadata"].setdefault("namespace", NAMESPACE)
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "workflow-controller-configmap":
            # What an admin sets for namespaces that enforce Pod Security `restricted`
            # (docs/cluster-prerequisites.md): the security context of the executor's `init` and
            # `wait` containers in every step pod (JSON is YAML, which the controller reads).
            d.setdefault("data", {})["executor"] = json.dumps({"securityContext": ARGO_EXECUTOR_SECURITY_CONTEXT})
    # memoization: upstream's docs/memoization.md — "add the verbs create and update to the
    # configmaps resource … In the case of a cluster install the argo-cluster-role cluster role
    # should be updated". v4.0.5 keeps every ConfigMap cache in the controller's own namespace
    # (controllercache.NewCacheFactory(kubeclientset, namespace)); without this, a memoized step
    # ends in Error: `could not save to config map cache: configmaps is forbidden: User
    # "system:serviceaccount:argo:argo" cannot create resource "configmaps" … in the namespace "argo"`.
    # Granted by a ClusterRole of its own rather than by editing upstream's.
    docs += [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "forge-argo-memoization"},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "update"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "forge-argo-memoization"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "forge-argo-memoization"},
         "subjects": [{"kind": "ServiceAccount", "name": "argo", "namespace": NAMESPACE}]},
    ]
    _kubectl(node, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    for ns in namespaces:
        executor = _docs(m / "quick-start" / "base" / "executor" / "emissary" / "executor-role.yaml") + \
            _docs(m / "quick-start" / "base" / "executor-default-rolebinding.yaml", ns)
        for d in executor:
            d["metadata"]["namespace"] = ns
        _kubectl(node, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": executor}))
    # the controller's identity: the `argo` ServiceAccount (a client certificate for its user name)
    kubeconfig = service_account_kubeconfig(cluster, node, NAMESPACE, "argo", "argo")
    def started(c: HostController) -> bool:
        tail = c.log_tail()
        return "Starting Workflow Controller" in tail or "Started workflow garbage collection" in tail
    host = spawn(node, "workflow-controller", [
        str(bins["workflow-controller"]), f"--kubeconfig={kubeconfig}", f"--namespace={NAMESPACE}",
        f"--executor-image={ref}", "--executor-image-pull-policy=Never",
    ], env=dict(os.environ, LEADER_ELECTION_DISABLE="true"), ready=started, timeout=60,
        die_with_parent=die_with_parent)
    ctl = ArgoController(**asdict(host), version=v, executor_image=ref, namespaces=list(namespaces))
    ctl.start_seconds = round(time.monotonic() - t0, 2)
    log(f"Argo {v} workflow-controller running (pid {ctl.pid}) after {ctl.start_seconds:.1f} s")
    return ctl
