"""Make git agree after a rollback: commit, on a branch, the model spec as it was at the revision
the stable version was rendered from — so the repository stops claiming a version that is not
live. Uses a temporary worktree, so the user's checkout is never touched."""

from __future__ import annotations

import tempfile
from pathlib import Path

import git

from reconciler.diagnostics import ForgeError


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
