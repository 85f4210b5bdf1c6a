"""Analysis of one measurement: pass, fail or inconclusive — three outcomes, not two.

No data, NaN, or Prometheus unreachable is *inconclusive*: the rollout holds and says why; it never
promotes, and it rolls back on that alone only when the policy says so (`inconclusiveLimit`, or
`onPrometheusUnreachable: rollback`). Pure: queries are rendered and results judged here; running
them is `reconciler.prometheus`'s job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from specs.rollout import Metric


class Verdict(str, Enum):
    """Outcome of one measurement."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Measurement:
    """One measurement of one metric, with everything needed to explain it."""

    metric: str
    verdict: Verdict
    query: str
    value: float | None
    threshold: str
    detail: str
    at: float

    def to_json(self) -> dict[str, object]:
        """A plain dict for the rollout state and `rollout status --output json`."""
        return {"metric": self.metric, "verdict": self.verdict.value, "query": self.query, "value": self.value,
                "threshold": self.threshold, "detail": self.detail, "at": self.at}


def render_query(metric: Metric, *, endpoint: str, namespace: str, version: str, role: str) -> str:
    """The metric's PromQL with its arguments filled in."""
    return metric.render(endpoint=endpoint, namespace=namespace, version=version, role=role)


def threshold_text(metric: Metric) -> str:
    """`≥ 0.99`, `≤ 0.2`, `≤ stable + 0.01` … for reports."""
    parts = []
    if metric.min is not None:
        parts.append(f"≥ {metric.min:g}")
    if metric.max is not None:
        parts.append(f"≤ {metric.max:g}")
    cmp = metric.compare_to_stable
    if cmp is not None:
        if cmp.max_increase is not None:
            parts.append(f"≤ stable + {cmp.max_increase:g}")
        if cmp.max_decrease is not None:
            parts.append(f"≥ stable − {cmp.max_decrease:g}")
    return " and ".join(parts)


def _missing(value: float | None) -> bool:
    return value is None or math.isnan(value)


def judge(metric: Metric, value: float | None, stable: float | None, *, query: str, at: float,
          error: str | None = None) -> Measurement:
    """The verdict on one value of ``metric`` (``stable`` for comparisons, ``error`` when the query
    could not run)."""
    rule = threshold_text(metric)
    if error is not None:
        return Measurement(metric.name, Verdict.INCONCLUSIVE, query, None, rule, f"Prometheus unreachable: {error}", at)
    if _missing(value):
        return Measurement(metric.name, Verdict.INCONCLUSIVE, query, None, rule, "no data (no samples yet, or NaN)", at)
    assert value is not None
    if metric.min is not None and value < metric.min:
        return Measurement(metric.name, Verdict.FAIL, query, value, rule, f"{value:.4g} < {metric.min:g}", at)
    if metric.max is not None and value > metric.max:
        return Measurement(metric.name, Verdict.FAIL, query, value, rule, f"{value:.4g} > {metric.max:g}", at)
    cmp = metric.compare_to_stable
    if cmp is not None:
        if _missing(stable):
            return Measurement(metric.name, Verdict.INCONCLUSIVE, query, value, rule, "no data for the stable variant to compare with", at)
        assert stable is not None
        if cmp.max_increase is not None and value > stable + cmp.max_increase:
            return Measurement(metric.name, Verdict.FAIL, query, value, rule,
                               f"{value:.4g} > stable {stable:.4g} + {cmp.max_increase:g}", at)
        if cmp.max_decrease is not None and value < stable - cmp.max_decrease:
            return Measurement(metric.name, Verdict.FAIL, query, value, rule,
                               f"{value:.4g} < stable {stable:.4g} − {cmp.max_decrease:g}", at)
    return Measurement(metric.name, Verdict.PASS, query, value, rule, f"{value:.4g} meets {rule}", at)
