"""Cluster DNS on the node (devkit/node/coredns.py): CoreDNS, built from the module proxy, runs as a
cluster runs it (the Deployment ``coredns`` behind the Service ``kube-dns`` at 10.0.0.10 in
``kube-system``), and every pod's resolver points at it.

Checked, with the real CoreDNS answering (its own metrics count the answers): the objects are
upstream's (coredns.yaml.sed) and the pod runs unprivileged; from the host, ``kubernetes.default.svc``
is 10.0.0.1 and an unknown name in the cluster domain is NXDOMAIN; a pod's resolv.conf names 10.0.0.10
with the namespace's search path, and in the pod ``kubernetes.default.svc.cluster.local`` is 10.0.0.1, a
Service of its namespace resolves by its short name and by ``<svc>.<ns>.svc`` (the form the quick-start's
``prometheus-operated.monitoring.svc`` has) to its ClusterIP, a headless Service to its Ready pod's IP,
and a name that does not exist is NXDOMAIN. See docs/test-cluster.md, "CoreDNS on the node".
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devkit.node import coredns, dnswire
from devkit.node.node import CLUSTER_DNS_IP, KUBERNETES_SERVICE_IP, Node
from tests.cluster import nodekit
from tests.polling import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NS = "forge-dns-test"


def node_images() -> list[tuple[str, str]]:
    """None beyond the node's own: busybox, and CoreDNS's image, which every node imports and runs."""
    return []


@pytest.fixture(scope="module")
def dns(shared_node: nodekit.SharedNode) -> coredns.ClusterDNS:
    return shared_node.dns()


@pytest.fixture(scope="module")
def core(shared_node: nodekit.SharedNode) -> Iterator[client.CoreV1Api]:
    api = shared_node.node.api()
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()


@pytest.fixture(scope="module")
def ns(shared_node: nodekit.SharedNode) -> Iterator[str]:
    with shared_node.namespace(NS) as name:
        yield name


def _responses(dns: coredns.ClusterDNS) -> dict[str, float]:
    """CoreDNS's ``coredns_dns_responses_total``, summed by response code."""
    with urllib.request.urlopen(dns.metrics_url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for m in re.finditer(r'^coredns_dns_responses_total\{[^}]*rcode="([A-Z]+)"[^}]*\} (\S+)$', text, re.M):
        out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


def _counted(dns: coredns.ClusterDNS, before: dict[str, float], **more: int) -> None:
    """Wait until CoreDNS's response counters have grown by at least ``more`` (by response code) since
    ``before``: its metrics plugin counts a response after writing it, so a client can be faster."""
    def grown() -> dict[str, float] | None:
        now = _responses(dns)
        return now if all(now.get(k, 0) >= before.get(k, 0) + n for k, n in more.items()) else None

    wait_until(grown, 10, f"CoreDNS to count {more} more responses than {before}", interval=0.2)


def _wait(what: str, fn: Callable[[], Any], timeout: float = 90.0) -> Any:
    return wait_until(fn, timeout, what, interval=0.5)


def test_coredns_runs_as_the_cluster_runs_it(dns: coredns.ClusterDNS, core: client.CoreV1Api,
                                             shared_node: nodekit.SharedNode) -> None:
    assert dns.service_ip == CLUSTER_DNS_IP == "10.0.0.10" and dns.domain == "cluster.local"
    svc = core.read_namespaced_service(coredns.SERVICE, coredns.NAMESPACE)
    assert svc.spec.cluster_ip == CLUSTER_DNS_IP
    assert {(p.name, p.port, p.protocol) for p in svc.spec.ports} == {
        ("dns", 53, "UDP"), ("dns-tcp", 53, "TCP"), ("metrics", 9153, "TCP")}
    apps = client.AppsV1Api(core.api_client)
    dep = apps.read_namespaced_deployment(coredns.NAME, coredns.NAMESPACE)
    assert (dep.status.available_replicas or 0) >= 1
    pod = core.read_namespaced_pod(dns.pod, coredns.NAMESPACE)
    (c,) = pod.spec.containers
    assert c.image == f"forge.local/coredns:{shared_node.node.versions['COREDNS_VERSION']}" == dns.image
    assert pod.spec.service_account_name == "coredns" and pod.spec.dns_policy == "Default"
    assert c.security_context.capabilities.drop == ["all"] and c.security_context.read_only_root_filesystem
    # the image's USER: the server runs unprivileged (uid 65532), port 53 bound all the same
    status = pod.status.container_statuses[0]
    assert status.ready and status.restart_count == 0, status
    cid = status.container_id.split("//", 1)[1]
    tasks = {f[0]: f[1] for ln in shared_node.node.ctr("tasks", "ls").stdout.splitlines()[1:] if len(f := ln.split()) >= 2}
    uids = next(ln for ln in Path(f"/proc/{tasks[cid]}/status").read_text().splitlines() if ln.startswith("Uid:"))
    assert uids.split()[1:] == [str(coredns.NONROOT)] * 4, uids
    rbac = client.RbacAuthorizationV1Api(core.api_client)
    rules = {(tuple(r.api_groups), tuple(sorted(r.resources)), tuple(sorted(r.verbs)))
             for r in rbac.read_cluster_role("system:coredns").rules}
    assert rules == {(("",), ("endpoints", "namespaces", "pods", "services"), ("list", "watch")),
                     (("discovery.k8s.io",), ("endpointslices",), ("list", "watch"))}
    # the version that answers is the pinned one (its prometheus plugin's build info)
    with urllib.request.urlopen(dns.metrics_url, timeout=5) as r:
        metrics = r.read().decode()
    assert f'version="{dns.version.lstrip("v")}"' in next(ln for ln in metrics.splitlines()
                                                           if ln.startswith("coredns_build_info{"))


def test_the_host_reaches_it_at_the_service_ip(dns: coredns.ClusterDNS) -> None:
    """From the host, through kube-proxy's rules for the kube-dns Service."""
    before = _responses(dns)
    got = dnswire.resolve(CLUSTER_DNS_IP, "kubernetes.default.svc.cluster.local")
    assert got == dnswire.Answer("NOERROR", (KUBERNETES_SERVICE_IP,), authoritative=True)
    missing = dnswire.resolve(CLUSTER_DNS_IP, "no-such-service.default.svc.cluster.local")
    assert missing.rcode == "NXDOMAIN" and not missing.addresses and missing.authoritative
    _counted(dns, before, NOERROR=1, NXDOMAIN=1)


def _sections(log: str) -> dict[str, str]:
    """The client pod's output, by its ``== <what>`` headings."""
    out: dict[str, str] = {}
    for block in log.split("== ")[1:]:
        head, _, body = block.partition("\n")
        out[head.strip()] = body
    return out


def test_a_pod_resolves_services_by_name(dns: coredns.ClusterDNS, core: client.CoreV1Api, ns: str,
                                          shared_node: nodekit.SharedNode) -> None:
    node: Node = shared_node.node
    busybox = node.images["busybox"][1]
    # a ClusterIP Service (no endpoints needed for its name), and a headless one in front of a Ready
    # pod, as the Prometheus Operator's prometheus-operated is
    core.create_namespaced_service(ns, client.V1Service(
        metadata=client.V1ObjectMeta(name="echo"),
        spec=client.V1ServiceSpec(selector={"app": "echo"}, ports=[client.V1ServicePort(port=80, target_port=8080)])))
    core.create_namespaced_service(ns, client.V1Service(
        metadata=client.V1ObjectMeta(name="web-headless"),
        spec=client.V1ServiceSpec(cluster_ip="None", selector={"app": "web"},
                                  ports=[client.V1ServicePort(port=8080)])))
    core.create_namespaced_pod(ns, client.V1Pod(
        metadata=client.V1ObjectMeta(name="web", labels={"app": "web"}),
        spec=client.V1PodSpec(termination_grace_period_seconds=1, containers=[client.V1Container(
            name="httpd", image=busybox, image_pull_policy="Never",
            command=["sh", "-c", "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www"],
            readiness_probe=client.V1Probe(http_get=client.V1HTTPGetAction(path="/index.html", port=8080),
                                           period_seconds=1))])))
    web = _wait("the web pod to be Ready", lambda: (p := core.read_namespaced_pod("web", ns)).status.conditions and any(
        c.type == "Ready" and c.status == "True" for c in p.status.conditions) and p)
    echo_ip = core.read_namespaced_service("echo", ns).spec.cluster_ip
    before = _responses(dns)
    # busybox's nslookup prints the server and the rcode (and applies the search path to dotless names
    # only); ping resolves through the C library's resolver (search path and ndots, as applications
    # do) and prints the address before it pings (a ClusterIP does not answer ICMP: its exit is ignored)
    script = "\n".join([
        "echo '== resolv.conf'; cat /etc/resolv.conf",
        *(f"echo '== nslookup {n}'; nslookup -type=a {n}; echo rc=$?"
          for n in ("kubernetes.default.svc.cluster.local", "echo", f"does-not-exist.{ns}.svc.cluster.local")),
        *(f"echo '== ping {n}'; ping -c 1 -W 1 {n} 2>&1 | head -1"
          for n in (f"echo.{ns}.svc", "echo", f"web-headless.{ns}.svc", "kubernetes.default")),
        "exit 0",
    ])
    core.create_namespaced_pod(ns, client.V1Pod(
        metadata=client.V1ObjectMeta(name="client"),
        spec=client.V1PodSpec(restart_policy="Never", containers=[client.V1Container(
            name="main", image=busybox, image_pull_policy="Never", command=["sh", "-c", script])])))
    phase = _wait("the client pod to finish", lambda: (p := core.read_namespaced_pod("client", ns).status.phase)
                  in ("Succeeded", "Failed") and p, timeout=120)
    log = core.read_namespaced_pod_log("client", ns)
    assert phase == "Succeeded", log
    out = _sections(log)

    # the kubelet's clusterDNS and clusterDomain, with the pod's namespace first in the search path
    resolv = out["resolv.conf"]
    assert f"nameserver {CLUSTER_DNS_IP}" in resolv.splitlines(), resolv
    assert f"search {ns}.svc.cluster.local svc.cluster.local cluster.local" in resolv.splitlines(), resolv

    kube = out["nslookup kubernetes.default.svc.cluster.local"]
    assert re.search(rf"^Server:\s+{re.escape(CLUSTER_DNS_IP)}$", kube, re.M), kube
    assert re.search(r"^Name:\s+kubernetes\.default\.svc\.cluster\.local\nAddress: 10\.0\.0\.1$", kube, re.M), kube
    assert "rc=0" in kube, kube

    # busybox asks for every name of the search path at once and prints each answer (the other two are
    # NXDOMAIN, so it exits 1): the namespace's own is the Service
    short = out["nslookup echo"]
    assert re.search(rf"^Name:\s+echo\.{ns}\.svc\.cluster\.local\nAddress: {re.escape(echo_ip)}$", short, re.M), short
    assert "server can't find echo.svc.cluster.local: NXDOMAIN" in short, short

    missing = out[f"nslookup does-not-exist.{ns}.svc.cluster.local"]
    assert f"server can't find does-not-exist.{ns}.svc.cluster.local: NXDOMAIN" in missing, missing
    assert "rc=1" in missing, missing

    for name, want in ((f"echo.{ns}.svc", echo_ip), ("echo", echo_ip), (f"web-headless.{ns}.svc", web.status.pod_ip),
                       ("kubernetes.default", KUBERNETES_SERVICE_IP)):
        said = out[f"ping {name}"]
        assert said.startswith(f"PING {name} ({want})"), (name, said)

    # the answers were CoreDNS's: its counters moved by at least what the pod asked
    _counted(dns, before, NOERROR=5, NXDOMAIN=1)
