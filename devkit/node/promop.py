"""The Prometheus Operator on the node: the real operator (on the host) managing a real Prometheus
(a pod on the node) that scrapes what Forge's PodMonitors select and loads Forge's PrometheusRules.

Built from the module proxy by ``scripts/cluster/build.sh promop``
(``PROMETHEUS_OPERATOR_VERSION`` of ``scripts/cluster/versions.env``):

- ``bin/prometheus-operator-<version>/{operator,prometheus-config-reloader}`` (``cmd/operator``,
  ``cmd/prometheus-config-reloader``; static, ``CGO_ENABLED=0``);
- ``bin/prometheus-<prometheus version>/prometheus``: Prometheus itself, the version the pinned
  operator deploys by default (the last entry of its ``PrometheusCompatibilityMatrix``), with
  upstream's build tags ``remove_all_sd,enable_kubernetes_sd``. Debian's ``prometheus`` package
  cannot serve: Debian builds it without Kubernetes service discovery, which every configuration
  the operator generates for a PodMonitor uses (``kubernetes_sd_configs``).

Images (OCI archives for ``Node.start(extra_images=...)``, see :func:`images`), each on Debian's
``busybox-static`` as upstream's are on ``quay.io/prometheus/busybox``:

- ``forge.local/prometheus-config-reloader:<version>``: ``/bin/prometheus-config-reloader``,
  ``USER nobody``, ``ENTRYPOINT ["/bin/prometheus-config-reloader"]`` (upstream's
  ``cmd/prometheus-config-reloader/Dockerfile``);
- ``forge.local/prometheus:<prometheus version>``: ``/bin/prometheus``, upstream's
  ``documentation/examples/prometheus.yml`` at ``/etc/prometheus/prometheus.yml``, ``/prometheus``
  owned by nobody, ``WORKDIR /prometheus``, ``USER nobody``, ``ENTRYPOINT ["/bin/prometheus"]``
  and upstream's ``CMD`` (its ``Dockerfile``).

:func:`start` installs the operator's CRDs the test cluster does not serve and upstream's operator
RBAC (``example/rbac/prometheus-operator/``, ServiceAccount ``prometheus-operator`` in
``monitoring``), and runs the operator on the host as
``system:serviceaccount:monitoring:prometheus-operator`` (a client certificate).
:func:`deploy_prometheus` creates a ``Prometheus`` the operator turns into the StatefulSet
``prometheus-prometheus`` and the governing Service ``prometheus-operated``, and returns the URL
of its pod on the node's bridge.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devkit.node import images as imagesmod
from devkit.node import paths
from devkit.node.controllers import (
    HostController,
    apply_docs,
    kubectl,
    manifest_docs,
    service_account_kubeconfig,
    spawn,
    wait_established,
)
from devkit.node.node import Node, NodeError, _stderr_log, _tail

Log = Callable[[str], None]

NAMESPACE = "monitoring"  # the operator's ServiceAccount and, by default, the Prometheus (as kube-prometheus)
OPERATOR_ACCOUNT = "prometheus-operator"  # upstream's example/rbac/prometheus-operator names it so
PROMETHEUS_ACCOUNT = "prometheus"  # upstream's example/rbac/prometheus
PROMETHEUS_NAME = "prometheus"  # the Prometheus object; its pod is prometheus-<name>-0
RELOADER_IMAGE = "forge.local/prometheus-config-reloader"
PROMETHEUS_IMAGE = "forge.local/prometheus"
# the CRDs the test cluster already serves (devkit/crds.py) are applied again from the same
# module: same version, so nothing changes; the others (prometheuses, probes, ...) are new
CRD_DIR = Path("example") / "prometheus-operator-crd"


def version() -> str:
    """The pinned operator version, e.g. ``v0.93.0``."""
    return paths.versions()["PROMETHEUS_OPERATOR_VERSION"]


def module_dir() -> Path:
    """The pinned operator module's source (``go mod download``)."""
    v = paths.versions()
    return paths.go_mod_download(v["PROMETHEUS_OPERATOR_MODULE"], v["PROMETHEUS_OPERATOR_VERSION"])


def prometheus_version() -> str:
    """The Prometheus version the pinned operator deploys by default (``DefaultPrometheusVersion``:
    the last entry of ``PrometheusCompatibilityMatrix`` in ``pkg/operator/defaults.go``)."""
    text = (module_dir() / "pkg" / "operator" / "defaults.go").read_text()
    body = text.split("PrometheusCompatibilityMatrix = []string{", 1)[1].split("}", 1)[0]
    return re.findall(r'"(v[0-9.]+)"', body)[-1]


def prometheus_module_version(v: str) -> str:
    """Prometheus tags its Go module v0.<major><minor:02>.<patch>: v3.13.1 -> v0.313.1."""
    major, minor, patch = (int(x) for x in v.lstrip("v").split("."))
    return f"v0.{major}{minor:02d}.{patch}"


def binaries() -> dict[str, Path]:
    """Where ``build.sh promop`` puts the operator, the reloader and Prometheus (may not exist yet)."""
    d = paths.cache_dir() / "bin" / f"prometheus-operator-{version()}"
    return {"operator": d / "operator", "prometheus-config-reloader": d / "prometheus-config-reloader",
            "prometheus": paths.cache_dir() / "bin" / f"prometheus-{prometheus_version()}" / "prometheus"}


def ensure_binaries(log: Log = _stderr_log) -> dict[str, Path]:
    """The three binaries, built by ``scripts/cluster/build.sh promop`` when missing."""
    bins = binaries()
    if not all(os.access(p, os.X_OK) for p in bins.values()):
        log("building the Prometheus Operator, its config reloader and Prometheus (first time only)")
        if subprocess.run(["nice", "-n", "10", str(paths.BUILD_SH), "promop"]).returncode != 0:
            raise NodeError("scripts/cluster/build.sh promop failed")
    return bins


def _busybox_entries(log: Log) -> tuple[list[imagesmod.Entry], str]:
    """Debian's busybox-static with one symlink per applet, /tmp and a passwd naming nobody: what
    upstream's base image quay.io/prometheus/busybox provides. Returns (entries, Debian version)."""
    root, debver = imagesmod.debian_package("busybox-static", log)
    bb = root / "bin" / "busybox"
    applets = subprocess.run([str(bb), "--list-full"], capture_output=True, text=True, check=True).stdout.split()
    entries = [imagesmod.Entry("/bin/busybox", 0o755, bb.read_bytes())]
    entries += [imagesmod.Entry("/" + a, link="/bin/busybox") for a in applets if a != "bin/busybox"]
    entries += [
        imagesmod.Entry("/tmp", 0o1777), imagesmod.Entry("/root", 0o700),
        imagesmod.Entry("/etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\n"
                                              b"nobody:x:65534:65534:nobody:/home:/bin/false\n"),
        imagesmod.Entry("/etc/group", 0o644, b"root:x:0:\nnobody:x:65534:\n"),
    ]
    return entries, debver


def _image(name: str, tag: str, files: list[imagesmod.Entry], log: Log, **spec: Any) -> tuple[str, str]:
    """(archive, ref) of busybox + ``files``, cached under a key of every input."""
    base, debver = _busybox_entries(log)
    key = imagesmod._key(debver, json.dumps(spec, sort_keys=True),
                         *(f"{e.path}:{e.mode:o}:{e.uid}:{e.gid}:{e.link}".encode() + (e.data or b"") for e in files))
    dest = paths.cache_dir() / "images" / f"{name.rsplit('/', 1)[-1]}-{tag}-{key}.tar"
    ref = f"{name}:{tag}"
    if not dest.is_file():
        log(f"building the image {ref}")
        imagesmod.pack_oci_archive(imagesmod.ImageSpec(name, tag, base + files, **spec), dest)
    return str(dest), ref


def reloader_image(log: Log = _stderr_log) -> tuple[str, str]:
    """(archive, ref) of ``forge.local/prometheus-config-reloader:<version>``."""
    bins = ensure_binaries(log)
    # upstream: COPY prometheus-config-reloader /bin/; USER nobody; ENTRYPOINT ["/bin/prometheus-config-reloader"]
    return _image(RELOADER_IMAGE, version(),
                  [imagesmod.Entry("/bin/prometheus-config-reloader", 0o755, bins["prometheus-config-reloader"].read_bytes())],
                  log, entrypoint=["/bin/prometheus-config-reloader"], user="nobody")


def prometheus_image(log: Log = _stderr_log) -> tuple[str, str]:
    """(archive, ref) of ``forge.local/prometheus:<prometheus version>``, as upstream's Dockerfile."""
    bins = ensure_binaries(log)
    pv = prometheus_version()
    src = paths.go_mod_download("github.com/prometheus/prometheus", prometheus_module_version(pv))
    nobody = {"uid": 65534, "gid": 65534}
    files = [
        imagesmod.Entry("/bin/prometheus", 0o755, bins["prometheus"].read_bytes()),
        imagesmod.Entry("/etc/prometheus", 0o755, **nobody),
        imagesmod.Entry("/etc/prometheus/prometheus.yml", 0o644,
                        (src / "documentation" / "examples" / "prometheus.yml").read_bytes(), **nobody),
        imagesmod.Entry("/LICENSE", 0o644, (src / "LICENSE").read_bytes()),
        imagesmod.Entry("/NOTICE", 0o644, (src / "NOTICE").read_bytes()),
        # upstream: chown -R nobody:nobody /prometheus && chmod g+w /prometheus
        imagesmod.Entry("/prometheus", 0o775, **nobody),
    ]
    return _image(PROMETHEUS_IMAGE, pv, files, log, entrypoint=["/bin/prometheus"], user="nobody",
                  workdir="/prometheus",
                  cmd=["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"])


def images(log: Log = _stderr_log) -> list[tuple[str, str]]:
    """(archive, ref) of the reloader and Prometheus images: ``Node.start(extra_images=images())``."""
    return [reloader_image(log), prometheus_image(log)]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start(cluster: Any, node: Node, *, die_with_parent: bool = False, log: Log = _stderr_log) -> HostController:
    """Install the operator's CRDs and RBAC and run the operator on the host against ``node``'s cluster.

    ``node`` must have been started with ``extra_images=images()`` (the operator only names the
    reloader image; the pods need it in containerd).
    """
    t0 = time.monotonic()
    bins = ensure_binaries(log)
    reloader = f"{RELOADER_IMAGE}:{version()}"
    if reloader not in node.images:
        raise NodeError(f"the node has no {reloader}: start it with extra_images=devkit.node.promop.images()")
    m = module_dir()
    crds = sorted((m / CRD_DIR).glob("monitoring.coreos.com_*.yaml"))
    for f in crds:
        # server-side: prometheuses' CRD is larger than the client-side apply annotation allows
        kubectl(node, "apply", "--server-side", "--force-conflicts", "-f", str(f))
    wait_established(node, [f"crd/{f.name.split('_', 1)[1].removesuffix('.yaml')}.monitoring.coreos.com" for f in crds])
    # upstream's operator RBAC with the namespace kustomize's `namespace:` would set (upstream
    # writes `default`); the Deployment, Service and ServiceMonitor are left out: it runs on the host
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}]
    rbac = m / "example" / "rbac" / "prometheus-operator"
    for f in ("prometheus-operator-service-account.yaml", "prometheus-operator-cluster-role.yaml",
              "prometheus-operator-cluster-role-binding.yaml"):
        docs += manifest_docs(rbac / f)
    _set_namespace(docs, NAMESPACE)
    apply_docs(node, docs)
    kubeconfig = service_account_kubeconfig(cluster, node, NAMESPACE, OPERATOR_ACCOUNT, "prometheus-operator")
    port = paths.free_port()
    argv = [
        str(bins["operator"]),
        f"--web.listen-address=127.0.0.1:{port}",
        f"--prometheus-config-reloader={reloader}",
        # as upstream's Deployment (example/rbac/prometheus-operator/prometheus-operator-deployment.yaml),
        # less --kubelet-service: no kubelet Endpoints sync (the node's kubelet listens on loopback only)
        "--watch-referenced-objects-in-all-namespaces=true",
        "--disable-unmanaged-prometheus-configuration=true",
    ]
    # the operator has no --kubeconfig flag: pkg/k8s.NewClusterConfig reads $KUBECONFIG
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), GOGC="30")
    ctl = spawn(node, "prometheus-operator", argv, env=env,
                ready=lambda c: _healthy(f"http://127.0.0.1:{port}/healthz"),
                timeout=90, die_with_parent=die_with_parent, log=log)
    log(f"Prometheus Operator {version()} on 127.0.0.1:{port} after {time.monotonic() - t0:.1f} s")
    return ctl


def _set_namespace(docs: list[dict[str, Any]], namespace: str) -> None:
    """What kustomize's ``namespace:`` does to these manifests: namespaced objects and the
    ServiceAccount subjects of bindings get ``namespace`` (overriding upstream's ``default``)."""
    for d in docs:
        if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            d["metadata"]["namespace"] = namespace
        for s in d.get("subjects") or []:
            if s.get("kind") == "ServiceAccount":
                s["namespace"] = namespace


def deploy_prometheus(node: Node, namespace: str = NAMESPACE, *, image: str | None = None,
                      prom_version: str | None = None, interval: str = "2s", timeout: float = 240,
                      controller: HostController | None = None, log: Log = _stderr_log) -> str:
    """Create a ``Prometheus`` named ``prometheus`` in ``namespace`` (with its ServiceAccount and
    upstream's ``example/rbac/prometheus/`` RBAC) selecting every PodMonitor and PrometheusRule of
    every namespace; wait until the operator's StatefulSet pod is Ready and answers ``/-/ready``
    from the host; return its URL at the ClusterIP of upstream's ``prometheus`` Service
    (``http://10.0.0.x:9090``; the host reaches it through kube-proxy), which outlives the pod."""
    t0 = time.monotonic()
    pv = prom_version or prometheus_version()
    image = image or f"{PROMETHEUS_IMAGE}:{pv}"
    m = module_dir()
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}]
    rbac = m / "example" / "rbac" / "prometheus"
    for f in ("prometheus-service-account.yaml", "prometheus-cluster-role.yaml", "prometheus-cluster-role-binding.yaml"):
        docs += manifest_docs(rbac / f)
    _set_namespace(docs, namespace)
    docs.append({
        "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
        "metadata": {"name": PROMETHEUS_NAME, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "image": image,
            # the operator generates the configuration and the flags for this version
            "version": pv,
            # the images are imported, never pulled: a missing one fails as ErrImageNeverPull
            "imagePullPolicy": "Never",
            "serviceAccountName": PROMETHEUS_ACCOUNT,
            "podMonitorSelector": {}, "podMonitorNamespaceSelector": {},
            "ruleSelector": {}, "ruleNamespaceSelector": {},
            "scrapeInterval": interval, "evaluationInterval": interval,
        },
    })
    # A stable address: the pod's IP changes whenever the operator rolls its StatefulSet (it does
    # when the first PrometheusRule adds a rule-file volume), and the governing `prometheus-operated`
    # Service is headless. Upstream's getting-started guide exposes Prometheus with this Service
    # (there a NodePort; a ClusterIP here, which the host reaches through kube-proxy).
    [service] = manifest_docs(m / "example" / "user-guides" / "getting-started" / "prometheus-service.yaml")
    service["metadata"]["namespace"] = namespace
    service["spec"]["type"] = "ClusterIP"
    for port in service["spec"]["ports"]:
        port.pop("nodePort", None)
    docs.append(service)
    apply_docs(node, docs)
    cluster_ip = json.loads(kubectl(node, "-n", namespace, "get", "service", service["metadata"]["name"], "-o", "json"))[
        "spec"]["clusterIP"]
    pod = f"prometheus-{PROMETHEUS_NAME}-0"
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            p = json.loads(kubectl(node, "-n", namespace, "get", "pod", pod, "-o", "json"))
        except NodeError as e:
            p, last = {}, str(e)
        st = p.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
        if ready and st.get("podIP"):
            url = f"http://{cluster_ip}:9090"
            if _healthy(url + "/-/ready"):
                break
            last = f"{url}/-/ready does not answer 200 yet"
        elif p:
            last = json.dumps({"phase": st.get("phase"), "containers": st.get("containerStatuses")})[:2000]
        if controller is not None and not controller.running():
            raise NodeError(f"the Prometheus Operator exited:\n{_tail(controller.log_path)}")
        if time.monotonic() > deadline:
            events = ""
            try:
                events = kubectl(node, "-n", namespace, "get", "events", "--sort-by=.lastTimestamp")
            except NodeError as e:
                events = str(e)
            raise NodeError(f"Prometheus pod {namespace}/{pod} not ready after {timeout:.0f} s: {last}\n{events[-4000:]}"
                            + (f"\noperator log:\n{_tail(controller.log_path)}" if controller else ""))
        time.sleep(0.5)
    log(f"Prometheus {pv} ready at {url} after {time.monotonic() - t0:.1f} s")
    return url
