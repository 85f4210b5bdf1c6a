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

Twice (issue 35): with the settings *tuned* to the stated effect (`--min-samples`, mixing variance
τ² = effect², the command line's α and threshold) and with the *product's defaults* — what an
Experiment that sets nothing decides with, read from its spec (`minSamplesPerArm` 1000, τ² =
(`minimumEffect` or 0.01)², α 0.05, `probabilityToBeat` 0.95). The last line is a JSON object of
the figures, also written to ``--out`` (default ``bench/results/experiment-<date>.json``) with the
command.

    .venv/bin/python bench/experiment.py --runs 400
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reconciler.experiment.stats import ArmCounts, decide  # noqa: E402
from specs.experiment import Decision, Experiment  # noqa: E402


@dataclass(frozen=True)
class Settings:
    """What the decision is made with: the minimum sample per arm, msprt's mixing variance (None:
    the product's default from ``minimum_effect``), α, the Bayesian threshold."""

    min_samples: int
    tau2: float | None
    alpha: float
    threshold: float
    minimum_effect: float = 0.0


def product_defaults() -> Settings:
    """The settings of an Experiment that states none, as its spec's defaults give them."""
    decision = Decision()
    return Settings(min_samples=Experiment.model_fields["min_samples_per_arm"].default, tau2=decision.mixture_variance,
                    alpha=decision.alpha, threshold=decision.probability_to_beat, minimum_effect=decision.minimum_effect)


def one_run(rng: random.Random, p_control: float, p_arm: float, rule: str, args: argparse.Namespace,
            settings: Settings) -> tuple[str | None, int]:
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
            if n >= settings.min_samples and abs((sa - sc) / n / se) > 1.959964:
                return ("arm" if sa > sc else "control"), n
            if n >= args.max_per_arm:
                return None, n
            continue
        d = decide(ArmCounts("control", sc, n), [ArmCounts("arm", sa, n)], rule="msprt" if rule == "msprt" else "bayesian",
                   alpha=settings.alpha,
                   threshold=settings.threshold, min_samples=settings.min_samples, deadline_passed=n >= args.max_per_arm,
                   previous_p=previous, tau2=settings.tau2, minimum_effect=settings.minimum_effect)
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
    ap.add_argument("--out", type=Path, default=None, help="result file (default bench/results/experiment-<date>.json)")
    args = ap.parse_args()

    started = time.monotonic()
    figures: dict[str, object] = {"runs": args.runs, "base": args.base, "effect": args.effect,
                                  "batch": args.batch, "maxPerArm": args.max_per_arm}
    cases = {"tuned": Settings(args.min_samples, args.effect ** 2, args.alpha, args.threshold),
             "defaults": product_defaults()}
    for case, settings in cases.items():
        rows: dict[str, object] = {"settings": asdict(settings)}
        print(f"{case}: {settings}")
        for rule in ("msprt", "bayesian", "peeking-z"):
            rng = random.Random(args.seed)
            null = [one_run(rng, args.base, args.base, rule, args, settings) for _ in range(args.runs)]
            fpr = sum(1 for w, _ in null if w is not None) / args.runs
            rng = random.Random(args.seed + 1)
            alt = [one_run(rng, args.base, args.base + args.effect, rule, args, settings) for _ in range(args.runs)]
            found = [n for w, n in alt if w == "arm"]
            power = len(found) / args.runs
            wrong = sum(1 for w, _ in alt if w == "control") / args.runs
            median = statistics.median(found) if found else None
            print(f"  {rule:>9}: false-positive rate {fpr:.3f} (α {settings.alpha}); effect {args.effect:+g}: power "
                  f"{power:.3f}, wrong winner {wrong:.3f}, median samples per arm to decide {median}")
            rows[rule] = {"falsePositiveRate": fpr, "power": power, "wrongWinner": wrong, "medianSamplesPerArm": median}
        figures[case] = rows
    figures["seconds"] = round(time.monotonic() - started, 1)
    figures["command"] = " ".join(["bench/experiment.py", *sys.argv[1:]])
    path = args.out or REPO / "bench" / "results" / f"experiment-{time.strftime('%Y-%m-%d')}.json"
    path.write_text(json.dumps(figures) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
