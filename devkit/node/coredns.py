"""CoreDNS on the node: the cluster's DNS, run the way a cluster runs it (the Deployment ``coredns``
behind the Service ``kube-dns`` in ``kube-system``), so that pods reach Services by name
(``prometheus-operated.monitoring.svc``, ``<svc>`` from its own namespace).

The binary is CoreDNS ``COREDNS_VERSION`` with upstream's default plugin set, built by
``scripts/cluster/build.sh coredns`` from the module proxy (cached by version). :func:`image` packs it
as upstream's Dockerfile does (distroless ``static`` + ``/coredns``, ``USER 65532:65532``,
``ENTRYPOINT ["/coredns"]``, ``WORKDIR /``); the node imports it like its other images.

:func:`manifests` are upstream's ``kubernetes/coredns.yaml.sed`` (github.com/coredns/deployment, the
manifest its ``deploy.sh`` fills in; that repository is not a Go module the proxy serves, so its
objects are written out here) with the template's values filled in: ``CLUSTER_DOMAIN`` cluster.local,
``REVERSE_CIDRS`` ``in-addr.arpa ip6.arpa``, ``UPSTREAMNAMESERVER`` ``/etc/resolv.conf``,
``CLUSTER_DNS_IP`` :data:`CLUSTER_DNS_IP` (the node's kubelet's ``clusterDNS``), no stub
domains. The ServiceAccount ``coredns``, the ClusterRole and ClusterRoleBinding ``system:coredns``
(list/watch endpoints, services, pods, namespaces and endpointslices), the ConfigMap ``coredns``
(the Corefile), the Deployment ``coredns`` (one replica, upstream's default) and the Service
``kube-dns`` (53/UDP, 53/TCP, 9153 metrics). What differs, and why:

* the image is the one built here (``forge.local/coredns:<version>``, present in containerd, so
  upstream's ``imagePullPolicy: IfNotPresent`` never pulls);
* no CPU request (upstream: 100m): the node has two cores, and the quick-start's training step
  requests both (its Compute's ``node.cpu: "2"``); with CoreDNS holding 100m it would never be
  scheduled. The memory request and limit are upstream's;
* the pod's sysctl ``net.ipv4.ip_unprivileged_port_start=53`` (a safe sysctl the kubelet allows):
  upstream's image gives ``/coredns`` the file capability ``cap_net_bind_service`` (its Dockerfile's
  ``setcap``), so that uid 65532 may bind port 53; the layers packed here carry no extended
  attributes, so the port is opened to unprivileged users in the pod's own network namespace instead.
  Upstream's securityContext (every capability dropped but NET_BIND_SERVICE, read-only root, no
  privilege escalation) is kept;
* the readiness probe every second (upstream: every 10 s), since ``Node.start`` waits for it: the
  kubelet delays a new node's first probes by up to a period, and the ``ready`` plugin says ready
  only once the ``kubernetes`` plugin has synced, so at 10 s the node took 10-20 s longer to start.

``forward . /etc/resolv.conf`` (the pod's ``dnsPolicy: Default``: the host's resolver) answers what is
outside ``cluster.local``, as before there was cluster DNS (pods then had the host's resolv.conf);
nothing on the node depends on it: every name the tests use is a Service's.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from devkit.cluster import KUBERNETES_SERVICE_IP
from devkit.node import dnswire, images, paths
from devkit.node.kubectl import apply_list, kubectl

# The node (devkit/node/node.py) imports this module: its kubelet's clusterDNS and clusterDomain are
# these, and Node.start calls start(). So nothing here imports the node back (no import cycle).
#: the kube-dns Service's ClusterIP, the tenth address of the Service range as kubeadm makes it; in the
#: range's low band, which the API server hands out only when asked for by address
CLUSTER_DNS_IP = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"

NAMESPACE = "kube-system"
NAME = "coredns"
SERVICE = "kube-dns"
IMAGE = "forge.local/coredns"
LABELS = {"k8s-app": "kube-dns", "app.kubernetes.io/name": "coredns"}  # the Deployment's selector
REVERSE_ZONES = "in-addr.arpa ip6.arpa"
UPSTREAM = "/etc/resolv.conf"
METRICS_PORT = 9153
NONROOT = 65532  # distroless "nonroot", upstream's USER


class CoreDNSError(RuntimeError):
    """CoreDNS could not be built or did not come up."""


class NodeView(Protocol):
    """What :func:`start` reads of a :class:`devkit.node.node.Node`."""

    @property
    def kubeconfig(self) -> str: ...

    exes: dict[str, str]
    images: dict[str, list[str]]


def _stderr_log(msg: str) -> None:
    print(f"[node] {msg}", file=sys.stderr, flush=True)


def _kubectl(node: NodeView, *args: str) -> str:
    return kubectl(node, *args, error=CoreDNSError)


def version() -> str:
    return paths.versions()["COREDNS_VERSION"]


def binary_path() -> Path:
    """Where ``build.sh coredns`` puts CoreDNS (may not exist yet)."""
    return paths.cache_dir() / "bin" / f"coredns-{version()}" / "coredns"


def ensure_binary(log: Callable[[str], None] = _stderr_log) -> Path:
    """CoreDNS, built by ``scripts/cluster/build.sh coredns`` (niced) when missing (about 4 min of
    compiling the first time)."""
    return paths.ensure_built("coredns", binary_path(), f"CoreDNS {version()}", log, error=CoreDNSError)


def image(log: Callable[[str], None] = _stderr_log) -> tuple[str, str]:
    """(archive, ref) of CoreDNS's image, as upstream's Dockerfile makes it on distroless
    ``static-debian12:nonroot`` (its ``/etc/passwd`` and ``/etc/group`` with root and nonroot, the CA
    bundle, ``/tmp``); built when not cached."""
    data = ensure_binary(log).read_bytes()
    files = {
        "/etc/passwd": b"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
        "/etc/group": b"root:x:0:\nnonroot:x:65532:\n",
        "/etc/ssl/certs/ca-certificates.crt": Path("/etc/ssl/certs/ca-certificates.crt").read_bytes(),
    }
    h = hashlib.sha256(images.PACKER_FORMAT.encode() + b"\0" + data)
    for path, content in sorted(files.items()):
        h.update(b"\0" + path.encode() + b"\0" + content)
    dest = paths.cache_dir() / "images" / f"coredns-{version()}-{h.hexdigest()[:16]}.tar"
    ref = f"{IMAGE}:{version()}"
    if not dest.is_file():
        log(f"building the CoreDNS image {ref}")
        entries = [images.Entry("/coredns", 0o755, data), images.Entry("/tmp", 0o1777),
                   images.Entry("/home/nonroot", 0o700, uid=NONROOT, gid=NONROOT)]
        entries += [images.Entry(p, 0o644, b) for p, b in files.items()]
        spec = images.ImageSpec(IMAGE, version(), entries, entrypoint=["/coredns"], user=f"{NONROOT}:{NONROOT}",
                                workdir="/", env=["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                                  "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"])
        images.pack_oci_archive(spec, dest)
    return str(dest), ref


def corefile(domain: str = CLUSTER_DOMAIN, upstream: str = UPSTREAM) -> str:
    """Upstream's Corefile (coredns.yaml.sed's ConfigMap) for ``domain``, forwarding the rest to ``upstream``."""
    return f"""\
.:53 {{
    errors
    health {{
      lameduck 5s
    }}
    ready
    kubernetes {domain} {REVERSE_ZONES} {{
      fallthrough in-addr.arpa ip6.arpa
    }}
    prometheus :{METRICS_PORT}
    forward . {upstream} {{
      max_concurrent 1000
    }}
    cache 30
    loop
    reload
    loadbalance
}}
"""


def manifests(image_ref: str, cluster_ip: str = CLUSTER_DNS_IP, domain: str = CLUSTER_DOMAIN) -> list[dict[str, Any]]:
    """Upstream's objects (see the module docstring), in the order ``deploy.sh`` applies them."""
    meta = {"namespace": NAMESPACE}
    bootstrapping = {"kubernetes.io/bootstrapping": "rbac-defaults"}
    container = {
        "name": NAME, "image": image_ref, "imagePullPolicy": "IfNotPresent",
        "resources": {"limits": {"memory": "170Mi"}, "requests": {"memory": "70Mi"}},
        "args": ["-conf", "/etc/coredns/Corefile"],
        "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": True}],
        "ports": [{"containerPort": 53, "name": "dns", "protocol": "UDP"},
                  {"containerPort": 53, "name": "dns-tcp", "protocol": "TCP"},
                  {"containerPort": METRICS_PORT, "name": "metrics", "protocol": "TCP"}],
        "securityContext": {"allowPrivilegeEscalation": False,
                            "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["all"]},
                            "readOnlyRootFilesystem": True},
        "livenessProbe": {"httpGet": {"path": "/health", "port": 8080, "scheme": "HTTP"}, "initialDelaySeconds": 60,
                          "timeoutSeconds": 5, "successThreshold": 1, "failureThreshold": 5},
        # upstream's probe, asked every second (upstream: the default 10 s): Node.start waits for it
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181, "scheme": "HTTP"}, "periodSeconds": 1},
    }
    pod_spec = {
        "priorityClassName": "system-cluster-critical", "serviceAccountName": NAME,
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchExpressions": [{"key": "k8s-app", "operator": "In", "values": ["kube-dns"]}]},
            "topologyKey": "kubernetes.io/hostname"}]}},
        # uid 65532 binds port 53 without the file capability upstream's image has (module docstring)
        "securityContext": {"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"}]},
        "containers": [container],
        "dnsPolicy": "Default",
        "volumes": [{"name": "config-volume",
                     "configMap": {"name": NAME, "items": [{"key": "Corefile", "path": "Corefile"}]}}],
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, **meta}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:coredns", "labels": bootstrapping},
         "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns", "labels": bootstrapping,
                      "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, **meta},
         "data": {"Corefile": corefile(domain)}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": NAME, **meta, "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS",
                                                      "app.kubernetes.io/name": "coredns"}},
         "spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                  "selector": {"matchLabels": dict(LABELS)},
                  "template": {"metadata": {"labels": dict(LABELS)}, "spec": pod_spec}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": SERVICE, **meta,
                      "annotations": {"prometheus.io/port": str(METRICS_PORT), "prometheus.io/scrape": "true"},
                      "labels": {"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true",
                                 "kubernetes.io/name": "CoreDNS", "app.kubernetes.io/name": "coredns"}},
         "spec": {"selector": dict(LABELS), "clusterIP": cluster_ip,
                  "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                            {"name": "metrics", "port": METRICS_PORT, "protocol": "TCP"}]}},
    ]


@dataclass(frozen=True)
class ClusterDNS:
    """The node's running cluster DNS."""

    service_ip: str  # the kube-dns Service's ClusterIP, the kubelet's clusterDNS
    domain: str  # the kubelet's clusterDomain
    version: str
    image: str
    pod: str  # the CoreDNS pod serving it
    pod_ip: str
    start_seconds: float

    @property
    def metrics_url(self) -> str:
        """CoreDNS's Prometheus metrics (its ``prometheus`` plugin), at the pod: reachable from the host."""
        return f"http://{self.pod_ip}:{METRICS_PORT}/metrics"


def _ready_pod(node: NodeView) -> tuple[str, str] | None:
    """(name, IP) of a Ready CoreDNS pod of the current Deployment generation, if there is one."""
    selector = ",".join(f"{k}={v}" for k, v in LABELS.items())
    pods = json.loads(_kubectl(node, "-n", NAMESPACE, "get", "pods", "-l", selector, "-o", "json"))["items"]
    for p in pods:
        conds = {c["type"]: c["status"] for c in (p.get("status") or {}).get("conditions") or []}
        if conds.get("Ready") == "True" and not p["metadata"].get("deletionTimestamp"):
            return p["metadata"]["name"], p["status"]["podIP"]
    return None


def _waiting_on(node: NodeView) -> str:
    """What the pods say while CoreDNS is not ready (for the timeout's message)."""
    selector = ",".join(f"{k}={v}" for k, v in LABELS.items())
    out = _kubectl(node, "-n", NAMESPACE, "get", "pods", "-l", selector, "-o", "wide")
    events = _kubectl(node, "-n", NAMESPACE, "get", "events", "--sort-by=.lastTimestamp")
    return f"{out}\n{events[-3000:]}"


def start(node: NodeView, *, log: Callable[[str], None] = _stderr_log, timeout: float = 120.0) -> ClusterDNS:
    """Apply :func:`manifests` (the image must be in the node's containerd: ``Node.start`` imports it)
    and return once a CoreDNS pod is Ready (its ``ready`` plugin answers only after the ``kubernetes``
    plugin has synced with the API server) and the ``kube-dns`` Service answers from the host for
    ``kubernetes.default.svc`` (so kube-proxy routes it too). Idempotent: on a node where it runs
    already, it returns at once."""
    t0 = time.monotonic()
    ref = next((r for _, r in node.images.values() if r.startswith(IMAGE + ":")), None)
    if ref is None:
        raise CoreDNSError(f"the node has no {IMAGE} image (Node.start imports it: devkit/node/node.py ensure_images)")
    apply_list(node, manifests(ref), error=CoreDNSError)
    fqdn = f"kubernetes.default.svc.{CLUSTER_DOMAIN}"
    deadline = t0 + timeout
    last = ""
    while True:
        ready = _ready_pod(node)
        if ready:
            try:
                answer = dnswire.resolve(CLUSTER_DNS_IP, fqdn, timeout=1.0)
                if answer.rcode == "NOERROR" and answer.addresses == (KUBERNETES_SERVICE_IP,):
                    break
                last = f"{fqdn}: {answer}"
            except (OSError, dnswire.DNSWireError) as e:
                last = f"{CLUSTER_DNS_IP}:53: {e}"
        if time.monotonic() > deadline:
            raise CoreDNSError(f"CoreDNS not answering at {CLUSTER_DNS_IP} after {timeout:.0f} s ({last or 'no Ready pod'}):\n"
                            f"{_waiting_on(node)}")
        time.sleep(0.5)
    dns = ClusterDNS(service_ip=CLUSTER_DNS_IP, domain=CLUSTER_DOMAIN, version=version(), image=ref,
                     pod=ready[0], pod_ip=ready[1], start_seconds=round(time.monotonic() - t0, 2))
    log(f"CoreDNS {dns.version} answering at {dns.service_ip} (pod {dns.pod}) after {dns.start_seconds:.1f} s")
    return dns
