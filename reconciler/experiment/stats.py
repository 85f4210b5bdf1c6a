"""The statistics of an experiment: pure functions of per-arm counts (successes out of trials).

Why these tests:

* **mSPRT** (mixture sequential probability ratio test; Robbins 1970, in the form of Johari,
  Pekelis & Walsh, "Always valid inference", 2017/2022 — what Optimizely's Stats Engine runs). The
  difference of two proportions θ = p_arm − p_control is estimated by θ̂ with variance V (the
  plug-in binomial variance, a normal approximation); mixing the likelihood ratio over a prior
  θ ~ N(0, τ²) gives

      Λ = sqrt(V / (V + τ²)) · exp(τ² θ̂² / (2 V (V + τ²)))

  and p = min over all looks so far of 1/Λ is an *always-valid p-value*: P(p ≤ α ever) ≤ α under
  θ = 0 however often it is computed (Ville's inequality), so the controller may look at every
  interval and stop the moment p ≤ α. The matching confidence sequence is
  θ̂ ± sqrt(2 V (V + τ²)/τ² · (log(1/α) + ½ log((V + τ²)/V))). With k treatment arms each is compared
  with control at α/k (Bonferroni). The normal approximation needs some successes and failures in
  each arm: nothing is decided before `min_samples` trials per arm (and ≥ 10 successes and ≥ 10
  failures over all arms); V uses the Agresti–Caffo adjustment (one success and one failure added
  to each arm), so an arm without a single failure does not claim zero variance.
* **Bayesian** probability to beat control, Beta(1, 1) priors: P(p_arm > p_control) exactly
  (Evan Miller's closed form, a sum of Beta functions) when the arm has at most 5 000 successes,
  else by the normal approximation to the two Beta posteriors. It is a posterior statement, not a
  frequentist bound: looked at continuously its false-positive rate exceeds 1 − threshold (the
  tests and `bench/experiment.py` measure how much).

Both are checked by simulation (tests/experiments/test_stats.py, bench/experiment.py): the false-
positive rate under no difference stays under α with a look every 100 requests per arm, and a
real difference is found within the sample bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Rule = Literal["msprt", "bayesian"]
#: Fewest successes and failures per arm before the normal approximation is trusted.
MIN_OUTCOMES = 10
_EXACT_LIMIT = 5000


@dataclass(frozen=True)
class ArmCounts:
    """Successes out of trials of one arm, counted since the experiment began."""

    name: str
    successes: float
    trials: float

    @property
    def rate(self) -> float:
        return self.successes / self.trials if self.trials > 0 else math.nan


@dataclass(frozen=True)
class Comparison:
    """One treatment arm against control."""

    arm: str
    effect: float  # p_arm − p_control (absolute difference of proportions)
    low: float  # interval for the effect: confidence sequence (msprt) or 95 % credible interval (bayesian)
    high: float
    p_value: float | None  # always-valid p-value (msprt)
    probability_to_beat: float | None  # P(p_arm > p_control) (bayesian)
    verdict: Literal["better", "worse", "too-small", "undecided"]

    def to_json(self) -> dict[str, object]:
        return {"arm": self.arm, "effect": self.effect, "low": self.low, "high": self.high, "pValue": self.p_value,
                "probabilityToBeat": self.probability_to_beat, "verdict": self.verdict}


@dataclass(frozen=True)
class Decision:
    """What the numbers say now."""

    outcome: Literal["running", "decided", "inconclusive"]
    winner: str | None
    rule: str  # the rule that fired (or why none did), in words
    comparisons: tuple[Comparison, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, object]:
        return {"outcome": self.outcome, "winner": self.winner, "rule": self.rule,
                "comparisons": [c.to_json() for c in self.comparisons]}


# -- mSPRT ---------------------------------------------------------------------------------------
def _variance(control: ArmCounts, arm: ArmCounts) -> float:
    # Agresti–Caffo: one success and one failure added to each arm, so an arm with no failures
    # (or no successes) does not claim zero variance
    pa = (control.successes + 1) / (control.trials + 2)
    pb = (arm.successes + 1) / (arm.trials + 2)
    return pa * (1 - pa) / (control.trials + 2) + pb * (1 - pb) / (arm.trials + 2)


def msprt_lambda(effect: float, variance: float, tau2: float) -> float:
    """The mixture likelihood ratio Λ for an estimated effect with the given variance."""
    if variance <= 0:
        return math.inf if effect != 0 else 1.0
    log = 0.5 * math.log(variance / (variance + tau2)) + tau2 * effect * effect / (2 * variance * (variance + tau2))
    return math.exp(min(log, 700.0))


def msprt_interval(effect: float, variance: float, tau2: float, alpha: float) -> tuple[float, float]:
    """The always-valid (1 − α) confidence sequence for the effect at this look."""
    if variance <= 0:
        return effect, effect
    half = math.sqrt(2 * variance * (variance + tau2) / tau2 * (math.log(1 / alpha) + 0.5 * math.log((variance + tau2) / variance)))
    return effect - half, effect + half


def msprt_p_value(control: ArmCounts, arm: ArmCounts, tau2: float, previous: float = 1.0) -> float:
    """The always-valid p-value after this look (``previous``: the one after the last look)."""
    variance = _variance(control, arm)
    return min(previous, 1.0 / max(msprt_lambda(arm.rate - control.rate, variance, tau2), 1e-300))


# -- Bayesian ------------------------------------------------------------------------------------
def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def probability_to_beat(control: ArmCounts, arm: ArmCounts) -> float:
    """P(p_arm > p_control) with Beta(1, 1) priors on both proportions."""
    a_c, b_c = 1 + control.successes, 1 + control.trials - control.successes
    a_t, b_t = 1 + arm.successes, 1 + arm.trials - arm.successes
    whole = all(float(x).is_integer() for x in (a_c, b_c, a_t, b_t))
    if whole and a_t <= _EXACT_LIMIT:
        total = 0.0
        base = _log_beta(a_c, b_c)
        for i in range(int(a_t)):
            total += math.exp(_log_beta(a_c + i, b_c + b_t) - math.log(b_t + i) - _log_beta(1 + i, b_t) - base)
        return min(1.0, max(0.0, total))
    mean_c, mean_t = a_c / (a_c + b_c), a_t / (a_t + b_t)
    var_c = a_c * b_c / ((a_c + b_c) ** 2 * (a_c + b_c + 1))
    var_t = a_t * b_t / ((a_t + b_t) ** 2 * (a_t + b_t + 1))
    return _phi((mean_t - mean_c) / math.sqrt(var_c + var_t))


def _phi(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


# -- the decision ----------------------------------------------------------------------------------
def decide(control: ArmCounts, arms: Sequence[ArmCounts], *, rule: Rule = "msprt", alpha: float = 0.05,
           threshold: float = 0.95, tau2: float | None = None, minimum_effect: float = 0.0, min_samples: int = 1000,
           higher_is_better: bool = True, deadline_passed: bool = False,
           previous_p: dict[str, float] | None = None) -> Decision:
    """Decide between ``control`` and the treatment ``arms`` from their counts now.

    ``previous_p`` carries each arm's always-valid p-value from the last look (msprt takes the
    running minimum). A treatment *wins* when it is significantly better than control by at least
    ``minimum_effect``; control wins when every treatment is significantly worse (or better by less
    than ``minimum_effect``); at the deadline anything else is *inconclusive* and control stays."""
    if tau2 is None:
        tau2 = max(minimum_effect, 0.01) ** 2
    sign = 1.0 if higher_is_better else -1.0
    everyone = (control, *arms)
    short = [a for a in everyone if a.trials < min_samples]
    pooled_s = sum(a.successes for a in everyone)
    pooled_f = sum(a.trials - a.successes for a in everyone)
    if short or min(pooled_s, pooled_f) < MIN_OUTCOMES:
        names = ", ".join(f"{a.name} {a.trials:.0f}" for a in everyone)
        why = (f"below the minimum sample ({min_samples} per arm, ≥ {MIN_OUTCOMES} successes and failures in all): "
               f"{names}")
        if deadline_passed:
            return Decision("inconclusive", None, f"deadline reached {why}; control {control.name} kept")
        return Decision("running", None, why)
    level = alpha / max(1, len(arms))
    comparisons = []
    for arm in arms:
        effect = arm.rate - control.rate
        if rule == "msprt":
            p = msprt_p_value(control, arm, tau2, (previous_p or {}).get(arm.name, 1.0))
            low, high = msprt_interval(effect, _variance(control, arm), tau2, level)
            significant = p <= level
            prob = None
        else:
            prob = probability_to_beat(control, arm)
            beat = prob if higher_is_better else 1 - prob
            significant = beat >= threshold or beat <= 1 - threshold
            p = None
            sd = math.sqrt(_variance(control, arm))
            low, high = effect - 1.959964 * sd, effect + 1.959964 * sd
        directed = sign * effect
        if significant and directed > 0 and abs(effect) >= minimum_effect:
            verdict: Literal["better", "worse", "too-small", "undecided"] = "better"
        elif significant and directed < 0:
            verdict = "worse"
        elif significant:
            verdict = "too-small"
        else:
            verdict = "undecided"
        comparisons.append(Comparison(arm.name, effect, low, high, p, prob, verdict))
    what = (f"always-valid p ≤ {level:.3g} (mSPRT, α {alpha:g}" + (f" / {len(arms)} arms" if len(arms) > 1 else "") + ")"
            if rule == "msprt" else f"P(beats control) ≥ {threshold:g} (Beta(1,1) priors)")
    better = [c for c in comparisons if c.verdict == "better"]
    if better:
        best = max(better, key=lambda c: sign * c.effect)
        return Decision("decided", best.arm, f"{best.arm} beats {control.name} by {best.effect:+.4g} "
                                             f"[{best.low:+.4g}, {best.high:+.4g}]: {what}", tuple(comparisons))
    if all(c.verdict in ("worse", "too-small") for c in comparisons):
        return Decision("decided", control.name, f"no arm beats {control.name} by {minimum_effect:g} or more: {what}",
                        tuple(comparisons))
    if deadline_passed:
        return Decision("inconclusive", None, f"deadline reached without {what}; control {control.name} kept",
                        tuple(comparisons))
    return Decision("running", None, f"not yet: {what}", tuple(comparisons))
