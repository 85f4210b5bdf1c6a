#!/usr/bin/env python3
"""Benchmark: a pull request's plan (`forgectl plan --base BASE --head HEAD`) at scale, this checkout
against a baseline revision of Forge, side by side.

For each N (default 1,000 and 10,000) it

1. writes N Models and N Endpoints, one file each, plus an Environment (target kubernetes), a
   Dataset, a Compute and a RolloutPolicy — `bench/plan_scale.py`'s specs — into a fresh git
   repository and commits them (the base), then changes `learningRate` of 1 % of the models and
   commits again (the head);
2. runs `forgectl plan --base HEAD~1 --head HEAD` from that repository with each Forge — the
   baseline (`--baseline REV`: that revision's tree, `git archive`d into a temporary folder and
   put first on `PYTHONPATH`) and this checkout — with the same interpreter and dependencies, each
   with its own `$FORGE_CACHE`:
   * once with an empty cache (**cold**: a CI runner that keeps nothing),
   * `--repeats` times with the cache the runs before left (**warm**: a runner that keeps
     `~/.cache/forge`, or a second push to the same pull request),
   * once more warm with `-o json`;
   the two Forges' runs interleaved (the order alternating), so a busier moment of a shared machine
   hits both;
3. checks that both print the same plan (the text byte for byte, the JSON equal once parsed).

No cluster is reached: `KUBECONFIG` names a file that does not exist, so the plan says "no live
diff" after its git part (the part every pull request pays). Each run is a child process measured
with `os.wait4`: wall time, CPU time (user + sys) and peak RSS.

Prints a table per N, then as its LAST line one JSON object: every run's figures, and per N the
candidate/baseline ratios of the medians (< 1: faster or smaller).

    .venv/bin/python bench/plan_pr.py --baseline 1b59567                 # N = 1000, 10000
    .venv/bin/python bench/plan_pr.py --baseline 1b59567 --n 500 --repeats 1
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import plan_scale  # noqa: E402  (the specs and the change, shared with the live-plan bench)

from devkit.gitserver import git  # noqa: E402

log = partial(plan_scale.log, bench="plan_pr")

MODES = ("cold", "warm", "json")


@dataclass
class Run:
    """One `forgectl plan --base` child process."""

    n: int
    side: str
    mode: str
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    output_bytes: int




def spec_repository(root: Path, n: int) -> Path:
    """A repository whose HEAD~1 holds the N-endpoint specs and HEAD changes 1 % of the models."""
    repo = root / f"specs-{n}"
    plan_scale.generate_specs(repo, n, "forge-bench")
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "base", cwd=repo)
    plan_scale.change_models(repo, plan_scale.changed_indices(n, 1.0))
    git("commit", "-qam", "1 % of the models' learningRate", cwd=repo)
    return repo


def baseline_tree(rev: str, root: Path) -> Path:
    """The Python packages of Forge at ``rev`` (this repository's history), unpacked."""
    data = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev], check=True,
                          capture_output=True).stdout
    folder = root / "baseline"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def run_plan(n: int, side: str, mode: str, code: Path, cache: Path, repo: Path, out: Path) -> Run:
    """One plan of ``repo``'s last commit against the one before, by the Forge in ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code), "FORGE_CACHE": str(cache),
           "KUBECONFIG": str(repo.parent / "no-such-kubeconfig"), "COLUMNS": "120"}
    cmd = [sys.executable, "-m", "forgectl", "plan", "--base", "HEAD~1", "--head", "HEAD"]
    if mode == "json":
        cmd += ["-o", "json"]
    with out.open("wb") as stdout, tempfile.TemporaryFile() as stderr:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            stderr.seek(0)
            raise SystemExit(f"{side} {mode} at N={n}: {' '.join(cmd)} failed:\n{stderr.read()[-3000:].decode()}")
    return Run(n, side, mode, round(wall, 3), round(usage.ru_utime + usage.ru_stime, 3),
               round(usage.ru_maxrss / 1024, 1), out.stat().st_size)


def same_json(a: Path, b: Path) -> bool:
    """Whether two plan JSON files are equal once parsed (in a child: they are hundreds of MB, and a
    large bench process would inflate the next children's peak RSS)."""
    check = "import json,sys; sys.exit(0 if json.load(open(sys.argv[1])) == json.load(open(sys.argv[2])) else 1)"
    return subprocess.run([sys.executable, "-c", check, str(a), str(b)]).returncode == 0


def bench_n(n: int, repeats: int, sides: dict[str, Path], work: Path) -> tuple[list[Run], dict[str, bool]]:
    repo = spec_repository(work, n)
    caches = {side: work / f"cache-{side}-{n}" for side in sides}
    outputs = {(side, mode): work / f"plan-{side}-{n}-{mode}.out" for side in sides for mode in MODES}
    runs: list[Run] = []
    order = list(sides)
    schedule = [("cold", 0)] + [("warm", i) for i in range(repeats)] + [("json", 0)]
    for i, (mode, _) in enumerate(schedule):
        for side in (order if i % 2 == 0 else order[::-1]):
            run = run_plan(n, side, mode, sides[side], caches[side], repo, outputs[side, mode])
            runs.append(run)
            log(f"N={n} {side:9s} {mode:4s} wall {run.wall_s:7.2f} s  CPU {run.cpu_s:7.2f} s  "
                           f"peak RSS {run.peak_rss_mib:7.0f} MiB  output {run.output_bytes:,} B")
    same = {
        "text": all(outputs["baseline", m].read_bytes() == outputs["candidate", m].read_bytes() for m in ("cold", "warm")),
        "json": same_json(outputs["baseline", "json"], outputs["candidate", "json"]),
    }
    for path in outputs.values():
        path.unlink()
    return runs, same


def medians(runs: list[Run], n: int, side: str, mode: str) -> dict[str, float]:
    chosen = [r for r in runs if r.n == n and r.side == side and r.mode == mode]
    return {k: statistics.median(getattr(r, k) for r in chosen) for k in ("wall_s", "cpu_s", "peak_rss_mib")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="the Forge revision to compare with (a commit of this repository)")
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000], help="endpoints (and models) per run")
    parser.add_argument("--repeats", type=int, default=2, help="warm runs per Forge and N")
    args = parser.parse_args()
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, check=True).stdout.strip())
    result: dict[str, Any] = {"bench": "plan_pr", "baseline": args.baseline, "candidate": head + ("+dirty" if dirty else ""),
                              "uptime_start": plan_scale.uptime(), "runs": [], "same_plan": {}, "ratios": {}}
    with tempfile.TemporaryDirectory(prefix="forge-plan-pr-") as tmp:
        work = Path(tmp)
        sides = {"baseline": baseline_tree(args.baseline, work), "candidate": REPO}
        for n in args.n:
            runs, same = bench_n(n, args.repeats, sides, work)
            result["runs"] += [asdict(r) for r in runs]
            result["same_plan"][str(n)] = same
            ratios: dict[str, dict[str, float]] = {}
            print(f"\nN = {n:,} ({5 * n + 5:,} objects, 1 % of the models changed); medians, candidate / baseline")
            print(f"{'':6s} {'baseline wall / CPU / RSS':>34s} {'candidate wall / CPU / RSS':>34s} {'wall ×':>7s} {'RSS ×':>6s}")
            for mode in MODES:
                b, c = medians(runs, n, "baseline", mode), medians(runs, n, "candidate", mode)
                ratios[mode] = {k: round(c[k] / b[k], 3) for k in b}
                print(f"{mode:6s} {b['wall_s']:9.2f} s {b['cpu_s']:8.2f} s {b['peak_rss_mib']:7.0f} MiB "
                      f"{c['wall_s']:9.2f} s {c['cpu_s']:8.2f} s {c['peak_rss_mib']:7.0f} MiB "
                      f"{ratios[mode]['wall_s']:6.2f}× {ratios[mode]['peak_rss_mib']:5.2f}×")
            print(f"same plan printed by both: text {same['text']}, JSON {same['json']}")
            result["ratios"][str(n)] = ratios
    result["uptime_end"] = plan_scale.uptime()
    print(json.dumps(result))
    return 0 if all(s["text"] and s["json"] for s in result["same_plan"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
