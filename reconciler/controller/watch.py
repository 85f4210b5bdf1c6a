"""`forgectl reconcile`: the rollout and experiment controllers of one environment, one pass over
its endpoints, and the watch loop with its stop rules and exit-code policy.

A pass reconciles every endpoint once: an endpoint with an `experiment` is the experiment
controller's (it decides what serves), every other one the rollout controller's. The loop repeats
passes until one of the stop rules holds; what a pass changed reaches the caller as lines (only
when an endpoint's line differs from its last one) and as the states of the pass.

With a :class:`~reconciler.controller.leadership.Leadership`, only the watch holding the
environment's lock acts; another one reads the states each pass (for its stop rules) and waits to
take the lock over (see :mod:`reconciler.controller.leadership`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.controller.leadership import Leadership
from reconciler.diagnostics import ForgeError
from reconciler.errors import ConflictError, LeaseLost, LockHeldError, StorageFullError, TransientError
from reconciler.experiment.controller import FINAL as EXPERIMENT_FINAL
from reconciler.experiment.controller import ExperimentController, ExperimentState
from reconciler.experiment.writeback import winner_hook
from reconciler.load.endpoints import DesiredEndpoint
from reconciler.load.loader import LoadResult
from reconciler.metrics.prometheus import Prometheus, PrometheusUnavailable
from reconciler.metrics.shadow import shadow_figures
from reconciler.rollout.controller import Controller, RolloutState
from reconciler.rollout.steering import AT_REST, FAILED
from reconciler.rollout.writeback import CHECKOUT, WritebackSite, rollback_hook
from reconciler.targets.base import RolloutBackend, Target
from specs import Environment, duration_seconds

#: Exit codes of `forgectl reconcile`: done (or every rollout settled well); with
#: `--until-settled`, some rollout ended rolled back or aborted.
EXIT_OK = 0
EXIT_ROLLED_BACK = 3


@dataclass(frozen=True)
class AtRest:
    """An endpoint a pass left at rest: what it read, and the state and line it gave."""

    read: tuple[object, str, str]
    state: RolloutState
    line: str


@dataclass(frozen=True)
class Controllers:
    """The controllers of one environment, on one backend."""

    backend: RolloutBackend
    rollouts: Controller
    experiments: ExperimentController
    #: The Prometheus they measure with (None: none) and the namespace of the endpoints.
    prometheus: Prometheus | None = None
    namespace: str = ""
    #: The endpoints whose last pass left them at rest, with what that pass read
    #: (:meth:`RolloutBackend.observed`, the version and model the specs want) and the state and
    #: line it gave: see :func:`reconcile_pass`.
    at_rest: dict[str, AtRest] = field(default_factory=dict)

    def shadow_stats(self, endpoint: str) -> dict[str, Any] | None:
        """The shadow's figures: the target's own (the local router's mirror), else what the live
        servers' copies counted in Prometheus (a cluster: runtimes/serving/mirror.py); None when
        neither has any or Prometheus does not answer."""
        figures = self.backend.shadow_stats(endpoint)
        if figures is not None or self.prometheus is None:
            return figures
        try:
            return shadow_figures(self.prometheus, endpoint, self.namespace)
        except PrometheusUnavailable:
            return None


def prometheus_for(environment: Environment, target: Target, override: str | None = None) -> str | None:
    """The Prometheus the rollout gates measure with: ``override`` (`--prometheus-url`, for an
    in-cluster address forgectl cannot reach from where it runs), else the Environment's
    `prometheus.url`, else the one the target runs itself (the local target's; started on first
    use), else None (every measurement inconclusive)."""
    return override or environment.spec.prometheus.url or target.prometheus_url()


def controllers_for(result: LoadResult, environment: Environment, backend: RolloutBackend, prometheus_url: str | None,
                    namespace: str, writeback: WritebackSite = CHECKOUT) -> Controllers:
    """The rollout controller (with the write-back policy as its rollback hook) and the experiment
    controller of ``environment``, both measuring with the Prometheus at ``prometheus_url``
    (:func:`prometheus_for` chooses it; None: none, every measurement inconclusive); their
    write-backs go to ``writeback`` (`forgectl`'s checkout by default)."""
    prometheus = (Prometheus(prometheus_url, timeout=duration_seconds(environment.spec.prometheus.timeout))
                  if prometheus_url else None)
    rollouts = Controller(backend, prometheus, namespace, on_rollback=rollback_hook(result, environment, backend, writeback))
    experiments = ExperimentController(backend, prometheus, namespace, on_decided=winner_hook(result, writeback))
    return Controllers(backend, rollouts, experiments, prometheus, namespace)


def rollout_line(endpoint: str, state: RolloutState) -> str:
    """What a pass reports of an endpoint's rollout."""
    return f"{endpoint}: {state.phase.value} step {state.step + 1} canary {state.weight} % — {state.reason}"


def experiment_line(endpoint: str, state: ExperimentState) -> str:
    """What a pass reports of an endpoint's experiment."""
    return f"{endpoint}: experiment {state.phase} — {state.reason}"


def reconcile_pass(controllers: Controllers, endpoints: list[DesiredEndpoint]) -> tuple[dict[str, RolloutState], dict[str, str]]:
    """Refresh the backend, then reconcile each endpoint once. Returns the rollout state of each
    endpoint that has one (an experiment's lives in its rollout state) and a line for each."""
    controllers.backend.refresh()
    states: dict[str, RolloutState] = {}
    lines: dict[str, str] = {}
    # What a pass decides for an endpoint at rest depends on nothing but what it reads of it (its
    # serving and saved state) and the version and model the specs want: no clock, no Prometheus,
    # no gate. So while those stay the same, the next pass has nothing to do there and reuses the
    # state; at 10,000 endpoints at rest that was nearly all of a walk. A backend that cannot say
    # what it read (no `observed`) has every endpoint reconciled every pass.
    observed: Callable[[str], object | None] | None = getattr(controllers.backend, "observed", None)
    at_rest = controllers.at_rest
    for endpoint, model, version, policy in endpoints:
        name = endpoint.name
        if endpoint.spec.experiment is not None:
            at_rest.pop(name, None)
            experiment = controllers.experiments.reconcile(endpoint, version)
            if experiment is not None:
                saved = controllers.backend.load_state(name)  # the experiment controller saved it there
                if saved is not None:
                    states[name] = saved
                lines[name] = experiment_line(name, experiment)
            continue
        rest = at_rest.get(name)
        if rest is not None and observed is not None:
            read = (observed(name), version, model)
            if read[0] is not None and read == rest.read:  # the same objects compare by identity: no deep compare
                if read[0] is not rest.read[0]:
                    at_rest[name] = AtRest(read, rest.state, rest.line)
                states[name], lines[name] = rest.state, rest.line
                continue
        state = controllers.rollouts.reconcile(endpoint, version, model, policy)
        if state is None:
            at_rest.pop(name, None)
            continue
        states[name] = state
        lines[name] = rollout_line(name, state)
        after = observed(name) if observed is not None else None  # after its own writes
        if state.phase in AT_REST and after is not None:
            at_rest[name] = AtRest((after, version, model), state, lines[name])
        else:
            at_rest.pop(name, None)
    return states, lines


def observe_pass(controllers: Controllers, endpoints: list[DesiredEndpoint]) -> dict[str, RolloutState]:
    """Refresh the backend and read each endpoint's rollout state without acting or writing: what
    a watch that does not hold the environment's lock sees while another one acts."""
    controllers.backend.refresh()
    states: dict[str, RolloutState] = {}
    for endpoint, model, version, _policy in endpoints:
        state = (controllers.backend.load_state(endpoint.name) if endpoint.spec.experiment is not None
                 else controllers.rollouts.observe(endpoint, version, model))
        if state is not None:
            states[endpoint.name] = state
    return states


def settled(states: Mapping[str, RolloutState]) -> bool:
    """No rollout in progress: each at rest, and each experiment decided, inconclusive or stopped."""
    return all(st.phase in AT_REST and (not st.experiment or st.experiment.get("phase") in EXPERIMENT_FINAL)
               for st in states.values())


def failed(states: Mapping[str, RolloutState]) -> list[str]:
    """The endpoints whose rollout ended rolled back or aborted."""
    return [name for name, st in states.items() if st.phase in FAILED]


@dataclass(frozen=True)
class WatchOptions:
    """When `forgectl reconcile` stops (its flags)."""

    #: Keep reconciling; False: one pass.
    watch: bool = False
    #: Seconds between passes.
    interval: float = 1.0
    #: Stop after this many passes (0: never).
    passes: int = 0
    #: Stop once :func:`settled`; the exit code then says whether a rollout failed.
    until_settled: bool = False
    #: Give up (an error) after this many seconds (0: never).
    timeout: float = 0.0


def run(controllers: Controllers, endpoints: list[DesiredEndpoint], options: WatchOptions, *,
        leadership: Leadership | None = None,
        on_line: Callable[[str], None] | None = None,
        on_pass: Callable[[dict[str, RolloutState]], None] | None = None,
        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> int:
    """Reconcile until a stop rule holds and return the exit code: :data:`EXIT_ROLLED_BACK` when
    `until_settled` and a rollout failed, else :data:`EXIT_OK`. ``on_line`` gets an endpoint's line
    when it differs from the last one it got for that endpoint; ``on_pass`` gets each pass's
    states. Raises :class:`ForgeError` past the timeout, naming the rollouts still in progress.

    With ``leadership``, a pass acts only while it holds the environment's lock (taken when free,
    let go for good once a write finds it lost); otherwise the pass only reads the states, and
    ``on_line`` hears whenever this watch starts or stops leading. A single pass (no `watch`) that
    cannot take the lock raises :class:`LockHeldError`. The lock is let go on return.
    ``clock`` and ``sleep`` are injectable for tests."""
    last: dict[str, str] = {}
    count = 0
    began = clock()

    def say(key: str, line: str) -> None:
        if last.get(key) != line:
            last[key] = line
            if on_line is not None:
                on_line(line)

    def check_timeout(states: Mapping[str, RolloutState]) -> None:
        if options.timeout and clock() - began > options.timeout:
            raise ForgeError(f"rollouts still in progress after {options.timeout:.0f} s: "
                             + ", ".join(f"{n} {st.phase.value}" for n, st in states.items()))

    def one_pass() -> tuple[dict[str, RolloutState], dict[str, str], bool]:
        """One pass: reconciled while this watch leads (or without a lock), else only observed;
        and whether it may end the watch — not a pass whose write was refused, which recorded
        nothing of what it decided (a promotion's traffic move may have landed without its state)."""
        if leadership is None or leadership.leading():
            if leadership is not None:
                say("", f"{leadership.holder}: leading — this watch alone moves the rollouts")
            try:
                states, lines = reconcile_pass(controllers, endpoints)
            except LeaseLost as exc:
                if leadership is None:
                    raise
                leadership.deposed(str(exc))
                states, lines = observe_pass(controllers, endpoints), {}
            except ConflictError as exc:
                # A write refused as stale (409), the Lease still ours: never sent again as it
                # was — this pass ends, and the next one reads again and decides anew.
                if not options.watch:
                    raise
                say("", f"{leadership.holder if leadership else 'reconcile'}: {exc}")
                return observe_pass(controllers, endpoints), {}, False
        elif not options.watch:
            raise LockHeldError(f"not reconciled: {leadership.waiting}")
        else:
            states, lines = observe_pass(controllers, endpoints), {}
        return states, lines, True

    states: dict[str, RolloutState] = {}
    try:
        while True:
            try:
                states, lines, final = one_pass()
            except (TransientError, StorageFullError) as exc:
                # The API server (or its etcd) did not answer through the target's retries, or
                # etcd refuses every write for want of space: this pass moved nothing it could not
                # finish (a write either landed or was refused; the saved state says which), and a
                # watch goes on — the next pass reads again. A lock whose renewals failed
                # meanwhile is found lost by its fence: no write.
                if not options.watch:
                    raise
                why = ("the cluster refuses every write (its etcd is out of space)" if isinstance(exc, StorageFullError)
                       else "the cluster did not answer")
                say("", f"{leadership.holder if leadership else 'reconcile'}: {why}, nothing moved — {exc}")
                check_timeout(states)
                sleep(options.interval)
                continue
            if leadership is not None and leadership.waiting is not None:
                say("", f"{leadership.holder}: following, nothing written — {leadership.waiting}")
            for name, line in lines.items():
                say(name, line)
            if on_pass is not None:
                on_pass(states)
            count += 1
            if not options.watch or (options.passes and count >= options.passes) or (
                    options.until_settled and final and settled(states)):
                return EXIT_ROLLED_BACK if options.until_settled and failed(states) else EXIT_OK
            check_timeout(states)
            sleep(options.interval)
    finally:
        if leadership is not None:
            leadership.release()
