"""The simulated day's pure part (bench/queue_day.py does the I/O): the seeded trace of training
jobs, and the arithmetic over what the API server reported — GPU-hours used against available,
idle fraction, wait percentiles per priority, preemptions, makespan — and the table.

No clock, no cluster, no randomness but the seeded :class:`random.Random`: every function here is
a function of its arguments, unit-tested in tests/bench/test_queue_day.py.

Times are simulated hours from the start of a replay (the I/O side divides real seconds by its
``--hour-s``).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

HIGH, LOW = "high", "low"
PRIORITIES = (HIGH, LOW)
#: Forge's PriorityClass of each level (renderers/queues.py WORKLOAD_PRIORITY: 1000 / 100).
PRIORITY_CLASS = {HIGH: "forge-high", LOW: "forge-low"}

#: Succeeded, or stopped by Kueue (preempted / evicted: resubmitted), failed otherwise, or still
#: waiting or running when the replay's time ran out.
SUCCEEDED, PREEMPTED, FAILED, UNFINISHED = "succeeded", "preempted", "failed", "unfinished"


@dataclass(frozen=True)
class Team:
    """A team and its queued pool: ``quota`` GPUs of nominal quota; its burst of work over the
    fraction ``busy`` of the day (outside it, a job now and then)."""

    name: str
    quota: int
    busy: tuple[float, float]


#: Three teams on the node's 8 fake GPUs, busy one after another with short overlaps: while one
#: team is busy the others are mostly idle, which is when borrowing matters.
TEAMS = (Team("a", 4, (0.04, 0.375)), Team("b", 2, (0.29, 0.625)), Team("c", 2, (0.54, 0.875)))
NODE_GPUS = 8
#: A job's GPUs (weight); sizes above the team's quota are folded into the quota: a job larger than
#: the quota could never be admitted without a cohort, so the baseline would never finish it.
SIZES = ((1, 0.5), (2, 0.3), (4, 0.2))
#: A job's duration in hours (equally likely).
HOURS = (0.5, 1.0, 1.5, 2.0, 3.0)
HIGH_SHARE = 0.25
#: During its burst a team offers this many times its quota in GPUs (so its own quota is not enough).
BUSY_LOAD = 1.6
#: Outside its burst, one job per this many hours on average.
IDLE_EVERY_H = 6.0


@dataclass(frozen=True)
class Job:
    """One training job of the trace."""

    id: str
    team: str
    submit_h: float
    gpus: int
    hours: float
    priority: str


def size_weights(quota: int) -> list[tuple[int, float]]:
    """:data:`SIZES` with the sizes above ``quota`` folded into ``quota`` (weights kept)."""
    folded: dict[int, float] = {}
    for size, weight in SIZES:
        key = min(size, quota)
        folded[key] = folded.get(key, 0.0) + weight
    return sorted(folded.items())


def mean_gpu_hours(quota: int) -> float:
    """The expected GPU-hours of one job of a team with ``quota`` (size and duration independent)."""
    sizes = size_weights(quota)
    total = sum(w for _, w in sizes)
    return sum(s * w for s, w in sizes) / total * (sum(HOURS) / len(HOURS))


def poisson_arrivals(rng: random.Random, start_h: float, end_h: float, rate_per_h: float) -> list[float]:
    """Arrival times of a Poisson process of ``rate_per_h`` over [start_h, end_h)."""
    out: list[float] = []
    if rate_per_h <= 0:
        return out
    t = start_h
    while True:
        t += rng.expovariate(rate_per_h)
        if t >= end_h:
            return out
        out.append(t)


def _busy_window(team: Team, day_h: float) -> tuple[float, float]:
    return team.busy[0] * day_h, team.busy[1] * day_h


def team_arrivals(rng: random.Random, team: Team, day_h: float, busy_load: float, idle_every_h: float) -> list[float]:
    """A team's submit times: its burst at ``busy_load`` × quota GPUs offered, a job every
    ``idle_every_h`` hours on average outside it; sorted."""
    lo, hi = _busy_window(team, day_h)
    busy_rate = busy_load * team.quota / mean_gpu_hours(team.quota)
    idle_rate = 1.0 / idle_every_h if idle_every_h > 0 else 0.0
    times = poisson_arrivals(rng, lo, hi, busy_rate)
    times += poisson_arrivals(rng, 0.0, lo, idle_rate) + poisson_arrivals(rng, hi, day_h, idle_rate)
    return sorted(times)


def _pick(rng: random.Random, weighted: Sequence[tuple[int, float]]) -> int:
    return rng.choices([v for v, _ in weighted], weights=[w for _, w in weighted])[0]


def make_trace(seed: int, teams: Sequence[Team] = TEAMS, day_h: float = 24.0, *, busy_load: float = BUSY_LOAD,
               idle_every_h: float = IDLE_EVERY_H, high_share: float = HIGH_SHARE) -> list[Job]:
    """The day's jobs, sorted by submit time: per team, bursty Poisson arrivals
    (:func:`team_arrivals`), each job's GPUs from :func:`size_weights`, its duration from
    :data:`HOURS` (at most what is left of the day, at least half an hour), ``high_share`` of them
    high priority. The same ``seed`` gives the same trace."""
    rng = random.Random(seed)
    jobs: list[Job] = []
    for team in teams:
        for i, t in enumerate(team_arrivals(rng, team, day_h, busy_load, idle_every_h)):
            gpus = _pick(rng, size_weights(team.quota))
            hours = rng.choice(HOURS)
            priority = HIGH if rng.random() < high_share else LOW
            jobs.append(Job(f"{team.name}-{i:03d}", team.name, round(t, 3), gpus, hours, priority))
    return sorted(jobs, key=lambda j: (j.submit_h, j.id))


def trace_summary(jobs: Sequence[Job], gpus: int = NODE_GPUS, day_h: float = 24.0) -> dict[str, Any]:
    """What the trace asks for: jobs, GPU-hours demanded (and as a fraction of the day's capacity),
    per team and priority."""
    demand = sum(j.gpus * j.hours for j in jobs)
    return {
        "jobs": len(jobs), "high": sum(j.priority == HIGH for j in jobs), "low": sum(j.priority == LOW for j in jobs),
        "by_size": {str(k): v for k, v in sorted(Counter(j.gpus for j in jobs).items())},
        "gpu_hours_demanded": round(demand, 2), "offered_load": round(demand / (gpus * day_h), 3),
        "by_team": {t: {"jobs": sum(j.team == t for j in jobs),
                        "gpu_hours": round(sum(j.gpus * j.hours for j in jobs if j.team == t), 2)}
                    for t in sorted({j.team for j in jobs})},
    }


# -- what a replay observed ------------------------------------------------------------------------


@dataclass
class Attempt:
    """One pod of a job (a preempted job's retry is a new attempt), in hours from the replay's
    start: created, its Workload first seen admitted, its pod first seen running, first seen ended."""

    pod: str
    submitted_h: float
    seconds: int
    work_h: float | None = None  # the work it was asked to do (its sleep), in hours
    admitted_h: float | None = None
    running_h: float | None = None
    ended_h: float | None = None
    outcome: str | None = None
    reason: str | None = None

    def worked_until(self, end_h: float) -> float | None:
        """When its pod stopped working: ended (or ``end_h`` while it has not), but no later than
        its start + ``work_h`` (the node reports a pod's end a little after its sleep ends; that lag
        is quota held, not GPU time used); None when it never ran."""
        if self.running_h is None:
            return None
        end = self.ended_h if self.ended_h is not None else end_h
        return end if self.work_h is None else min(end, self.running_h + self.work_h)

    def ran_h(self) -> float:
        """Hours its pod worked (0 when it never ran or has not ended)."""
        until = self.worked_until(self.ended_h) if self.ended_h is not None else None
        return 0.0 if until is None or self.running_h is None else max(0.0, until - self.running_h)


@dataclass
class JobRecord:
    """A job of the trace and its attempts, in order."""

    job: Job
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        """The last attempt's outcome (:data:`UNFINISHED` while it has none)."""
        return (self.attempts[-1].outcome if self.attempts else None) or UNFINISHED

    def wait_h(self) -> float | None:
        """Submit → its first attempt admitted (None: never admitted)."""
        first = self.attempts[0] if self.attempts else None
        if first is None or first.admitted_h is None:
            return None
        return max(0.0, first.admitted_h - self.job.submit_h)

    def requeued_wait_h(self) -> float:
        """Hours its retries waited for admission again after preemptions."""
        return sum(max(0.0, (a.admitted_h if a.admitted_h is not None else a.submitted_h) - a.submitted_h)
                   for a in self.attempts[1:])

    def remaining_h(self) -> float:
        """Hours of work left: its duration less what its attempts ran (a retry resumes from the
        checkpoint, as Forge's train step does; checkpoint granularity not modelled)."""
        return max(0.0, self.job.hours - sum(a.ran_h() for a in self.attempts))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self.job), "outcome": self.outcome, "wait_h": _round(self.wait_h()),
                "attempts": [{k: _round(v) if isinstance(v, float) else v for k, v in asdict(a).items()}
                             for a in self.attempts]}


def _round(v: float | None, digits: int = 3) -> float | None:
    return None if v is None else round(v, digits)


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0–100) by linear interpolation between closest ranks (numpy's
    default); None for no values."""
    data = sorted(values)
    if not data:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    pos = (len(data) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


Interval = tuple[float, float, int]  # (start h, end h, GPUs)


def gpu_hours(intervals: Iterable[Interval], lo: float = -math.inf, hi: float = math.inf) -> float:
    """GPU-hours of ``intervals`` inside [lo, hi)."""
    return sum(g * max(0.0, min(e, hi) - max(s, lo)) for s, e, g in intervals)


def hourly_gpus(intervals: Sequence[Interval], hours: int) -> list[float]:
    """The mean number of GPUs in use in each whole hour [h, h+1) for h < ``hours``."""
    return [round(gpu_hours(intervals, h, h + 1), 2) for h in range(hours)]


def run_intervals(records: Iterable[JobRecord], end_h: float) -> list[Interval]:
    """Each attempt's GPU time used: pod running → it stopped working (:meth:`Attempt.worked_until`;
    still running: until ``end_h``)."""
    out: list[Interval] = []
    for r in records:
        for a in r.attempts:
            until = a.worked_until(end_h)
            if a.running_h is not None and until is not None:
                out.append((a.running_h, until, r.job.gpus))
    return out


def held_intervals(records: Iterable[JobRecord], end_h: float) -> list[Interval]:
    """Each attempt's quota held (admitted → ended), as Kueue accounts it."""
    return [(a.admitted_h, a.ended_h if a.ended_h is not None else end_h, r.job.gpus)
            for r in records for a in r.attempts if a.admitted_h is not None]


def wait_stats(waits: Sequence[float]) -> dict[str, Any]:
    """n, p50, p95 and max of waits in hours."""
    return {"n": len(waits), "p50_h": _round(percentile(waits, 50)), "p95_h": _round(percentile(waits, 95)),
            "max_h": _round(max(waits) if waits else None)}


def preemption_counts(records: Sequence[JobRecord]) -> dict[str, Any]:
    """Attempts stopped by Kueue: in all, by reason (the Workload's ``Preempted`` / ``Evicted``
    reason as seen), by the preempted job's priority, and how many jobs it hit."""
    stopped = [(r.job, a) for r in records for a in r.attempts if a.outcome == PREEMPTED]
    return {"total": len(stopped), "jobs": len({j.id for j, _ in stopped}),
            "by_reason": dict(sorted(Counter(a.reason or "unknown" for _, a in stopped).items())),
            "by_priority": {p: sum(j.priority == p for j, _ in stopped) for p in PRIORITIES}}


def summarise(records: Sequence[JobRecord], *, gpus: int, day_h: float, end_h: float) -> dict[str, Any]:
    """A replay's figures from its records (``end_h``: when observation stopped).

    * GPU-hours used: pods working (:func:`run_intervals`), inside the day ([0, day_h)) against
      ``gpus`` × ``day_h`` (utilisation, idle fraction), and in all against ``gpus`` × the makespan;
    * GPU-hours held: Kueue's admitted quota (admitted → ended), the same way;
    * waits (submit → first admitted) per priority, the requeued waits after preemptions;
    * preemptions; makespan (hours from the replay's start to the last job's end).
    """
    running, held = run_intervals(records, end_h), held_intervals(records, end_h)
    ends = [a.ended_h for r in records for a in r.attempts if a.ended_h is not None]
    ended = [r for r in records if r.outcome in (SUCCEEDED, FAILED)]
    makespan = max(ends) if ends and len(ended) == len(records) else end_h
    used_day, held_day = gpu_hours(running, 0, day_h), gpu_hours(held, 0, day_h)
    used, held_total = gpu_hours(running), gpu_hours(held)
    available = gpus * day_h
    waits = {p: [w for r in records if r.job.priority == p for w in [r.wait_h()] if w is not None] for p in PRIORITIES}
    outcomes = Counter(r.outcome for r in records)
    starts = [a.running_h - a.admitted_h for r in records for a in r.attempts
              if a.running_h is not None and a.admitted_h is not None]
    return {
        "jobs": len(records), "succeeded": outcomes[SUCCEEDED], "failed": outcomes[FAILED],
        "unfinished": len(records) - outcomes[SUCCEEDED] - outcomes[FAILED],
        "gpu_hours_available": round(available, 2),
        "gpu_hours_used_in_day": round(used_day, 2), "utilisation_in_day": round(used_day / available, 4),
        "idle_fraction_in_day": round(1 - used_day / available, 4),
        "gpu_hours_held_in_day": round(held_day, 2), "held_fraction_in_day": round(held_day / available, 4),
        "gpu_hours_used": round(used, 2), "gpu_hours_held": round(held_total, 2),
        "makespan_h": round(makespan, 3),
        "utilisation_over_makespan": round(used / (gpus * makespan), 4) if makespan > 0 else None,
        "wait": {p: wait_stats(waits[p]) for p in PRIORITIES} | {"all": wait_stats(waits[HIGH] + waits[LOW])},
        "requeued_wait_h": round(sum(r.requeued_wait_h() for r in records), 3),
        "admitted_to_running_p50_h": _round(percentile(starts, 50)),
        "preemptions": preemption_counts(records),
        "hourly_gpus_in_use": hourly_gpus(running, math.ceil(max(day_h, makespan))),
    }


def ratio(value: float | None, baseline: float | None) -> float | None:
    """``value`` / ``baseline`` rounded (None when either is missing or the baseline is 0)."""
    if value is None or baseline is None or baseline == 0:
        return None
    return round(value / baseline, 3)


def compare(baseline: dict[str, Any], other: dict[str, Any]) -> dict[str, float | None]:
    """``other``'s headline figures as ratios against ``baseline``'s."""
    return {
        "utilisation_in_day": ratio(other["utilisation_in_day"], baseline["utilisation_in_day"]),
        "idle_fraction_in_day": ratio(other["idle_fraction_in_day"], baseline["idle_fraction_in_day"]),
        "p95_wait_high": ratio(other["wait"][HIGH]["p95_h"], baseline["wait"][HIGH]["p95_h"]),
        "p95_wait_low": ratio(other["wait"][LOW]["p95_h"], baseline["wait"][LOW]["p95_h"]),
        "p95_wait_all": ratio(other["wait"]["all"]["p95_h"], baseline["wait"]["all"]["p95_h"]),
        "makespan": ratio(other["makespan_h"], baseline["makespan_h"]),
    }


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.2f}{unit}"
    return f"{v}{unit}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f} %"


def table(baseline: dict[str, Any], borrowing: dict[str, Any], ratios: dict[str, float | None]) -> str:
    """The terminal table: the baseline (no borrowing), borrowing, and borrowing / baseline."""
    rows: list[tuple[str, str, str, str]] = [
        ("GPU-hours used in the day / available", f"{_fmt(baseline['gpu_hours_used_in_day'])} / "
         f"{_fmt(baseline['gpu_hours_available'])}", f"{_fmt(borrowing['gpu_hours_used_in_day'])} / "
         f"{_fmt(borrowing['gpu_hours_available'])}", _fmt(ratios["utilisation_in_day"], "×")),
        ("utilisation in the day", _pct(baseline["utilisation_in_day"]), _pct(borrowing["utilisation_in_day"]),
         _fmt(ratios["utilisation_in_day"], "×")),
        ("idle in the day (seed's anchor: 35 %)", _pct(baseline["idle_fraction_in_day"]),
         _pct(borrowing["idle_fraction_in_day"]), _fmt(ratios["idle_fraction_in_day"], "×")),
        ("quota held in the day (Kueue)", _pct(baseline["held_fraction_in_day"]), _pct(borrowing["held_fraction_in_day"]), ""),
        ("makespan", _fmt(baseline["makespan_h"], " h"), _fmt(borrowing["makespan_h"], " h"), _fmt(ratios["makespan"], "×")),
        ("utilisation over the makespan", _pct(baseline["utilisation_over_makespan"]),
         _pct(borrowing["utilisation_over_makespan"]), ""),
    ]
    for p in (HIGH, LOW, "all"):
        b, o = baseline["wait"][p], borrowing["wait"][p]
        rows.append((f"wait {p}: p50 / p95 (n)", f"{_fmt(b['p50_h'])} / {_fmt(b['p95_h'])} h ({b['n']})",
                     f"{_fmt(o['p50_h'])} / {_fmt(o['p95_h'])} h ({o['n']})", _fmt(ratios.get(f"p95_wait_{p}"), "×")))
    for name, key in (("preemptions (jobs hit)", "preemptions"),):
        b, o = baseline[key], borrowing[key]
        rows.append((name, f"{b['total']} ({b['jobs']})", f"{o['total']} ({o['jobs']})", ""))
    rows.append(("jobs succeeded / failed / unfinished", f"{baseline['succeeded']} / {baseline['failed']} / "
                 f"{baseline['unfinished']}", f"{borrowing['succeeded']} / {borrowing['failed']} / "
                 f"{borrowing['unfinished']}", ""))
    head = ("", "no borrowing (baseline)", "borrowing (one cohort)", "borrowing / baseline")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
