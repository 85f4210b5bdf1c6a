"""The shadow's figures in a cluster, read from Prometheus: what the live servers' copies to the
shadow counted (runtimes/serving/mirror.py, the ``forge_shadow_*`` series), in the shape the local
router's mirror reports them (``reconciler.targets.local.router.Router.shadow_stats``), so `forgectl
rollout status` shows one line for both.

The counters are summed over the endpoint's live servers as they stand: counted since each server
started (a restarted pod starts again from 0), as the local router counts since it started.
"""

from __future__ import annotations

from typing import Any

from reconciler.metrics.prometheus import MetricSource
from specs.rollout import SERIES_LABELS


def _by(source: MetricSource, query: str, label: str) -> dict[str, float]:
    """``label`` value → the series' value, of an instant query aggregated by ``label``."""
    out: dict[str, float] = {}
    for series in source.series(query):
        if series.samples:
            out[series.labels.get(label, "")] = series.samples[-1][1]
    return out


def _ratio(source: MetricSource, metric: str, selector: str) -> float | None:
    """A histogram's mean (its `_sum` over its `_count`), None without observations."""
    return source.value(f"sum({metric}_sum{{{selector}}}) / sum({metric}_count{{{selector}}})")


def shadow_figures(source: MetricSource, endpoint: str, namespace: str) -> dict[str, Any] | None:
    """Copies sent, answered, failed, dropped (`skipped`), compared, the agreement (rows labelled
    as the live server did, over the rows compared), the mean largest probability difference and
    the shadow's mean answer time; None when no live server of the endpoint copies to a shadow.
    Raises :class:`reconciler.metrics.prometheus.PrometheusUnavailable` as the source does."""
    selector = f'{SERIES_LABELS["endpoint"]}="{endpoint}",{SERIES_LABELS["namespace"]}="{namespace}"'
    outcomes = _by(source, f"sum by (outcome) (forge_shadow_requests_total{{{selector}}})", "outcome")
    if not outcomes:
        return None
    rows = _by(source, f"sum by (agreement) (forge_shadow_rows_total{{{selector}}})", "agreement")
    compared, failed = int(outcomes.get("compared", 0)), int(outcomes.get("failed", 0))
    answered = compared + int(outcomes.get("unreadable", 0))
    total_rows = rows.get("agreed", 0.0) + rows.get("disagreed", 0.0)
    return {"mirrored": answered + failed, "answered": answered, "failed": failed,
            "skipped": int(outcomes.get("dropped", 0)), "compared": compared,
            "agreement": rows.get("agreed", 0.0) / total_rows if total_rows else None,
            "meanProbabilityDistance": _ratio(source, "forge_shadow_probability_delta", selector) if compared else None,
            "meanLatencySeconds": _ratio(source, "forge_shadow_duration_seconds", selector) if answered else None}
