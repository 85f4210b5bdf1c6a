"""The real Prometheus Operator on the one-node cluster (devkit.node.promop).

A cluster of its own (with the CRDs) plus the node; the operator (built from the pinned module)
runs on the host as its upstream ServiceAccount and manages a Prometheus that runs as a pod on the
node. A pod like the one Forge's endpoint serves (label ``forge.dev/endpoint: digits``, a container
port named ``http`` serving ``/metrics``) is scraped through the PodMonitor Forge renders for the
quick-start's ``cluster`` Environment, and its PrometheusRule becomes a loaded rule group; a pod
reaches that Prometheus at the Environment's URL, by name (the node's CoreDNS). Needs root. See docs/test-cluster.md, "The Prometheus Operator on the node".
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devkit.cluster import Cluster
from devkit.node import promop
from devkit.node.controllers import apply_docs
from devkit.node.node import Node
from tests.cluster import nodekit
from tests.polling import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart"
# what the canary's server would expose; the rule's expressions name these labels
METRICS = ('forge_requests_total{forge_endpoint="digits",forge_namespace="forge-promop-test",'
           'forge_role="canary",code="200"} 5\n')
# Prometheus 3 refuses a scrape without a Content-Type it knows ("non-compliant scrape target sending
# blank Content-Type and no fallback_scrape_protocol"), and busybox httpd sends none for a file
# without a suffix. So /metrics is a directory: httpd redirects /metrics to /metrics/ (Prometheus
# follows redirects), finds no index.html there and runs /cgi-bin/index.cgi, which sends the file
# as the text format.
CGI = '#!/bin/sh\nprintf "Content-Type: text/plain; version=0.0.4\\r\\n\\r\\n"\nexec cat /www/forge.prom\n'


NS = "forge-promop-test"  # the module's own namespace; the quick-start's `cluster` Environment renders into it


def _rendered(env: str = "cluster") -> list[dict[str, Any]]:
    """The quick-start as Forge renders it for ``env``, moved into :data:`NS` (as a platform team
    would point the Environment at another namespace)."""
    from reconciler.load.environments import load_environment
    from renderers import RenderContext, render

    result, environment = load_environment([str(QUICKSTART)], None, env)
    assert environment.spec.kubernetes is not None
    kube = environment.spec.kubernetes.model_copy(update={"namespace": NS})
    environment = environment.model_copy(update={"spec": environment.spec.model_copy(update={"kubernetes": kube})})
    return render(result.specs, RenderContext(environment)).manifests


class _Stack:
    def __init__(self, cluster: Cluster, node: Node, operator: promop.HostController, url: str) -> None:
        self.cluster, self.node, self.operator, self.url = cluster, node, operator, url


def node_images() -> list[tuple[str, str]]:
    """The operator's reloader and Prometheus (built the first time, with the operator)."""
    return promop.images()


@pytest.fixture(scope="module")
def stack(shared_node: nodekit.SharedNode) -> Iterator[_Stack]:
    operator, url = shared_node.prometheus()
    with shared_node.namespace(NS, create=False):  # the test applies it, as rendered
        yield _Stack(shared_node.cluster, shared_node.node, operator, url)


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.loads(r.read())
    assert body.get("status") == "success", body
    return body["data"]


def test_the_rendered_podmonitor_and_rule_reach_prometheus(stack: _Stack) -> None:
    node, url = stack.node, stack.url
    rendered = _rendered()
    ns = next(m for m in rendered if m["kind"] == "Namespace")
    monitors = [m for m in rendered if m["kind"] in ("PodMonitor", "PrometheusRule")]
    assert {m["kind"] for m in monitors} == {"PodMonitor", "PrometheusRule"}, [m["kind"] for m in rendered]
    namespace = ns["metadata"]["name"]
    apply_docs(node, [ns])
    core = client.CoreV1Api(node.api())
    labels = {"forge.dev/endpoint": "digits", "app": "digits-canary"}
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="digits-canary", labels=labels),
        spec=client.V1PodSpec(termination_grace_period_seconds=1, containers=[client.V1Container(
            name="server", image=node.images["busybox"][1], image_pull_policy="Never",
            env=[client.V1EnvVar(name="METRICS", value=METRICS), client.V1EnvVar(name="CGI", value=CGI)],
            command=["sh", "-c", "mkdir -p /www/metrics /www/cgi-bin && printf '%s' \"$METRICS\" > /www/forge.prom "
                                 "&& printf '%s' \"$CGI\" > /www/cgi-bin/index.cgi && chmod 755 /www/cgi-bin/index.cgi "
                                 "&& exec httpd -f -p 8080 -h /www"],
            ports=[client.V1ContainerPort(container_port=8080, name="http")],
            readiness_probe=client.V1Probe(http_get=client.V1HTTPGetAction(path="/metrics/", port=8080),
                                           period_seconds=1))]))
    core.create_namespaced_pod(namespace, pod)
    # exactly as rendered (their namespace is the Environment's, where the pod runs)
    apply_docs(node, monitors)

    def scraped() -> list[dict[str, Any]]:
        active = _get(url + "/api/v1/targets?state=active")["activeTargets"]
        return [t for t in active if t["labels"].get("namespace") == namespace and t["health"] == "up"]

    targets = wait_until(scraped, 180, "the digits pod's target to be up", interval=1)
    t = targets[0]
    assert t["labels"]["pod"] == "digits-canary", t
    # the operator's scrape job per PodMonitor endpoint; the job label it relabels to <namespace>/<name>
    assert t["scrapePool"] == f"podMonitor/{namespace}/digits/0", t
    assert t["labels"]["job"] == f"{namespace}/digits", t
    assert t["discoveredLabels"]["__meta_kubernetes_pod_label_forge_dev_endpoint"] == "digits", t
    assert t["scrapeUrl"].endswith(":8080/metrics"), t

    q = urllib.parse.quote(f'forge_requests_total{{forge_endpoint="digits",forge_role="canary",namespace="{NS}"}}')
    result = wait_until(lambda: _get(f"{url}/api/v1/query?query={q}")["result"], 60, "the scraped series", interval=1)
    assert result[0]["value"][1] == "5", result
    assert result[0]["metric"]["pod"] == "digits-canary" and result[0]["metric"]["code"] == "200", result

    def group() -> dict[str, Any] | None:
        groups = _get(url + "/api/v1/rules")["groups"]
        return next((g for g in groups if g["name"] == "forge-digits"), None)

    g = wait_until(group, 180, "the rule group forge-digits to be loaded", interval=1)
    assert {r["name"] for r in g["rules"]} == {"ForgeDigitsSuccessRateBelow", "ForgeDigitsLatencyP99Above"}, g
    assert all(r["health"] in ("ok", "unknown") for r in g["rules"]), g
    assert g["file"].startswith("/etc/prometheus/rules/"), g


def test_the_governing_service_is_what_the_cluster_environment_names(stack: _Stack) -> None:
    """The cluster Environment names http://prometheus-operated.monitoring.svc:9090; a pod reaches
    Prometheus by that URL (the node's CoreDNS resolves it; the host cannot)."""
    from reconciler.load.environments import load_environment

    _, environment = load_environment([str(QUICKSTART)], None, "cluster")
    assert environment.spec.prometheus is not None
    env_url = environment.spec.prometheus.url
    where = urllib.parse.urlsplit(env_url)
    assert (where.hostname, where.port) == ("prometheus-operated.monitoring.svc", 9090), env_url
    core = client.CoreV1Api(stack.node.api())
    svc = core.read_namespaced_service("prometheus-operated", "monitoring")
    assert [p.port for p in svc.spec.ports] == [9090], svc.spec.ports
    assert stack.operator.running()
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="by-name"),
        spec=client.V1PodSpec(restart_policy="Never", containers=[client.V1Container(
            name="main", image=stack.node.images["busybox"][1], image_pull_policy="Never",
            # busybox's wget (Debian's static build) dies of SIGSEGV once a name resolves; nc does not
            command=["sh", "-c", f"printf 'GET /-/ready HTTP/1.0\\r\\nHost: {where.netloc}\\r\\n\\r\\n' | "
                                 f"nc -w 10 {where.hostname} {where.port} 2>&1; echo rc=$?"])]))
    core.create_namespaced_pod("default", pod)
    try:
        phase = wait_until(lambda: (p := core.read_namespaced_pod("by-name", "default").status.phase)
                           in ("Succeeded", "Failed") and p, 90, "the pod asking Prometheus by name to finish")
        log = core.read_namespaced_pod_log("by-name", "default")
        assert phase == "Succeeded" and "rc=0" in log, (phase, log)
        assert log.startswith(("HTTP/1.0 200 ", "HTTP/1.1 200 ")) and "Prometheus Server is Ready." in log, log
    finally:
        core.delete_namespaced_pod("by-name", "default", grace_period_seconds=1)
