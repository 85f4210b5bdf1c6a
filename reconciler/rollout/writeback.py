"""Make git agree after a rollback: commit, on a branch, the model spec as it was at the revision
the stable version was rendered from — so the repository stops claiming a version that is not
live. The commit is made with git's plumbing on a temporary index (read-tree, update-index,
write-tree, commit-tree, update-ref): no work tree is checked out, so the user's checkout is never
touched and no checkout filter, hook or fsmonitor of the tree runs; every command goes through
:mod:`reconciler.load.gitrepo` (closed environment, repository checks)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from reconciler.diagnostics import ForgeError, printable
from reconciler.load.gitrepo import open_repository
from reconciler.load.loader import LoadResult
from reconciler.rollout.controller import RolloutState
from specs import Endpoint, Environment

#: What the rollout controller calls after a rollback (``Controller.on_rollback``): it returns a
#: line for the rollout state's ``writeback`` field ("" when the policy asks for nothing).
RollbackHook = Callable[[Endpoint, RolloutState], str]

#: Who the write-back's commits are by.
AUTHOR = {"GIT_AUTHOR_NAME": "forgectl", "GIT_AUTHOR_EMAIL": "forgectl@forge.dev",
          "GIT_COMMITTER_NAME": "forgectl", "GIT_COMMITTER_EMAIL": "forgectl@forge.dev"}


class StableRevisions(Protocol):
    """Where a model version came from: the rollout backend knows the git revision each live
    version's Workflow was rendered from."""

    def stable_revision(self, model: str, version: str) -> str | None:
        """The git revision ``version`` of ``model`` was rendered from, or None when unknown."""
        ...


def write_back(repo_dir: str | Path, files: list[str], stable_revision: str, branch: str, message: str) -> str:
    """Commit ``files`` as they were at ``stable_revision`` onto ``branch`` (created from HEAD, or
    advanced if it exists) of the repository whose work tree holds ``repo_dir``. Returns the new
    commit's sha (the branch's tip when nothing changed)."""
    repo = open_repository(repo_dir, needed_by="the rollback write-back")
    rel = []
    for name in files:
        path = os.path.relpath(os.path.abspath(name), repo.top)
        if path == os.pardir or path.startswith(os.pardir + os.sep):
            raise ForgeError(f"{printable(name)}: outside the git repository {repo.top}")
        rel.append(Path(path).as_posix())
    stable = repo.commit(stable_revision.removesuffix("-dirty"))
    ref = f"refs/heads/{branch}"
    repo.run("check-ref-format", ref, what=f"checking the branch name {printable(branch)!r}")
    for line in repo.run("worktree", "list", "--porcelain", "-z", what="listing the work trees").split(b"\0"):
        if line.decode(errors="replace") == f"branch {ref}":
            raise ForgeError(f"branch {printable(branch)!r} is checked out in a work tree; the write-back commits only "
                             "to a branch no work tree has checked out")
    try:
        parent, old = repo.commit(ref), repo.commit(ref)
    except ForgeError:
        parent, old = repo.commit("HEAD"), ""
    entries = []
    for path in rel:
        entry = repo.entry(stable, path, rev=stable_revision)
        if entry is None or entry.type != "blob":
            raise ForgeError(f"{printable(path)} is not a file at revision {printable(stable_revision)}")
        entries.append(f"{entry.mode} {entry.oid}\t{path}\0")
    with tempfile.TemporaryDirectory(prefix="forge-writeback-") as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        repo.run("read-tree", parent, what=f"reading the tree of {ref}", env=index)
        repo.run("update-index", "-z", "--index-info", what="staging the stable model spec",
                 input="".join(entries).encode(errors="surrogateescape"), env=index)
        tree = repo.run("write-tree", what="writing the tree", env=index).decode().strip()
    if tree == repo.run("rev-parse", "--verify", f"{parent}^{{tree}}", what="reading the parent's tree").decode().strip():
        new = parent
    else:
        new = repo.run("commit-tree", tree, "-p", parent, "-F", "-", what="committing the write-back",
                       input=message.encode(), env=AUTHOR).decode().strip()
    if new != old:
        repo.run("update-ref", "-m", "forgectl rollback write-back", ref, new, old, what=f"moving {ref}")
    return new


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
