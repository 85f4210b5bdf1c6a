#!/usr/bin/env python3
"""Fault drills for `forgectl apply` against a real kube-apiserver + etcd (issue 19).

Each drill is repeated and judged by what a user would check afterwards: a plain rerun of
`forgectl apply` converges (`forgectl plan --detailed-exitcode` then reports no change, so nothing
owned is orphaned, missing or duplicated) and the environment's Lease is released.

* ``kill-apply`` — `forgectl apply` SIGKILLed inside its write phase: once the API server shows
  the environment's Lease held by that apply (it plans, then takes the Lease, then writes), at a
  uniform point of the write phase a full apply was measured to take (issue 35: a kill drawn over
  the whole apply mostly landed before the Lease, where there is nothing to break). Where each kill
  landed is recorded (seconds after the Lease was taken, the fraction of the write phase, whether
  the Lease was still the killed apply's); a kill that found the apply already finished is not a
  run: that apply is verified (the plan has no change) and the kill drawn again. The desired
  state alternates between N endpoints and N/2 (so an apply both creates and prunes). The rerun
  finds the dead holder's Lease: it must be refused *naming that holder* (the wait for its expiry
  is reported per run), and succeed once the Lease has expired.
* ``concurrent-apply`` — two `forgectl apply` started together: exactly one proceeds, the other is
  refused naming the holder.
* ``apiserver-restart`` — the API server is stopped (SIGTERM) at a uniform point of the write phase
  and started again a few seconds later on the same etcd: the apply completes (a one-shot command
  retries a transient failure for 30 s, which bridges the restart) or fails with a clear error
  naming the server, and the next apply converges; where each restart landed is recorded.
* ``etcd-kill`` — etcd SIGKILLed at a uniform point of an apply's write phase (after the Lease) and
  started again a few seconds later on the same data, the API server left running: the apply
  completes or fails with an error naming the cause, and a plain rerun converges.
* ``etcd-nospace`` — etcd out of space at a uniform point of the write phase: its NOSPACE alarm,
  the state etcd enters by itself when its backend reaches the quota (writes refused with
  "database space exceeded", reads served), raised until the apply ends, then disarmed: the apply
  fails naming it, and a rerun converges (waiting out the Lease it could not give back).

Prints a table and, as its LAST line, one JSON object: runs, failures, refusals that named the
holder, the maximum time to converge per fault and where each kill landed; the same object is
written to ``--out`` (default ``bench/results/faults-apply-<date>.json``) with the command.

    .venv/bin/python bench/faults.py                       # 20 / 10 / 5 runs, 40 endpoints
    .venv/bin/python bench/faults.py --kill-runs 3 --concurrent-runs 2 --restart-runs 1 --etcd-kill-runs 1 --etcd-space-runs 1 --n 10

Not covered here (see bench/README.md): the rollout drills (controller killed mid-step, Prometheus
stopped, canary server killed) and the local target's apply (its lock is an flock the kernel
releases when the holder dies; its apply starts training, too heavy to repeat 20 times).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.plan_scale import ENV_NAME, generate_specs  # noqa: E402
from devkit.cluster import Cluster  # noqa: E402

FORGECTL = [sys.executable, "-m", "forgectl"]


def log(msg: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Drill:
    """Figures of one fault, over its runs."""

    name: str
    runs: int = 0
    failures: int = 0
    named_holder: int = 0
    missed: int = 0
    """Faults drawn after the apply had already finished (drawn again; not counted as runs)."""
    converge_s: list[float] = field(default_factory=list)
    outcomes: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: Where each kill landed (kill-apply), one entry per run.
    landed: list[dict[str, Any]] = field(default_factory=list)

    def fail(self, why: str) -> None:
        self.failures += 1
        self.notes.append(why)
        log(f"{self.name}: FAILED: {why}")

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "failures": self.failures, "refusedNamingHolder": self.named_holder,
                "missedDraws": self.missed,
                "maxConvergeS": round(max(self.converge_s), 2) if self.converge_s else None,
                "medianConvergeS": round(sorted(self.converge_s)[len(self.converge_s) // 2], 2) if self.converge_s else None,
                "outcomes": self.outcomes, "notes": self.notes[:5], **({"landed": self.landed} if self.landed else {})}


class Bench:
    """A namespace on the cluster and two spec folders: N endpoints (`full`) and N/2 (`half`)."""

    def __init__(self, cluster: Cluster, work: Path, n: int) -> None:
        self.cluster = cluster
        self.namespace = f"forge-faults-{os.getpid()}"
        self.full, self.half = work / "full", work / "half"
        generate_specs(self.full, n, self.namespace)
        generate_specs(self.half, max(1, n // 2), self.namespace)
        self.span = 3.0  # seconds a full change takes (measured by the kill drill)
        self.write_phase = 2.0  # seconds of it after the Lease is taken (measured by the kill drill)
        self.env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "NO_COLOR": "1", "COLUMNS": "200"}

    def apply_cmd(self, specs: Path) -> list[str]:
        return [*FORGECTL, "apply", str(specs), "--env", ENV_NAME, "--auto-approve"]

    def start_apply(self, specs: Path) -> subprocess.Popen[str]:
        return subprocess.Popen(self.apply_cmd(specs), env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def apply(self, specs: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.apply_cmd(specs), env=self.env, text=True, capture_output=True, timeout=timeout)

    def clean(self, specs: Path) -> tuple[bool, str]:
        """True when the plan against the live state has no change (exit 0 of --detailed-exitcode)."""
        proc = subprocess.run([*FORGECTL, "plan", str(specs), "--env", ENV_NAME, "--detailed-exitcode"],
                              env=self.env, text=True, capture_output=True, timeout=600)
        return proc.returncode == 0, (proc.stdout + proc.stderr)[-600:]

    def lease(self) -> dict[str, Any] | None:
        """The environment's Lease as stored, or None."""
        from kubernetes.client import CoordinationV1Api
        from kubernetes.client.exceptions import ApiException

        try:
            api = CoordinationV1Api(self.cluster.api_client())
            return api.read_namespaced_lease(f"forgectl-{ENV_NAME}", self.namespace).to_dict()
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def holder_pid(self) -> int | None:
        """The PID the Lease's holder names (`user@host:pid`), or None without a Lease."""
        lease = self.lease()
        holder = (lease or {}).get("spec", {}).get("holder_identity") or ""
        match = re.search(r":(\d+)$", holder)
        return int(match.group(1)) if match else None

    def wait_for_lease(self, proc: subprocess.Popen[str], timeout: float = 300) -> float | None:
        """Seconds until ``proc`` held the Lease (polled every 20 ms), or None if it exited first."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.holder_pid() == proc.pid:
                return time.monotonic() - t0
            if proc.poll() is not None:
                return None
            time.sleep(0.02)
        raise TimeoutError(f"apply pid {proc.pid} did not take the Lease within {timeout:.0f} s")

    def lease_expires_in(self) -> float:
        """Seconds until the Lease expires by its own renewTime + leaseDurationSeconds (0 if none)."""
        lease = self.lease()
        if not lease:
            return 0.0
        spec = lease["spec"]
        renewed: datetime = spec.get("renew_time") or spec.get("acquire_time")
        return max(0.0, renewed.timestamp() + int(spec.get("lease_duration_seconds") or 0) - time.time())

    def converge(self, specs: Path, drill: Drill, dead_holder: int | None) -> float | None:
        """Rerun apply until it succeeds (waiting out a dead holder's Lease); the time it took,
        or None (and a failure recorded) when it does not converge."""
        t0 = time.monotonic()
        for _ in range(4):
            proc = self.apply(specs)
            if proc.returncode == 0:
                ok, tail = self.clean(specs)
                if not ok:
                    drill.fail(f"apply succeeded but the plan still has changes: {tail}")
                    return None
                if self.lease() is not None:
                    drill.fail("the Lease was not released after a successful apply")
                    return None
                return time.monotonic() - t0
            message = proc.stderr + proc.stdout
            if "locked by" in message:
                if dead_holder is not None and re.search(rf":{dead_holder}\b", message):
                    drill.named_holder += 1
                elif dead_holder is not None:
                    drill.fail(f"refused without naming the dead holder {dead_holder}: {message[-300:]}")
                    return None
                wait = self.lease_expires_in()
                log(f"{drill.name}: refused while the dead holder's Lease lives; waiting {wait:.0f} s for it to expire")
                if drill.landed:
                    drill.landed[-1]["leftover_lease_wait_s"] = round(wait, 1)
                time.sleep(wait + 0.5)
                continue
            drill.fail(f"rerun failed (exit {proc.returncode}): {message[-400:]}")
            return None
        drill.fail("did not converge in 4 reruns")
        return None


def kill_apply(b: Bench, runs: int, drill: Drill) -> None:
    """SIGKILL `forgectl apply` at a uniform point of its write phase (after it took the Lease),
    record where it landed, then converge."""
    assert b.apply(b.full).returncode == 0
    t0 = time.monotonic()
    proc = b.start_apply(b.half)  # prunes half: one measured full-size change
    planning = b.wait_for_lease(proc)
    proc.communicate(timeout=600)
    assert proc.returncode == 0 and planning is not None, "the measured apply did not take the Lease and finish"
    b.span = time.monotonic() - t0
    writing = b.write_phase = b.span - planning
    log(f"kill-apply: a full change takes {b.span:.1f} s, {planning:.1f} s of it before the Lease is taken; "
        f"killing at a uniform point of the {writing:.1f} s after")
    rng = random.Random(19)
    desired = b.full
    while drill.runs < runs:
        started = _write_phase_point(b, drill, desired, rng)
        if started is None:  # finished before the kill: not a run
            desired = b.half if desired == b.full else b.full
            continue
        proc, held_after, at = started
        drill.runs += 1
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        still_held = b.holder_pid() == proc.pid
        drill.landed.append({"run": drill.runs, "lease_taken_after_s": round(held_after, 2), "killed_after_lease_s": round(at, 2),
                             "fraction_of_write_phase": round(at / writing, 2) if writing > 0 else None,
                             "lease_still_the_killed_apply": still_held})
        log(f"kill-apply run {drill.runs}/{runs}: killed pid {proc.pid} {at:.2f} s after it took the Lease "
            f"({at / writing:.0%} of the write phase; Lease still its own: {still_held})")
        took = b.converge(desired, drill, proc.pid)
        if took is not None:
            drill.converge_s.append(took)
        desired = b.half if desired == b.full else b.full
    drill.outcomes["write_phase_s"] = round(writing, 2)
    thirds = [sum(1 for k in drill.landed if k["fraction_of_write_phase"] is not None and lo <= k["fraction_of_write_phase"] < hi)
              for lo, hi in ((0, 1 / 3), (1 / 3, 2 / 3), (2 / 3, 1.01))]
    drill.outcomes["landed_in_thirds_of_write_phase"] = thirds


def concurrent_apply(b: Bench, runs: int, drill: Drill) -> None:
    """Two applies at once: exactly one proceeds, the other is refused naming the holder."""
    desired = b.full if b.clean(b.half)[0] else b.half
    for i in range(runs):
        drill.runs += 1
        t0 = time.monotonic()
        procs = [b.start_apply(desired), b.start_apply(desired)]
        outs = [p.communicate(timeout=600) for p in procs]
        codes = [p.returncode for p in procs]
        winners = [k for k, c in enumerate(codes) if c == 0]
        if len(winners) != 1:
            drill.fail(f"run {i + 1}: exits {codes}, expected exactly one success: {[o[1][-200:] for o in outs]}")
        else:
            loser = 1 - winners[0]
            message = outs[loser][1] + outs[loser][0]
            if "locked by" in message and re.search(rf":{procs[winners[0]].pid}\b", message):
                drill.named_holder += 1
                ok, tail = b.clean(desired)
                if ok:
                    drill.converge_s.append(time.monotonic() - t0)
                else:
                    drill.fail(f"run {i + 1}: the winner's apply left changes: {tail}")
            else:
                drill.fail(f"run {i + 1}: the loser was not refused naming pid {procs[winners[0]].pid}: {message[-300:]}")
        log(f"concurrent-apply run {i + 1}/{runs}: exits {codes}")
        desired = b.half if desired == b.full else b.full


def apiserver_restart(b: Bench, runs: int, drill: Drill, down_s: float, at: float | None = None) -> None:
    """The API server stopped (SIGTERM) inside an apply's write phase and started again ``down_s``
    later on the same etcd: a one-shot apply's retry window (``ONE_SHOT_RETRY_SECONDS``) bridges
    the restart, or the apply fails naming the server; a rerun converges."""
    _write_phase_fault(b, runs, drill, lambda: b.cluster.restart_apiserver(down_seconds=down_s), lambda: None,
                       lambda text: b.cluster.server in text or "did not answer" in text, seed=7, at=at)


def _write_phase_point(b: Bench, drill: Drill, desired: Path, rng: random.Random, at: float | None = None
                       ) -> tuple[subprocess.Popen[str], float, float] | None:
    """Start an apply of ``desired`` and wait until a uniform point of its write phase (after it
    took the Lease), or ``at`` seconds into it: the running apply, when it took the Lease and where
    in the phase it is; None (a missed draw, the finished apply verified) when it finished first."""
    proc = b.start_apply(desired)
    held_after = b.wait_for_lease(proc)
    at = rng.uniform(0.0, b.write_phase) if at is None else at
    if held_after is not None:
        time.sleep(at)
    if held_after is None or proc.poll() is not None:
        drill.missed += 1
        proc.communicate()
        ok, tail = b.clean(desired)
        if proc.returncode != 0 or not ok:
            drill.fail(f"an apply that finished before its fault left changes (exit {proc.returncode}): {tail}")
        return None
    return proc, held_after, at


def _write_phase_fault(b: Bench, runs: int, drill: Drill, fault: Callable[[], None], recover: Callable[[], None],
                clear: Callable[[str], bool], seed: int, at: float | None = None) -> None:
    """One fault (of etcd or the API server) per run at a uniform point of an apply's write phase: the apply completes or
    fails with an error that names the cause (``clear``); nothing moves while writes fail; after
    ``recover`` a plain rerun converges (waiting out the failed apply's Lease when it could not give
    it back, as after a kill). ``at``: the fault that many seconds into the write phase, not drawn."""
    desired = b.full if b.clean(b.half)[0] else b.half
    rng = random.Random(seed)
    while drill.runs < runs:
        started = _write_phase_point(b, drill, desired, rng, at)
        if started is None:
            desired = b.half if desired == b.full else b.full
            continue
        proc, held_after, landed = started
        drill.runs += 1
        fault()
        out, err = proc.communicate(timeout=600)
        recover()
        if proc.returncode == 0:
            outcome = "completed"
        elif clear(err + out):
            outcome = "failed clearly"
        else:
            drill.fail(f"run {drill.runs}: the apply failed without naming the cause: {(err + out)[-400:]}")
            outcome = "failed unclearly"
        error = next((line.strip() for line in err.splitlines() if line.strip()), "") if proc.returncode else ""
        drill.landed.append({"run": drill.runs, "lease_taken_after_s": round(held_after, 2), "fault_after_lease_s": round(landed, 2),
                             "fraction_of_write_phase": round(landed / b.write_phase, 2), "outcome": outcome,
                             # out of space, etcd still takes deletes: a shrinking apply (prunes only) may complete
                             "apply": "creates" if desired == b.full else "prunes",
                             "error": error[:240]})
        drill.outcomes[outcome] = drill.outcomes.get(outcome, 0) + 1
        took = b.converge(desired, drill, proc.pid if proc.returncode else None)
        if took is not None:
            drill.converge_s.append(took)
        log(f"{drill.name} run {drill.runs}/{runs}: fault {landed:.2f} s into the write phase; the apply {outcome}; "
            f"converged in {took} s")
        desired = b.half if desired == b.full else b.full


def etcd_kill(b: Bench, runs: int, drill: Drill, down_s: float, at: float | None = None) -> None:
    """etcd SIGKILLed inside an apply's write phase and started again ``down_s`` later (same data,
    the API server left running)."""
    _write_phase_fault(b, runs, drill, lambda: b.cluster.restart_etcd(down_seconds=down_s), lambda: None,
                lambda text: any(k in text for k in ("(etcd) did not answer", "etcdserver", "did not answer", b.cluster.server)),
                seed=35, at=at)


def etcd_nospace(b: Bench, runs: int, drill: Drill, at: float | None = None) -> None:
    """etcd out of space inside an apply's write phase: its NOSPACE alarm raised (writes refused,
    reads served) until the apply has ended, then disarmed, as an operator does after compacting
    or raising the quota (`etcdctl alarm disarm`)."""
    def recover() -> None:
        drill.outcomes.setdefault("alarms_disarmed", []).append(b.cluster.disarm_etcd_alarms())

    _write_phase_fault(b, runs, drill, b.cluster.raise_etcd_nospace, recover,
                lambda text: "etcd is out of space" in text, seed=36, at=at)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=40, help="endpoints in the full spec set (default 40)")
    ap.add_argument("--kill-runs", type=int, default=20)
    ap.add_argument("--concurrent-runs", type=int, default=10)
    ap.add_argument("--restart-runs", type=int, default=5)
    ap.add_argument("--etcd-kill-runs", type=int, default=3)
    ap.add_argument("--etcd-space-runs", type=int, default=3)
    ap.add_argument("--down-seconds", type=float, default=3.0, help="how long the API server (or etcd) stays down")
    ap.add_argument("--out", type=Path, default=None, help="result file (default bench/results/faults-apply-<date>.json)")
    args = ap.parse_args()

    started = time.monotonic()
    cluster = Cluster.start(Path(tempfile.mkdtemp(prefix="forge-faults-")), die_with_parent=True, log=log)
    drills = {name: Drill(name) for name in ("kill-apply", "concurrent-apply", "apiserver-restart", "etcd-kill", "etcd-nospace")}
    try:
        with tempfile.TemporaryDirectory(prefix="forge-faults-specs-") as tmp:
            b = Bench(cluster, Path(tmp), args.n)
            kill_apply(b, args.kill_runs, drills["kill-apply"])
            concurrent_apply(b, args.concurrent_runs, drills["concurrent-apply"])
            apiserver_restart(b, args.restart_runs, drills["apiserver-restart"], args.down_seconds)
            etcd_kill(b, args.etcd_kill_runs, drills["etcd-kill"], args.down_seconds)
            etcd_nospace(b, args.etcd_space_runs, drills["etcd-nospace"])
    finally:
        cluster.stop(quiet=True)
    print(f"{'fault':<20} {'runs':>5} {'failed':>7} {'named holder':>13} {'max converge':>13}")
    for d in drills.values():
        j = d.to_json()
        mx = f"{j['maxConvergeS']:.1f} s" if j["maxConvergeS"] is not None else "-"
        print(f"{d.name:<20} {d.runs:>5} {d.failures:>7} {d.named_holder:>13} {mx:>13}")
    result = {"target": "kubernetes", "endpoints": args.n, "at": datetime.now(UTC).isoformat(timespec="seconds"),
              "seconds": round(time.monotonic() - started, 1), "command": " ".join(["bench/faults.py", *sys.argv[1:]]),
              "faults": {k: d.to_json() for k, d in drills.items()}}
    path = args.out or REPO / "bench" / "results" / f"faults-apply-{time.strftime('%Y-%m-%d')}.json"
    path.write_text(json.dumps(result) + "\n")
    log(f"wrote {path}")
    print(json.dumps(result))
    return 0 if all(d.failures == 0 for d in drills.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
