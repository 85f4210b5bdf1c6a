"""The rollout queries and alerts against series scraped the way the Prometheus Operator scrapes
them (issue 11, defect 3).

Nothing here re-states what the operator does; the upstream code decides:

* ``judges/promop`` (the operator's module at the version scripts/cluster/versions.env pins) turns
  the PodMonitors and PrometheusRules Forge renders for the ``cluster`` environments into the
  Prometheus configuration and rule files, with the operator's own ``ConfigGenerator`` and
  ``PrometheusRuleSelector``;
* the pods are the ones the rendered SeldonDeployments' predictors describe (their labels,
  containers and ports), running and ready at 127.0.0.1, and their ``__meta_kubernetes_pod_*``
  labels come from Prometheus's own Kubernetes pod discovery (``promop pod-targets``);
* the operator's generated scrape jobs then run, unchanged apart from ``kubernetes_sd_configs``
  becoming ``static_configs`` with those labels, in Debian's real Prometheus, scraping the serving
  runtime's own :class:`~runtimes.serving.telemetry.Telemetry` (``tests/monitoring/exporter.py``);
* every built-in rollout query (as the rollout controller renders it) and every rendered alert is
  evaluated through Prometheus's HTTP API and must return the values the traffic implies.

Two Prometheus set-ups: the operator's defaults, and a hardened multi-tenant one
(``overrideHonorLabels: true``, ``enforcedNamespaceLabel: namespace``, which also rewrites the rules).
Finally the local target's own Prometheus (``reconciler/targets/local/monitoring.py``) scrapes the
same servers, and its series must carry the same labels as the operator's.

Before the fix (server labels ``endpoint``/``namespace``/``role``/…, local ``honor_labels: true``),
the operator set-up renamed them to ``exported_endpoint``/``exported_namespace`` and every query and
alert here returned nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.prometheus import ensure_prometheus
from reconciler.load.loader import load_or_raise
from reconciler.metrics.analysis import render_query
from reconciler.targets.local import processes
from reconciler.targets.local.monitoring import LocalPrometheus
from reconciler.targets.local.serving import LocalServing, Predictor
from reconciler.targets.local.state import StateDB
from renderers import RenderContext, ServingState, render
from renderers.stepargs import decode_step_config
from specs import Endpoint, RolloutPolicy, SpecSet
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ["quickstart", "llm-finetune", "edge-vision"]
CANARY_VERSION = "cccccccccccc"
#: Target labels the operator's PodMonitor jobs give every series (promcfg.go generatePodMonitorConfig).
OPERATOR_TARGET_LABELS = {"namespace", "pod", "container", "endpoint", "job", "instance"}
#: The serving runtime's own labels (runtimes/serving/telemetry.py): none of them is a target label.
SERVER_LABELS = {"forge_endpoint", "forge_namespace", "forge_version", "forge_variant", "forge_role"}
#: Traffic of the fake servers: stable answers everything in 4 ms; the canary fails every second
#: request and takes 3 s, so every alert of the examples fires (latency-p99 max 2.5 included).
STABLE = {"errorEvery": 0, "seconds": 0.004}
CANARY = {"errorEvery": 2, "seconds": 3.0}



def live(test: Callable[..., None]) -> Callable[..., None]:
    """Marks of the tests that run Prometheus and the runtime environment's exporter."""
    return pytest.mark.prometheus(pytest.mark.runtime(pytest.mark.slow(test)))


# -- rendering (pure) -------------------------------------------------------------------------------

@dataclass
class Example:
    name: str
    specs: SpecSet
    manifests: list[dict[str, Any]]

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.manifests if m["kind"] == kind]


def _rendered(example: str) -> Example:
    """The example's `cluster` objects, with a canary in flight on every endpoint."""
    specs = load_or_raise([str(ROOT / "examples" / example)]).specs
    env = specs.environment("cluster")
    assert env is not None
    first = render(specs, RenderContext(env, revision="0123456789ab")).manifests
    serving = {}
    for sd in (m for m in first if m["kind"] == "SeldonDeployment"):
        stable = sd["spec"]["predictors"][0]["labels"]["forge.dev/model-version"]
        serving[sd["metadata"]["labels"]["forge.dev/endpoint"]] = ServingState(stable, CANARY_VERSION, 10)
    manifests = render(specs, RenderContext(env, revision="0123456789ab", serving=serving)).manifests
    return Example(example, specs, manifests)


@dataclass
class Server:
    """One predictor's pod, served by the exporter on ``port``."""

    example: str
    namespace: str
    sdep: str
    predictor: dict[str, Any]
    config: dict[str, Any]
    port: int = 0

    @property
    def role(self) -> str:
        return self.config["role"]

    @property
    def pod_name(self) -> str:
        # Seldon's Deployment <sdep>-<predictor>-0-<container>, plus a ReplicaSet/pod suffix
        return f"{self.sdep}-{self.predictor['name']}-0-model-5d9c7b-x2k4q"

    def pod(self) -> dict[str, Any]:
        """The pod Kubernetes runs for this predictor: the componentSpec's labels and spec (with the
        `http` port where the exporter listens), running and ready at 127.0.0.1."""
        component = self.predictor["componentSpecs"][0]
        spec = json.loads(json.dumps(component["spec"]))
        for container in spec["containers"]:
            for port in container.get("ports") or []:
                if port.get("name") == "http":
                    port["containerPort"] = self.port
        labels = {**(self.predictor.get("labels") or {}), **(component.get("metadata", {}).get("labels") or {})}
        ready = [{"type": t, "status": "True"} for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.pod_name, "namespace": self.namespace, "labels": labels},
            "spec": spec,
            "status": {"phase": "Running", "podIP": "127.0.0.1", "hostIP": "127.0.0.1", "conditions": ready,
                       "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0, "image": c["image"],
                                              "imageID": "", "containerID": f"containerd://{c['name']}"}
                                             for c in spec["containers"]]},
        }


def _servers(examples: list[Example]) -> list[Server]:
    out = []
    for ex in examples:
        for sd in ex.kind("SeldonDeployment"):
            for predictor in sd["spec"]["predictors"]:
                config = decode_step_config(predictor["componentSpecs"][0]["spec"]["containers"][0])
                out.append(Server(ex.name, sd["metadata"]["namespace"], sd["metadata"]["name"], predictor, config))
    return out


def test_queries_select_only_labels_the_server_writes() -> None:
    """The design in one line: a rollout query never selects a label a scrape may add or rename."""
    for ex in map(_rendered, EXAMPLES):
        for policy in ex.specs.of(RolloutPolicy):
            for metric in policy.spec.metrics:
                query = metric.render(endpoint="e", namespace="n", version="v", role="canary")
                selected = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"", query))
                assert selected, query
                assert selected <= SERVER_LABELS | {"code"}, (policy.name, metric.name, query)
                assert not selected & OPERATOR_TARGET_LABELS, query


# -- the live set-up ----------------------------------------------------------------------------------

def _wait(what: str, fn: Callable[[], Any], timeout: float = 90.0) -> Any:
    return wait_until(fn, timeout, what, interval=0.5)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        doc = json.loads(resp.read())
    assert doc.get("status") == "success", doc
    return doc["data"]


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    return _get(url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))["result"]


@pytest.fixture(scope="session")
def promop() -> str:
    """The promop binary (built once per version into the Forge cache)."""
    proc = subprocess.run([str(ROOT / "judges" / "promop" / "build.sh")], capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode != 0:
        pytest.fail(f"judges/promop/build.sh failed:\n{proc.stderr[-4000:]}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def prometheus_exe() -> tuple[str, str]:
    """Debian's prometheus and its version (the operator generates the config for that version)."""
    exe = ensure_prometheus(lambda msg: None)
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"version (\d+\.\d+\.\d+)", out)
    assert match, out
    return exe, match.group(1)


@dataclass
class Scene:
    examples: list[Example]
    servers: list[Server]
    exporter: processes.ProcessRecord
    static: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # pod name -> static_configs


@pytest.fixture(scope="module")
def scene(promop: str, runtime_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    examples = [_rendered(e) for e in EXAMPLES]
    servers = _servers(examples)
    assert {s.role for s in servers} == {"stable", "canary"} and len(servers) == 2 * len(EXAMPLES)
    work = tmp_path_factory.mktemp("exporter")
    (work / "servers.json").write_text(json.dumps(
        [{"config": s.config, **(CANARY if s.role == "canary" else STABLE)} for s in servers]))
    exporter = processes.spawn("exporter", "exporter", [runtime_python, "-m", "tests.monitoring.exporter",
                                                          str(work / "servers.json"), str(work / "ports.json")],
                               env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, cwd=ROOT, log=work / "exporter.log")
    try:
        ports = _wait("the exporter's ports", lambda: (work / "ports.json").exists()
                      and json.loads((work / "ports.json").read_text()), timeout=60)
        for server, port in zip(servers, ports):
            server.port = port
        scene = Scene(examples, servers, exporter)
        for server in servers:
            proc = subprocess.run([promop, "pod-targets"], input=json.dumps(server.pod()), capture_output=True,
                                  text=True, timeout=60, check=False)
            assert proc.returncode == 0, proc.stderr
            scene.static[server.pod_name] = json.loads(proc.stdout)
        yield scene
    finally:
        processes.stop(exporter)


def _operator_prometheus_config(scene: Scene, promop: str, version: str, flags: list[str], rules_dir: Path) -> dict[str, Any]:
    objects = [m for ex in scene.examples for m in ex.manifests if m["kind"] in ("PodMonitor", "PrometheusRule")]
    proc = subprocess.run([promop, "config", "-prometheus-version", version, *flags], input=json.dumps(objects),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    generated = json.loads(proc.stdout)
    rules_dir.mkdir(parents=True, exist_ok=True)
    for name, content in generated["ruleFiles"].items():
        (rules_dir / name).write_text(content)
    # what prometheus-config-reloader does before Prometheus reads it: $(VAR) from the StatefulSet's env
    text = generated["config"].replace("$(SHARD)", "0").replace("$(POD_NAME)", "prometheus-k8s-0")
    assert "$(" not in text, text
    config = yaml.safe_load(text)
    # the rule ConfigMap is mounted by the kubelet; here it is a directory
    assert config["rule_files"] == ["/etc/prometheus/rules/prometheus-k8s-rulefiles-0/*.yaml"]
    config["rule_files"] = [str(rules_dir / "*.yaml")]
    # Forge's PodMonitors leave honorLabels alone: the operator's default, false (and forced false
    # by overrideHonorLabels); enforcedNamespaceLabel adds its namespace matcher to every rule
    assert [job["honor_labels"] for job in config["scrape_configs"]] == [False] * len(config["scrape_configs"])
    if "-enforced-namespace-label" in flags:
        assert all('namespace="' in content for content in generated["ruleFiles"].values()), generated["ruleFiles"]
    pods = [(s, scene.static[s.pod_name]) for s in scene.servers]
    for job in config["scrape_configs"]:
        (sd,) = job.pop("kubernetes_sd_configs")
        assert sd["role"] == "pod", sd
        namespaces = set(sd.get("namespaces", {}).get("names") or [])
        # Kubernetes SD lists the pods of those namespaces; the job's relabel rules do the rest
        job["static_configs"] = [group for s, groups in pods if not namespaces or s.namespace in namespaces
                                 for group in groups]
    return config


VARIANTS = {
    "operator-defaults": [],
    "multi-tenant": ["-override-honor-labels", "-enforced-namespace-label", "namespace"],
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def operator_prometheus(request: pytest.FixtureRequest, scene: Scene, promop: str, prometheus_exe: tuple[str, str],
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe, version = prometheus_exe
    work = tmp_path_factory.mktemp(f"prometheus-{request.param}")
    config = _operator_prometheus_config(scene, promop, version, VARIANTS[request.param], work / "rules")
    (work / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    port = processes.free_port()
    server = processes.spawn("prometheus", "prometheus",
                             [exe, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
                              f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                             log=work / "prometheus.log", die_with_parent=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            if not processes.alive(server):
                raise AssertionError("prometheus exited:\n" + (work / "prometheus.log").read_text()[-3000:])
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=1) as resp:
                    return resp.status == 200
            except OSError:
                return False
        _wait("prometheus ready", ready, timeout=60)
        yield url
    finally:
        processes.stop(server)


# -- the checks ---------------------------------------------------------------------------------------

@live
def test_targets_carry_exactly_the_operators_labels(scene: Scene, operator_prometheus: str) -> None:
    """One target per predictor pod (its `http` port; the init container's port-less target is
    dropped), up, with the target labels the operator sets and nothing else."""
    expected = {}
    for s in scene.servers:
        monitor = next(m for ex in scene.examples for m in ex.kind("PodMonitor")
                       if m["metadata"]["namespace"] == s.namespace
                       and m["spec"]["selector"]["matchLabels"].items() <= s.pod()["metadata"]["labels"].items())
        expected[f"127.0.0.1:{s.port}"] = {
            "namespace": s.namespace, "pod": s.pod_name, "container": "model", "endpoint": "http",
            "job": f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}", "instance": f"127.0.0.1:{s.port}",
        }

    def active() -> list[dict[str, Any]]:
        targets = _get(operator_prometheus + "/api/v1/targets?state=active")["activeTargets"]
        return targets if len(targets) == len(expected) and all(t["health"] == "up" for t in targets) else []
    targets = _wait(f"{len(expected)} targets up", active)
    assert {t["labels"]["instance"]: t["labels"] for t in targets} == expected


@live
def test_series_keep_the_servers_labels(scene: Scene, operator_prometheus: str) -> None:
    """No label of the server is renamed to ``exported_*``; every series has the server's labels
    and the operator's target labels."""
    rows = _wait("forge_requests_total of every server",
                 lambda: (r := _query(operator_prometheus, "forge_requests_total")) and len(
                     {x["metric"]["instance"] for x in r}) == len(scene.servers) and r)
    for row in rows:
        labels = set(row["metric"]) - {"__name__"}
        assert labels == SERVER_LABELS | OPERATOR_TARGET_LABELS | {"code"}, row["metric"]
        assert row["metric"]["namespace"] == row["metric"]["forge_namespace"]


def _policies(ex: Example) -> list[tuple[Endpoint, RolloutPolicy]]:
    env = ex.specs.environment("cluster")
    out = []
    for endpoint in ex.specs.of(Endpoint):
        policy = ex.specs.policy_of(endpoint, env)
        assert policy is not None
        out.append((endpoint, policy))
    return out


@live
def test_builtin_rollout_queries_measure_the_traffic(scene: Scene, operator_prometheus: str) -> None:
    """Each built-in template, rendered as the rollout controller renders it, for both roles."""
    expected = {  # (template, role) -> value range the traffic implies
        ("success-rate", "stable"): (1.0, 1.0), ("success-rate", "canary"): (0.45, 0.55),
        ("error-rate", "stable"): (0.0, 0.0), ("error-rate", "canary"): (0.45, 0.55),
        ("latency-p99", "stable"): (0.0025, 0.005), ("latency-p99", "canary"): (2.5, 5.0),
    }
    checked = set()
    for ex in scene.examples:
        for endpoint, policy in _policies(ex):
            namespace = next(s.namespace for s in scene.servers if s.sdep == endpoint.name)
            for metric in policy.spec.metrics:
                assert metric.template, f"{policy.name}/{metric.name}: the examples use built-in templates"
                for s in (s for s in scene.servers if s.sdep == endpoint.name):
                    query = render_query(metric, endpoint=endpoint.name, namespace=namespace,
                                         version=s.config["version"], role=s.role)
                    rows = _wait(f"data for {query}", lambda q=query: _query(operator_prometheus, q))
                    assert len(rows) == 1, rows
                    low, high = expected[(metric.template, s.role)]
                    value = float(rows[0]["value"][1])
                    assert low <= value <= high, (ex.name, metric.name, s.role, query, value)
                    checked.add(metric.template)
    assert checked == {"success-rate", "error-rate", "latency-p99"}


@live
def test_every_rendered_alert_fires_on_the_failing_canary(scene: Scene, operator_prometheus: str) -> None:
    """Every rendered alert, as the operator wrote it into the rule files Prometheus loaded (the
    multi-tenant set-up adds its namespace matchers), evaluates to data: the canary breaks them all."""
    groups = _wait("the rule groups loaded", lambda: _get(operator_prometheus + "/api/v1/rules")["groups"])
    rules = [r for g in groups for r in g["rules"]]
    rendered = [r for ex in scene.examples for pr in ex.kind("PrometheusRule")
                for g in pr["spec"]["groups"] for r in g["rules"]]
    assert rendered and sorted(r["name"] for r in rules) == sorted(r["alert"] for r in rendered)
    for rule in rules:
        rows = _wait(f"{rule['name']} to evaluate to data: {rule['query']}", lambda q=rule["query"]: _query(operator_prometheus, q))
        assert rows, rule


@live
def test_local_prometheus_series_have_the_operators_labels(scene: Scene, operator_prometheus: str, tmp_path: Path) -> None:
    """The local target's Prometheus, scraping the same servers as the local target would list
    them, stores series with the same labels and values as the operator's (the pod's name aside:
    locally there is no pod)."""
    db = StateDB(tmp_path / "state.db")
    serving = LocalServing(db, tmp_path, "python", tmp_path / "ws", ROOT)
    for s in scene.servers:
        p = Predictor(s.sdep, s.predictor)
        info = {**p.record_info(key="k" + s.role), "url": f"http://127.0.0.1:{s.port}"}
        db.record_process(processes.ProcessRecord(f"serve/{s.sdep}/{s.role}/k", "serve", scene.exporter.pid,
                                                  scene.exporter.start_ticks, [], scene.exporter.log, info))
    local = LocalPrometheus(db, tmp_path, scrape_interval="1s")
    local.ensure()
    try:
        local.set_targets(serving.scrape_targets())

        def series(url: str) -> set[tuple[tuple[str, str], ...]]:
            rows = _query(url, "forge_requests_total")
            return {tuple(sorted((k, v) for k, v in r["metric"].items() if k != "pod")) for r in rows}
        want = _wait("the operator's series", lambda: series(operator_prometheus))
        got = _wait("the local series", lambda: (s := series(local.url)) and len(s) >= len(want) and s)
        assert got == want
    finally:
        local.stop()
