"""Traffic that really splits on the node: a real Traefik v3 (its Kubernetes Gateway provider,
devkit.node.traefik) executes the HTTPRoute Forge renders for an Endpoint whose router is
`gatewayAPI`, in front of the predictors the real Seldon Core v1.17.1 operator makes.

The cluster with the Gateway API CRDs, the node, the Seldon operator and Traefik with its accepted
GatewayClass and Gateway. A SeldonDeployment shaped like Forge's (`seldon.io/no-engine`, one model
container on 9000 named `http`, predictors `stable` and `canary`) whose model is busybox's httpd,
logging each request (`-vv`). The route is Forge's (`render_serving_route` of the quick-start's
`digits` Endpoint) and every weight move goes through `reconciler.traffic.serving.apply_route`,
which returns only once Traefik reports the route Accepted with ResolvedRefs for the Gateway.
Through the gateway, 4,000 requests at each of 10 %, 50 % and 100 %: the canary's share is counted
from the predictors' own request logs (never from the client), and must lie in the binomial
99.9 % interval around the weight.

An A/B experiment sticky by a caller key (`sticky: {header: x-user-id}`, arms at 70 / 30) on its
own host name of the same Gateway: 1,000 keys (random UUIDs), three requests each, through the
gateway: every key reaches one arm only, the arm its key's bucket names (renderers/keybuckets.py),
the split of keys lies in the binomial 99.9 % interval around the shares, and the arms' own logs
hold three requests per key. Needs root. See docs/test-cluster.md, "Traefik on the node".
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devkit.cluster import Cluster
from devkit.node import seldon, traefik
from devkit.node.node import Node
from reconciler.load.loader import load_or_raise
from reconciler.targets.kubernetes.target import KubernetesTarget
from reconciler.traffic.gateway import route_admission
from reconciler.traffic.serving import apply_route, render_serving_route
from renderers.keybuckets import arm_buckets, bucket_of
from renderers.seldon import ArmServing, ServingState
from specs import Endpoint
from specs.experiment import Experiment
from specs.traffic import GatewayParentRef, TrafficRouting
from tests.cluster import nodekit
from tests.polling import wait_until
from tests.specedits import route_by_gateway

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NS = "forge-gateway-test"  # where the route Forge renders for the quick-start's Endpoint is applied (the module's own)
NAME = "digits"  # the Endpoint, so the SeldonDeployment and the route
GROUP, VERSION, PLURAL = "machinelearning.seldon.io", "v1", "seldondeployments"
REQUESTS = 4000
Z999 = 3.2905  # two-sided 99.9 % normal quantile
PATH = "/index.html"  # what the test asks; the readiness probe asks /ready.txt, so logs tell them apart
STABLE, CANARY = "aaaaaaaaaaaa", "bbbbbbbbbbbb"  # the versions the route's state names (not read by the route)


def node_images() -> list[tuple[str, str]]:
    """No images of its own; Seldon's operator and Traefik built the first time (Traefik: a long
    build, docs/test-cluster.md)."""
    seldon.ensure_binary()
    traefik.ensure_binary()
    return []


@pytest.fixture(scope="module")
def env(shared_node: nodekit.SharedNode) -> Iterator[tuple[Cluster, Node, traefik.TraefikGateway]]:
    shared_node.seldon()
    gateway = shared_node.gateway()
    with shared_node.namespace(NS):
        yield shared_node.cluster, shared_node.node, gateway


def _predictor(name: str, image: str, traffic: int) -> dict[str, Any]:
    model = {
        "name": "model", "image": image, "imagePullPolicy": "Never",
        "command": ["sh", "-c", f"mkdir -p /www && echo served-by-{name} > /www/index.html && echo ok > /www/ready.txt"
                                " && exec httpd -f -vv -p 9000 -h /www"],
        "ports": [{"name": "http", "containerPort": 9000, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/ready.txt", "port": 9000}, "periodSeconds": 1},
    }
    return {
        "name": name, "replicas": 1, "traffic": traffic,
        "annotations": {"seldon.io/no-engine": "true"},  # where Forge puts it (renderers/seldon.py)
        "componentSpecs": [{"spec": {"terminationGracePeriodSeconds": 1, "containers": [model]}}],
        "graph": {"name": "model", "type": "MODEL", "endpoint": {"type": "REST", "httpPort": 9000}, "children": []},
    }


def _routing_env(gateway: traefik.TraefikGateway, hostnames: tuple[str, ...] = ()):
    specs = load_or_raise([str(ROOT / "examples" / "quickstart")]).specs
    env = specs.environment("cluster")
    endpoint = specs.get(Endpoint, NAME)
    assert env is not None and endpoint is not None
    ref = gateway.parent_ref()
    routing = TrafficRouting(router="gatewayAPI", parent_ref=GatewayParentRef(
        name=ref["name"], namespace=ref["namespace"], section_name=ref["sectionName"]), hostnames=list(hostnames))
    return env.model_copy(update={"spec": env.spec.model_copy(update={"traffic": routing})}), endpoint


def _seldon_deployment(name: str, image: str, predictors: dict[str, int]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SeldonDeployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"protocol": "v2", "predictors": [_predictor(role, image, w) for role, w in predictors.items()]}}


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read().decode().strip()


def _send(url: str, n: int, workers: int = 8) -> list[tuple[int, str]]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda _: _get(url), range(n)))


def _served(core: client.CoreV1Api, deployment: str = NAME, roles: tuple[str, ...] = ("stable", "canary")) -> dict[str, int]:
    """Requests for PATH each predictor's own httpd logged so far (`url:/index.html` lines)."""
    counts: dict[str, int] = {}
    for pod in core.list_namespaced_pod(NS).items:
        app = (pod.metadata.labels or {}).get("seldon-app", "")
        role = app.removeprefix(f"{deployment}-")
        if role in roles and pod.status.phase == "Running":
            log = core.read_namespaced_pod_log(pod.metadata.name, NS, container="model")
            counts[role] = counts.get(role, 0) + sum(1 for line in log.splitlines() if line.endswith(f"url:{PATH}"))
    return counts


def _served_since(core: client.CoreV1Api, before: dict[str, int], n: int, deployment: str = NAME,
                  roles: tuple[str, ...] = ("stable", "canary")) -> dict[str, int] | None:
    """The counts of :func:`_served` once the logs hold ``n`` more requests than ``before`` (None until then)."""
    now = _served(core, deployment, roles)
    return now if sum(now.values()) - sum(before.values()) >= n else None


def _interval(n: int, p: float) -> tuple[float, float]:
    half = Z999 * math.sqrt(n * p * (1 - p))
    return n * p - half, n * p + half


def _move(target: KubernetesTarget, env: Any, endpoint: Endpoint, weight: int) -> tuple[dict[str, Any], float]:
    route = render_serving_route(env, NS, None, endpoint, ServingState(STABLE, CANARY, weight))
    assert route is not None
    t0 = time.monotonic()
    stored = apply_route(target, target.get, route, timeout=60)
    return stored, time.monotonic() - t0


def _settled(url: str, weight: int, batch: int = 200, timeout: float = 30.0) -> float:
    """Seconds until a batch of requests splits as ``weight`` says (its canary count in the
    batch's own 99.9 % interval): how long the gateway takes to apply a weight it has admitted."""
    t0 = time.monotonic()
    lo, hi = _interval(batch, weight / 100)

    def ok() -> bool:
        canary = sum(body == "served-by-canary" for _, body in _send(url, batch))
        return (canary == batch) if weight == 100 else (lo <= canary <= hi)

    wait_until(ok, timeout, f"a batch through the gateway to split at {weight} %")
    return time.monotonic() - t0


def _latencies(url: str, n: int = 400) -> dict[str, float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        _get(url)
        times.append((time.perf_counter() - t0) * 1000)
    q = statistics.quantiles(times, n=100)
    return {"p50_ms": round(q[49], 3), "p99_ms": round(q[98], 3)}


def test_a_canary_splits_through_the_gateway_at_10_50_and_100_percent(env, capsys) -> None:
    _, node, gateway = env
    api = node.api()
    core, apps, crd = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    image = node.images["busybox"][1]
    crd.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL,
                                        _seldon_deployment(NAME, image, {"stable": 100, "canary": 0}))
    target = KubernetesTarget("cluster", NS, kubeconfig=node.kubeconfig)
    route_env, endpoint = _routing_env(gateway)
    url = gateway.url + PATH
    numbers: dict[str, Any] = {"traefik": traefik.version(), "requests": REQUESTS}
    try:
        wait_until(lambda: sum((d.status.ready_replicas or 0) for d in apps.list_namespaced_deployment(NS).items) >= 2,
                   180, "both predictors' pods to be Ready", interval=0.5)

        # at 0 %: the route admitted, the stable predictor answers, the canary only when asked by name
        stored, admitted = _move(target, route_env, endpoint, 0)
        verdict = route_admission(stored, stored["spec"]["parentRefs"][0])
        assert verdict.admitted and traefik.CONTROLLER_NAME in verdict.detail, verdict
        numbers["admitted_s"] = {"0": round(admitted, 3)}
        wait_until(lambda: _get(url)[1] == "served-by-stable", 30, "the gateway to route to the stable predictor",
                   ignore=(OSError,))
        # the blue-green preview: waited for too — the gateway learns each Service's endpoints on its
        # own, so the canary's may come after the stable's (a 503 from Traefik until then: seen once)
        wait_until(lambda: _get(url, {"x-forge-predictor": "canary"}) == (200, "served-by-canary"), 30,
                   "the gateway to route the preview header to the canary predictor", ignore=(OSError,))
        numbers["settle_s"] = {}
        for weight in (10, 50, 100):
            _, admitted = _move(target, route_env, endpoint, weight)
            numbers["admitted_s"][str(weight)] = round(admitted, 3)
            numbers["settle_s"][str(weight)] = round(_settled(url, weight), 3)
            before = _served(core)
            answers = _send(url, REQUESTS)
            assert all(status == 200 for status, _ in answers)
            after = wait_until(functools.partial(_served_since, core, before, REQUESTS), 30,
                               "the predictors' logs to hold every request")
            served = {role: after.get(role, 0) - before.get(role, 0) for role in ("stable", "canary")}
            assert sum(served.values()) == REQUESTS, served  # each request answered by one predictor, logged once
            numbers[f"canary_{weight}"] = served["canary"]
            if weight == 100:
                assert served == {"stable": 0, "canary": REQUESTS}, served
            else:
                lo, hi = _interval(REQUESTS, weight / 100)
                assert lo <= served["canary"] <= hi, (weight, served, (lo, hi))

        # the gateway's added latency: the same predictor through Traefik and at its Service's ClusterIP
        svc = core.read_namespaced_service(f"{NAME}-canary", NS)
        numbers["latency_gateway"] = _latencies(url)
        numbers["latency_service"] = _latencies(f"http://{svc.spec.cluster_ip}:9000{PATH}")
        assert gateway.controller.running(), gateway.controller.log_tail()[-3000:]
    finally:
        with capsys.disabled():
            print("\n" + json.dumps(numbers))
        crd.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME)
        api.close()


AB_HOST = "ab.forge.test"  # the experiment's route answers this host only, beside the canary's route
AB_ARMS = {"control": 70, "treatment": 30}
KEYS = 1000


def test_an_ab_experiment_keeps_each_caller_key_in_one_arm_and_splits_keys_by_the_shares(env, capsys) -> None:
    _, node, gateway = env
    api = node.api()
    core, apps, crd = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    name = f"{NAME}-ab"
    crd.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL,
                                        _seldon_deployment(name, node.images["busybox"][1], AB_ARMS))
    target = KubernetesTarget("cluster", NS, kubeconfig=node.kubeconfig)
    route_env, endpoint = _routing_env(gateway, (AB_HOST,))
    experiment = Experiment.model_validate({"arms": [{"name": a, "share": w} for a, w in AB_ARMS.items()],
                                            "sticky": {"header": "x-user-id"}, "primary": {"kind": "success-rate"}})
    endpoint = endpoint.model_copy(update={
        "metadata": endpoint.metadata.model_copy(update={"name": name}),
        "spec": endpoint.spec.model_copy(update={"experiment": experiment})})
    state = ServingState(STABLE, arms=tuple(ArmServing(a, STABLE, "base", w) for a, w in AB_ARMS.items()))
    url = gateway.url + PATH
    owner = {b: arm for arm, lo, hi in arm_buckets(list(AB_ARMS.items())) for b in range(lo, hi)}
    rng = random.Random(29)
    keys = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(KEYS)]
    numbers: dict[str, Any] = {"keys": KEYS}

    def arm_of(key: str, **extra: str) -> str:
        status, body = _get(url, {"Host": AB_HOST, "x-user-id": key, **extra})
        assert status == 200
        return body.removeprefix("served-by-")

    try:
        wait_until(lambda: sum((d.status.ready_replicas or 0) for d in apps.list_namespaced_deployment(NS).items
                               if d.metadata.name.startswith(name)) >= 2, 180, "both arms' pods to be Ready", interval=0.5)
        route = render_serving_route(route_env, NS, None, endpoint, state)
        assert route is not None and any(r["name"].startswith("sticky-") for r in route["spec"]["rules"])
        t0 = time.monotonic()
        apply_route(target, target.get, route, timeout=60)
        # a key of each arm: Traefik learns each arm's Service endpoints on its own (a 503 until then)
        probes = {owner[bucket_of(k)]: k for k in reversed(keys)}
        assert set(probes) == set(AB_ARMS), probes
        wait_until(lambda: all(arm_of(k) == arm for arm, k in probes.items()), 30,
                   "the gateway to route a key of each arm to it", ignore=(OSError,))
        numbers["routed_s"] = round(time.monotonic() - t0, 3)

        before = _served(core, name, tuple(AB_ARMS))
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda k: (k, [arm_of(k) for _ in range(3)]), keys))
        arms_of = {k: set(a) for k, a in answers}
        split = [k for k, a in arms_of.items() if len(a) != 1]
        assert not split, f"{len(split)} keys reached more than one arm, e.g. {split[:3]}"
        wrong = [k for k, a in arms_of.items() if a != {owner[bucket_of(k)]}]
        assert not wrong, f"{len(wrong)} keys reached another arm than their bucket's, e.g. {wrong[:3]}"
        per_arm = {arm: sum(1 for a in arms_of.values() if a == {arm}) for arm in AB_ARMS}
        numbers["keys_per_arm"] = per_arm
        lo, hi = _interval(KEYS, AB_ARMS["treatment"] / 100)
        assert lo <= per_arm["treatment"] <= hi, (per_arm, (lo, hi))
        # the arms' own logs: three requests per key each arm was given (not the client's count)
        after = wait_until(functools.partial(_served_since, core, before, 3 * KEYS, name, tuple(AB_ARMS)), 30,
                           "the arms' logs to hold every request")
        served = {arm: after.get(arm, 0) - before.get(arm, 0) for arm in AB_ARMS}
        assert served == {arm: 3 * n for arm, n in per_arm.items()}, (served, per_arm)
        # naming an arm wins over the key; a caller without a usable key is split per request
        assert arm_of(keys[0], **{"x-forge-predictor": "treatment" if owner[bucket_of(keys[0])] == "control"
                                  else "control"}) != owner[bucket_of(keys[0])]
        assert _get(url, {"Host": AB_HOST, "x-user-id": "user-42"})[0] == 200
    finally:
        with capsys.disabled():
            print("\n" + json.dumps(numbers))
        crd.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
        api.close()


def test_doctor_finds_the_gateway_accepted_and_programmed_by_traefik(env, tmp_path) -> None:
    """`forgectl doctor` of the quick-start routed through the node's Gateway: the HTTPRoute CRD is
    served, the GatewayClass is accepted by Traefik's controller and the Gateway programmed with
    the listener the routes name; no Istio or Ambassador is asked for."""
    _, node, gateway = env
    specs = tmp_path / "quickstart"
    shutil.copytree(ROOT / "examples" / "quickstart", specs)
    route_by_gateway(specs, gateway.parent_ref())
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "forgectl"), "doctor", str(specs), "--env", "cluster", "-n", NS,
                           "-o", "json"], capture_output=True, text=True, env=dict(os.environ, KUBECONFIG=node.kubeconfig),
                          cwd=ROOT, check=False)
    findings = {(f["kind"], f["name"]): f for f in json.loads(proc.stdout)["findings"]}
    ref = gateway.parent_ref()
    found = findings[("Gateway", f"{ref['namespace']}/{ref['name']}")]
    assert found["status"] == "ok", found
    assert traefik.CONTROLLER_NAME in found["detail"] and f"listener {ref['sectionName']!r}" in found["detail"], found
    assert findings[("CustomResourceDefinition", "httproutes.gateway.networking.k8s.io")]["status"] == "ok"
    assert ("TrafficSplitter", "istio-or-ambassador") not in findings
