"""The watch loop of `forgectl reconcile` (`reconciler/controller/watch.py`): its passes, lines and
exit codes, run on the real rollout controller over a fake backend with a fake clock and sleep (no
server, no waiting)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from reconciler.controller.leadership import Leadership
from reconciler.controller.watch import EXIT_OK, EXIT_ROLLED_BACK, Controllers, WatchOptions, failed, reconcile_pass, run, settled
from reconciler.diagnostics import ForgeError
from reconciler.errors import ConflictError, LeaseLost, LockHeldError, TransientError
from reconciler.experiment.controller import ExperimentState
from reconciler.rollout.controller import Controller, Phase, RolloutState
from renderers.seldon import ServingState
from specs import Endpoint, RolloutPolicy
from tests.reconciler.rollout_fakes import V1, V2, FakeBackend, an_endpoint, desired_of


@dataclass
class FakeExperiments:
    """The experiment controller: answers a fixed phase, saving it in the rollout state as the real one does."""

    backend: FakeBackend
    phase: str = "Running"
    asked: list[str] = field(default_factory=list)

    def reconcile(self, endpoint: Endpoint, version: str) -> ExperimentState:
        self.asked.append(endpoint.name)
        state = ExperimentState("k", self.phase, 0.0, "control", [], reason=f"looked at {version}")
        self.backend.save_state(endpoint.name, RolloutState(endpoint.name, V1, experiment=state.to_json()))
        return state


@dataclass
class Clock:
    """The loop's clock and sleep: sleeping moves the clock."""

    now: float = 100.0
    sleeps: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _controllers(backend: FakeBackend, policy: RolloutPolicy | None = None) -> Controllers:
    rollouts = Controller(backend, None, "forge-test", clock=lambda: 1_000.0)
    return Controllers(backend, rollouts, FakeExperiments(backend))


def _run(controllers: Controllers, endpoints: list[Any], options: WatchOptions, clock: Clock) -> tuple[int, list[str], list[dict[str, str]]]:
    lines: list[str] = []
    passes: list[dict[str, str]] = []
    code = run(controllers, endpoints, options, on_line=lines.append,
               on_pass=lambda states: passes.append({k: v.phase.value for k, v in states.items()}),
               clock=clock, sleep=clock.sleep)
    return code, lines, passes


def test_one_pass_without_watch() -> None:
    backend = FakeBackend({"digits": ServingState(V1)})
    clock = Clock()
    code, lines, passes = _run(_controllers(backend), desired_of(an_endpoint("digits")), WatchOptions(), clock)
    assert (code, backend.refreshes, clock.sleeps) == (EXIT_OK, 1, [])
    assert passes == [{"digits": "Idle"}] and lines == ["digits: Idle step 0 canary 0 % — "]


def test_an_endpoint_not_applied_yet_has_no_line_and_no_state() -> None:
    backend = FakeBackend()
    code, lines, passes = _run(_controllers(backend), desired_of(an_endpoint("digits")), WatchOptions(), Clock())
    assert (code, lines, passes) == (EXIT_OK, [], [{}])


def test_watch_reports_a_line_only_when_it_changes_and_stops_after_passes() -> None:
    backend = FakeBackend({"digits": ServingState(V1)})
    clock = Clock()
    code, lines, passes = _run(_controllers(backend), desired_of(an_endpoint("digits")),
                               WatchOptions(watch=True, interval=0.5, passes=3), clock)
    assert code == EXIT_OK and len(passes) == 3 and backend.refreshes == 3
    assert clock.sleeps == [0.5, 0.5]  # none after the last pass
    assert lines == ["digits: Idle step 0 canary 0 % — "]


def test_until_settled_exits_3_when_a_rollout_rolled_back() -> None:
    backend = FakeBackend({"digits": ServingState(V1, V2, 0)}, gate=(True, False, "evaluation accuracy 0.5 < 0.95"))
    clock = Clock()
    code, lines, passes = _run(_controllers(backend), desired_of(an_endpoint("digits"), version=V2),
                               WatchOptions(watch=True, until_settled=True), clock)
    assert code == EXIT_ROLLED_BACK and passes[-1] == {"digits": "RolledBack"}
    assert lines[-1].startswith("digits: RolledBack ")


def test_until_settled_exits_0_when_every_rollout_promoted() -> None:
    backend = FakeBackend({"digits": ServingState(V1, V2, 0)})
    clock = Clock()
    code, _, passes = _run(_controllers(backend), desired_of(an_endpoint("digits"), version=V2),
                           WatchOptions(watch=True, until_settled=True), clock)
    assert code == EXIT_OK and passes[-1] == {"digits": "Promoted"}


def test_a_plain_watch_ignores_how_rollouts_ended() -> None:
    backend = FakeBackend({"digits": ServingState(V1, V2, 0)}, gate=(True, False, "evaluation failed"))
    code, _, passes = _run(_controllers(backend), desired_of(an_endpoint("digits"), version=V2),
                           WatchOptions(watch=True, passes=2), Clock())
    assert code == EXIT_OK and passes[-1] == {"digits": "RolledBack"}


def test_watch_gives_up_after_the_timeout_naming_what_is_in_progress() -> None:
    backend = FakeBackend({"digits": ServingState(V1, V2, 0)}, gate=(False, False, "Workflow still running"))
    clock = Clock()
    with pytest.raises(ForgeError, match=r"rollouts still in progress after 3 s: digits WaitingForModel"):
        _run(_controllers(backend), desired_of(an_endpoint("digits"), version=V2),
             WatchOptions(watch=True, interval=1.0, until_settled=True, timeout=3.0), clock)
    assert clock.sleeps == [1.0] * 4  # after passes at 0, 1, 2 and 3 s; the fifth, at 4 s, is past the 3 s


def test_an_experiment_endpoint_is_the_experiment_controllers() -> None:
    backend = FakeBackend({"digits": ServingState(V1), "ab": ServingState(V1)})
    controllers = _controllers(backend)
    states, lines = reconcile_pass(controllers, desired_of(an_endpoint("ab", experiment=True), an_endpoint("digits")))
    assert controllers.experiments.asked == ["ab"]
    assert lines == {"ab": f"ab: experiment Running — looked at {V1}", "digits": "digits: Idle step 0 canary 0 % — "}
    assert states["ab"].experiment is not None and states["ab"].experiment["phase"] == "Running"
    assert not settled(states)  # an experiment still running keeps the watch going
    controllers.experiments.phase = "Decided"
    states, _ = reconcile_pass(controllers, desired_of(an_endpoint("ab", experiment=True), an_endpoint("digits")))
    assert settled(states)


@dataclass
class ObservedBackend(FakeBackend):
    """A backend that says what it read of an endpoint (``observed``, as the kubernetes one hands
    back its SeldonDeployment), and counts the endpoints the rollout controller asked it about."""

    asked: list[str] = field(default_factory=list)

    def serving(self, endpoint: str) -> ServingState | None:
        self.asked.append(endpoint)
        return super().serving(endpoint)

    def observed(self, endpoint: str) -> object | None:
        return (self.serving_now.get(endpoint), json.dumps(self.saved.get(endpoint), sort_keys=True))


def test_a_pass_skips_an_endpoint_at_rest_until_what_it_reads_or_wants_changes() -> None:
    backend = ObservedBackend({"digits": ServingState(V1), "other": ServingState(V1)})
    controllers = _controllers(backend)
    endpoints = desired_of(an_endpoint("digits"), an_endpoint("other"))
    first, first_lines = reconcile_pass(controllers, endpoints)
    assert sorted(backend.asked) == ["digits", "other"]
    backend.asked.clear()
    again, again_lines = reconcile_pass(controllers, endpoints)
    assert backend.asked == [] and again == first and again_lines == first_lines  # nothing read, the same answer

    backend.serving_now["other"] = ServingState(V2)  # someone changed what `other` serves: the specs' V1 goes out again
    states, _ = reconcile_pass(controllers, endpoints)
    assert backend.asked == ["other"] and states["other"].phase is Phase.PROMOTED  # (no policy: at once)
    assert backend.serving_now["other"] == ServingState(V1)
    backend.asked.clear()
    reconcile_pass(controllers, endpoints)
    assert backend.asked == []  # at rest again, as its own writes left it
    controllers.at_rest.clear()  # the manager's full walk, every FULL_WALK_SECONDS
    reconcile_pass(controllers, endpoints)
    assert sorted(backend.asked) == ["digits", "other"]
    backend.asked.clear()

    backend.gate = (False, False, "Workflow still running")
    wanted = desired_of(an_endpoint("digits"), an_endpoint("other"), version=V2)  # a revision wants V2
    states, _ = reconcile_pass(controllers, wanted)
    assert sorted(backend.asked) == ["digits", "other"] and {st.phase for st in states.values()} == {Phase.WAITING}
    backend.asked.clear()
    for _ in range(2):  # a rollout in progress is the controller's every pass (its gate, its clock)
        reconcile_pass(controllers, wanted)
    assert sorted(backend.asked) == ["digits", "digits", "other", "other"]


def test_an_endpoint_is_reconciled_every_pass_where_the_backend_cannot_say_what_it_read() -> None:
    backend = FakeBackend({"digits": ServingState(V1)})
    asked: list[str] = []
    serving = backend.serving
    backend.serving = lambda endpoint: asked.append(endpoint) or serving(endpoint)  # type: ignore[method-assign]
    controllers = _controllers(backend)
    for _ in range(3):
        reconcile_pass(controllers, desired_of(an_endpoint("digits")))
    assert asked == ["digits"] * 3 and controllers.at_rest == {}


@pytest.mark.parametrize("phase, at_rest, has_failed", [
    (Phase.IDLE, True, False), (Phase.WAITING, False, False), (Phase.PROGRESSING, False, False),
    (Phase.HOLDING, False, False), (Phase.PAUSED, False, False), (Phase.PROMOTED, True, False),
    (Phase.ROLLED_BACK, True, True), (Phase.ABORTED, True, True)])
def test_settled_and_failed_by_phase(phase: Phase, at_rest: bool, has_failed: bool) -> None:
    states = {"digits": RolloutState("digits", V1, V2, phase)}
    assert settled(states) is at_rest
    assert failed(states) == (["digits"] if has_failed else [])


# -- two watches: only the lock's holder acts (issue 35) -------------------------------------------

@dataclass
class FakeFence:
    held: bool = True
    deadline: float | None = None

    def check(self, what: str) -> None:
        if not self.held:
            raise LeaseLost(f"{what}: not sent")


@dataclass
class FakeLock:
    """One environment lock shared by several watches: taken when free, refused naming its holder."""

    holder: str | None = None
    fence: FakeFence | None = None

    def lock(self, holder: str | None = None) -> Iterator[FakeFence]:
        @contextmanager
        def held() -> Iterator[FakeFence]:
            if self.holder is not None:
                raise LockHeldError(f"environment 'dev' is locked by {self.holder}")
            self.holder, self.fence = holder, FakeFence()
            try:
                yield self.fence
            finally:
                if self.fence.held:  # a lost one is not ours to release
                    self.holder = None
        return held()  # type: ignore[return-value]


class FencedBackend(FakeBackend):
    """Every write checked against the lock's fence first, as a target does; the fence is lost
    while the first pass reads (the process paused there past its Lease, another took it)."""

    def __init__(self, lock: FakeLock, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.the_lock = lock

    def refresh(self) -> None:
        super().refresh()
        if self.refreshes == 1 and self.the_lock.fence is not None:
            self.the_lock.fence.held = False
            self.the_lock.holder = "the new leader"

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        self._fenced(f"save {endpoint}")
        super().save_state(endpoint, state)

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        self._fenced(f"move {endpoint.name}")
        super().set_serving(endpoint, state)

    def _fenced(self, what: str) -> None:
        assert self.the_lock.fence is not None
        self.the_lock.fence.check(what)


def test_a_watch_that_cannot_take_the_lock_follows_and_writes_nothing() -> None:
    lock = FakeLock(holder="the other watch")
    backend = FakeBackend({"digits": ServingState(V1, V2, 0)})
    code, lines, passes = _run_led(_controllers(backend), desired_of(an_endpoint("digits"), version=V2),
                                   WatchOptions(watch=True, passes=3), Clock(), Leadership(lock.lock, "me"))
    assert code == EXIT_OK and backend.saved == {} and backend.serving_now["digits"] == ServingState(V1, V2, 0)
    # it still reads what the holder does (its stop rules need the states): a canary waiting
    assert passes == [{"digits": "WaitingForModel"}] * 3
    assert lines == ["me: following, nothing written — environment 'dev' is locked by the other watch"]


def test_a_follower_takes_the_lock_over_when_it_is_free_and_releases_it_at_the_end() -> None:
    lock = FakeLock(holder="the other watch")
    backend = FakeBackend({"digits": ServingState(V1, V2, 0)})
    clock = Clock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        lock.holder = None  # the holder is gone after the first pass

    lines: list[str] = []
    code = run(_controllers(backend), desired_of(an_endpoint("digits"), version=V2),
               WatchOptions(watch=True, until_settled=True), leadership=Leadership(lock.lock, "me"),
               on_line=lines.append, clock=clock, sleep=sleep)
    assert code == EXIT_OK and RolloutState.from_json(backend.saved["digits"]).phase is Phase.PROMOTED
    assert lines[0].startswith("me: following") and lines[1] == "me: leading — this watch alone moves the rollouts"
    assert lock.holder is None  # released on return


def test_a_deposed_watch_stops_writing_follows_and_does_not_release_the_lock() -> None:
    lock = FakeLock()
    backend = FencedBackend(lock, {"digits": ServingState(V1, V2, 0)})
    leadership = Leadership(lock.lock, "me")
    code, lines, passes = _run_led(_controllers(backend), desired_of(an_endpoint("digits"), version=V2),
                                   WatchOptions(watch=True, passes=2), Clock(), leadership)
    # the first pass's first write found the fence lost: nothing moved, nothing saved
    assert code == EXIT_OK and backend.saved == {} and backend.serving_now["digits"] == ServingState(V1, V2, 0)
    assert lines[0] == "me: leading — this watch alone moves the rollouts"
    assert lines[1].startswith("me: following, nothing written — lost the environment's lock: move digits: not sent")
    assert lines[2] == "me: following, nothing written — environment 'dev' is locked by the new leader"
    assert passes == [{"digits": "WaitingForModel"}] * 2
    assert lock.holder == "the new leader" and leadership.fence is None


def test_a_single_pass_refuses_while_another_holds_the_lock() -> None:
    lock = FakeLock(holder="a watch")
    backend = FakeBackend({"digits": ServingState(V1, V2, 0)})
    with pytest.raises(LockHeldError, match="not reconciled: environment 'dev' is locked by a watch"):
        _run_led(_controllers(backend), desired_of(an_endpoint("digits"), version=V2), WatchOptions(), Clock(),
                 Leadership(lock.lock, "me"))
    assert backend.saved == {}


def _run_led(controllers: Controllers, endpoints: list[Any], options: WatchOptions, clock: Clock,
             leadership: Leadership) -> tuple[int, list[str], list[dict[str, str]]]:
    lines: list[str] = []
    passes: list[dict[str, str]] = []
    code = run(controllers, endpoints, options, leadership=leadership, on_line=lines.append,
               on_pass=lambda states: passes.append({k: v.phase.value for k, v in states.items()}),
               clock=clock, sleep=clock.sleep)
    return code, lines, passes


class RefusedOnceBackend(FakeBackend):
    """The first traffic move is refused as stale (409: the object moved since the pass read it),
    the Lease still this watch's; every later write goes through."""

    refused: int = 0

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        if not self.refused:
            self.refused += 1
            raise ConflictError(f"the traffic of {endpoint.name}: refused by the API server as stale (409)", status=409)
        super().set_serving(endpoint, state)


def test_a_write_refused_as_stale_ends_the_pass_and_the_next_one_reads_again_and_decides_anew() -> None:
    lock = FakeLock()
    backend = RefusedOnceBackend({"digits": ServingState(V1, V2, 0)})
    code, lines, passes = _run_led(_controllers(backend), desired_of(an_endpoint("digits"), version=V2),
                                   WatchOptions(watch=True, until_settled=True), Clock(), Leadership(lock.lock, "me"))
    assert code == EXIT_OK and backend.refused == 1
    assert RolloutState.from_json(backend.saved["digits"]).phase is Phase.PROMOTED  # decided again, and went on
    assert lines[1] == "me: the traffic of digits: refused by the API server as stale (409)"
    assert passes[0] == {"digits": "WaitingForModel"}  # the refused pass saved nothing
    assert backend.refreshes >= 3  # the refused pass, then passes that read again


def test_a_single_pass_whose_write_is_refused_as_stale_fails() -> None:
    backend = RefusedOnceBackend({"digits": ServingState(V1, V2, 0)})
    with pytest.raises(ConflictError, match="refused by the API server as stale"):
        _run_led(_controllers(backend), desired_of(an_endpoint("digits"), version=V2), WatchOptions(), Clock(),
                 Leadership(FakeLock().lock, "me"))
    assert backend.saved == {}


class DownForAWhileBackend(FakeBackend):
    """The cluster stops answering on the second pass's read and answers again at the fourth (etcd
    killed and restarted: the API server's reads and writes fail meanwhile)."""

    def refresh(self) -> None:
        super().refresh()
        if self.refreshes in (2, 3):
            raise TransientError("GET …/seldondeployments: the API server answered 500 (etcdserver: request timed out)")


def test_a_watch_holds_while_the_cluster_does_not_answer_and_goes_on_when_it_does() -> None:
    backend = DownForAWhileBackend({"digits": ServingState(V1, V2, 0)})
    clock = Clock()
    code, lines, passes = _run(_controllers(backend), desired_of(an_endpoint("digits"), version=V2),
                               WatchOptions(watch=True, interval=0.5, passes=3), clock)
    assert code == EXIT_OK and passes == [{"digits": "Promoted"}] * 3
    down = [line for line in lines if "did not answer" in line]
    assert down == ["reconcile: the cluster did not answer, nothing moved — GET …/seldondeployments: the API server "
                    "answered 500 (etcdserver: request timed out)"]
    # the failed passes neither count nor report a state; the watch slept its interval after each
    assert backend.refreshes == 5 and clock.sleeps == [0.5] * 4
    # the endpoint's line said once: the passes after the outage found the state as it was before
    assert lines[0].startswith("digits: Promoted") and len(lines) == 2


def test_a_single_pass_fails_when_the_cluster_does_not_answer() -> None:
    backend = DownForAWhileBackend({"digits": ServingState(V1, V2, 0)})
    backend.refreshes = 1
    with pytest.raises(TransientError, match="etcdserver"):
        _run(_controllers(backend), desired_of(an_endpoint("digits"), version=V2), WatchOptions(), Clock())
    assert backend.saved == {}


def test_a_watch_gives_up_after_its_timeout_while_the_cluster_does_not_answer() -> None:
    class Down(FakeBackend):
        def refresh(self) -> None:
            raise TransientError("connection refused")
    with pytest.raises(ForgeError, match="rollouts still in progress after 2 s"):
        _run(_controllers(Down({"digits": ServingState(V1, V2, 0)})), desired_of(an_endpoint("digits"), version=V2),
             WatchOptions(watch=True, interval=1.0, until_settled=True, timeout=2.0), Clock())


class PromotionSaveRefusedOnceBackend(FakeBackend):
    """Found on the node: the promotion's traffic move landed, then its state's save was refused
    (409: Seldon's operator had written the SeldonDeployment meanwhile) — once."""

    refused: int = 0

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        if state.phase is Phase.PROMOTED and not self.refused:
            self.refused += 1
            raise ConflictError(f"the rollout state on {endpoint}: refused by the API server as stale (409)", status=409)
        super().save_state(endpoint, state)


def test_until_settled_never_stops_on_a_pass_whose_write_was_refused() -> None:
    """The serving shows the canary promoted while the saved state is still at step 3: the pass
    records the promotion and its save is refused. What that pass then observes looks at rest, but
    nothing recorded it: the watch goes on, and the next pass saves Promoted before it stops.
    (Before, `--until-settled` exited 0 there with the rollout saved as Progressing.)"""
    backend = PromotionSaveRefusedOnceBackend({"digits": ServingState(V2)})
    backend.save_state("digits", RolloutState("digits", V1, V2, Phase.PROGRESSING, step=2, weight=100))
    code, lines, passes = _run_led(_controllers(backend), desired_of(an_endpoint("digits"), version=V2),
                                   WatchOptions(watch=True, until_settled=True), Clock(), Leadership(FakeLock().lock, "me"))
    assert code == EXIT_OK and backend.refused == 1
    assert lines[1] == "me: the rollout state on digits: refused by the API server as stale (409)"
    assert passes[0] == {"digits": "Promoted"}  # observed as the landed promotion, not as "specs serve V2 again"
    assert len(passes) >= 2  # the refused pass did not end the watch
    saved = RolloutState.from_json(backend.saved["digits"])
    assert saved.phase is Phase.PROMOTED and "had landed" in saved.reason
