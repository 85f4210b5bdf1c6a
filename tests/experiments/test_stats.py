"""The experiment statistics against known cases and by simulation (fixed seeds).

A simulated run: two arms get requests in batches of 100 per arm, each request a success with its
arm's probability; `decide` looks after every batch (continuous monitoring) until it decides or
the deadline (a maximum sample) passes. Under no difference the share of runs that decide
anything is the false-positive rate; it must stay under α. With a real difference the better arm
must be found, within the bound.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from reconciler.experiment.stats import ArmCounts, decide, msprt_interval, msprt_lambda, probability_to_beat


def simulate(p_control: float, p_arm: float, *, runs: int, seed: int, rule: str = "msprt", alpha: float = 0.05,
             batch: int = 100, max_per_arm: int = 5000, min_samples: int = 200, minimum_effect: float = 0.0,
             threshold: float = 0.95) -> list[tuple[str, str | None, int]]:
    """(outcome, winner, samples per arm at the end) of each simulated run."""
    rng = random.Random(seed)
    r = rng.random
    results = []
    for _ in range(runs):
        sc = sa = n = 0
        previous: dict[str, float] = {}
        decision = None
        while True:
            sc += sum(r() < p_control for _ in range(batch))
            sa += sum(r() < p_arm for _ in range(batch))
            n += batch
            deadline = n >= max_per_arm
            decision = decide(ArmCounts("control", sc, n), [ArmCounts("arm", sa, n)], rule=rule, alpha=alpha,
                              threshold=threshold, min_samples=min_samples, minimum_effect=minimum_effect,
                              deadline_passed=deadline, previous_p=previous)
            previous = {c.arm: c.p_value for c in decision.comparisons if c.p_value is not None}
            if decision.outcome != "running":
                break
        results.append((decision.outcome, decision.winner, n))
    return results


def test_no_difference_false_positive_rate_stays_under_alpha() -> None:
    alpha = 0.05
    runs = simulate(0.9, 0.9, runs=300, seed=11, alpha=alpha)
    decided = sum(1 for outcome, _, _ in runs if outcome == "decided")
    rate = decided / len(runs)
    # looked at 50 times per run; a fixed-horizon z-test peeked at that often exceeds 0.25
    assert rate <= alpha, f"false-positive rate {rate:.3f} > α {alpha}"
    assert all(outcome in ("decided", "inconclusive") for outcome, _, _ in runs)


def test_naive_peeking_would_not_hold_alpha() -> None:
    """The reason for a sequential test: a two-proportion z-test at 1.96 looked at after every
    batch declares a difference between identical arms far more often than 5 %."""
    rng = random.Random(5)
    r = rng.random
    hits = 0
    for _ in range(200):
        sc = sa = n = 0
        while n < 5000:
            sc += sum(r() < 0.9 for _ in range(100))
            sa += sum(r() < 0.9 for _ in range(100))
            n += 100
            pa, pb = sc / n, sa / n
            pooled = (sc + sa) / (2 * n)
            z = (pb - pa) / math.sqrt(pooled * (1 - pooled) * 2 / n)
            if n >= 200 and abs(z) > 1.96:
                hits += 1
                break
    assert hits / 200 > 0.15


def test_a_real_difference_is_found_within_the_bound() -> None:
    # the arm fails 2 % of requests more often: 0.97 vs 0.95 success
    runs = simulate(0.95, 0.97, runs=60, seed=3, max_per_arm=10000)
    winners = [w for outcome, w, _ in runs if outcome == "decided"]
    power = sum(1 for w in winners if w == "arm") / len(runs)
    assert power >= 0.8, f"found the better arm in {power:.0%} of runs"
    assert "control" not in winners  # never the worse one
    samples = statistics.median(n for outcome, w, n in runs if w == "arm")
    assert samples < 10000


def test_a_worse_arm_makes_control_win() -> None:
    runs = simulate(0.97, 0.90, runs=30, seed=4)
    assert all(outcome == "decided" and w == "control" for outcome, w, _ in runs)


def test_an_effect_below_the_minimum_keeps_control() -> None:
    decision = decide(ArmCounts("c", 90_000, 100_000), [ArmCounts("t", 90_500, 100_000)], minimum_effect=0.01)
    assert decision.outcome == "decided" and decision.winner == "c"
    assert decision.comparisons[0].verdict == "too-small"


def test_below_the_minimum_sample_nothing_is_decided() -> None:
    decision = decide(ArmCounts("c", 10, 500), [ArmCounts("t", 490, 500)], min_samples=1000)
    assert decision.outcome == "running" and "minimum sample" in decision.rule
    late = decide(ArmCounts("c", 10, 500), [ArmCounts("t", 490, 500)], min_samples=1000, deadline_passed=True)
    assert late.outcome == "inconclusive" and late.winner is None


def test_inconclusive_at_the_deadline_keeps_control() -> None:
    decision = decide(ArmCounts("c", 900, 1000), [ArmCounts("t", 905, 1000)], deadline_passed=True)
    assert decision.outcome == "inconclusive" and decision.winner is None and "kept" in decision.rule


def test_lower_is_better() -> None:
    decision = decide(ArmCounts("c", 300, 2000), [ArmCounts("t", 150, 2000)], higher_is_better=False)
    assert decision.winner == "t"


def test_msprt_known_values() -> None:
    # Λ = sqrt(V/(V+τ²)) · exp(τ²θ²/(2V(V+τ²))), by hand: V = 1e-4, τ² = 1e-4, θ = 0.03
    assert msprt_lambda(0.03, 1e-4, 1e-4) == pytest.approx(math.sqrt(0.5) * math.exp(1e-4 * 9e-4 / (2 * 1e-4 * 2e-4)))
    # θ = 0 → Λ < 1: no evidence
    assert msprt_lambda(0.0, 1e-4, 1e-4) < 1
    # the interval excludes 0 exactly when Λ ≥ 1/α
    for theta in (0.01, 0.02, 0.03, 0.04, 0.05):
        low, high = msprt_interval(theta, 1e-4, 1e-4, 0.05)
        assert (low > 0) == (msprt_lambda(theta, 1e-4, 1e-4) >= 20)


def test_probability_to_beat_exact_against_monte_carlo() -> None:
    rng = random.Random(9)
    for (sa, na), (sb, nb) in [((40, 100), (50, 100)), ((5, 20), (3, 20)), ((300, 1000), (330, 1000))]:
        exact = probability_to_beat(ArmCounts("a", sa, na), ArmCounts("b", sb, nb))
        draws = 40_000
        mc = sum(rng.betavariate(1 + sb, 1 + nb - sb) > rng.betavariate(1 + sa, 1 + na - sa) for _ in range(draws)) / draws
        assert exact == pytest.approx(mc, abs=0.01)
    # symmetric case: one half
    assert probability_to_beat(ArmCounts("a", 50, 100), ArmCounts("b", 50, 100)) == pytest.approx(0.5, abs=1e-9)
    # large counts: the normal approximation path agrees with the exact one at the boundary
    big_exact = probability_to_beat(ArmCounts("a", 4900, 10000), ArmCounts("b", 4990, 10000))
    big_approx = probability_to_beat(ArmCounts("a", 4900.5, 10000), ArmCounts("b", 4990.5, 10000))  # non-integers: approx
    assert big_exact == pytest.approx(big_approx, abs=0.01)


def test_bayesian_finds_a_real_difference() -> None:
    runs = simulate(0.95, 0.97, runs=30, seed=8, rule="bayesian", max_per_arm=10000)
    assert sum(1 for _, w, _ in runs if w == "arm") / len(runs) >= 0.8


def test_three_arms_bonferroni() -> None:
    control = ArmCounts("c", 9000, 10000)
    decision = decide(control, [ArmCounts("t1", 9000, 10000), ArmCounts("t2", 9300, 10000)])
    assert decision.winner == "t2"
    assert "/ 2 arms" in decision.rule
