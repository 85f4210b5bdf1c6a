"""The logic `forgectl` delegates to `reconciler/` (issue 13, a thin CLI): the shared target flags,
the endpoints and the versions the specs want, the watch loop and its exit codes, steering a
rollout by hand, the write-back hook and the pull-request plan.

The loop and steering run the real rollout controller on a fake backend (the target as the
controller sees it, state kept as JSON like both targets keep it) with a fake clock and sleep:
no server, no waiting. The write-back and the pull-request plan run on real git repositories.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import git
import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from forgectl.cli import app as forgectl_app
from forgectl.options import NO_OVERRIDES, PathsArg, TargetFlags, with_target_flags
from reconciler.controller.watch import EXIT_OK, EXIT_ROLLED_BACK, Controllers, WatchOptions, failed, reconcile_pass, run, settled
from reconciler.diagnostics import ForgeError
from reconciler.experiment.controller import ExperimentState
from reconciler.load.endpoints import desired_endpoints, find_endpoint
from reconciler.load.loader import load_or_raise
from reconciler.plan.pullrequest import pull_request_plan
from reconciler.rollout.controller import Controller, Phase, RolloutState
from reconciler.rollout.steering import retry, status_data, steer
from reconciler.rollout.writeback import rollback_hook
from renderers.seldon import ServingState
from renderers.versions import model_version
from specs import Endpoint, RolloutPolicy

ROOT = Path(__file__).resolve().parents[2]
V1, V2 = "a" * 12, "b" * 12
FLAG_HELP = {
    "--kubeconfig": "Kubeconfig file (default $KUBECONFIG, then ~/.kube/config).",
    "--context": "Kubeconfig context (default: the current one).",
    "--namespace": "Namespace (default: the environment's).",
    "--prometheus-url": "Prometheus the rollout gates query (default: the environment's `prometheus.url`), e.g. "
                        "http://127.0.0.1:9090 through `kubectl port-forward` when forgectl runs outside the cluster.",
}


# -- the shared target flags ------------------------------------------------------------------

def _tiny_app() -> tuple[typer.Typer, list[tuple[Any, ...]]]:
    seen: list[tuple[Any, ...]] = []
    app = typer.Typer()

    @app.command()
    @with_target_flags
    def show(paths: PathsArg = None, flags: TargetFlags = NO_OVERRIDES,
             verbose: Annotated[bool, typer.Option("--verbose")] = False) -> None:
        seen.append((paths, flags, verbose))

    @app.command()
    def other() -> None:  # a second command, so `show` is a subcommand as in forgectl
        seen.append(("other",))

    return app, seen


def test_target_flags_arrive_as_one_value_and_positionals_stay() -> None:
    app, seen = _tiny_app()
    result = CliRunner().invoke(app, ["show", "a", "b", "-n", "ns", "--kubeconfig", "k", "--context", "c", "--verbose",
                                      "--prometheus-url", "http://127.0.0.1:9090"])
    assert result.exit_code == 0, result.output
    assert seen == [(["a", "b"], TargetFlags("k", "c", "ns", "http://127.0.0.1:9090"), True)]
    seen.clear()
    assert CliRunner().invoke(app, ["show"]).exit_code == 0
    assert seen == [(None, TargetFlags(), False)]


def test_target_flags_take_the_place_of_the_group_parameter() -> None:
    app, _ = _tiny_app()
    params = [p for p in get_command(app).commands["show"].params]
    assert [p.name for p in params] == ["paths", "kubeconfig", "context", "namespace", "prometheus_url", "verbose"]
    assert [p.opts for p in params[1:4]] == [["--kubeconfig"], ["--context"], ["--namespace", "-n"]]


def test_with_target_flags_refuses_a_command_without_the_group_or_with_a_clash() -> None:
    def without(paths: PathsArg = None) -> None: ...

    def clash(namespace: str = "", flags: TargetFlags = NO_OVERRIDES) -> None: ...

    with pytest.raises(TypeError, match="exactly one parameter annotated TargetFlags"):
        with_target_flags(without)
    with pytest.raises(TypeError, match="clash with the target flags"):
        with_target_flags(clash)


def _commands(group: Any, prefix: str = "") -> dict[str, Any]:
    found = {}
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            found.update(_commands(command, f"{prefix}{name} "))
        else:
            found[f"{prefix}{name}"] = command
    return found


def test_every_command_with_target_flags_has_the_same_four() -> None:
    commands = _commands(get_command(forgectl_app))
    with_flags = sorted(name for name, c in commands.items() if any(p.name == "kubeconfig" for p in c.params))
    assert with_flags == ["apply", "diff", "doctor", "down", "experiment status", "experiment stop", "models diff", "models list",
                          "models report", "models show", "plan", "reconcile", "rollout abort", "rollout promote",
                          "rollout retry", "rollout status", "status"]
    for name in with_flags:
        params = {p.name: p for p in commands[name].params}
        for flag, help_text in FLAG_HELP.items():
            option = params[flag.removeprefix("--").replace("-", "_")]
            assert option.opts[0] == flag and option.help == help_text and option.default is None, (name, flag)
        assert params["namespace"].opts == ["--namespace", "-n"]


# -- endpoints -----------------------------------------------------------------------------------

def _specs(tmp_path: Path, example: str = "quickstart") -> Any:
    root = tmp_path / example
    shutil.copytree(ROOT / "examples" / example, root)
    return load_or_raise([str(root)])


def test_desired_endpoints_name_the_model_version_and_policy(tmp_path: Path) -> None:
    result = _specs(tmp_path)
    env = result.specs.environment(None)
    [digits] = desired_endpoints(result.specs, env)
    endpoint, model, version, policy = digits  # unpacks as the 4-tuple the commands use
    assert (endpoint.name, model) == ("digits", "digits-mlp")
    assert version == model_version(result.specs, result.specs.model_of(endpoint), env)
    assert policy is not None and policy.name == "three-step-canary"  # the environment's default
    assert find_endpoint(result.specs, env, "digits") == digits
    assert desired_endpoints(result.specs, env, "nope") == []
    with pytest.raises(ForgeError, match="no Endpoint 'nope' in the specs"):
        find_endpoint(result.specs, env, "nope")
    with pytest.raises(ForgeError, match="no Endpoint '' in the specs"):  # an empty name is no wildcard
        find_endpoint(result.specs, env, "")


# -- the watch loop --------------------------------------------------------------------------------

def _endpoint(name: str, *, experiment: bool = False, shadow: bool = False) -> Endpoint:
    """A valid Endpoint of the quick-start's model; with an A/B experiment or a shadow when asked."""
    spec: dict[str, Any] = {"modelRef": "digits-mlp"}
    if experiment:
        spec["experiment"] = {"arms": [{"name": "control", "share": 50}, {"name": "int8", "variant": "int8", "share": 50}],
                              "primary": {"kind": "success-rate"}}
    if shadow:
        spec["shadow"] = {"variant": "pruned", "percent": 100}
    return Endpoint.model_validate({"apiVersion": "forge.dev/v1alpha1", "kind": "Endpoint", "metadata": {"name": name},
                                    "spec": spec})


@dataclass
class FakeBackend:
    """The target as the rollout commands see it: what serves, the saved state (as JSON), the
    offline gate, events, and how often the loop read the target afresh."""

    serving_now: dict[str, ServingState] = field(default_factory=dict)
    gate: tuple[bool, bool, str] = (True, True, "Workflow succeeded: evaluation thresholds met")
    saved: dict[str, dict[str, Any]] = field(default_factory=dict)
    refreshes: int = 0
    revisions: dict[str, str] = field(default_factory=dict)

    def refresh(self) -> None:
        self.refreshes += 1

    def serving(self, endpoint: str) -> ServingState | None:
        return self.serving_now.get(endpoint)

    def load_state(self, endpoint: str) -> RolloutState | None:
        data = self.saved.get(endpoint)
        return RolloutState.from_json(data) if data is not None else None

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        self.saved[endpoint] = json.loads(json.dumps(state.to_json()))

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        self.serving_now[endpoint.name] = state

    def model_gate(self, model: str, version: str) -> tuple[bool, bool, str]:
        return self.gate

    def event(self, endpoint: str, kind: str, reason: str, message: str) -> None:
        pass

    def stable_revision(self, model: str, version: str) -> str | None:
        return self.revisions.get(version)

    def shadow_stats(self, endpoint: str) -> dict[str, Any] | None:
        return {"mirrored": 3}


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


def _desired(*endpoints: Endpoint, version: str = V1) -> list[Any]:
    from reconciler.load.endpoints import DesiredEndpoint

    return [DesiredEndpoint(e, "digits-mlp", version, None) for e in endpoints]


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
    code, lines, passes = _run(_controllers(backend), _desired(_endpoint("digits")), WatchOptions(), clock)
    assert (code, backend.refreshes, clock.sleeps) == (EXIT_OK, 1, [])
    assert passes == [{"digits": "Idle"}] and lines == ["digits: Idle step 0 canary 0 % — "]


def test_an_endpoint_not_applied_yet_has_no_line_and_no_state() -> None:
    backend = FakeBackend()
    code, lines, passes = _run(_controllers(backend), _desired(_endpoint("digits")), WatchOptions(), Clock())
    assert (code, lines, passes) == (EXIT_OK, [], [{}])


def test_watch_reports_a_line_only_when_it_changes_and_stops_after_passes() -> None:
    backend = FakeBackend({"digits": ServingState(V1)})
    clock = Clock()
    code, lines, passes = _run(_controllers(backend), _desired(_endpoint("digits")),
                               WatchOptions(watch=True, interval=0.5, passes=3), clock)
    assert code == EXIT_OK and len(passes) == 3 and backend.refreshes == 3
    assert clock.sleeps == [0.5, 0.5]  # none after the last pass
    assert lines == ["digits: Idle step 0 canary 0 % — "]


def test_until_settled_exits_3_when_a_rollout_rolled_back() -> None:
    backend = FakeBackend({"digits": ServingState(V1, V2, 0)}, gate=(True, False, "evaluation accuracy 0.5 < 0.95"))
    clock = Clock()
    code, lines, passes = _run(_controllers(backend), _desired(_endpoint("digits"), version=V2),
                               WatchOptions(watch=True, until_settled=True), clock)
    assert code == EXIT_ROLLED_BACK and passes[-1] == {"digits": "RolledBack"}
    assert lines[-1].startswith("digits: RolledBack ")


def test_until_settled_exits_0_when_every_rollout_promoted() -> None:
    backend = FakeBackend({"digits": ServingState(V1, V2, 0)})
    clock = Clock()
    code, _, passes = _run(_controllers(backend), _desired(_endpoint("digits"), version=V2),
                           WatchOptions(watch=True, until_settled=True), clock)
    assert code == EXIT_OK and passes[-1] == {"digits": "Promoted"}


def test_a_plain_watch_ignores_how_rollouts_ended() -> None:
    backend = FakeBackend({"digits": ServingState(V1, V2, 0)}, gate=(True, False, "evaluation failed"))
    code, _, passes = _run(_controllers(backend), _desired(_endpoint("digits"), version=V2),
                           WatchOptions(watch=True, passes=2), Clock())
    assert code == EXIT_OK and passes[-1] == {"digits": "RolledBack"}


def test_watch_gives_up_after_the_timeout_naming_what_is_in_progress() -> None:
    backend = FakeBackend({"digits": ServingState(V1, V2, 0)}, gate=(False, False, "Workflow still running"))
    clock = Clock()
    with pytest.raises(ForgeError, match=r"rollouts still in progress after 3 s: digits WaitingForModel"):
        _run(_controllers(backend), _desired(_endpoint("digits"), version=V2),
             WatchOptions(watch=True, interval=1.0, until_settled=True, timeout=3.0), clock)
    assert clock.sleeps == [1.0] * 4  # after passes at 0, 1, 2 and 3 s; the fifth, at 4 s, is past the 3 s


def test_an_experiment_endpoint_is_the_experiment_controllers() -> None:
    backend = FakeBackend({"digits": ServingState(V1), "ab": ServingState(V1)})
    controllers = _controllers(backend)
    states, lines = reconcile_pass(controllers, _desired(_endpoint("ab", experiment=True), _endpoint("digits")))
    assert controllers.experiments.asked == ["ab"]
    assert lines == {"ab": f"ab: experiment Running — looked at {V1}", "digits": "digits: Idle step 0 canary 0 % — "}
    assert states["ab"].experiment is not None and states["ab"].experiment["phase"] == "Running"
    assert not settled(states)  # an experiment still running keeps the watch going
    controllers.experiments.phase = "Decided"
    states, _ = reconcile_pass(controllers, _desired(_endpoint("ab", experiment=True), _endpoint("digits")))
    assert settled(states)


@pytest.mark.parametrize("phase, at_rest, has_failed", [
    (Phase.IDLE, True, False), (Phase.WAITING, False, False), (Phase.PROGRESSING, False, False),
    (Phase.HOLDING, False, False), (Phase.PAUSED, False, False), (Phase.PROMOTED, True, False),
    (Phase.ROLLED_BACK, True, True), (Phase.ABORTED, True, True)])
def test_settled_and_failed_by_phase(phase: Phase, at_rest: bool, has_failed: bool) -> None:
    states = {"digits": RolloutState("digits", V1, V2, phase)}
    assert settled(states) is at_rest
    assert failed(states) == (["digits"] if has_failed else [])


# -- steering by hand -----------------------------------------------------------------------------

def _in_progress(backend: FakeBackend, endpoint: Endpoint) -> RolloutState:
    """A rollout waiting for its model (the offline gate not passed yet), as `reconcile` leaves it."""
    backend.serving_now[endpoint.name] = ServingState(V1, V2, 0)
    backend.gate = (False, False, "Workflow still running")
    state = Controller(backend, None, "forge-test").reconcile(endpoint, V2, "digits-mlp", None)
    assert state is not None and state.phase is Phase.WAITING
    return state


@pytest.mark.parametrize("promote, phase", [(True, Phase.PROMOTED), (False, Phase.ABORTED)])
def test_steer_promotes_or_aborts_a_rollout_in_progress_and_saves_it(promote: bool, phase: Phase) -> None:
    backend = FakeBackend()
    desired = _desired(_endpoint("digits"), version=V2)[0]
    state = _in_progress(backend, desired.endpoint)
    controller = Controller(backend, None, "forge-test")
    after = steer(controller, backend, desired, state, promote=promote)
    assert after.phase is phase and backend.load_state("digits") == after
    with pytest.raises(ForgeError, match="endpoint 'digits' has no rollout in progress"):
        steer(controller, backend, desired, after, promote=promote)  # at rest now


def test_steer_refuses_without_a_rollout() -> None:
    backend = FakeBackend()
    desired = _desired(_endpoint("digits"))[0]
    controller = Controller(backend, None, "forge-test")
    for state in (None, RolloutState("digits", V1), RolloutState("digits", V1, V2, Phase.IDLE)):
        with pytest.raises(ForgeError, match="has no rollout in progress"):
            steer(controller, backend, desired, state, promote=True)
    assert backend.saved == {}


def test_retry_starts_a_failed_rollout_again_and_refuses_others() -> None:
    backend = FakeBackend()
    desired = _desired(_endpoint("digits"), version=V2)[0]
    controller = Controller(backend, None, "forge-test")
    aborted = steer(controller, backend, desired, _in_progress(backend, desired.endpoint), promote=False)
    again = retry(controller, backend, desired, aborted)
    assert again.phase is Phase.WAITING and again.canary == V2 and backend.load_state("digits") == again
    for state in (None, again, RolloutState("digits", V1, V2, Phase.PROMOTED)):
        with pytest.raises(ForgeError, match="has no rolled-back or aborted rollout to retry"):
            retry(controller, backend, desired, state)


def test_status_data_asks_for_shadow_figures_only_with_a_shadow() -> None:
    asked: list[str] = []

    def stats(endpoint: str) -> dict[str, Any]:
        asked.append(endpoint)
        return {"mirrored": 3}

    desired = _desired(_endpoint("digits"), version=V2)[0]
    state = RolloutState("digits", V1, V2, Phase.PROGRESSING, step=0, weight=10)
    data = status_data(desired, ServingState(V1, V2, 10), state, stats)
    assert data == {"endpoint": "digits", "model": "digits-mlp", "desiredVersion": V2,
                    "serving": {"stable": V1, "canary": V2, "weights": {"stable": 90, "canary": 10}},
                    "rollout": state.to_json(), "shadow": None}
    assert asked == []
    shadowed = _desired(_endpoint("digits", shadow=True), version=V2)[0]
    assert status_data(shadowed, None, None, stats)["shadow"] == {"mirrored": 3} and asked == ["digits"]
    assert status_data(desired, None, None, None) == {"endpoint": "digits", "model": "digits-mlp", "desiredVersion": V2,
                                                      "serving": None, "rollout": None, "shadow": None}


# -- the write-back hook --------------------------------------------------------------------------

def _repo(tmp_path: Path, writeback: bool) -> tuple[Path, git.Repo, str]:
    """The quick-start committed twice: the second commit changes the learning rate."""
    root = tmp_path / "quickstart"
    shutil.copytree(ROOT / "examples" / "quickstart", root)
    if writeback:
        policy = root / "rollout.yaml"
        policy.write_text(policy.read_text().replace("  onPrometheusUnreachable: hold",
                                                     "  onPrometheusUnreachable: hold\n  gitWriteback:\n    enabled: true"))
    repo = git.Repo.init(root)
    with repo.config_writer() as config:
        config.set_value("user", "name", "Forge Tests").set_value("user", "email", "tests@forge.invalid")
    repo.git.add(".")
    first = repo.index.commit("quick-start").hexsha
    model = root / "model.yaml"
    model.write_text(model.read_text().replace("learningRate: 0.002", "learningRate: 0.003"))
    repo.git.add(".")
    repo.index.commit("learning rate 0.003")
    return root, repo, first


def test_rollback_hook_commits_the_stable_model_spec_on_the_policy_branch(tmp_path: Path) -> None:
    root, repo, first = _repo(tmp_path, writeback=True)
    result = load_or_raise([str(root)])
    env = result.specs.environment(None)
    endpoint = result.specs.get(Endpoint, "digits")
    assert env is not None and endpoint is not None
    hook = rollback_hook(result, env, FakeBackend(revisions={V1: first}))
    state = RolloutState("digits", V1, V2, Phase.ROLLED_BACK, reason="success-rate 0.5 < 0.99")
    line = hook(endpoint, state)
    sha = repo.heads["forge/rollback-digits"].commit.hexsha
    assert line == f"committed {sha[:12]} on branch forge/rollback-digits"
    commit = repo.commit(sha)
    assert "learningRate: 0.002" in (commit.tree / "model.yaml").data_stream.read().decode()
    assert str(commit.message).startswith(f"Revert model digits-mlp to {V1}: canary {V2} rolled back")
    assert "learningRate: 0.003" in (root / "model.yaml").read_text()  # the checkout is untouched
    assert hook(endpoint, RolloutState("digits", "c" * 12, V2, Phase.ROLLED_BACK)) == \
        f"write-back skipped: the revision of stable version {'c' * 12} is unknown"
    broken = rollback_hook(result, env, FakeBackend(revisions={V1: "0" * 40}))
    assert broken(endpoint, state).startswith("write-back failed: ")  # reported, never raised


def test_rollback_hook_does_nothing_unless_the_policy_asks(tmp_path: Path) -> None:
    root, repo, first = _repo(tmp_path, writeback=False)
    result = load_or_raise([str(root)])
    env = result.specs.environment(None)
    endpoint = result.specs.get(Endpoint, "digits")
    assert env is not None and endpoint is not None
    hook = rollback_hook(result, env, FakeBackend(revisions={V1: first}))
    assert hook(endpoint, RolloutState("digits", V1, V2, Phase.ROLLED_BACK)) == ""
    assert "forge/rollback-digits" not in repo.heads


# -- the pull-request plan -------------------------------------------------------------------------

def test_pull_request_plan_of_a_local_environment_has_no_live_diff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, repo, _ = _repo(tmp_path, writeback=False)
    monkeypatch.chdir(root)
    plan = pull_request_plan(["."], "HEAD~1", "HEAD", None)
    assert (plan["base"], plan["head"]) == ("HEAD~1", "HEAD")
    assert "no live diff: the environment's target is not a cluster" in plan["notes"]
    assert "live" not in plan
    assert plan["summary"]["create"] >= 1  # the learning rate's new model version: a new Workflow
    assert any(c["path"].endswith("learningRate") for c in plan["specChanges"])
    working = pull_request_plan(["."], "HEAD", None, None)
    assert working["head"] == "working tree" and working["specChanges"] == []
    assert (working["summary"]["create"], working["summary"]["update"], working["summary"]["delete"]) == (0, 0, 0)


def test_pull_request_plan_reads_the_cluster_only_where_the_base_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, repo, _ = _repo(tmp_path, writeback=False)
    monkeypatch.chdir(root)
    envs = root / "environments.yaml"
    envs.write_text(envs.read_text().replace("namespace: forge-quickstart", "namespace: elsewhere"))
    from reconciler.plan.session import TargetOptions

    plan = pull_request_plan(["."], "HEAD", None, "cluster", TargetOptions(kubeconfig="/nonexistent/forge-tests/kubeconfig"))
    notes = "\n".join(plan["notes"])
    assert "environment `cluster` changes its cluster settings; the live diff uses those at HEAD" in notes
    assert "no live diff: " in notes and "live" not in plan  # no cluster answers at a kubeconfig that does not exist
    with pytest.raises(ForgeError, match="no environment 'nope' in the specs"):
        pull_request_plan(["."], "HEAD", None, "nope")


# -- the plan `plan` shows and `apply` carries out ------------------------------------------------

def test_saved_plan_is_read_only_from_one_existing_json_file(tmp_path: Path) -> None:
    from reconciler.plan.live import saved_plan
    from reconciler.plan.plan import Plan

    plan = Plan("local", "local", (), live_fingerprint="f" * 16, notes=("a note",))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_json()))
    assert saved_plan([str(path)]) == plan
    (tmp_path / "specs").mkdir()
    for paths in (None, [], [str(tmp_path / "specs")], [str(tmp_path / "missing.json")], [str(path), str(path)]):
        assert saved_plan(paths) is None  # specs to plan, not a saved plan
    bad = tmp_path / "bad.json"
    for text in ("{not json", json.dumps({"format": 1})):
        bad.write_text(text)
        with pytest.raises(ForgeError, match=r"bad\.json: not a saved Forge plan"):
            saved_plan([str(bad)])


def test_ensure_runnable_refuses_a_blocked_plan_naming_the_first_blocker() -> None:
    from reconciler.plan.live import ensure_runnable
    from reconciler.plan.plan import Plan
    from reconciler.plan.risks import Finding

    ensure_runnable(Plan("local", "local", ()))
    one = Finding("gpu-capacity", "model `big` needs 16 GPUs; pool `a100` has 8")
    with pytest.raises(ForgeError, match=r"^the target cannot run this plan: model `big` needs 16 GPUs; pool `a100` has 8$"):
        ensure_runnable(Plan("local", "local", (), blockers=(one,)))
    with pytest.raises(ForgeError, match=r"pool `a100` has 8 \(and 2 more\)$"):
        ensure_runnable(Plan("local", "local", (), blockers=(one, one, one)))


def test_plan_json_adds_prerequisite_notes_only_for_a_cluster(tmp_path: Path) -> None:
    from reconciler.plan.live import plan_json
    from reconciler.plan.plan import Plan

    result = _specs(tmp_path)
    local = result.specs.environment("local")
    plan = Plan("local", "local", (), notes=("a note",))
    # the local target is never asked: there is no cluster to check
    assert plan_json(plan, local, None) == plan.to_json()
