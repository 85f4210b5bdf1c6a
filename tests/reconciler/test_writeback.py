"""The write-back hook (`reconciler/rollout/writeback.py`): after a rollback, the stable version's
model spec committed on the policy's branch of a real git repository, when the policy asks."""

from __future__ import annotations

from pathlib import Path

from reconciler.load.loader import load_or_raise
from reconciler.rollout.controller import Phase, RolloutState
from reconciler.rollout.writeback import rollback_hook
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
