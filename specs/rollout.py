"""`RolloutPolicy`: how a new model version reaches traffic — canary steps or blue-green — and the
Prometheus analysis that gates each step."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from specs.base import Duration, LaterFieldsModel, Name, SpecModel, duration_seconds

#: The labels the serving runtime puts on every series it exports (runtimes/serving/telemetry.py),
#: by what they hold. They are prefixed so that no scrape can add or rename them: the Prometheus
#: Operator gives every series of a PodMonitor the target labels `namespace`, `pod`, `container`,
#: `endpoint` (the port's name), `job` and `instance`, and without `honorLabels` (or with a
#: Prometheus's `overrideHonorLabels`) a server's own label of the same name becomes `exported_*`.
#: With these names a query means the same under any scrape configuration — the operator's, a
#: hardened multi-tenant one, a plain `kubernetes_sd_configs` job, the local target's — and the
#: namespace is written by the server too, so no query depends on a target label.
SERIES_LABELS: dict[str, str] = {
    "endpoint": "forge_endpoint",
    "namespace": "forge_namespace",
    "version": "forge_version",
    "variant": "forge_variant",
    "role": "forge_role",
}

#: Ready-made PromQL templates over the serving runtime's metrics (labels: :data:`SERIES_LABELS`).
#: The placeholders `{endpoint}`, `{namespace}`, `{version}`, `{role}` (stable|canary) and
#: `{window}` are filled in by :func:`fill_placeholders` — never by `str.format`, so a label
#: matcher's braces stay as written.
BUILTIN_TEMPLATES: dict[str, str] = {
    "success-rate": (
        'sum(rate(forge_requests_total{forge_endpoint="{endpoint}",forge_namespace="{namespace}",forge_role="{role}",code!~"5.."}[{window}]))'
        ' / sum(rate(forge_requests_total{forge_endpoint="{endpoint}",forge_namespace="{namespace}",forge_role="{role}"}[{window}]))'
    ),
    "error-rate": (
        'sum(rate(forge_requests_total{forge_endpoint="{endpoint}",forge_namespace="{namespace}",forge_role="{role}",code=~"5.."}[{window}]))'
        ' / sum(rate(forge_requests_total{forge_endpoint="{endpoint}",forge_namespace="{namespace}",forge_role="{role}"}[{window}]))'
    ),
    "latency-p99": (
        "histogram_quantile(0.99, sum by (le) (rate(forge_request_duration_seconds_bucket"
        '{forge_endpoint="{endpoint}",forge_namespace="{namespace}",forge_role="{role}"}[{window}])))'
    ),
    # The shadow's agreement with what callers got: rows it labelled as the live server did, over
    # the copies of every live server of the endpoint (runtimes/serving/mirror.py). Not by role:
    # the shadow is compared with whichever predictor answered.
    "shadow-agreement": (
        'sum(rate(forge_shadow_rows_total{forge_endpoint="{endpoint}",forge_namespace="{namespace}",agreement="agreed"}[{window}]))'
        ' / sum(rate(forge_shadow_rows_total{forge_endpoint="{endpoint}",forge_namespace="{namespace}"}[{window}]))'
    ),
}


#: The placeholders of a query template; any other text in braces (label matchers) is PromQL.
PLACEHOLDERS = ("endpoint", "namespace", "version", "role", "window")
_PLACEHOLDER_RE = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
#: What a filled-in value may hold: names, versions, durations and the `.*` of alert rules. Nothing
#: that could end a PromQL string literal or add syntax.
_SAFE_VALUE_RE = re.compile(r"^[A-Za-z0-9_.:*+\-]*$")
#: Bounds on a query, checked before it reaches the parser (whose time grows quickly with nesting
#: and operator chains): see docs/security.md.
MAX_QUERY_LENGTH = 1024
MAX_QUERY_NESTING = 32
MAX_METRICS = 32
MAX_STEPS = 100
#: Stand-in values used to check a template at validate time.
_SAMPLE_VALUES = {"endpoint": "endpoint", "namespace": "namespace", "version": "0123456789ab", "role": "canary"}
#: The latest `@` timestamp a query may name (9999-12-31T23:59:59Z, in seconds); none may be
#: negative. Prometheus refuses one at or past 2⁶³ (promql-parser does not), and a gate pinned to a
#: fixed time outside that range measures nothing.
MAX_AT_TIMESTAMP = 253_402_300_799
#: Aggregations Prometheus runs only behind `--enable-feature=promql-experimental-functions` (the
#: functions behind it are marked so by promql-parser itself).
_EXPERIMENTAL_AGGREGATIONS = frozenset({"limitk", "limit_ratio"})
#: A number as PromQL writes one (after `@`): decimal, scientific, hexadecimal, Inf or NaN.
_NUMBER_RE = re.compile(r"[-+]?(?:0[xX][0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[iI][nN][fF]|[nN][aA][nN])")
_AT_FUNCTION_RE = re.compile(r"(?:start|end)\s*\(\s*\)")


def fill_placeholders(template: str, values: Mapping[str, str]) -> str:
    """``template`` with exactly `{endpoint}`, `{namespace}`, `{version}`, `{role}` and `{window}`
    replaced by ``values``; every other brace is left alone (so `{code=~"5.."}` is fine, and a
    stray `{0}` or `{x.y}` is PromQL's business, not a format-string crash). A value with
    characters that could change the query's syntax is refused."""
    for key, value in values.items():
        if key not in PLACEHOLDERS:
            raise ValueError(f"unknown placeholder {key!r}; expected one of {', '.join(PLACEHOLDERS)}")
        if not _SAFE_VALUE_RE.fullmatch(value):
            raise ValueError(f"value {value!r} for {{{key}}} holds characters a query cannot take")

    def one(match: re.Match[str]) -> str:
        return values.get(match[1], match[0])

    return _PLACEHOLDER_RE.sub(one, template)


def _code(text: str) -> list[tuple[int, str]]:
    """The characters of a query outside its string literals ("…", '…', `…`), with their index."""
    out = []
    quote = ""
    escaped = False
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote != "`":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "\"'`":
            quote = ch
        else:
            out.append((i, ch))
    return out


def _nesting(text: str) -> int:
    depth = deepest = 0
    for _, ch in _code(text):
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest


def _lexical_problem(text: str) -> str:
    """What Prometheus would make of the query's text other than promql-parser does: a comment
    (`#` outside a string runs to the end of the line, so it swallows the comparison Forge appends
    in the PrometheusRule), and `@` timestamps outside [0, :data:`MAX_AT_TIMESTAMP`]."""
    for i, ch in _code(text):
        if ch == "#":
            return ("query holds a comment (`#`): it would swallow what Forge appends to the query (the comparison "
                    "with the threshold in the PrometheusRule); remove it")
        if ch == "@":
            rest = text[i + 1:].lstrip()
            if _AT_FUNCTION_RE.match(rest):
                continue
            number = _NUMBER_RE.match(rest)
            if number is None:
                continue  # the parser says what is wrong
            literal = number[0]
            value = int(literal, 16) if literal.lstrip("+-")[:2].lower() == "0x" else float(literal)
            if not 0 <= value <= MAX_AT_TIMESTAMP:  # NaN compares false: refused too
                shown = literal if len(literal) <= 24 else literal[:23] + "…"
                return (f"query pins a selector to `@ {shown}`: an `@` timestamp must be between 0 and {MAX_AT_TIMESTAMP} "
                        "seconds (9999-12-31); Prometheus refuses one of 2^63 seconds or more, promql-parser does not")
    return ""


def check_promql(template: str, window: str) -> None:
    """Raise ValueError unless ``template``, its placeholders filled in, is one valid PromQL
    expression that yields an instant vector (parsed by `promql-parser`, a Rust port of
    Prometheus's own parser), and stays one as Prometheus reads it in the PrometheusRule Forge
    renders: compared with a threshold (`(query) < min`, a scalar would need `bool`), not swallowed
    by a comment, with `@` timestamps Prometheus accepts and no experimental function."""
    import promql_parser

    if len(template) > MAX_QUERY_LENGTH:
        raise ValueError(f"query is {len(template):,} characters long; at most {MAX_QUERY_LENGTH:,} are allowed")
    if _nesting(template) > MAX_QUERY_NESTING:
        raise ValueError(f"query nests brackets deeper than {MAX_QUERY_NESTING} levels")
    text = fill_placeholders(template, {**_SAMPLE_VALUES, "window": window})
    problem = _lexical_problem(text)
    if problem:
        raise ValueError(problem)
    expr = _parse(promql_parser, text, "query is not valid PromQL")
    if isinstance(expr, (promql_parser.MatrixSelector, promql_parser.SubqueryExpr)):
        raise ValueError("query yields a range vector; a gate needs one number per series (wrap it in rate(), avg_over_time(), …)")
    if isinstance(expr, promql_parser.StringLiteral):
        raise ValueError("query yields a string; a gate needs a number")
    experimental: list[str] = []

    def visit(node: Any, *_: Any) -> None:
        if isinstance(node, promql_parser.Call) and node.func.experimental:
            experimental.append(node.func.name)
        elif isinstance(node, promql_parser.AggregateExpr) and str(node.op) in _EXPERIMENTAL_AGGREGATIONS:
            experimental.append(str(node.op))

    promql_parser.walk(expr, visit)
    if experimental:
        raise ValueError(f"query calls {experimental[0]}(), an experimental function: Prometheus refuses it unless "
                         "started with --enable-feature=promql-experimental-functions")
    # The expressions Forge renders around it (renderers/monitoring.py), as Prometheus will parse them.
    for rendered in (f"({text}) < 0", f"({text}) - ({text}) > 0"):
        try:
            promql_parser.parse(rendered)
        except (KeyboardInterrupt, SystemExit):  # pragma: no cover
            raise
        except BaseException as exc:  # a ValueError, or a PanicException from the Rust side
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if "scalar" in reason:
                raise ValueError("query yields a scalar: Forge compares it with its threshold (`(query) < min`), and "
                                 "Prometheus refuses a comparison of two scalars without `bool`; wrap it in vector(…)") from None
            raise ValueError(f"query is not valid PromQL once compared with its threshold (`(query) < min`): {reason}") from None


def _parse(promql_parser: Any, text: str, what: str) -> Any:
    try:
        return promql_parser.parse(text)
    except (KeyboardInterrupt, SystemExit):  # pragma: no cover
        raise
    except BaseException as exc:  # a ValueError, or a PanicException from the Rust side
        raise ValueError(f"{what}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


class CompareToStable(SpecModel):
    """Pass when the canary's value is within `maxIncrease`/`maxDecrease` of the stable variant's."""

    max_increase: float | None = Field(default=None, ge=0, description="Canary may be at most this much above stable.")
    max_decrease: float | None = Field(default=None, ge=0, description="Canary may be at most this much below stable.")

    @model_validator(mode="after")
    def _one_bound(self) -> CompareToStable:
        if self.max_increase is None and self.max_decrease is None:
            raise ValueError("compareToStable needs `maxIncrease`, `maxDecrease` or both")
        return self


class Metric(SpecModel):
    """One analysis metric: a PromQL query and the rule it must meet."""

    name: Name = Field(description="Name used in steps' `analysis` lists and in reports.")
    template: Literal["success-rate", "error-rate", "latency-p99", "shadow-agreement"] | None = Field(
        default=None, description="A built-in query over the serving runtime's metrics."
    )
    query: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_QUERY_LENGTH,
        description="A PromQL template; `{endpoint}`, `{namespace}`, `{version}`, `{role}` and `{window}` are filled in "
        "(nothing else: label matchers such as `{code=~\"5..\"}` are written as in Prometheus). The serving runtime's "
        "series carry `forge_endpoint`, `forge_namespace`, `forge_version`, `forge_variant`, `forge_role` (and `code`): "
        "select on those, e.g. `forge_endpoint=\"{endpoint}\"`, never on `endpoint` or `namespace`, which a scrape sets. "
        f"Parsed when the specs are validated; at most {MAX_QUERY_LENGTH} characters.",
    )
    min: float | None = Field(default=None, description="Pass when the value is at least this.")
    max: float | None = Field(default=None, description="Pass when the value is at most this.")
    compare_to_stable: CompareToStable | None = Field(
        default=None, description="Pass when the canary is within a margin of the stable variant."
    )
    interval: Duration = Field(default="5s", description="Time between two measurements.")
    window: Duration = Field(
        default="2m",
        description="Range of the `rate()` windows in the query. Keep it at least 4 × Prometheus's scrape "
        "interval: a window holding fewer than two samples has no rate, and the analysis is inconclusive.",
    )
    count: int = Field(default=3, ge=1, le=1000, description="Measurements per analysis run.")
    failure_limit: int = Field(default=1, ge=0, le=1000, description="Failed measurements tolerated before the run fails.")
    inconclusive_limit: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="Roll back after this many inconclusive measurements in a row (no data or NaN from "
        "a reachable Prometheus; an unreachable one is `onPrometheusUnreachable`'s to decide); unset "
        "means hold until they become conclusive.",
    )

    @model_validator(mode="after")
    def _query_and_rule(self) -> Metric:
        if (self.template is None) == (self.query is None):
            raise ValueError("a metric needs exactly one of `template` or `query`")
        if self.min is None and self.max is None and self.compare_to_stable is None:
            raise ValueError("a metric needs a rule: `min`, `max` or `compareToStable`")
        if self.min is not None and self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max:g}) is below min ({self.min:g})")
        if duration_seconds(self.interval) <= 0:
            raise ValueError("interval must be positive")
        check_promql(self.promql(), self.window)
        return self

    def promql(self) -> str:
        """The PromQL template of this metric (built-in or user-written)."""
        return BUILTIN_TEMPLATES[self.template] if self.template else str(self.query)

    def render(self, *, endpoint: str, namespace: str, version: str, role: str) -> str:
        """The metric's query with its placeholders filled in (see :func:`fill_placeholders`)."""
        return fill_placeholders(self.promql(), {"endpoint": endpoint, "namespace": namespace, "version": version,
                                                 "role": role, "window": self.window})


class CanaryStep(SpecModel):
    """Send `weight` percent of traffic to the canary, wait `pause`, then run the analysis."""

    weight: int = Field(ge=1, le=100, description="Percent of traffic for the canary at this step.")
    pause: Duration = Field(default="0s", description="Wait before the analysis starts.")
    analysis: list[Name] = Field(
        default_factory=list, max_length=MAX_METRICS, description="Names of `metrics` to run at this step."
    )


class Canary(SpecModel):
    """Canary: weights grow step by step while the analysis passes."""

    steps: list[CanaryStep] = Field(
        min_length=1, max_length=MAX_STEPS, description=f"Steps with strictly increasing weights (at most {MAX_STEPS})."
    )

    @model_validator(mode="after")
    def _increasing(self) -> Canary:
        weights = [s.weight for s in self.steps]
        for before, after in zip(weights, weights[1:]):
            if after <= before:
                raise ValueError(f"canary weights must increase strictly: {weights}")
        return self


class BlueGreen(SpecModel):
    """Blue-green: the new version runs as a preview with no traffic, is analysed, then takes all
    traffic at once; the old one is kept for `scaleDownDelay` for a fast rollback."""

    preview_replicas: int = Field(default=1, ge=1, le=1000, description="Replicas of the preview.")
    analysis: list[Name] = Field(
        default_factory=list, max_length=MAX_METRICS, description="Metrics run against the preview."
    )
    preview_traffic_percent: int = Field(
        default=0, ge=0, le=100, description="Mirror/test traffic sent to the preview during analysis."
    )
    auto_promote: bool = Field(default=True, description="Switch when the analysis passes; false waits for `promote`.")
    scale_down_delay: Duration = Field(default="30s", description="Keep the old version this long after the switch.")


#: What a write-back's branch may be written as, and what it means (its validator checks the rest).
BRANCH_PATTERN = r"^[A-Za-z0-9._/{}\-]+$"
BRANCH_HELP = ("Branch for the commit; `{endpoint}` is filled in (no other placeholder). The result must be a valid "
               "git branch name.")


class GitWriteback(SpecModel):
    """After a rollback, commit the revert of the endpoint's model change to a branch."""

    enabled: bool = Field(default=False, description="Create the revert commit.")
    branch: str = Field(default="forge/rollback-{endpoint}", max_length=200, pattern=BRANCH_PATTERN, description=BRANCH_HELP)

    @model_validator(mode="after")
    def _branch_name(self) -> GitWriteback:
        check_branch(self.branch_for("x"))
        return self

    def branch_for(self, endpoint: str) -> str:
        """The branch name for ``endpoint``: `{endpoint}` replaced, nothing else touched."""
        return self.branch.replace("{endpoint}", endpoint)


def check_branch(name: str) -> str:
    """Raise ValueError unless ``name`` is a branch name `git check-ref-format --branch` accepts."""
    if "{" in name or "}" in name:
        raise ValueError(f"branch {name!r}: only the placeholder `{{endpoint}}` is filled in")
    parts = name.split("/")
    if (
        not name or name.startswith(("-", "/")) or name.endswith(("/", ".")) or ".." in name or "@{" in name
        or any(not part or part.startswith(".") or part.endswith(".lock") for part in parts) or name == "@"
    ):
        raise ValueError(
            f"branch {name!r} is not a valid git branch name (no empty or dot-leading parts, no `..`, "
            "no trailing `/`, `.` or `.lock`)"
        )
    return name


class RegressionGate(SpecModel):
    """Before a canary takes traffic: the candidate against the live (stable) version on the same
    held-out data, from the registry's measurements of both. Refused when the candidate is worse
    by more than `maxDrop`."""

    metric: Literal["accuracy"] = Field(default="accuracy", description="The held-out metric compared (higher is better).")
    max_drop: float = Field(default=0.0, ge=0, le=1, description="Largest drop (absolute, e.g. 0.01 = 1 point) accepted.")
    on_different_data: Literal["skip", "refuse"] = Field(
        default="skip",
        description="When the two versions were evaluated on different datasets (digests differ) the numbers are not "
        "comparable: `skip` the gate (and say so) or `refuse` the candidate.",
    )


class RolloutPolicySpec(LaterFieldsModel):
    """How new model versions reach traffic, and when Forge rolls them back by itself."""

    strategy: Literal["canary", "blueGreen"] = Field(description="`canary` or `blueGreen`.")
    canary: Canary | None = Field(default=None, description="Canary steps (`strategy: canary`).")
    blue_green: BlueGreen | None = Field(default=None, description="Blue-green settings (`strategy: blueGreen`).")
    metrics: list[Metric] = Field(
        default_factory=list, max_length=MAX_METRICS,
        description=f"Analysis metrics referenced by name (at most {MAX_METRICS}).",
    )
    on_prometheus_unreachable: Literal["hold", "rollback"] = Field(
        default="hold",
        description="`hold`: never promote or roll back on missing data alone (each metric's "
        "`inconclusiveLimit` may still roll back); `rollback`: treat it as a failure.",
    )
    git_writeback: GitWriteback = Field(default_factory=GitWriteback, description="Revert commit after rollback.")
    regression_gate: RegressionGate | None = Field(
        default=None, description="Compare the candidate with the live version on the held-out data before any traffic moves."
    )

    added_later = {"regression_gate": None}

    @model_validator(mode="after")
    def _strategy_section(self) -> RolloutPolicySpec:
        if self.strategy == "canary" and self.canary is None:
            raise ValueError("`strategy: canary` needs a `canary:` section with steps")
        if self.strategy == "blueGreen" and self.blue_green is None:
            raise ValueError("`strategy: blueGreen` needs a `blueGreen:` section")
        if self.strategy == "canary" and self.blue_green is not None:
            raise ValueError("`blueGreen:` is set but `strategy` is canary")
        if self.strategy == "blueGreen" and self.canary is not None:
            raise ValueError("`canary:` is set but `strategy` is blueGreen")
        names = [m.name for m in self.metrics]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"metric names must be unique; repeated: {', '.join(dupes)}")
        used = [a for s in (self.canary.steps if self.canary else []) for a in s.analysis]
        used += self.blue_green.analysis if self.blue_green else []
        for ref in used:
            if ref not in names:
                raise ValueError(f"analysis names metric {ref!r}, which `metrics` does not define")
        return self
