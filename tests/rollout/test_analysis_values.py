"""What Prometheus can answer that is not a measurement (issue 35's bad-data drill): NaN, +Inf,
−Inf, an infinite stable value — each judged inconclusive or failed by the policy's own rule, never
passed — and the evaluation time of its answers compared with the controller's clock (a skewed
clock, answers frozen at one moment). Pure: :func:`judge` and :func:`out_of_step` on values."""

from __future__ import annotations

import json
import math

import pytest

from reconciler.metrics.analysis import (
    MAX_SKEW_SECONDS,
    Cause,
    Liveness,
    LivenessQueries,
    Readiness,
    Series,
    judge,
    liveness_queries,
    out_of_step,
)
from specs.rollout import Metric

SUCCESS = Metric.model_validate({"name": "success-rate", "template": "success-rate", "min": 0.99})
LATENCY = Metric.model_validate({"name": "latency-p99", "template": "latency-p99", "max": 0.2})
VS_STABLE = Metric.model_validate({"name": "errors", "template": "error-rate", "compareToStable": {"maxIncrease": 0.01}})
VS_STABLE_DOWN = Metric.model_validate({"name": "ok", "template": "success-rate", "compareToStable": {"maxDecrease": 0.01}})
INF, NAN = math.inf, math.nan


def verdict(metric: Metric, value: float | None, stable: float | None = 0.001) -> tuple[str, str]:
    m = judge(metric, value, stable, query="q", at=1.0)
    json.dumps(m.to_json(), allow_nan=False)  # what the state annotation and `-o json` write: strict JSON
    return m.cause.value, m.verdict.value


@pytest.mark.parametrize("metric, value, stable, expected", [
    # +Inf against a `min` alone: 1/0, not a success rate — no bound refuses it, so it is not judged
    (SUCCESS, INF, None, ("not-finite", "inconclusive")),
    # −Inf below a `min`: that bound's failure
    (SUCCESS, -INF, None, ("below-min", "fail")),
    # histogram_quantile's +Inf (the quantile past the highest bucket) is above any `max`
    (LATENCY, INF, None, ("above-max", "fail")),
    (LATENCY, -INF, None, ("not-finite", "inconclusive")),
    (SUCCESS, NAN, None, ("no-data", "inconclusive")),
    (LATENCY, NAN, None, ("no-data", "inconclusive")),
    (SUCCESS, None, None, ("no-data", "inconclusive")),
    # compared with stable: +Inf past maxIncrease fails; −Inf has no bound on its side
    (VS_STABLE, INF, 0.001, ("above-stable", "fail")),
    (VS_STABLE, -INF, 0.001, ("not-finite", "inconclusive")),
    (VS_STABLE_DOWN, -INF, 0.999, ("below-stable", "fail")),
    # a finite canary against an infinite stable value: nothing to compare with
    (VS_STABLE, 0.001, INF, ("not-finite", "inconclusive")),
    (VS_STABLE, 0.001, -INF, ("not-finite", "inconclusive")),
    (VS_STABLE, 0.001, NAN, ("no-stable-data", "inconclusive")),
    # finite values as before
    (SUCCESS, 1.0, None, ("met", "pass")),
    (LATENCY, 0.01, None, ("met", "pass")),
], ids=lambda v: repr(v) if isinstance(v, float) else None)
def test_no_infinity_or_nan_is_ever_a_pass(metric: Metric, value: float | None, stable: float | None,
                                            expected: tuple[str, str]) -> None:
    assert verdict(metric, value, stable) == expected


def test_a_failure_on_an_infinity_names_it_and_writes_no_infinity() -> None:
    m = judge(LATENCY, INF, None, query="q", at=1.0)
    assert m.detail == "inf > 0.2" and m.value == INF and m.to_json()["value"] is None
    n = judge(SUCCESS, INF, None, query="q", at=1.0)
    assert "inf is no measurement" in n.detail and "≥ 0.99" in n.detail


QUERIES: LivenessQueries = liveness_queries(endpoint="digits", namespace="ns", role="canary", reach=10.0)
TARGET = {"job": "forge", "instance": "127.0.0.1:9000"}


def stamped(evaluated: float, asked: float | None = 100.0, answered: float | None = 100.2) -> Liveness:
    """A liveness observation whose instant answers Prometheus stamped with ``evaluated``."""
    series = (Series({**TARGET, "forge_role": "canary"}, ((evaluated - 1, 1.0), (evaluated, 2.0))),)
    return Liveness(Readiness(True, "ready"), QUERIES, series, (Series(dict(TARGET), ((evaluated, evaluated),)),),
                    (Series(dict(TARGET), ((evaluated, 1.0),)),), since=80.0, asked=asked, answered=answered)


def test_out_of_step_compares_the_evaluation_time_with_the_span_of_the_measurement() -> None:
    assert out_of_step(stamped(100.1)) is None  # evaluated while the controller asked
    assert out_of_step(stamped(100.0 - MAX_SKEW_SECONDS)) is None
    assert out_of_step(stamped(100.2 + MAX_SKEW_SECONDS)) is None
    behind = out_of_step(stamped(97.0)) or ""
    assert "3 s before the controller's clock" in behind and "behind, or its answers are frozen" in behind
    ahead = out_of_step(stamped(103.7)) or ""
    assert "3.5 s after the controller's clock" in ahead and "ahead" in ahead
    # not recorded (a caller without a clock), or nothing stamped: not compared
    assert out_of_step(stamped(50.0, asked=None, answered=None)) is None
    assert out_of_step(Liveness(Readiness(True, "ready"), QUERIES, (), (), (), since=80.0, asked=100.0, answered=100.2)) is None


def test_each_new_cause_belongs_to_one_verdict() -> None:
    assert Cause.NOT_FINITE.verdict.value == "inconclusive"
    assert Cause.CLOCK_SKEW.verdict.value == "inconclusive"
