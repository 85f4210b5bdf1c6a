"""Make git agree after a rollback: commit, on a branch, the model spec as it was at the revision
the stable version was rendered from — so the repository stops claiming a version that is not
live. The commit is made with git's plumbing on a temporary index (read-tree, update-index,
write-tree, commit-tree, update-ref): no work tree is checked out, so the user's checkout is never
touched and no checkout filter, hook or fsmonitor of the tree runs; every command goes through
:mod:`reconciler.load.gitrepo` (closed environment, repository checks).

Where a write-back goes is its :data:`WritebackSite`: `forgectl` commits in the checkout it runs in
(a branch to merge by hand, never pushed); the in-cluster controller, whose specs are a revision of
its cache repository, commits there on top of the applied revision and pushes the branch to its
source — only where the source's `pushWritebacks` allows it, with the source's own credentials."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from reconciler.diagnostics import ForgeError, printable
from reconciler.load.gitrepo import GitCredentials, Repository, mirror_branch, open_repository, push_branch
from reconciler.load.loader import LoadResult
from reconciler.rollout.controller import RolloutState
from specs import Endpoint, Environment

#: What the rollout controller calls after a rollback (``Controller.on_rollback``): it returns a
#: line for the rollout state's ``writeback`` field ("" when the policy asks for nothing).
RollbackHook = Callable[[Endpoint, RolloutState], str]

#: Who the write-back's commits are by.
AUTHOR = {"GIT_AUTHOR_NAME": "forgectl", "GIT_AUTHOR_EMAIL": "forgectl@forge.dev",
          "GIT_COMMITTER_NAME": "forgectl", "GIT_COMMITTER_EMAIL": "forgectl@forge.dev"}


@dataclass(frozen=True)
class Checkout:
    """`forgectl`'s write-backs: committed in the repository holding the spec's file, on its HEAD
    (a branch to merge by hand; nothing is pushed)."""


@dataclass(frozen=True)
class SourcePush:
    """The in-cluster controller's write-backs: committed in its cache repository on top of the
    applied ``revision`` (what HEAD is to a checkout), on the branch as the source at ``url`` has
    it, then pushed there (made, or moved forward: never forced) with the source's credentials
    (``credentials`` reads them when a write-back is due), each git call bounded by ``timeout``."""

    cache: Path
    url: str
    revision: str
    timeout: float
    credentials: Callable[[], GitCredentials | None]


@dataclass(frozen=True)
class NoWriteback:
    """No write-back is made here, for ``reason`` (said in place of one)."""

    reason: str


#: Where the write-backs of a controller go.
WritebackSite = Checkout | SourcePush | NoWriteback
#: `forgectl`'s site (the default).
CHECKOUT = Checkout()

#: Commits one write-back: (the repository's folder, the commit HEAD stands for) → the new commit.
CommitWriteback = Callable[[Path, str], str]


def write_back_at(site: WritebackSite, checkout_folder: Path, branch: str, commit: CommitWriteback) -> str:
    """Make one write-back at ``site`` and return its line (for a state's ``writeback`` field):
    ``commit`` is called with ``checkout_folder`` (the spec's folder) and HEAD for a
    :class:`Checkout`, with the cache and the applied revision for a :class:`SourcePush`. Never
    raises: the rollback or decision has happened already, and a git failure is said in the line."""
    if isinstance(site, NoWriteback):
        return f"write-back skipped: {site.reason}"
    try:
        if isinstance(site, Checkout):
            return f"committed {commit(checkout_folder, 'HEAD')[:12]} on branch {branch}"
        credentials = site.credentials()
        mirror_branch(site.cache, site.url, branch, timeout=site.timeout, credentials=credentials)
        sha = commit(site.cache, site.revision)
        push_branch(site.cache, site.url, branch, timeout=site.timeout, credentials=credentials)
    except Exception as exc:  # noqa: BLE001 - git failures must not stop the controller
        return f"write-back failed: {exc}"
    return f"pushed {sha[:12]} to branch {branch} of {printable(site.url)}"


class StableRevisions(Protocol):
    """Where a model version came from: the rollout backend knows the git revision each live
    version's Workflow was rendered from."""

    def stable_revision(self, model: str, version: str) -> str | None:
        """The git revision ``version`` of ``model`` was rendered from, or None when unknown."""
        ...


def write_back(repo_dir: str | Path, files: list[str], stable_revision: str, branch: str, message: str,
               head: str = "HEAD") -> str:
    """Commit ``files`` as they were at ``stable_revision`` onto ``branch`` (created from ``head``,
    or advanced if it exists) of the repository whose work tree holds ``repo_dir``. Returns the new
    commit's sha (the branch's tip when nothing changed)."""
    repo = open_repository(repo_dir, needed_by="the rollback write-back")
    rel = _relative(repo, files)
    stable = repo.commit(stable_revision.removesuffix("-dirty"))
    entries = []
    for path in rel:
        entry = repo.entry(stable, path, rev=stable_revision)
        if entry is None or entry.type != "blob":
            raise ForgeError(f"{printable(path)} is not a file at revision {printable(stable_revision)}")
        entries.append(f"{entry.mode} {entry.oid}\t{path}\0")
    return _commit(repo, branch, entries, message, "forgectl rollback write-back", head=head)


def write_edited(repo_dir: str | Path, file: str, edit: Callable[[str], str], branch: str, message: str,
                 head: str = "HEAD") -> str:
    """Commit ``file`` as ``head`` has it, edited by ``edit`` (its text in, the new text out), onto
    ``branch``: a commit on ``head``, the branch created or moved there — refused when the branch
    holds commits ``head`` lacks (someone's work not merged yet). The work tree is never read.
    Returns the new commit's sha (``head``'s when the edit changes nothing)."""
    repo = open_repository(repo_dir, needed_by="the experiment write-back")
    [path] = _relative(repo, [file])
    base = repo.commit(head)
    entry = repo.entry(base, path)
    if entry is None or entry.type != "blob":
        raise ForgeError(f"{printable(path)} is not a committed file at {printable(head)}")
    [blob] = repo.blobs([entry.oid])
    text = edit(blob.decode("utf-8"))
    oid = repo.run("hash-object", "-w", "--stdin", what="storing the edited spec", input=text.encode()).decode().strip()
    return _commit(repo, branch, [f"{entry.mode} {oid}\t{path}\0"], message, "forgectl experiment write-back", onto=base)


def _tree(repo: Repository, commit: str) -> str:
    return repo.run("rev-parse", "--verify", f"{commit}^{{tree}}", what="reading a commit's tree").decode().strip()


def _is_ancestor(repo: Repository, commit: str, of: str) -> bool:
    try:
        repo.run("merge-base", "--is-ancestor", commit, of, what="comparing the branch with HEAD")
    except ForgeError:
        return False
    return True


def _relative(repo: Repository, files: list[str]) -> list[str]:
    """``files`` relative to the repository's top, refused when outside it."""
    rel = []
    for name in files:
        path = os.path.relpath(os.path.abspath(name), repo.top)
        if path == os.pardir or path.startswith(os.pardir + os.sep):
            raise ForgeError(f"{printable(name)}: outside the git repository {repo.top}")
        rel.append(Path(path).as_posix())
    return rel


def _tip(repo: Repository, branch: str, head: str) -> tuple[str, str]:
    """(the commit a write-back onto ``branch`` builds on — ``head`` for a new branch —, the
    branch's tip before: "" when new) — refused when the name is not a branch's or a work tree has
    the branch checked out."""
    ref = f"refs/heads/{branch}"
    repo.run("check-ref-format", ref, what=f"checking the branch name {printable(branch)!r}")
    for line in repo.run("worktree", "list", "--porcelain", "-z", what="listing the work trees").split(b"\0"):
        if line.decode(errors="replace") == f"branch {ref}":
            raise ForgeError(f"branch {printable(branch)!r} is checked out in a work tree; the write-back commits only "
                             "to a branch no work tree has checked out")
    try:
        tip = repo.commit(ref)
        return tip, tip
    except ForgeError:
        return repo.commit(head), ""


def _commit(repo: Repository, branch: str, entries: list[str], message: str, reflog: str, *, onto: str | None = None,
            head: str = "HEAD") -> str:
    """Commit the parent's tree — the branch's tip (``head`` for a new branch), or ``onto`` — with
    ``entries`` (``mode oid\\tpath\\0`` each) staged, on a temporary index (no work tree touched),
    and move ``branch`` there, only from the tip it had."""
    ref = f"refs/heads/{branch}"
    parent, old = _tip(repo, branch, onto or head)
    parent = onto or parent
    with tempfile.TemporaryDirectory(prefix="forge-writeback-") as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        repo.run("read-tree", parent, what=f"reading the tree of {ref}", env=index)
        repo.run("update-index", "-z", "--index-info", what="staging the spec",
                 input="".join(entries).encode(errors="surrogateescape"), env=index)
        tree = repo.run("write-tree", what="writing the tree", env=index).decode().strip()
    if onto is not None and old and old != onto and not _is_ancestor(repo, old, onto):
        # not merged yet: this very write-back (a controller asked again), or someone's work
        if tree == _tree(repo, old) and _is_ancestor(repo, onto, old):
            return old
        raise ForgeError(f"branch {printable(branch)!r} holds commits {onto[:12]} lacks: merge or delete it first")
    if tree == _tree(repo, parent):
        new = parent
    else:
        new = repo.run("commit-tree", tree, "-p", parent, "-F", "-", what="committing the write-back",
                       input=message.encode(), env=AUTHOR).decode().strip()
    if new != old:
        repo.run("update-ref", "-m", reflog, ref, new, old, what=f"moving {ref}")
    return new


def rollback_hook(result: LoadResult, environment: Environment, backend: StableRevisions,
                  site: WritebackSite = CHECKOUT) -> RollbackHook:
    """The write-back policy, as the controller's rollback hook: when the endpoint's RolloutPolicy
    enables `gitWriteback`, commit the Model spec's file as it was at the stable version's revision
    onto the policy's branch, at ``site``. Never raises (:func:`write_back_at`)."""

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
        message = f"Revert model {model.name} to {state.stable}: canary {state.canary} rolled back\n\n{state.reason}"
        return write_back_at(site, Path(origin.file).parent, branch, lambda folder, head: write_back(
            folder, [origin.file], revision, branch, message, head=head))

    return hook
