"""Where spec files come from: the working tree, or any git revision (read with gitpython, with no
checkout, so `--rev` never touches the user's files)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import git

from reconciler.diagnostics import ForgeError

SPEC_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class SourceFile:
    """One spec file's name (as shown in diagnostics) and bytes."""

    path: str
    data: bytes


def _is_spec_file(name: str) -> bool:
    return name.endswith(SPEC_SUFFIXES) and not name.startswith(".")


def _hidden(part: str) -> bool:
    return part.startswith(".") and part not in (".", "..")


def files_from_paths(paths: list[str]) -> list[SourceFile]:
    """Spec files under ``paths`` (files or folders, recursively; hidden entries skipped), sorted."""
    found: dict[str, Path] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            found[str(path)] = path
        elif path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not _hidden(d))
                for name in files:
                    if _is_spec_file(name):
                        full = Path(root) / name
                        found[str(full)] = full
        else:
            raise ForgeError(f"{raw}: no such file or folder")
    if not found:
        raise ForgeError(f"no spec files (*.yaml, *.yml) under {', '.join(paths)}")
    files = []
    for display, path in sorted(found.items()):
        try:
            files.append(SourceFile(display, path.read_bytes()))
        except OSError as exc:
            raise ForgeError(f"{display}: cannot read: {exc.strerror}") from exc
    return files


def files_from_git(paths: list[str], rev: str) -> list[SourceFile]:
    """Spec files under ``paths`` as they were at git revision ``rev`` of the enclosing repository."""
    start = Path(paths[0] if paths else ".").resolve()
    try:
        repo = git.Repo(start if start.is_dir() else start.parent, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise ForgeError(f"{paths[0] if paths else '.'}: not inside a git repository (needed by --rev)") from exc
    try:
        commit = repo.commit(rev)
    except (git.BadName, ValueError, git.GitCommandError) as exc:
        raise ForgeError(f"unknown git revision {rev!r} in {repo.working_dir}") from exc
    root = Path(repo.working_dir).resolve()
    cwd = Path.cwd().resolve()
    files: dict[str, bytes] = {}
    for raw in paths or ["."]:
        try:
            rel = Path(raw).resolve().relative_to(root).as_posix()
        except ValueError as exc:
            raise ForgeError(f"{raw}: outside the git repository {root}") from exc
        rel = "" if rel == "." else rel
        matched = False
        for item in commit.tree.traverse():
            if item.type != "blob":
                continue
            if rel and item.path != rel and not item.path.startswith(rel + "/"):
                continue
            parts = item.path.split("/")
            if any(_hidden(p) for p in parts[len(rel.split("/")) if rel else 0:-1]) or (
                item.path != rel and not _is_spec_file(parts[-1])
            ):
                continue
            matched = True
            display = os.path.relpath(root / item.path, cwd)
            files[display] = item.data_stream.read()
        if not matched:
            raise ForgeError(f"{raw}: no spec files at revision {rev}")
    return [SourceFile(p, d) for p, d in sorted(files.items())]


def revision_of(paths: list[str], rev: str | None) -> str | None:
    """The commit the specs come from: ``rev`` resolved, else the working tree's HEAD with
    `-dirty` when it has uncommitted changes; None outside a git repository."""
    start = Path(paths[0] if paths else ".").resolve()
    try:
        repo = git.Repo(start if start.is_dir() else start.parent, search_parent_directories=True)
        if rev:
            return repo.commit(rev).hexsha[:12]
        head = repo.head.commit.hexsha[:12]
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, git.BadName, ValueError, git.GitCommandError):
        return None
    return head + ("-dirty" if repo.is_dirty(untracked_files=False) else "")
