"""Make git agree after a rollback: commit, on a branch, the model spec as it was at the revision
the stable version was rendered from — so the repository stops claiming a version that is not
live. Uses a temporary worktree, so the user's checkout is never touched."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import git

from reconciler.diagnostics import ForgeError
from reconciler.load.loader import LoadResult
from reconciler.rollout.controller import RolloutState
from specs import Endpoint, Environment

#: What the rollout controller calls after a rollback (``Controller.on_rollback``): it returns a
#: line for the rollout state's ``writeback`` field ("" when the policy asks for nothing).
RollbackHook = Callable[[Endpoint, RolloutState], str]


class StableRevisions(Protocol):
    """Where a model version came from: the rollout backend knows the git revision each live
    version's Workflow was rendered from."""

    def stable_revision(self, model: str, version: str) -> str | None:
        """The git revision ``version`` of ``model`` was rendered from, or None when unknown."""
        ...


def write_back(repo_dir: str | Path, files: list[str], stable_revision: str, branch: str, message: str) -> str:
    """Commit ``files`` as they were at ``stable_revision`` onto ``branch`` (created from HEAD, or
    advanced if it exists). Returns the new commit's sha."""
    try:
        repo = git.Repo(repo_dir, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise ForgeError(f"{repo_dir}: not a git repository; cannot write the rollback back") from exc
    root = Path(repo.working_dir)
    rel = [str(Path(f).resolve().relative_to(root.resolve())) for f in files]
    base = branch if branch in repo.heads else "HEAD"
    with tempfile.TemporaryDirectory(prefix="forge-writeback-") as tmp:
        work = Path(tmp) / "wt"
        if base == "HEAD":
            repo.git.worktree("add", "-b", branch, str(work), "HEAD")
        else:
            repo.git.worktree("add", str(work), branch)
        try:
            wt = git.Repo(work)
            wt.git.checkout(stable_revision.removesuffix("-dirty"), "--", *rel)
            if not wt.is_dirty(index=True, working_tree=False):
                return wt.head.commit.hexsha
            wt.index.commit(message, author=git.Actor("forgectl", "forgectl@forge.dev"),
                            committer=git.Actor("forgectl", "forgectl@forge.dev"))
            return wt.head.commit.hexsha
        finally:
            repo.git.worktree("remove", "--force", str(work))


def rollback_hook(result: LoadResult, environment: Environment, backend: StableRevisions) -> RollbackHook:
    """The write-back policy, as the controller's rollback hook: when the endpoint's RolloutPolicy
    enables `gitWriteback`, commit the Model spec's file as it was at the stable version's revision
    onto the policy's branch. Never raises: a rollback has happened already, and a git failure is
    reported in the returned line instead of stopping the controller."""

    def hook(endpoint: Endpoint, state: RolloutState) -> str:
        policy = result.specs.policy_of(endpoint, environment)
        if policy is None or not policy.spec.git_writeback.enabled:
            return ""
        model = result.specs.model_of(endpoint)
        revision = backend.stable_revision(model.name, state.stable)
        if not revision:
            return f"write-back skipped: the revision of stable version {state.stable} is unknown"
        origin = result.origins[("Model", model.name)]
        branch = policy.spec.git_writeback.branch_for(endpoint.name)
        try:
            sha = write_back(Path(origin.file).parent, [origin.file], revision, branch,
                             f"Revert model {model.name} to {state.stable}: canary {state.canary} rolled back\n\n{state.reason}")
        except Exception as exc:  # noqa: BLE001 - git failures must not stop the rollback itself
            return f"write-back failed: {exc}"
        return f"committed {sha[:12]} on branch {branch}"

    return hook
