"""Where spec files come from: the working tree, or any git revision (read with gitpython, with no
checkout, so `--rev` never touches the user's files).

Reading is bounded and never blocks: a spec file must be a regular file (a FIFO, device or socket is
refused without opening it for a blocking read), a symlink must resolve inside the project (the git
work tree holding the path, else the folder given), and sizes are checked before a byte is read.
A file that breaks one of these rules becomes a diagnostic on that file, not a hang or a traceback.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import git

from reconciler.diagnostics import ForgeError
from reconciler.load.yamlsource import MAX_FILE_BYTES

SPEC_SUFFIXES = (".yaml", ".yml")
#: Limits on one run's input (docs/security.md): spec files, and their bytes in all.
MAX_FILES = 50_000
MAX_TOTAL_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class SourceFile:
    """One spec file's name (as shown in diagnostics) and bytes, or why it was not read."""

    path: str
    data: bytes
    problem: str | None = None
    hint: str = ""


def _is_spec_file(name: str) -> bool:
    return name.endswith(SPEC_SUFFIXES) and not name.startswith(".")


def _hidden(part: str) -> bool:
    return part.startswith(".") and part not in (".", "..")


def project_root(path: Path) -> Path:
    """The project a spec path belongs to — the git work tree holding it, else the working
    directory when the path is under it, else the path's own folder — found from the path as
    written, not from where a symlink leads (a PR's `specs` → `/etc` must not make `/etc` the
    project). Symlinks among the specs must resolve inside it."""
    start = path.absolute()
    for candidate in (start, *start.parents):
        if (candidate / ".git").exists():
            return candidate.resolve()
    cwd = Path.cwd()
    if start == cwd or cwd in start.parents:
        return cwd.resolve()
    real = path.resolve()
    return real if real.is_dir() else real.parent


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def read_bounded(path: Path, display: str, root: Path, limit: int = MAX_FILE_BYTES) -> SourceFile:
    """Read one file if it is a regular file inside ``root`` of at most ``limit`` bytes; otherwise
    say why not (without blocking: a FIFO is never opened for a blocking read)."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # dangling symlink, loop
        return SourceFile(display, b"", f"cannot read: {getattr(exc, 'strerror', None) or 'broken or looping symlink'}")
    if not _inside(real, root):
        return SourceFile(display, b"", f"is a symlink to {real}, outside the project {root}",
                          "specs are read only from inside the project; copy the file in instead")
    try:
        info = os.stat(real)
    except OSError as exc:
        return SourceFile(display, b"", f"cannot read: {exc.strerror}")
    if not stat.S_ISREG(info.st_mode):
        return SourceFile(display, b"", f"is {_kind(info.st_mode)}, not a regular file", "spec files must be regular files")
    if info.st_size > limit:
        return SourceFile(display, b"", f"file is {info.st_size:,} bytes; spec files may be at most {limit:,}",
                          "split it into several files")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return SourceFile(display, b"", f"cannot read: {exc.strerror}")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat above
            return SourceFile(display, b"", "is not a regular file", "spec files must be regular files")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        return SourceFile(display, b"", f"cannot read: {exc.strerror}")
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        return SourceFile(display, b"", f"file is more than {limit:,} bytes; spec files may be at most {limit:,}",
                          "split it into several files")
    return SourceFile(display, data)


def _budget(files: list[SourceFile]) -> list[SourceFile]:
    if len(files) > MAX_FILES:
        raise ForgeError(f"{len(files):,} spec files; at most {MAX_FILES:,} are read in one run (see docs/security.md)")
    total = sum(len(f.data) for f in files)
    if total > MAX_TOTAL_BYTES:
        raise ForgeError(f"the spec files hold {total:,} bytes; at most {MAX_TOTAL_BYTES:,} are read in one run "
                         "(see docs/security.md)")
    return files


def files_from_paths(paths: list[str]) -> list[SourceFile]:
    """Spec files under ``paths`` (files or folders, recursively; hidden entries skipped; symlinked
    folders not followed), sorted, each read as :func:`read_bounded` allows."""
    found: dict[str, tuple[Path, Path]] = {}
    for raw in paths:
        path = Path(raw)
        try:
            mode = os.stat(path).st_mode
        except OSError:
            raise ForgeError(f"{_printable(raw)}: no such file or folder") from None
        root = project_root(path)
        if stat.S_ISDIR(mode):
            for base, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not _hidden(d))
                for name in names:
                    if _is_spec_file(name):
                        full = Path(base) / name
                        found[str(full)] = (full, root)
                        if len(found) > MAX_FILES:
                            raise ForgeError(f"more than {MAX_FILES:,} spec files under {_printable(raw)}; "
                                             "at most that many are read in one run (see docs/security.md)")
        else:
            found[str(path)] = (path, root)  # named on the command line: read (or refused) below
    if not found:
        raise ForgeError(f"no spec files (*.yaml, *.yml) under {', '.join(_printable(p) for p in paths)}")
    files: list[SourceFile] = []
    total = 0
    for display, (path, root) in sorted(found.items()):
        source = read_bounded(path, display, root)
        total += len(source.data)
        if total > MAX_TOTAL_BYTES:
            raise ForgeError(f"the spec files hold more than {MAX_TOTAL_BYTES:,} bytes; at most that many are "
                             "read in one run (see docs/security.md)")
        files.append(source)
    return _budget(files)


def _printable(text: str) -> str:
    """``text`` with control characters shown as escapes (file names are user input too)."""
    return "".join(ch if ch.isprintable() or ch == " " else repr(ch)[1:-1] for ch in text)


def check_revision(rev: str) -> str:
    """Refuse revisions that could be read as options or hold control characters."""
    if not rev or rev.startswith("-") or len(rev) > 256 or not _printable(rev) == rev:
        raise ForgeError(f"invalid git revision {rev!r}")
    return rev


def resolve_commit(repo: git.Repo, rev: str) -> git.Commit:
    """The commit ``rev`` names — anything `git rev-parse` understands, reflog dates
    (`HEAD@{yesterday}`) included — or a :class:`ForgeError`."""
    check_revision(rev)
    try:
        sha = repo.git.rev_parse("--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}").strip()
        return repo.commit(sha)
    except Exception as exc:  # noqa: BLE001 - gitpython raises many types (BadName, ValueError, GitCommandError, …)
        raise ForgeError(f"unknown git revision {rev!r} in {repo.working_dir}") from exc


def files_from_git(paths: list[str], rev: str) -> list[SourceFile]:
    """Spec files under ``paths`` as they were at git revision ``rev`` of the enclosing repository."""
    start = Path(paths[0] if paths else ".").resolve()
    try:
        repo = git.Repo(start if start.is_dir() else start.parent, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise ForgeError(f"{paths[0] if paths else '.'}: not inside a git repository (needed by --rev)") from exc
    commit = resolve_commit(repo, rev)
    root = Path(repo.working_dir).resolve()
    cwd = Path.cwd().resolve()
    files: dict[str, SourceFile] = {}
    total = 0
    for raw in paths or ["."]:
        try:
            rel = Path(raw).resolve().relative_to(root).as_posix()
        except ValueError as exc:
            raise ForgeError(f"{_printable(raw)}: outside the git repository {root}") from exc
        rel = "" if rel == "." else rel
        try:
            top = commit.tree / rel if rel else commit.tree
        except KeyError:
            raise ForgeError(f"{_printable(raw)}: no spec files at revision {_printable(rev)}") from None
        items = [top] if top.type == "blob" else list(top.traverse()) if top.type == "tree" else []
        matched = False
        for item in items:
            # Tree.traverse() is typed as yielding trees, blobs, submodules and tuples; a tree
            # walk yields only the first three, and only blobs are spec files.
            if not isinstance(item, git.Blob):
                continue
            parts = str(item.path).split("/")
            if any(_hidden(p) for p in parts[len(rel.split("/")) if rel else 0:-1]) or (
                item.path != rel and not _is_spec_file(parts[-1])
            ):
                continue
            matched = True
            display = os.path.relpath(root / item.path, cwd)
            if len(files) >= MAX_FILES:
                raise ForgeError(f"more than {MAX_FILES:,} spec files at revision {_printable(rev)}; at most that "
                                 "many are read in one run (see docs/security.md)")
            if item.mode == 0o120000:
                files[display] = SourceFile(display, b"", "is a symlink in git; spec files must be regular files")
            elif item.size > MAX_FILE_BYTES:
                files[display] = SourceFile(display, b"", f"file is {item.size:,} bytes; spec files may be at most "
                                            f"{MAX_FILE_BYTES:,}", "split it into several files")
            else:
                total += item.size
                if total > MAX_TOTAL_BYTES:
                    raise ForgeError(f"the spec files at revision {_printable(rev)} hold more than "
                                     f"{MAX_TOTAL_BYTES:,} bytes; at most that many are read in one run")
                files[display] = SourceFile(display, item.data_stream.read())
        if not matched:
            raise ForgeError(f"{_printable(raw)}: no spec files at revision {_printable(rev)}")
    return _budget([files[p] for p in sorted(files)])


def revision_of(paths: list[str], rev: str | None) -> str | None:
    """The commit the specs come from: ``rev`` resolved, else the working tree's HEAD with
    `-dirty` when it has uncommitted changes; None outside a git repository."""
    start = Path(paths[0] if paths else ".").resolve()
    try:
        repo = git.Repo(start if start.is_dir() else start.parent, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None
    if rev:
        return resolve_commit(repo, rev).hexsha[:12]
    try:
        head = repo.head.commit.hexsha[:12]
    except Exception:  # noqa: BLE001 - an empty repository, a broken HEAD
        return None
    return head + ("-dirty" if repo.is_dirty(untracked_files=False) else "")
