"""The simulated day's pure part (bench/queue_day_core.py) and how bench/queue_day.py reads what the
API server reports, without a cluster: the seeded trace, the GPU-hour and percentile arithmetic,
the summary and the ratios, and an attempt advanced through fake pod and Workload snapshots
(admitted → running → preempted or succeeded)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench import queue_day
from bench import queue_day_core as core


def test_the_trace_is_seeded_sorted_and_fits_each_teams_quota() -> None:
    trace = core.make_trace(7)
    assert trace == core.make_trace(7) and trace != core.make_trace(8)
    assert [j.submit_h for j in trace] == sorted(j.submit_h for j in trace)
    quota = {t.name: t.quota for t in core.TEAMS}
    for job in trace:
        assert 0 <= job.submit_h < 24 and job.hours in core.HOURS and job.priority in core.PRIORITIES
        assert 1 <= job.gpus <= quota[job.team], job  # never larger than the pool could ever admit alone
    assert len({j.id for j in trace}) == len(trace)
    assert {j.priority for j in trace} == {core.HIGH, core.LOW} and {j.team for j in trace} == set(quota)


def test_each_team_is_busy_in_its_own_part_of_the_day() -> None:
    trace = core.make_trace(1)
    for team in core.TEAMS:
        lo, hi = team.busy[0] * 24, team.busy[1] * 24
        inside = [j for j in trace if j.team == team.name and lo <= j.submit_h < hi]
        outside = [j for j in trace if j.team == team.name and not lo <= j.submit_h < hi]
        assert len(inside) / (hi - lo) > 3 * len(outside) / (24 - (hi - lo)), team  # bursty


def test_sizes_above_the_quota_fold_into_it() -> None:
    assert core.size_weights(4) == [(1, 0.5), (2, 0.3), (4, 0.2)]
    assert core.size_weights(2) == [(1, 0.5), (2, 0.5)]
    assert core.mean_gpu_hours(2) == pytest.approx(1.5 * sum(core.HOURS) / len(core.HOURS))


def test_the_trace_summary_adds_up() -> None:
    jobs = [core.Job("a-000", "a", 0.0, 4, 2.0, core.HIGH), core.Job("b-000", "b", 1.0, 1, 0.5, core.LOW)]
    s = core.trace_summary(jobs, gpus=8, day_h=24)
    assert s["gpu_hours_demanded"] == 8.5 and s["offered_load"] == round(8.5 / 192, 3)
    assert s["high"] == 1 and s["by_size"] == {"1": 1, "4": 1} and s["by_team"]["a"] == {"jobs": 1, "gpu_hours": 8.0}


def test_percentile_interpolates_like_numpy() -> None:
    assert core.percentile([], 95) is None
    assert core.percentile([3.0], 95) == 3.0
    assert core.percentile([4, 1, 3, 2], 50) == 2.5
    assert core.percentile([1, 2, 3, 4], 95) == pytest.approx(3.85)
    assert core.percentile(range(101), 95) == 95
    with pytest.raises(ValueError):
        core.percentile([1], 101)


def test_gpu_hours_are_clipped_to_the_window() -> None:
    intervals = [(0.0, 2.0, 4), (1.5, 30.0, 2)]
    assert core.gpu_hours(intervals) == 8 + 57
    assert core.gpu_hours(intervals, 0, 24) == 8 + 45
    assert core.gpu_hours(intervals, 1, 2) == 4 + 1
    assert core.hourly_gpus(intervals, 3) == [4.0, 5.0, 2.0]


def _record(job: core.Job, *attempts: core.Attempt) -> core.JobRecord:
    return core.JobRecord(job, list(attempts))


def _day() -> list[core.JobRecord]:
    """Two hours on 2 GPUs: a high job waits 0.5 h then runs 1 h; a low job is preempted after
    0.5 h, its retry waits 0.25 h and runs the 0.5 h it had left; a third never gets in."""
    high = _record(core.Job("a-000", "a", 0.0, 2, 1.0, core.HIGH),
                   core.Attempt("a-000-0", 0.0, 8, admitted_h=0.5, running_h=0.5, ended_h=1.5, outcome=core.SUCCEEDED))
    low = _record(core.Job("b-000", "b", 0.0, 1, 1.0, core.LOW),
                  core.Attempt("b-000-0", 0.0, 8, admitted_h=0.0, running_h=0.0, ended_h=0.5, outcome=core.PREEMPTED,
                               reason="Preempted:InCohortReclamation"),
                  core.Attempt("b-000-1", 0.5, 4, admitted_h=0.75, running_h=0.75, ended_h=1.25, outcome=core.SUCCEEDED))
    never = _record(core.Job("c-000", "c", 1.0, 1, 1.0, core.LOW), core.Attempt("c-000-0", 1.0, 8))
    return [high, low, never]


def test_a_preempted_job_resumes_with_the_work_it_has_left() -> None:
    high, low, never = _day()
    assert low.remaining_h() == 0.0 and low.outcome == core.SUCCEEDED and low.wait_h() == 0.0
    assert low.requeued_wait_h() == pytest.approx(0.25)
    partial = core.JobRecord(low.job, low.attempts[:1])
    assert partial.remaining_h() == pytest.approx(0.5)
    assert never.outcome == core.UNFINISHED and never.wait_h() is None
    assert high.to_json()["attempts"][0]["pod"] == "a-000-0" and high.to_json()["wait_h"] == 0.5


def test_gpu_time_used_is_the_work_asked_not_the_nodes_lag_in_reporting_the_end() -> None:
    """A pod asked for 1 h of work, seen running at 0.5 h and seen Succeeded at 1.75 h, used 1 h;
    Kueue held its quota from 0.25 h to 1.75 h."""
    a = core.Attempt("p", 0.0, 10, work_h=1.0, admitted_h=0.25, running_h=0.5, ended_h=1.75, outcome=core.SUCCEEDED)
    record = _record(core.Job("a-000", "a", 0.0, 2, 1.0, core.LOW), a)
    assert a.ran_h() == 1.0 and a.worked_until(9.0) == 1.5
    assert core.run_intervals([record], 9.0) == [(0.5, 1.5, 2)] and core.held_intervals([record], 9.0) == [(0.25, 1.75, 2)]
    preempted = core.Attempt("p", 0.0, 10, work_h=1.0, admitted_h=0.0, running_h=0.5, ended_h=0.75, outcome=core.PREEMPTED)
    assert preempted.ran_h() == 0.25
    running = core.Attempt("p", 0.0, 10, work_h=1.0, admitted_h=0.0, running_h=0.5)
    assert running.ran_h() == 0.0 and running.worked_until(0.75) == 0.75


def test_the_summary_of_a_replay() -> None:
    s = core.summarise(_day(), gpus=2, day_h=2.0, end_h=2.0)
    used = 2 * 1.0 + 1 * 0.5 + 1 * 0.5  # GPU-hours running
    assert s["gpu_hours_used_in_day"] == used and s["gpu_hours_available"] == 4
    assert s["utilisation_in_day"] == round(used / 4, 4) and s["idle_fraction_in_day"] == round(1 - used / 4, 4)
    assert s["gpu_hours_held"] == used  # admitted when it started running, here
    assert (s["succeeded"], s["failed"], s["unfinished"]) == (2, 0, 1)
    assert s["makespan_h"] == 2.0  # a job unfinished: observation's end
    assert s["wait"]["high"] == {"n": 1, "p50_h": 0.5, "p95_h": 0.5, "max_h": 0.5}
    assert s["wait"]["low"]["n"] == 1 and s["wait"]["all"]["n"] == 2
    assert s["preemptions"] == {"total": 1, "jobs": 1, "by_reason": {"Preempted:InCohortReclamation": 1},
                                "by_priority": {"high": 0, "low": 1}}
    assert s["hourly_gpus_in_use"] == [1.75, 1.25]  # 0–1 h: 2 × 0.5 + 0.5 + 0.25; 1–2 h: 2 × 0.5 + 0.25
    finished = core.summarise(_day()[:2], gpus=2, day_h=2.0, end_h=2.0)
    assert finished["makespan_h"] == 1.5 and finished["utilisation_over_makespan"] == round(used / 3, 4)


def test_borrowing_is_reported_as_ratios_against_the_baseline() -> None:
    base = core.summarise(_day(), gpus=2, day_h=2.0, end_h=2.0)
    other = json.loads(json.dumps(base))
    other["utilisation_in_day"] *= 1.5
    other["wait"]["high"]["p95_h"] = 0.25
    r = core.compare(base, other)
    assert r["utilisation_in_day"] == 1.5 and r["p95_wait_high"] == 0.5 and r["makespan"] == 1.0
    assert core.ratio(1.0, 0.0) is None and core.ratio(None, 1.0) is None
    text = core.table(base, other, r)
    assert "no borrowing (baseline)" in text.splitlines()[0] and "35 %" in text and "0.50×" in text


def _pod(phase: str, *conditions: tuple[str, str], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T10:00:00Z"
    return {"metadata": meta, "status": {"phase": phase,
                                         "conditions": [{"type": t, "status": "True", "reason": r} for t, r in conditions]}}


def _workload(*conditions: tuple[str, str]) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": t, "status": "True", "reason": r} for t, r in conditions]}}


def _snap(pod: dict[str, Any] | None, wl: dict[str, Any] | None) -> queue_day.Snapshot:
    return queue_day.Snapshot({"p": pod} if pod else {}, {"p": wl} if wl else {})


def test_an_attempt_follows_its_workload_and_pod_to_success() -> None:
    a = core.Attempt("p", 0.0, 4)
    assert not queue_day.update_attempt(a, _snap(_pod("Pending", ("PodScheduled", "SchedulingGated")), _workload()), 0.1)
    assert a.admitted_h is None
    assert not queue_day.update_attempt(a, _snap(_pod("Pending"), _workload(("QuotaReserved", "QuotaReserved"))), 0.3)
    assert a.admitted_h == 0.3 and a.running_h is None
    assert not queue_day.update_attempt(a, _snap(_pod("Running"), _workload(("Admitted", "Admitted"))), 0.4)
    assert a.running_h == 0.4
    assert queue_day.update_attempt(a, _snap(_pod("Succeeded"), _workload(("Finished", "Succeeded"))), 0.9)
    assert (a.ended_h, a.outcome, a.reason) == (0.9, core.SUCCEEDED, None)
    assert not queue_day.update_attempt(a, _snap(None, None), 1.0)  # ended: no change


def test_an_attempt_stopped_by_kueue_is_a_preemption_with_its_reason() -> None:
    a = core.Attempt("p", 0.0, 4, admitted_h=0.1, running_h=0.2)
    wl = _workload(("Admitted", "Admitted"), ("Preempted", "InClusterQueue"))
    assert queue_day.update_attempt(a, _snap(_pod("Running", ("TerminationTarget", "WorkloadEvicted")), wl), 0.6)
    assert (a.outcome, a.reason, a.ran_h()) == (core.PREEMPTED, "Preempted:InClusterQueue", pytest.approx(0.4))
    gone = core.Attempt("p", 0.0, 4, admitted_h=0.1, running_h=0.2)
    assert queue_day.update_attempt(gone, _snap(None, None), 0.5) and gone.outcome == core.PREEMPTED
    deleting = core.Attempt("p", 0.0, 4, admitted_h=0.1, running_h=0.2)
    assert queue_day.update_attempt(deleting, _snap(_pod("Running", deleting=True), None), 0.5)
    assert deleting.reason == "TerminationTarget:deleted"


def test_a_pod_that_fails_by_itself_is_a_failure() -> None:
    a = core.Attempt("p", 0.0, 4, admitted_h=0.1, running_h=0.2)
    assert queue_day.update_attempt(a, _snap(_pod("Failed"), _workload(("Finished", "Failed"))), 0.5)
    assert a.outcome == core.FAILED


def test_the_queue_pods_carry_forges_labels_and_fake_gpus() -> None:
    compute, env, _ = queue_day.pool_specs(core.TEAMS[1], "forge-day-solo-b", borrowing=False)
    assert compute.spec.queue is not None and compute.spec.queue.cohort is None and compute.spec.queue.quota.gpus == 2
    borrowing, _, _ = queue_day.pool_specs(core.TEAMS[1], "forge-day-borrow-b", borrowing=True)
    assert borrowing.spec.queue is not None and borrowing.spec.queue.cohort == queue_day.COHORT
    pod = queue_day.job_pod("b-000-0", {"kueue.x-k8s.io/queue-name": "gpu-pool"}, "busybox:x", 2, 12)
    container = pod.spec.containers[0]
    assert container.command == ["sleep", "12"] and container.resources.limits[queue_day.GPU] == "2"
    assert container.resources.requests == container.resources.limits


def test_every_team_gets_its_own_local_queue_and_the_flavor_is_shared() -> None:
    """Three teams' pools, as applied: one ResourceFlavor, and per team a ClusterQueue, a LocalQueue
    (all named alike, in their own namespaces) and two WorkloadPriorityClasses; cohort only when borrowing."""
    for mode in queue_day.MODES:
        pools, objects = queue_day.pool_objects(mode, core.TEAMS)
        kinds = [o["kind"] for o in objects]
        assert kinds.count("ResourceFlavor") == 1 and kinds.count("ClusterQueue") == 3
        assert kinds.count("WorkloadPriorityClass") == 6
        local = sorted(o["metadata"]["namespace"] for o in objects if o["kind"] == "LocalQueue")
        assert local == sorted(pools.namespaces.values()) and len(set(local)) == 3
        cohorts = {o["spec"].get("cohortName") for o in objects if o["kind"] == "ClusterQueue"}
        assert cohorts == ({queue_day.COHORT} if mode == "borrowing" else {None})
        quotas = {o["metadata"]["name"]: [r["nominalQuota"] for r in o["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
                                          if r["name"] == queue_day.GPU] for o in objects if o["kind"] == "ClusterQueue"}
        assert sorted(q for [q] in quotas.values()) == ["2", "2", "4"]
        assert pools.labels["a"]["high"]["kueue.x-k8s.io/priority-class"] == f"{pools.namespaces['a']}-high"
        assert {o["kind"] for o in pools.cluster_objects} == {"ResourceFlavor", "ClusterQueue", "WorkloadPriorityClass"}


def test_trace_only_prints_the_trace_and_a_json_object_last(capsys: pytest.CaptureFixture[str]) -> None:
    queue_day.main(["--trace-only", "--smoke"])
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["jobs"] == len(lines) - 1 and summary["jobs"] == len(core.make_trace(1, day_h=6.0))
