"""Prometheus-Operator objects for an Endpoint: a PodMonitor that scrapes its model servers and a
PrometheusRule whose alerts mirror the RolloutPolicy's analysis thresholds."""

from __future__ import annotations

from typing import Any

from renderers.labels import ENDPOINT, owner_metadata
from specs import Endpoint, Environment, RolloutPolicy, duration_seconds

#: Scrape interval of the model servers unless a policy's rate windows need a shorter one.
SCRAPE_INTERVAL_S = 5
#: Samples a `rate()` window should hold (a window with fewer than two has no rate at all).
SAMPLES_PER_WINDOW = 4


def scrape_interval(policy: RolloutPolicy | None) -> str:
    """The PodMonitor's interval: 5s, or shorter so the policy's shortest `window` holds 4 scrapes
    (a 10s window scraped every 5s has one or two samples, and its rate is often no data)."""
    windows = [duration_seconds(m.window) for m in policy.spec.metrics] if policy else []
    seconds = min([SCRAPE_INTERVAL_S, *(w / SAMPLES_PER_WINDOW for w in windows)])
    return f"{max(1, int(seconds))}s"


def render_podmonitor(endpoint: Endpoint, env: Environment, namespace: str, revision: str | None,
                      policy: RolloutPolicy | None = None) -> dict[str, Any]:
    """A PodMonitor selecting the endpoint's predictor pods, scraping `/metrics` on `http` often
    enough for the policy's rate windows (:func:`scrape_interval`).

    No `honorLabels`: the operator's job gives every series the target labels `namespace`, `pod`,
    `container`, `endpoint` (`http`), `job` and `instance`, and the servers' own labels are
    `forge_*` (`specs.rollout.SERIES_LABELS`), which none of those collides with. So the series
    keep them with the operator's default, and with a Prometheus that sets `overrideHonorLabels`
    (where `honorLabels: true` would not help); the queries never select a target label."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": owner_metadata(endpoint, name=endpoint.name, namespace=namespace, environment=env.name,
                                   revision=revision, labels={ENDPOINT: endpoint.name}),
        "spec": {
            "selector": {"matchLabels": {ENDPOINT: endpoint.name}},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": scrape_interval(policy)}],
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
        stable = metric.render(endpoint=endpoint.name, namespace=namespace, version=".*", role="stable")
        hold = f"{int(duration_seconds(metric.interval) * metric.count)}s"
        # (alert suffix, expression that is true while the rule is broken, summary, requirement)
        bounds: list[tuple[str, str, str, str]] = []
        if metric.min is not None:
            bounds.append(("Below", f"({query}) < {metric.min:g}", f"below {metric.min:g}", f"≥ {metric.min:g}"))
        if metric.max is not None:
            bounds.append(("Above", f"({query}) > {metric.max:g}", f"above {metric.max:g}", f"≤ {metric.max:g}"))
        compare = metric.compare_to_stable
        if compare is not None and compare.max_increase is not None:
            bounds.append(("AboveStable", f"({query}) - ({stable}) > {compare.max_increase:g}",
                           f"more than {compare.max_increase:g} above stable", f"at most {compare.max_increase:g} above stable"))
        if compare is not None and compare.max_decrease is not None:
            bounds.append(("BelowStable", f"({stable}) - ({query}) > {compare.max_decrease:g}",
                           f"more than {compare.max_decrease:g} below stable", f"at most {compare.max_decrease:g} below stable"))
        for suffix, expr, summary, requirement in bounds:
            rules.append({
                "alert": f"Forge{_alert_name(endpoint.name)}{_alert_name(metric.name)}{suffix}",
                "expr": expr,
                "for": hold,
                "labels": {"severity": "warning", ENDPOINT.replace("/", "_").replace(".", "_"): endpoint.name},
                "annotations": {
                    "summary": f"{endpoint.name}: canary {metric.name} {summary}",
                    "description": f"Rollout policy {policy.name} requires {metric.name} {requirement}; "
                                   "Forge rolls back on a failed analysis.",
                },
            })
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": owner_metadata(endpoint, name=f"{endpoint.name}-rollout", namespace=namespace, environment=env.name,
                                   revision=revision, labels={ENDPOINT: endpoint.name}),
        "spec": {"groups": [{"name": f"forge-{endpoint.name}", "rules": rules}]},
    }
