"""Analysis of one measurement: pass, fail or inconclusive — three outcomes, not two.

No data, NaN, or Prometheus unreachable is *inconclusive*: the rollout holds and says why; it never
promotes, and it rolls back on that alone only when the policy says so (`inconclusiveLimit`, or
`onPrometheusUnreachable: rollback`). Pure: queries are rendered and results judged here; running
them is `reconciler.metrics.prometheus`'s job.

Each measurement carries a typed :class:`Cause` (why it got its verdict); the controller decides on
the cause, never on the text of ``detail``, which is for people.
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


class Cause(str, Enum):
    """Why a measurement got its verdict. Each cause belongs to exactly one verdict."""

    #: The value meets every bound of the rule.
    MET = "met"
    #: Below `min`.
    BELOW_MIN = "below-min"
    #: Above `max`.
    ABOVE_MAX = "above-max"
    #: More than `compareToStable.maxIncrease` above the stable variant.
    ABOVE_STABLE = "above-stable"
    #: More than `compareToStable.maxDecrease` below the stable variant.
    BELOW_STABLE = "below-stable"
    #: The query answered no samples, or NaN.
    NO_DATA = "no-data"
    #: The canary has a value but the stable variant, needed for `compareToStable`, has none.
    NO_STABLE_DATA = "no-stable-data"
    #: No metric source could answer: Prometheus down, timing out, refusing the query, or none configured.
    UNREACHABLE = "unreachable"
    #: The query has a value, but the canary's own series are stale: Prometheus's last scrape of it
    #: failed (its server is down), so the value is made of samples from before that (a `rate()`
    #: window keeps them for its whole range) and says nothing of the canary now.
    CANARY_DOWN = "canary-down"

    @property
    def verdict(self) -> Verdict:
        """The verdict this cause implies."""
        if self is Cause.MET:
            return Verdict.PASS
        if self in (Cause.NO_DATA, Cause.NO_STABLE_DATA, Cause.UNREACHABLE):
            return Verdict.INCONCLUSIVE
        return Verdict.FAIL


@dataclass(frozen=True)
class Measurement:
    """One measurement of one metric, with everything needed to explain it."""

    metric: str
    cause: Cause
    query: str
    value: float | None
    threshold: str
    detail: str
    at: float

    @property
    def verdict(self) -> Verdict:
        """Pass, fail or inconclusive: derived from :attr:`cause`, so the two can never disagree."""
        return self.cause.verdict

    def to_json(self) -> dict[str, object]:
        """A plain dict for the rollout state and `rollout status --output json`."""
        return {"metric": self.metric, "verdict": self.verdict.value, "cause": self.cause.value, "query": self.query,
                "value": self.value, "threshold": self.threshold, "detail": self.detail, "at": self.at}


def render_query(metric: Metric, *, endpoint: str, namespace: str, version: str, role: str) -> str:
    """The metric's PromQL with its arguments filled in."""
    return metric.render(endpoint=endpoint, namespace=namespace, version=version, role=role)


def liveness_query(*, endpoint: str, namespace: str, role: str) -> str:
    """An instant query with a value while Prometheus's last scrape of ``role``'s servers succeeded:
    the number of their `forge_requests_total` series (which exist from a server's start, at 0).
    A failed scrape marks them stale, and the query has no samples."""
    return (f'count(forge_requests_total{{forge_endpoint="{endpoint}",forge_namespace="{namespace}",'
            f'forge_role="{role}"}})')


def down(metric: Metric, value: float, *, query: str, liveness: str, at: float) -> Measurement:
    """A measurement whose value came from a canary that is no longer scraped: a failure."""
    return Measurement(metric.name, Cause.CANARY_DOWN, query, value, threshold_text(metric),
                       f"canary down: its series are stale (the last scrape failed; `{liveness}` has no samples), "
                       f"so {value:.4g} is from before", at)


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
    could not run: the cause is then :attr:`Cause.UNREACHABLE`, whatever the values)."""
    rule = threshold_text(metric)
    if error is not None:
        return Measurement(metric.name, Cause.UNREACHABLE, query, None, rule, f"Prometheus unreachable: {error}", at)
    if _missing(value):
        return Measurement(metric.name, Cause.NO_DATA, query, None, rule, "no data (no samples yet, or NaN)", at)
    assert value is not None
    if metric.min is not None and value < metric.min:
        return Measurement(metric.name, Cause.BELOW_MIN, query, value, rule, f"{value:.4g} < {metric.min:g}", at)
    if metric.max is not None and value > metric.max:
        return Measurement(metric.name, Cause.ABOVE_MAX, query, value, rule, f"{value:.4g} > {metric.max:g}", at)
    cmp = metric.compare_to_stable
    if cmp is not None:
        if _missing(stable):
            return Measurement(metric.name, Cause.NO_STABLE_DATA, query, value, rule, "no data for the stable variant to compare with", at)
        assert stable is not None
        if cmp.max_increase is not None and value > stable + cmp.max_increase:
            return Measurement(metric.name, Cause.ABOVE_STABLE, query, value, rule,
                               f"{value:.4g} > stable {stable:.4g} + {cmp.max_increase:g}", at)
        if cmp.max_decrease is not None and value < stable - cmp.max_decrease:
            return Measurement(metric.name, Cause.BELOW_STABLE, query, value, rule,
                               f"{value:.4g} < stable {stable:.4g} − {cmp.max_decrease:g}", at)
    return Measurement(metric.name, Cause.MET, query, value, rule, f"{value:.4g} meets {rule}", at)
