"""An Endpoint's `experiment` (A/B arms that the numbers decide between) and `shadow` (a predictor
that gets a copy of every request and whose answers nobody sees).

The primary metric of an experiment is always a *proportion* (successes out of trials), because a
proportion is what Prometheus counters give exactly and what a sequential test can be defended on:

* `success-rate`: requests answered without a 5xx, out of all requests;
* `latency-under`: requests answered within `latencyUnderSeconds` (a bucket bound of the serving
  runtime's histogram), out of all requests — a latency comparison on counters, no quantile estimate;
* `ratio`: the team's own counters, e.g. conversions out of requests, as two PromQL queries.

The decision rule is evaluated by `reconciler.experiment.stats`: `msprt` (a mixture sequential
probability ratio test: an always-valid p-value, valid however often it is looked at) or
`bayesian` (probability that an arm beats control under Beta(1, 1) priors, against a stated
threshold; not a frequentist guarantee under continuous monitoring — the docs say so).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from specs.base import Duration, LaterFieldsModel, Name, SpecModel, duration_seconds
from specs.rollout import BRANCH_HELP, BRANCH_PATTERN, MAX_METRICS, MAX_QUERY_LENGTH, GitWriteback, Metric, check_promql

#: Predictor roles Forge uses itself; an arm may not take one of these names.
RESERVED_ARM_NAMES = ("stable", "canary", "shadow")
MAX_ARMS = 4
#: Bucket bounds of the serving runtime's latency histogram (runtimes/serving/telemetry.py); a
#: `latency-under` metric must name one of them, or the counter it needs does not exist.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 1.0, 2.5, 5.0, 10.0)


class ArmFaults(SpecModel):
    """Injected faults of one arm, for drills and tests: never set this in production."""

    error_rate: float = Field(default=0.0, ge=0, le=1, description="Fraction of requests answered with HTTP 500.")
    added_latency_ms: float = Field(default=0.0, ge=0, le=60_000, description="Latency added to every request.")


class Arm(SpecModel):
    """One arm: a version and variant of the Endpoint's model, with a share of the traffic."""

    name: Name = Field(description="Name of the arm (a predictor name and the `forge_role` label of its series); "
                                   "not `stable`, `canary` or `shadow`.")
    variant: Name | None = Field(default=None, description="Variant served (any an Endpoint's `variant` may name); default the Endpoint's `variant`.")
    version: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{12}$",
        description="A registered model version (12 hex digits) to pin; default the version the specs build now.",
    )
    share: int = Field(ge=1, le=100, description="Percent of traffic (the arms' shares sum to 100).")
    fault_injection: ArmFaults | None = Field(default=None, description="Injected faults for drills and tests.")

    @model_validator(mode="after")
    def _not_reserved(self) -> Arm:
        if self.name in RESERVED_ARM_NAMES:
            raise ValueError(f"arm name {self.name!r} is reserved (not one of {', '.join(RESERVED_ARM_NAMES)})")
        return self


class Sticky(SpecModel):
    """Keep a user in one arm: the arm is chosen from a hash of this header or cookie."""

    header: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$",
                               description="Request header that identifies a user, e.g. `x-user-id`.")
    cookie: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                               description="Cookie that identifies a user.")

    @model_validator(mode="after")
    def _one(self) -> Sticky:
        if (self.header is None) == (self.cookie is None):
            raise ValueError("sticky needs exactly one of `header` or `cookie`")
        return self


class PrimaryMetric(SpecModel):
    """The metric the experiment decides on: a proportion per arm, counted since the experiment began."""

    kind: Literal["success-rate", "latency-under", "ratio"] = Field(
        description="`success-rate` (non-5xx / requests), `latency-under` (requests within `latencyUnderSeconds` / "
                    "requests) or `ratio` (your counters: `numerator` / `denominator`)."
    )
    latency_under_seconds: float | None = Field(
        default=None, gt=0, description=f"For `latency-under`: a bucket bound of the runtime's histogram "
                                        f"({', '.join(f'{b:g}' for b in LATENCY_BUCKETS)}).")
    numerator: str | None = Field(
        default=None, min_length=1, max_length=MAX_QUERY_LENGTH,
        description="For `ratio`: PromQL of the successes of one arm, e.g. "
                    "`sum(increase(shop_conversions_total{forge_endpoint=\"{endpoint}\",forge_role=\"{role}\"}[{window}]))`; "
                    "`{window}` is the time since the experiment started.",
    )
    denominator: str | None = Field(
        default=None, min_length=1, max_length=MAX_QUERY_LENGTH,
        description="For `ratio`: PromQL of the trials of one arm (same placeholders).",
    )
    higher_is_better: bool = Field(default=True, description="Whether a larger proportion is better.")

    @model_validator(mode="after")
    def _fields_of_kind(self) -> PrimaryMetric:
        if self.kind == "latency-under":
            if self.latency_under_seconds is None:
                raise ValueError("`kind: latency-under` needs `latencyUnderSeconds`")
            if not any(abs(self.latency_under_seconds - b) < 1e-12 for b in LATENCY_BUCKETS):
                raise ValueError(f"latencyUnderSeconds {self.latency_under_seconds:g} is not a bucket bound of the "
                                 f"serving runtime's histogram ({', '.join(f'{b:g}' for b in LATENCY_BUCKETS)})")
        elif self.latency_under_seconds is not None:
            raise ValueError("`latencyUnderSeconds` is only for `kind: latency-under`")
        if self.kind == "ratio":
            if self.numerator is None or self.denominator is None:
                raise ValueError("`kind: ratio` needs `numerator` and `denominator` queries")
            for part, query in (("numerator", self.numerator), ("denominator", self.denominator)):
                try:
                    check_promql(query, "1h")
                except ValueError as exc:
                    raise ValueError(f"{part}: {exc}") from None
        elif self.numerator is not None or self.denominator is not None:
            raise ValueError("`numerator`/`denominator` are only for `kind: ratio`")
        return self


class Decision(SpecModel):
    """How the experiment decides."""

    rule: Literal["msprt", "bayesian"] = Field(
        default="msprt",
        description="`msprt`: mixture sequential probability ratio test — an always-valid p-value below `alpha` "
                    "decides, however often it is looked at; `bayesian`: P(arm beats control) ≥ `probabilityToBeat` "
                    "(or ≤ 1 − it) decides (Beta(1,1) priors; no frequentist guarantee under continuous looks).",
    )
    alpha: float = Field(default=0.05, gt=0, lt=0.5, description="False-positive rate bound of `msprt`, over all looks.")
    probability_to_beat: float = Field(default=0.95, gt=0.5, lt=1, description="Threshold of `bayesian`.")
    mixture_variance: float | None = Field(
        default=None, gt=0, le=1,
        description="`msprt`'s mixing variance τ² on the difference of proportions; default (minimumEffect or 0.01)²: "
                    "tuned to the smallest effect worth finding.",
    )
    minimum_effect: float = Field(
        default=0.0, ge=0, lt=1,
        description="Smallest absolute difference of proportions worth promoting; a significant difference smaller "
                    "than this keeps control.",
    )


class WinnerWriteback(GitWriteback):
    """Once the experiment decides for a winner, commit to a branch the Endpoint's spec serving it —
    the `experiment` removed, `variant` set to the winner's — so git says what serves."""

    branch: str = Field(default="forge/experiment-{endpoint}", max_length=200, pattern=BRANCH_PATTERN, description=BRANCH_HELP)


class Experiment(LaterFieldsModel):
    """An A/B(/n) experiment between arms of the Endpoint's model, decided by a sequential test."""

    arms: list[Arm] = Field(min_length=2, max_length=MAX_ARMS, description=f"2–{MAX_ARMS} arms; shares sum to 100.")
    control: Name | None = Field(default=None, description="Name of the control arm; default the first arm.")
    sticky: Sticky | None = Field(default=None, description="Keep each user in one arm (by header or cookie).")
    primary: PrimaryMetric = Field(description="The metric the decision is made on.")
    guardrails: list[Metric] = Field(
        default_factory=list, max_length=MAX_METRICS,
        description="Metrics every arm must meet while the experiment runs (as in a RolloutPolicy; `compareToStable` "
                    "compares with the control arm). An arm that fails one more than `failureLimit` times stops the "
                    "experiment: control keeps all traffic.",
    )
    min_samples_per_arm: int = Field(default=1000, ge=10, le=10**9,
                                     description="No decision before every arm has this many trials.")
    max_duration: Duration = Field(default="24h", description="Deadline: still undecided then → inconclusive, control kept.")
    interval: Duration = Field(default="10s", description="Time between two looks at the counters.")
    decision: Decision = Field(default_factory=Decision, description="The decision rule.")
    git_writeback: WinnerWriteback | None = Field(
        default=None, description="Once decided, commit the Endpoint's spec serving the winner to a branch.")

    added_later = {"git_writeback": None}

    @model_validator(mode="after")
    def _consistent(self) -> Experiment:
        names = [a.name for a in self.arms]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"arm names must be unique; repeated: {', '.join(dupes)}")
        total = sum(a.share for a in self.arms)
        if total != 100:
            raise ValueError(f"the arms' shares sum to {total}, not 100 ({', '.join(f'{a.name}={a.share}' for a in self.arms)})")
        if self.control is not None and self.control not in names:
            raise ValueError(f"control names arm {self.control!r}, which `arms` does not define ({', '.join(names)})")
        gnames = [g.name for g in self.guardrails]
        gdupes = sorted({n for n in gnames if gnames.count(n) > 1})
        if gdupes:
            raise ValueError(f"guardrail names must be unique; repeated: {', '.join(gdupes)}")
        if duration_seconds(self.max_duration) < duration_seconds(self.interval):
            raise ValueError(f"maxDuration {self.max_duration} is shorter than one interval ({self.interval})")
        if duration_seconds(self.interval) <= 0:
            raise ValueError("interval must be positive")
        return self

    @property
    def control_arm(self) -> Arm:
        """The control arm (named by `control`, else the first)."""
        name = self.control or self.arms[0].name
        return next(a for a in self.arms if a.name == name)


class Shadow(SpecModel):
    """A shadow predictor: gets a copy of every request (or `percent` of them); its answers are
    discarded. Forge records its agreement with the live model and its latency."""

    variant: Name | None = Field(default=None, description="Variant served by the shadow; default the Endpoint's.")
    version: str | None = Field(default=None, pattern=r"^[0-9a-f]{12}$",
                                description="A registered version to pin; default the version the specs build now.")
    percent: int = Field(default=100, ge=1, le=100, description="Percent of requests mirrored.")
