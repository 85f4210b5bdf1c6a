"""The write-back of an experiment's winner: the Endpoint's spec edited to serve it (its
`experiment` removed, its `variant` the winner's, every other byte kept), committed with real git
onto a branch without touching the checkout, and called by the experiment controller once, when
it decides."""

from __future__ import annotations

import difflib
import shutil
import subprocess
from dataclasses import asdict, replace
from pathlib import Path

import git
import pytest

from reconciler.controller.config import Source
from reconciler.controller.sync import inside, load_revision
from reconciler.experiment.controller import DECIDED, RUNNING, ExperimentController, ExperimentState, experiment_key, resolve_arms
from reconciler.experiment.specedit import NotEditable, serve_winner
from reconciler.experiment.writeback import winner_hook
from reconciler.load.gitrepo import fetch_source
from reconciler.load.loader import load_or_raise
from reconciler.rollout.writeback import SourcePush
from renderers.seldon import ServingState
from specs import Endpoint
from specs.experiment import WinnerWriteback
from tests.experiments.test_controller import VERSION, Backend, Counters, _endpoint

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "experiments"
ORIGINAL = (EXAMPLE / "endpoint.yaml").read_text()


def _changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_the_edit_removes_the_experiment_and_sets_the_variant_keeping_every_other_byte(tmp_path: Path) -> None:
    edited = serve_winner(ORIGINAL, "digits-ab", "int8")
    doc = ORIGINAL.split("name: digits-ab\n", 1)[1]
    block = doc[doc.index("  variant: base\n"):doc.index("  shadow:")]  # `variant` and the whole experiment
    assert block.count("\n") > 20
    assert _changed_lines(ORIGINAL, edited) == [f"-{line}" for line in block.splitlines()] + ["+  variant: int8"]
    assert edited.count("experiment:") == ORIGINAL.count("experiment:") - 1  # the other Endpoint keeps its own
    # the result loads, validates, and says what the winner serves
    shutil.copytree(EXAMPLE, tmp_path / "specs")
    (tmp_path / "specs" / "endpoint.yaml").write_text(edited)
    endpoint = load_or_raise([str(tmp_path / "specs")]).specs.get(Endpoint, "digits-ab")
    assert endpoint is not None and endpoint.spec.experiment is None and endpoint.spec.variant == "int8"
    assert endpoint.spec.shadow is not None and endpoint.spec.shadow.variant == "pruned"


def test_without_a_variant_key_one_is_put_where_the_experiment_was_and_control_only_removes() -> None:
    edited = serve_winner(ORIGINAL, "digits-conversions", "int8")
    assert _changed_lines(ORIGINAL, edited)[-1] == "+  variant: int8"
    assert "digits-conversions\nspec:\n  modelRef: digits-mlp\n  variant: int8\n" in edited
    # a block scalar and a comment after the block: the comment stays, the scalar's lines go
    text = ("kind: Endpoint\nmetadata:\n  name: e\nspec:\n  modelRef: m\n  experiment:\n    primary:\n      kind: ratio\n"
            "      numerator: |\n        sum(a)\n        / 2\n  # the replicas below\n  replicas: 2\n")
    assert serve_winner(text, "e", None) == "kind: Endpoint\nmetadata:\n  name: e\nspec:\n  modelRef: m\n  # the replicas below\n  replicas: 2\n"


@pytest.mark.parametrize("text, why", [
    ("kind: Endpoint\nmetadata: {name: e}\nspec: {modelRef: m, experiment: {arms: []}}\n", "not a block mapping"),
    ("kind: Endpoint\nmetadata: {name: e}\nspec:\n  modelRef: m\n", "has no `spec.experiment`"),
    ("kind: Model\nmetadata: {name: e}\nspec:\n  experiment: {}\n", "no Endpoint named 'e'"),
])
def test_what_cannot_be_edited_is_refused(text: str, why: str) -> None:
    with pytest.raises(NotEditable, match=why):
        serve_winner(text, "e", "int8")


def _repo(tmp_path: Path, enabled: bool = True) -> Path:
    """A git repository of the experiments example, its A/B Endpoint's write-back on or off."""
    repo_dir = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo_dir / "specs")
    endpoint = repo_dir / "specs" / "endpoint.yaml"
    endpoint.write_text(ORIGINAL.replace("      minimumEffect: 0.005\n", "      minimumEffect: 0.005\n"
                                         f"    gitWriteback: {{enabled: {str(enabled).lower()}}}\n", 1))
    repo = git.Repo.init(repo_dir)
    repo.config_writer().set_value("user", "name", "T").set_value("user", "email", "t@example.com").release()
    repo.index.add(["specs"])
    repo.index.commit("experiments")
    return repo_dir


def _decided(endpoint: Endpoint, version: str, winner: str) -> ExperimentState:
    arms = resolve_arms(endpoint, version)
    return ExperimentState(experiment_key(endpoint, arms), DECIDED, 0.0, "base", [asdict(a) for a in arms], winner=winner,
                           reason="msprt (2,412 and 2,398 samples, p = 0.003); int8 serves all traffic")


def test_the_winner_is_committed_on_its_branch_and_the_checkout_is_untouched(tmp_path: Path) -> None:
    repo_dir = _repo(tmp_path)
    result = load_or_raise([str(repo_dir / "specs")])
    endpoint = result.specs.get(Endpoint, "digits-ab")
    assert endpoint is not None and endpoint.spec.experiment is not None
    assert endpoint.spec.experiment.git_writeback == WinnerWriteback(enabled=True)
    repo = git.Repo(repo_dir)
    head, before = repo.head.commit.hexsha, (repo_dir / "specs" / "endpoint.yaml").read_text()
    hook = winner_hook(result)
    line = hook(endpoint, "0123456789ab", _decided(endpoint, "0123456789ab", "int8"))
    branch = "forge/experiment-digits-ab"
    assert line == f"committed {repo.commit(branch).hexsha[:12]} on branch {branch}", line
    committed = repo.git.show(f"{branch}:specs/endpoint.yaml")
    assert committed + "\n" == serve_winner(before, "digits-ab", "int8")
    message = repo.commit(branch).message
    assert message.startswith("Serve arm int8 of endpoint digits-ab: its experiment decided") and "p = 0.003" in message
    assert repo.commit(branch).parents[0].hexsha == head and repo.commit(branch).author.name == "forgectl"
    # the checkout: same HEAD, same file, nothing staged
    assert repo.head.commit.hexsha == head and (repo_dir / "specs" / "endpoint.yaml").read_text() == before
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repo_dir, capture_output=True, text=True).stdout == ""
    # asked again (a restarted controller): written already, the branch stays
    tip = repo.commit(branch).hexsha
    assert hook(endpoint, "0123456789ab", _decided(endpoint, "0123456789ab", "int8")) == line
    assert repo.commit(branch).hexsha == tip
    # merged, then a later experiment decides: the branch moves on from the new HEAD
    repo.git.merge(branch)
    merged = repo.head.commit.hexsha
    (repo_dir / "specs" / "endpoint.yaml").write_text(before)  # the experiment back, a new one
    repo.index.add(["specs/endpoint.yaml"])
    repo.index.commit("another experiment")
    later = hook(endpoint, "0123456789ab", _decided(endpoint, "0123456789ab", "int8"))
    assert later.startswith("committed") and repo.commit(branch).parents[0].hexsha == repo.head.commit.hexsha != merged
    # someone's unmerged commit on the branch is never overwritten
    repo.git.branch("-f", branch, repo.head.commit.hexsha)
    repo.git.checkout("-q", branch)
    (repo_dir / "specs" / "note.txt").write_text("work in progress\n")
    repo.index.add(["specs/note.txt"])
    repo.index.commit("someone's work")
    repo.git.checkout("-q", "-")
    theirs = repo.commit(branch).hexsha
    refused = hook(endpoint, "0123456789ab", _decided(endpoint, "0123456789ab", "int8"))
    assert refused.startswith("write-back failed:") and "holds commits" in refused and repo.commit(branch).hexsha == theirs


def test_no_write_back_unless_enabled_and_none_for_a_version_the_specs_do_not_build(tmp_path: Path) -> None:
    result = load_or_raise([str(_repo(tmp_path, enabled=False) / "specs")])
    endpoint = result.specs.get(Endpoint, "digits-ab")
    assert endpoint is not None
    assert winner_hook(result)(endpoint, "0123456789ab", _decided(endpoint, "0123456789ab", "int8")) == ""
    on = endpoint.model_copy(update={"spec": endpoint.spec.model_copy(update={"experiment": endpoint.spec.experiment.model_copy(
        update={"git_writeback": WinnerWriteback(enabled=True)})})})
    state = _decided(on, "0123456789ab", "int8")
    state = replace(state, arms=[{**a, "version": "ffffffffffff"} if a["name"] == "int8" else a for a in state.arms])
    assert winner_hook(result)(on, "0123456789ab", state).startswith("write-back skipped: the winner serves version ffffffffffff")


def test_the_controller_asks_for_the_write_back_once_when_it_decides() -> None:
    ep = _endpoint(min_samples_per_arm=1000)
    counters = Counters({"base": 0.90, "int8": 0.97})
    backend = Backend(serving_now={ep.name: ServingState(VERSION)})
    asked: list[tuple[str, str, str | None]] = []

    def on_decided(endpoint: Endpoint, version: str, state: ExperimentState) -> str:
        asked.append((endpoint.name, version, state.winner))
        return "committed 0123456789ab on branch forge/experiment-digits-ab"

    clock = [1000.0]
    ctl = ExperimentController(backend, counters, "ns", clock=lambda: clock[0], on_decided=on_decided)
    state = ctl.reconcile(ep, VERSION)
    for _ in range(100):
        if state is None or state.phase != RUNNING:
            break
        counters.serve(200)
        clock[0] += 10
        state = ctl.reconcile(ep, VERSION)
    assert state is not None and state.phase == DECIDED
    for _ in range(3):  # later passes: decided already, nothing asked again
        clock[0] += 10
        state = ctl.reconcile(ep, VERSION)
    assert asked == [("digits-ab", VERSION, "int8")]
    assert state is not None and state.writeback == "committed 0123456789ab on branch forge/experiment-digits-ab"
    assert any(reason == "ExperimentDecided" and "write-back: committed 0123456789ab" in message
               for reason, message in backend.events)


def test_in_the_cluster_the_winner_is_committed_on_the_applied_revision_and_pushed_to_the_source(tmp_path: Path) -> None:
    repo_dir = _repo(tmp_path)
    source = git.Repo.init(tmp_path / "source.git", bare=True, initial_branch="main")
    git.Repo(repo_dir).git.push(source.git_dir, "HEAD:refs/heads/main")
    url, cache = Path(source.git_dir).as_uri(), tmp_path / "cache"
    revision = fetch_source(cache, url, "main", timeout=30)
    environment = load_or_raise([str(repo_dir / "specs")]).specs.environment(None)
    assert environment is not None
    loaded = load_revision(Source(name="experiments", url=url, path="specs", environment=environment.name,
                                  namespace="forge"), cache, revision)
    endpoint = loaded.result.specs.get(Endpoint, "digits-ab")
    assert endpoint is not None
    hook = winner_hook(loaded.result, SourcePush(cache, url, revision, 30.0, lambda: None))
    with inside(cache):
        line = hook(endpoint, "0123456789ab", _decided(endpoint, "0123456789ab", "int8"))
    pushed = source.heads["forge/experiment-digits-ab"].commit
    assert line == f"pushed {pushed.hexsha[:12]} to branch forge/experiment-digits-ab of {url}"
    assert [p.hexsha for p in pushed.parents] == [revision]
    assert (pushed.tree / "specs" / "endpoint.yaml").data_stream.read().decode() == serve_winner(
        (repo_dir / "specs" / "endpoint.yaml").read_text(), "digits-ab", "int8")
