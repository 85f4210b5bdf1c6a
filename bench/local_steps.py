"""bench/local_steps: the quick-start's Workflow on the local target with its steps forked by the
step host (reconciler.targets.local.stephost) beside the same run with each step a fresh
interpreter (``FORGE_STEP_HOST=off``), side by side on one machine.

    .venv/bin/python bench/local_steps.py [--repeats 2] [--out FILE]

Each run is a fresh copy of examples/quickstart in a git repository: ``forgectl apply
--auto-approve`` (the eight steps of its Workflow run, nothing cached; the endpoint's servers start)
and ``forgectl down``. The two ways alternate (off, on, off, on, …), so a change in the machine's
load falls on both. Measured: the apply's wall time and the CPU time of ``forgectl`` and every
process it waited for (its steps, the host and the host's children: ``wait4``'s rusage; the model
servers it leaves running are not in it), and the train step's own wall time from its log.

Last line, JSON: ``{"runs": [{"stepHost", "wallSeconds", "cpuSeconds"}, …], "off": {…medians},
"on": {…}, "cpuRatio", "wallRatio"}`` (on / off).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORGECTL = [sys.executable, "-m", "forgectl"]


def _repo(folder: Path) -> Path:
    repo = folder / "repo"
    shutil.copytree(ROOT / "examples" / "quickstart", repo / "specs")
    for args in (["init", "-q"], ["add", "specs"], ["-c", "user.name=bench", "-c", "user.email=bench@example.com",
                                                     "commit", "-qm", "quickstart"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    return repo


def one_run(step_host: bool) -> dict[str, object]:
    """Apply the quick-start in a fresh repository and bring it down; the apply's figures."""
    folder = Path(tempfile.mkdtemp(prefix="forge-bench-steps-"))
    try:
        repo = _repo(folder)
        env = {**os.environ, "FORGE_STEP_HOST": "on" if step_host else "off", "NO_COLOR": "1"}
        started = time.monotonic()
        proc = subprocess.Popen([*FORGECTL, "apply", "specs", "--auto-approve"], cwd=repo, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        output = proc.stdout.read().decode(errors="replace")
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - started
        subprocess.run([*FORGECTL, "down", "specs"], cwd=repo, env=env, capture_output=True, timeout=120)
        if proc.returncode != 0:
            raise SystemExit(f"forgectl apply exited {proc.returncode}:\n{output[-3000:]}")
        return {"stepHost": step_host, "wallSeconds": round(wall, 2),
                "cpuSeconds": round(usage.ru_utime + usage.ru_stime, 2)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _medians(runs: list[dict[str, object]], step_host: bool) -> dict[str, float]:
    mine = [r for r in runs if r["stepHost"] is step_host]
    return {key: round(statistics.median(float(str(r[key])) for r in mine), 2) for key in ("wallSeconds", "cpuSeconds")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each way (alternating)")
    parser.add_argument("--out", type=Path, help="also write the result here")
    args = parser.parse_args()
    runs = []
    for i in range(args.repeats):
        for step_host in (False, True):
            run = one_run(step_host)
            runs.append(run)
            print(f"[{i + 1}/{args.repeats}] step host {'on ' if step_host else 'off'}: apply {run['wallSeconds']} s, "
                  f"CPU {run['cpuSeconds']} s", file=sys.stderr, flush=True)
    off, on = _medians(runs, False), _medians(runs, True)
    result = {"bench": "local_steps", "cpus": os.cpu_count(), "loadAverage": os.getloadavg()[0], "runs": runs,
              "off": off, "on": on, "cpuRatio": round(on["cpuSeconds"] / off["cpuSeconds"], 3),
              "wallRatio": round(on["wallSeconds"] / off["wallSeconds"], 3)}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
