"""`RolloutPolicy`: how a new model version reaches traffic — canary steps or blue-green — and the
Prometheus analysis that gates each step."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from specs.base import Duration, Name, SpecModel, duration_seconds

#: Ready-made PromQL templates over the serving runtime's metrics. Arguments in braces are filled in
#: by the controller: endpoint, namespace, version, variant (stable|canary), window.
BUILTIN_TEMPLATES: dict[str, str] = {
    "success-rate": (
        'sum(rate(forge_requests_total{{endpoint="{endpoint}",namespace="{namespace}",role="{role}",code!~"5.."}}[{window}]))'
        ' / sum(rate(forge_requests_total{{endpoint="{endpoint}",namespace="{namespace}",role="{role}"}}[{window}]))'
    ),
    "error-rate": (
        'sum(rate(forge_requests_total{{endpoint="{endpoint}",namespace="{namespace}",role="{role}",code=~"5.."}}[{window}]))'
        ' / sum(rate(forge_requests_total{{endpoint="{endpoint}",namespace="{namespace}",role="{role}"}}[{window}]))'
    ),
    "latency-p99": (
        "histogram_quantile(0.99, sum by (le) (rate(forge_request_duration_seconds_bucket"
        '{{endpoint="{endpoint}",namespace="{namespace}",role="{role}"}}[{window}])))'
    ),
}


class CompareToStable(SpecModel):
    """Pass when the canary's value is within `maxIncrease`/`maxDecrease` of the stable variant's."""

    max_increase: float | None = Field(default=None, ge=0, description="Canary may be at most this much above stable.")
    max_decrease: float | None = Field(default=None, ge=0, description="Canary may be at most this much below stable.")

    @model_validator(mode="after")
    def _one_bound(self) -> "CompareToStable":
        if self.max_increase is None and self.max_decrease is None:
            raise ValueError("compareToStable needs `maxIncrease`, `maxDecrease` or both")
        return self


class Metric(SpecModel):
    """One analysis metric: a PromQL query and the rule it must meet."""

    name: Name = Field(description="Name used in steps' `analysis` lists and in reports.")
    template: Literal["success-rate", "error-rate", "latency-p99"] | None = Field(
        default=None, description="A built-in query over the serving runtime's metrics."
    )
    query: str | None = Field(
        default=None,
        min_length=1,
        description="A PromQL template; `{endpoint}`, `{namespace}`, `{version}`, `{role}` and `{window}` are filled in.",
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
        description="Roll back after this many inconclusive measurements in a row (no data, NaN, "
        "Prometheus unreachable); unset means hold until they become conclusive.",
    )

    @model_validator(mode="after")
    def _query_and_rule(self) -> "Metric":
        if (self.template is None) == (self.query is None):
            raise ValueError("a metric needs exactly one of `template` or `query`")
        if self.min is None and self.max is None and self.compare_to_stable is None:
            raise ValueError("a metric needs a rule: `min`, `max` or `compareToStable`")
        if self.min is not None and self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max:g}) is below min ({self.min:g})")
        if duration_seconds(self.interval) <= 0:
            raise ValueError("interval must be positive")
        return self

    def promql(self) -> str:
        """The PromQL template of this metric (built-in or user-written)."""
        return BUILTIN_TEMPLATES[self.template] if self.template else str(self.query)


class CanaryStep(SpecModel):
    """Send `weight` percent of traffic to the canary, wait `pause`, then run the analysis."""

    weight: int = Field(ge=1, le=100, description="Percent of traffic for the canary at this step.")
    pause: Duration = Field(default="0s", description="Wait before the analysis starts.")
    analysis: list[Name] = Field(default_factory=list, description="Names of `metrics` to run at this step.")


class Canary(SpecModel):
    """Canary: weights grow step by step while the analysis passes."""

    steps: list[CanaryStep] = Field(min_length=1, description="Steps with strictly increasing weights.")

    @model_validator(mode="after")
    def _increasing(self) -> "Canary":
        weights = [s.weight for s in self.steps]
        for before, after in zip(weights, weights[1:]):
            if after <= before:
                raise ValueError(f"canary weights must increase strictly: {weights}")
        return self


class BlueGreen(SpecModel):
    """Blue-green: the new version runs as a preview with no traffic, is analysed, then takes all
    traffic at once; the old one is kept for `scaleDownDelay` for a fast rollback."""

    preview_replicas: int = Field(default=1, ge=1, le=1000, description="Replicas of the preview.")
    analysis: list[Name] = Field(default_factory=list, description="Metrics run against the preview.")
    preview_traffic_percent: int = Field(
        default=0, ge=0, le=100, description="Mirror/test traffic sent to the preview during analysis."
    )
    auto_promote: bool = Field(default=True, description="Switch when the analysis passes; false waits for `promote`.")
    scale_down_delay: Duration = Field(default="30s", description="Keep the old version this long after the switch.")


class GitWriteback(SpecModel):
    """After a rollback, commit the revert of the endpoint's model change to a branch."""

    enabled: bool = Field(default=False, description="Create the revert commit.")
    branch: str = Field(
        default="forge/rollback-{endpoint}",
        pattern=r"^[A-Za-z0-9._/{}\-]+$",
        description="Branch for the commit; `{endpoint}` is filled in.",
    )


class RolloutPolicySpec(SpecModel):
    """How new model versions reach traffic, and when Forge rolls them back by itself."""

    strategy: Literal["canary", "blueGreen"] = Field(description="`canary` or `blueGreen`.")
    canary: Canary | None = Field(default=None, description="Canary steps (`strategy: canary`).")
    blue_green: BlueGreen | None = Field(default=None, description="Blue-green settings (`strategy: blueGreen`).")
    metrics: list[Metric] = Field(default_factory=list, description="Analysis metrics referenced by name.")
    on_prometheus_unreachable: Literal["hold", "rollback"] = Field(
        default="hold",
        description="`hold`: never promote or roll back on missing data alone (each metric's "
        "`inconclusiveLimit` may still roll back); `rollback`: treat it as a failure.",
    )
    git_writeback: GitWriteback = Field(default_factory=GitWriteback, description="Revert commit after rollback.")

    @model_validator(mode="after")
    def _strategy_section(self) -> "RolloutPolicySpec":
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
