"""The Grafana dashboard ConfigMap of an Endpoint: what Grafana's sidecar looks for, queries that
parse as PromQL and select the series the rollout gates select. (The kube-apiserver accepts it:
test_server_dry_run.py; the queries answer against the local target's real Prometheus:
tests/local/test_local_target.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import promql_parser

from reconciler.load.loader import load_or_raise
from renderers import RenderContext, render
from renderers.dashboards import label
from specs.rollout import BUILTIN_TEMPLATES

ROOT = Path(__file__).resolve().parents[2]


def _dashboards(example: str, env: str = "cluster") -> list[dict]:
    specs = load_or_raise([str(ROOT / "examples" / example)]).specs
    return [m for m in render(specs, RenderContext(specs.environment(env))).manifests if m["kind"] == "ConfigMap"]


def test_one_sidecar_configmap_per_endpoint() -> None:
    [cm] = _dashboards("quickstart")
    assert cm["metadata"]["name"] == "digits-dashboard" and cm["metadata"]["namespace"] == "forge-quickstart"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "forgectl"  # pruned like any owned object
    assert cm["metadata"]["annotations"]["grafana_folder"] == "Forge"
    [(name, text)] = cm["data"].items()
    assert name == "forge-digits.json"
    board = json.loads(text)
    assert board["uid"].startswith("forge-") and len(board["uid"]) <= 40  # Grafana's uid limit
    assert [p["title"] for p in board["panels"]] == [
        "Traffic per arm", "Success rate per arm", "Latency quantiles per arm", "Rollout step: canary share of requests",
        "Rollout policy", "Rows per model call (dynamic batching)"]


def test_queries_parse_and_select_what_the_gates_select() -> None:
    gate_labels = set(re.findall(r'(\w+)="\{(?:endpoint|namespace|role)\}"', BUILTIN_TEMPLATES["success-rate"]))
    assert {label("endpoint"), label("namespace"), label("role")} == gate_labels
    for example in ("quickstart", "edge-vision", "llm-finetune"):
        for cm in _dashboards(example):
            board = json.loads(next(iter(cm["data"].values())))
            for panel in board["panels"]:
                for target in panel.get("targets", []):
                    expr = target["expr"]
                    promql_parser.parse(expr.replace("$__rate_interval", "5m"))  # raises on a syntax error
                    assert f'{label("endpoint")}="' in expr and f'{label("namespace")}="{cm["metadata"]["namespace"]}"' in expr
                    # grouping and legends use the runtime's own label names, never a scrape's target labels
                    for by in re.findall(r"by \(([^)]*)\)", expr):
                        assert all(n.strip() in ("le", label("role"), label("version"), label("variant")) for n in by.split(","))


def test_policy_bounds_and_steps_are_on_the_dashboard() -> None:
    [cm] = _dashboards("quickstart")
    panels = {p["title"]: p for p in json.loads(next(iter(cm["data"].values())))["panels"]}
    success = panels["Success rate per arm"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert {"color": "green", "value": 0.99} in success  # the policy's success-rate min
    latency = panels["Latency quantiles per arm"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert {"color": "red", "value": 0.2} in latency  # the policy's latency-p99 max
    share = [s["value"] for s in panels["Rollout step: canary share of requests"]["fieldConfig"]["defaults"]["thresholds"]["steps"][1:]]
    assert share == [0.1, 0.5, 1.0]  # the canary steps 10 % → 50 % → 100 %
    assert "| 2 | 50 % | 5s | success-rate, latency-p99 |" in panels["Rollout policy"]["options"]["content"]
