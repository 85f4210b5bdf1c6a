"""The write-back hook (`reconciler/rollout/writeback.py`): after a rollback, the stable version's
model spec committed on the policy's branch of a real git repository, when the policy asks."""

from __future__ import annotations

from pathlib import Path

import git

from reconciler.controller.config import Source
from reconciler.controller.sync import inside, load_revision
from reconciler.load.gitrepo import fetch_source
from reconciler.load.loader import load_or_raise
from reconciler.rollout.controller import Phase, RolloutState
from reconciler.rollout.writeback import NoWriteback, SourcePush, rollback_hook
from specs import Endpoint
from tests.reconciler.quickstart_repo import committed_quickstart
from tests.reconciler.rollout_fakes import V1, V2, FakeBackend


def test_rollback_hook_commits_the_stable_model_spec_on_the_policy_branch(tmp_path: Path) -> None:
    root, repo, first = committed_quickstart(tmp_path, writeback=True)
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
    root, repo, first = committed_quickstart(tmp_path, writeback=False)
    result = load_or_raise([str(root)])
    env = result.specs.environment(None)
    endpoint = result.specs.get(Endpoint, "digits")
    assert env is not None and endpoint is not None
    hook = rollback_hook(result, env, FakeBackend(revisions={V1: first}))
    assert hook(endpoint, RolloutState("digits", V1, V2, Phase.ROLLED_BACK)) == ""
    assert "forge/rollback-digits" not in repo.heads


# -- the in-cluster controller's: committed in its cache at the applied revision, pushed to its source --


def test_the_controller_pushes_its_write_back_to_the_source_and_builds_on_the_branch_as_the_source_has_it(
        tmp_path: Path) -> None:
    root, work, first = committed_quickstart(tmp_path, writeback=True)
    source = git.Repo.init(tmp_path / "source.git", bare=True, initial_branch="main")
    work.git.push(source.git_dir, "HEAD:refs/heads/main")
    url = Path(source.git_dir).as_uri()
    cache = tmp_path / "cache"
    revision = fetch_source(cache, url, "main", timeout=30)
    environment = load_or_raise([str(root)]).specs.environment(None)
    assert environment is not None
    config = Source(name="quickstart", url=url, environment=environment.name, namespace="forge")
    loaded = load_revision(config, cache, revision)  # as the controller reads it: blobs of the cache, no checkout
    endpoint = loaded.result.specs.get(Endpoint, "digits")
    assert endpoint is not None
    hook = rollback_hook(loaded.result, loaded.environment, FakeBackend(revisions={V1: first}),
                         SourcePush(cache, url, revision, 30.0, lambda: None))
    state = RolloutState("digits", V1, V2, Phase.ROLLED_BACK, reason="success-rate 0.5 < 0.99")
    with inside(cache):
        line = hook(endpoint, state)
    pushed = source.heads["forge/rollback-digits"].commit
    assert line == f"pushed {pushed.hexsha[:12]} to branch forge/rollback-digits of {url}"
    assert [p.hexsha for p in pushed.parents] == [revision]  # on top of the applied revision
    assert "learningRate: 0.002" in (pushed.tree / "model.yaml").data_stream.read().decode()
    assert "forge/rollback-digits" not in work.heads  # nothing in anyone's checkout

    # a person adds to the branch at the source; the next write-back starts from theirs
    work.git.fetch(source.git_dir, "forge/rollback-digits:forge/rollback-digits")
    work.git.checkout("forge/rollback-digits")
    (root / "NOTES.md").write_text("reviewed\n")
    work.git.add("NOTES.md")
    theirs = work.index.commit("a note on the revert").hexsha
    work.git.push(source.git_dir, "forge/rollback-digits")
    with inside(cache):
        again = hook(endpoint, state)
    assert again == f"pushed {theirs[:12]} to branch forge/rollback-digits of {url}"  # nothing left to revert
    assert source.heads["forge/rollback-digits"].commit.hexsha == theirs

    # deleted at the source (merged, say): made again there, not from the cache's old copy
    source.delete_head("forge/rollback-digits", force=True)
    with inside(cache):
        third = hook(endpoint, state)
    remade = source.heads["forge/rollback-digits"].commit
    assert third.startswith(f"pushed {remade.hexsha[:12]} ") and [p.hexsha for p in remade.parents] == [revision]

    # where the source does not allow it, nothing is made and the line says why
    held = rollback_hook(loaded.result, loaded.environment, FakeBackend(revisions={V1: first}),
                         NoWriteback("source quickstart does not push write-backs (its `pushWritebacks` is off)"))
    assert held(endpoint, state) == "write-back skipped: source quickstart does not push write-backs (its `pushWritebacks` is off)"
    # a source that refuses the push: the rollback stands, the line says what git said
    refusing = rollback_hook(loaded.result, loaded.environment, FakeBackend(revisions={V1: first}),
                             SourcePush(cache, (tmp_path / "gone.git").as_uri(), revision, 30.0, lambda: None))
    with inside(cache):
        assert refusing(endpoint, state).startswith("write-back failed: ")
