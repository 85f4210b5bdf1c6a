"""Simulated A/B experiments through the controller's decision (reconciler/experiment/stats.py).

Arms get requests in batches (`--batch` per arm per look, a look after every batch: continuous
monitoring), each request a success with its arm's probability; a run ends when the rule decides or
the maximum sample per arm is reached. Prints, per rule:

* the observed false-positive rate with no difference (share of runs that decide anything; should
  stay under α for msprt — the Bayesian rule gives no such guarantee, and this measures it);
* for a stated effect, the power (share of runs that pick the better arm within the bound) and the
  median samples per arm to that decision;
* for comparison, a fixed-horizon two-proportion z-test looked at after every batch (what peeking
  at a classical test does to the false-positive rate).

The last line is a JSON object of the figures.

    .venv/bin/python bench/experiment.py --runs 400
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reconciler.experiment.stats import ArmCounts, decide  # noqa: E402


def one_run(rng: random.Random, p_control: float, p_arm: float, rule: str, args: argparse.Namespace) -> tuple[str | None, int]:
    r = rng.random
    sc = sa = n = 0
    previous: dict[str, float] = {}
    while True:
        sc += sum(r() < p_control for _ in range(args.batch))
        sa += sum(r() < p_arm for _ in range(args.batch))
        n += args.batch
        if rule == "peeking-z":
            pooled = (sc + sa) / (2 * n)
            se = math.sqrt(max(pooled * (1 - pooled) * 2 / n, 1e-12))
            if n >= args.min_samples and abs((sa - sc) / n / se) > 1.959964:
                return ("arm" if sa > sc else "control"), n
            if n >= args.max_per_arm:
                return None, n
            continue
        d = decide(ArmCounts("control", sc, n), [ArmCounts("arm", sa, n)], rule=rule, alpha=args.alpha,
                   threshold=args.threshold, min_samples=args.min_samples, deadline_passed=n >= args.max_per_arm,
                   previous_p=previous, tau2=args.effect ** 2)
        previous = {c.arm: c.p_value for c in d.comparisons if c.p_value is not None}
        if d.outcome != "running":
            return d.winner, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=400, help="Simulated experiments per case.")
    ap.add_argument("--base", type=float, default=0.95, help="Success rate of control.")
    ap.add_argument("--effect", type=float, default=0.02, help="Absolute improvement of the better arm.")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--threshold", type=float, default=0.95, help="Probability to beat control (bayesian).")
    ap.add_argument("--batch", type=int, default=100, help="Requests per arm between two looks.")
    ap.add_argument("--min-samples", type=int, default=200)
    ap.add_argument("--max-per-arm", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()

    figures: dict[str, object] = {"runs": args.runs, "base": args.base, "effect": args.effect, "alpha": args.alpha,
                                  "batch": args.batch, "maxPerArm": args.max_per_arm}
    for rule in ("msprt", "bayesian", "peeking-z"):
        rng = random.Random(args.seed)
        null = [one_run(rng, args.base, args.base, rule, args) for _ in range(args.runs)]
        fpr = sum(1 for w, _ in null if w is not None) / args.runs
        rng = random.Random(args.seed + 1)
        alt = [one_run(rng, args.base, args.base + args.effect, rule, args) for _ in range(args.runs)]
        found = [n for w, n in alt if w == "arm"]
        power = len(found) / args.runs
        wrong = sum(1 for w, _ in alt if w == "control") / args.runs
        median = statistics.median(found) if found else None
        print(f"{rule:>9}: false-positive rate {fpr:.3f} (α {args.alpha}); effect {args.effect:+g}: power {power:.3f}, "
              f"wrong winner {wrong:.3f}, median samples per arm to decide {median}")
        figures[rule] = {"falsePositiveRate": fpr, "power": power, "wrongWinner": wrong, "medianSamplesPerArm": median}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
