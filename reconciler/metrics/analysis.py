"""Analysis of one measurement: pass, fail or inconclusive — three outcomes, not two.

No data, NaN, an infinity no bound can judge, Prometheus unreachable, or answers that cannot be
lined up with the controller's clock is *inconclusive*: the rollout holds and says why; it never
promotes, and it rolls back on that alone only when the policy says so (`inconclusiveLimit`, or
`onPrometheusUnreachable: rollback`). Pure: queries are rendered and results judged here; running
them is `reconciler.metrics.prometheus`'s job.

Each measurement carries a typed :class:`Cause` (why it got its verdict); the controller decides on
the cause, never on the text of ``detail``, which is for people.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from statistics import median

from specs import duration_seconds
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
    #: The query answered +Inf or -Inf on the side no bound of the rule refuses (+Inf against a
    #: `min`, −Inf against a `max`, an infinite stable value to compare with): a division by zero
    #: or a broken exporter, not a measurement. An infinity past a bound is that bound's failure
    #: (`histogram_quantile` answers +Inf when the quantile lies past the highest bucket).
    NOT_FINITE = "not-finite"
    #: The canary has a value but the stable variant, needed for `compareToStable`, has none.
    NO_STABLE_DATA = "no-stable-data"
    #: No metric source could answer: Prometheus down, timing out, refusing the query, or none configured.
    UNREACHABLE = "unreachable"
    #: Prometheus evaluated the liveness query at a time more than :data:`MAX_SKEW_SECONDS` away
    #: from the controller's clock while it measured (:func:`out_of_step`): the two clocks disagree,
    #: or Prometheus's answers are frozen at one moment (a query cache that stopped moving). The
    #: query's window cannot be lined up with the step, so the value is not judged.
    CLOCK_SKEW = "clock-skew"
    #: The query has a value, but the canary is not demonstrably alive now (:func:`canary_down`):
    #: its servers not ready, its series stale (the last scrape failed, or its target is gone), or
    #: a sample the query counts is from before the step began — a `rate()` window keeps answering
    #: from samples scraped before the canary died, so the value says nothing of it now. A failure,
    #: and one that never counts toward the step's `count` (the weight cannot rise on it).
    CANARY_DOWN = "canary-down"

    @property
    def verdict(self) -> Verdict:
        """The verdict this cause implies."""
        if self is Cause.MET:
            return Verdict.PASS
        if self in (Cause.NO_DATA, Cause.NOT_FINITE, Cause.NO_STABLE_DATA, Cause.UNREACHABLE, Cause.CLOCK_SKEW):
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
        """A plain dict for the rollout state and `rollout status --output json` (JSON has no
        infinity: a non-finite value is written as null, ``detail`` says what it was)."""
        value = self.value if self.value is None or math.isfinite(self.value) else None
        return {"metric": self.metric, "verdict": self.verdict.value, "cause": self.cause.value, "query": self.query,
                "value": value, "threshold": self.threshold, "detail": self.detail, "at": self.at}


def render_query(metric: Metric, *, endpoint: str, namespace: str, version: str, role: str) -> str:
    """The metric's PromQL with its arguments filled in."""
    return metric.render(endpoint=endpoint, namespace=namespace, version=version, role=role)


@dataclass(frozen=True)
class Series:
    """One series of a Prometheus answer: its labels and its samples as ``(timestamp, value)``
    pairs — every raw sample a range selector holds (a matrix), or the one sample of an instant
    query (a vector: the evaluation time, or the sample's own time under ``timestamp()``)."""

    labels: Mapping[str, str]
    samples: tuple[tuple[float, float], ...]

    def key(self) -> tuple[tuple[str, str], ...]:
        """The series' identity without its metric name (which ``timestamp()`` and operators drop)."""
        return tuple(sorted((k, v) for k, v in self.labels.items() if k != "__name__"))

    def target(self) -> tuple[str, str]:
        """The scrape target the series came from: its ``job`` and ``instance`` target labels."""
        return self.labels.get("job", ""), self.labels.get("instance", "")


@dataclass(frozen=True)
class Readiness:
    """What the target says of the canary's servers right now: its pods Ready (a cluster), its
    server answering its readiness path (the local target). ``detail`` says what was seen."""

    ready: bool
    detail: str


@dataclass(frozen=True)
class LivenessQueries:
    """The queries that show whether the canary's series are fresh, over ``reach`` seconds (what
    a measurement's query counts: :func:`reach`). ``series`` selects the canary's serving series
    (they exist from a server's start, at 0)."""

    series: str
    #: every raw sample of the canary's series that the measurement counts (a matrix)
    counted: str
    #: the time of each series' latest sample, for the series that are not stale now: a scrape that
    #: failed, or stopped returning a series, writes a staleness marker and the series drops out
    current: str
    #: `up` of every scrape target the canary's series came from in that range: 1 when the last
    #: scrape succeeded, 0 when it failed, absent when the target is gone (Prometheus no longer
    #: scrapes it)
    up: str


def liveness_queries(*, endpoint: str, namespace: str, role: str, reach: float) -> LivenessQueries:
    """The :class:`LivenessQueries` of ``role``'s servers, selected as the built-in templates select
    them (endpoint, namespace, role: see ``specs.rollout.BUILTIN_TEMPLATES``)."""
    series = (f'forge_requests_total{{forge_endpoint="{endpoint}",forge_namespace="{namespace}",'
              f'forge_role="{role}"}}')
    window = f"[{_seconds(reach)}]"
    return LivenessQueries(series=series, counted=series + window, current=f"timestamp({series})",
                           up=f"up and on(job, instance) last_over_time({series}{window})")


#: How far, in seconds, Prometheus's evaluation time may lie outside the span of the controller's
#: clock during a measurement (from before its first query to after its last) before the two are
#: taken to disagree: the windows are 10 s and more, a scrape every second or more, so a second
#: of skew already shifts a window by a scrape.
MAX_SKEW_SECONDS = 1.0


@dataclass(frozen=True)
class Liveness:
    """What was observed of the canary for one measurement: the target's :class:`Readiness` and
    Prometheus's answers to the :class:`LivenessQueries`; ``since`` is when the step began or its
    weight took effect, whichever is later (a sample from before says nothing of this step).
    ``asked`` and ``answered`` are the controller's clock before the measurement's first query and
    after its last (None: not recorded, the clocks are not compared)."""

    readiness: Readiness
    queries: LivenessQueries
    counted: tuple[Series, ...]
    current: tuple[Series, ...]
    up: tuple[Series, ...]
    since: float
    asked: float | None = None
    answered: float | None = None


def out_of_step(live: Liveness) -> str | None:
    """Why Prometheus's answers cannot be lined up with the controller's clock, or None when they
    can: the evaluation time of its instant answers (the `up` query's, which Prometheus stamps with
    the time it evaluated at) lies more than :data:`MAX_SKEW_SECONDS` before ``asked`` or after
    ``answered``. A clock skew between the two machines and a Prometheus whose answers stopped
    moving (frozen at one evaluation time) look alike here, and both are named. Pure."""
    if live.asked is None or live.answered is None:
        return None
    evaluated = [s.samples[-1][0] for s in (*live.up, *live.current) if s.samples]
    if not evaluated:
        return None  # nothing stamped: canary_down names the missing target or the stale series
    at = max(evaluated)
    if at < live.asked - MAX_SKEW_SECONDS:
        return (f"Prometheus evaluated at {at:.3f}, {live.asked - at:.3g} s before the controller's clock "
                f"({live.asked:.3f}): its clock is behind, or its answers are frozen")
    if at > live.answered + MAX_SKEW_SECONDS:
        return (f"Prometheus evaluated at {at:.3f}, {at - live.answered:.3g} s after the controller's clock "
                f"({live.answered:.3f}): its clock is ahead")
    return None


def skewed(metric: Metric, value: float, reason: str, *, query: str, at: float) -> Measurement:
    """A measurement whose window cannot be lined up with the step (:func:`out_of_step` gave the
    ``reason``): inconclusive, whatever the value."""
    return Measurement(metric.name, Cause.CLOCK_SKEW, query, value, threshold_text(metric), f"clocks out of step: {reason}, so {value:.4g} is not judged", at)


def canary_down(live: Liveness) -> str | None:
    """Why the canary is not demonstrably alive now, or None when it is: its servers ready, every
    sample the measurement counts scraped after ``since``, and the last scrape of each of its
    targets successful (`up == 1`, no staleness marker on its series, no scrape interval missed).
    Pure. ``since`` is on the controller's clock and the samples on Prometheus's: a skew between
    them shows as samples from before the step (named with how much before)."""
    if not live.readiness.ready:
        return f"not ready ({live.readiness.detail})"
    if not live.counted:
        return f"no samples of its series in the range the query counts (`{live.queries.counted}` is empty)"
    up = {s.target(): s.samples[-1][1] for s in live.up if s.samples}
    for job, instance in sorted({s.target() for s in live.counted}):
        if (job, instance) not in up:
            return f"its scrape target {instance} (job {job}) is missing: Prometheus no longer scrapes it"
        if up[(job, instance)] != 1:
            return f"the last scrape of {instance} failed (up == {up[(job, instance)]:g})"
    current = {s.key() for s in live.current}
    stale = [s for s in live.counted if s.key() not in current]
    if stale:
        labels = ", ".join(f"{k}={v}" for k, v in stale[0].key())
        return f"its series are stale (a staleness marker: the last scrape did not return {{{labels}}})"
    # The `up` answer carries Prometheus's evaluation time: a series whose newest sample is more
    # than two scrape intervals older missed its last scrapes (a Prometheus that stopped scraping
    # the target without a staleness marker, e.g. across its own restart). The interval is the
    # median gap, not the smallest: a Prometheus resumed after a pause scrapes at once, and that
    # one short gap is not its interval.
    evaluated = max((s.samples[-1][0] for s in live.up if s.samples), default=None)
    for series in live.counted:
        times = sorted(t for t, _ in series.samples)
        gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
        interval = median(gaps) if gaps else None
        if evaluated is not None and interval is not None and evaluated - times[-1] > 2 * interval:
            return (f"its last sample is {evaluated - times[-1]:.3g} s old, more than two scrape intervals "
                    f"({interval:.3g} s): the last scrapes did not reach it")
    oldest = min(t for s in live.counted for t, _ in s.samples)
    if oldest < live.since:
        return (f"a sample the query counts was scraped {live.since - oldest:.3g} s before the step began or its weight "
                f"took effect (at {oldest:.3f} < {live.since:.3f})")
    return None


def down(metric: Metric, value: float, reason: str, *, query: str, at: float) -> Measurement:
    """A measurement whose value says nothing of the canary now (:func:`canary_down` gave the
    ``reason``): a failure, whatever the value."""
    return Measurement(metric.name, Cause.CANARY_DOWN, query, value, threshold_text(metric),
                       f"canary down: {reason}, so {value:.4g} is not of the canary now", at)


def reach(metric: Metric, query: str) -> float:
    """How far back, in seconds, ``query`` (``metric``'s, rendered) counts samples: its `window`,
    or longer when a range selector or subquery in it (with its `offset`) reaches further."""
    return max(duration_seconds(metric.window), _longest_range(query))


@lru_cache(maxsize=256)
def _longest_range(query: str) -> float:
    import promql_parser

    try:
        expr = promql_parser.parse(query)
    except (KeyboardInterrupt, SystemExit):  # pragma: no cover
        raise
    except BaseException:  # validated at load time; a parser panic is no reason to fail a measurement
        return 0.0
    longest = 0.0
    todo: list[tuple[object, float]] = [(expr, 0.0)]  # (node, how far back its evaluation is shifted)
    while todo:
        node, base = todo.pop()
        if isinstance(node, promql_parser.MatrixSelector):
            longest = max(longest, base + _td(node.range) + _td(node.vector_selector.offset))
            continue
        if isinstance(node, promql_parser.SubqueryExpr):  # its inner query is evaluated over the range
            todo.append((node.expr, base + _td(node.range) + _td(node.offset)))
            continue
        for name in ("lhs", "rhs", "expr", "param"):
            child = getattr(node, name, None)
            if child is not None:
                todo.append((child, base))
        todo.extend((arg, base) for arg in getattr(node, "args", None) or [])
    return longest


def _td(value: object) -> float:
    """Seconds of a parser duration (a ``timedelta``; None when absent)."""
    seconds = getattr(value, "total_seconds", None)
    return float(seconds()) if callable(seconds) else 0.0


def _seconds(value: float) -> str:
    """A PromQL duration of ``value`` seconds (whole milliseconds)."""
    ms = max(1, math.ceil(value * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


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


def _refused_by_a_bound(metric: Metric, value: float) -> bool:
    """Whether a bound of ``metric`` fails the infinite ``value`` (+Inf above a `max` or a
    `compareToStable.maxIncrease`, −Inf below a `min` or a `maxDecrease`): then it is that bound's
    failure; otherwise no bound can judge it."""
    cmp = metric.compare_to_stable
    if value > 0:
        return metric.max is not None or (cmp is not None and cmp.max_increase is not None)
    return metric.min is not None or (cmp is not None and cmp.max_decrease is not None)


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
    if math.isinf(value) and not _refused_by_a_bound(metric, value):
        return Measurement(metric.name, Cause.NOT_FINITE, query, None, rule,
                           f"{value:g} is no measurement (a division by zero, or a broken exporter): no bound of {rule} refuses it", at)
    if metric.min is not None and value < metric.min:
        return Measurement(metric.name, Cause.BELOW_MIN, query, value, rule, f"{value:.4g} < {metric.min:g}", at)
    if metric.max is not None and value > metric.max:
        return Measurement(metric.name, Cause.ABOVE_MAX, query, value, rule, f"{value:.4g} > {metric.max:g}", at)
    cmp = metric.compare_to_stable
    if cmp is not None:
        if _missing(stable):
            return Measurement(metric.name, Cause.NO_STABLE_DATA, query, value, rule, "no data for the stable variant to compare with", at)
        assert stable is not None
        if math.isinf(stable):
            return Measurement(metric.name, Cause.NOT_FINITE, query, value, rule,
                               f"the stable variant's value is {stable:g}: nothing can be compared with it", at)
        if cmp.max_increase is not None and value > stable + cmp.max_increase:
            return Measurement(metric.name, Cause.ABOVE_STABLE, query, value, rule,
                               f"{value:.4g} > stable {stable:.4g} + {cmp.max_increase:g}", at)
        if cmp.max_decrease is not None and value < stable - cmp.max_decrease:
            return Measurement(metric.name, Cause.BELOW_STABLE, query, value, rule,
                               f"{value:.4g} < stable {stable:.4g} − {cmp.max_decrease:g}", at)
    return Measurement(metric.name, Cause.MET, query, value, rule, f"{value:.4g} meets {rule}", at)
