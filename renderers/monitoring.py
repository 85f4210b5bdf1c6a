"""Prometheus-Operator objects for an Endpoint: a PodMonitor that scrapes its model servers and a
PrometheusRule whose alerts mirror the RolloutPolicy's analysis thresholds."""

from __future__ import annotations

from typing import Any

from renderers.labels import ENDPOINT, owner_metadata
from specs import Endpoint, Environment, RolloutPolicy, duration_seconds


def render_podmonitor(endpoint: Endpoint, env: Environment, namespace: str, revision: str | None) -> dict[str, Any]:
    """A PodMonitor selecting the endpoint's predictor pods, scraping `/metrics` on `http`."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": owner_metadata(endpoint, name=endpoint.name, namespace=namespace, environment=env.name,
                                   revision=revision, labels={ENDPOINT: endpoint.name}),
        "spec": {
            "selector": {"matchLabels": {ENDPOINT: endpoint.name}},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "5s"}],
            "namespaceSelector": {"matchNames": [namespace]},
        },
    }


def _alert_name(text: str) -> str:
    return "".join(part.capitalize() for part in text.replace("_", "-").split("-"))


def render_rules(endpoint: Endpoint, policy: RolloutPolicy, env: Environment, namespace: str, revision: str | None) -> dict[str, Any]:
    """A PrometheusRule with one alert per threshold of the policy's metrics, on the canary."""
    rules = []
    for metric in policy.spec.metrics:
        query = metric.render(endpoint=endpoint.name, namespace=namespace, version=".*", role="canary")
        hold = f"{int(duration_seconds(metric.interval) * metric.count)}s"
        bounds = []
        if metric.min is not None:
            bounds.append(("<", metric.min, "below"))
        if metric.max is not None:
            bounds.append((">", metric.max, "above"))
        for op, value, word in bounds:
            rules.append({
                "alert": f"Forge{_alert_name(endpoint.name)}{_alert_name(metric.name)}{word.capitalize()}",
                "expr": f"({query}) {op} {value:g}",
                "for": hold,
                "labels": {"severity": "warning", ENDPOINT.replace("/", "_").replace(".", "_"): endpoint.name},
                "annotations": {
                    "summary": f"{endpoint.name}: canary {metric.name} {word} {value:g}",
                    "description": f"Rollout policy {policy.name} requires {metric.name} "
                                   f"{'≥' if op == '<' else '≤'} {value:g}; Forge rolls back on a failed analysis.",
                },
            })
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": owner_metadata(endpoint, name=f"{endpoint.name}-rollout", namespace=namespace, environment=env.name,
                                   revision=revision, labels={ENDPOINT: endpoint.name}),
        "spec": {"groups": [{"name": f"forge-{endpoint.name}", "rules": rules}]},
    }
