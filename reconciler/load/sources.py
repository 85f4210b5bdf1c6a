"""Where spec files come from: the working tree, or any git revision (read from git's object
database by object id, with no checkout, so `--rev` never touches the user's files).

Reading is bounded and never blocks: a spec file must be a regular file (a FIFO, device or socket is
refused without opening it for a blocking read), a symlink must resolve inside the project (the work
tree of the working directory's repository when it holds the path, else the folder given), and
sizes are checked before a byte is read. A file that breaks one of these rules becomes a diagnostic
on that file, not a hang or a traceback.

Git is read only through :mod:`reconciler.load.gitrepo` (the working directory's repository, run
closed), and a spec tree holding a git directory of its own — a `.git`, or a folder that looks like
one (`HEAD`, `objects/`, `refs/`) — is refused with a diagnostic on it: git must never be pointed at
a folder a pull request wrote.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from reconciler.diagnostics import ForgeError
from reconciler.load.gitrepo import GIT_DIR_PARTS, NotInRepository, Repository, TreeEntry, looks_like_git_dir, open_repository
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
    """The project a spec path belongs to — the work tree of the working directory's repository
    (the nearest of the working directory and its parents holding `.git`) when it holds the path,
    else the working directory when the path is under it, else the path's own folder — found from
    the path as written, not from where a symlink leads (a PR's `specs` → `/etc` must not make
    `/etc` the project), and never by walking up from the path. Symlinks among the specs must
    resolve inside it."""
    start = path.absolute()
    cwd = Path.cwd()
    for candidate in (cwd, *cwd.parents):
        if os.path.lexists(candidate / ".git"):
            if start == candidate or candidate in start.parents:
                return candidate.resolve()
            break
    if start == cwd or cwd in start.parents:
        return cwd.resolve()
    real = path.resolve()
    return real if real.is_dir() else real.parent


GIT_DIR_HINT = "a spec folder must not hold a repository of its own (a copied .git, a submodule): move it out"


def _git_dir_problem(display: str, dot_git: bool) -> SourceFile:
    if dot_git:
        return SourceFile(display, b"", "a git repository (`.git`) inside the spec tree; forgectl reads git only "
                          "through the repository of the working directory and refuses a spec tree holding one of its own",
                          GIT_DIR_HINT)
    return SourceFile(display, b"", "a folder that looks like a git directory (HEAD, objects/, refs/) inside the spec "
                      "tree; forgectl reads git only through the repository of the working directory and refuses a "
                      "spec tree holding one", GIT_DIR_HINT)


def _git_dirs_above(path: Path, root: Path) -> list[SourceFile]:
    """The folders above ``path`` (a file's own folder included; a folder's own is walked) up to
    ``root`` (not included) that hold a git directory of their own."""
    problems: list[SourceFile] = []
    folder = path.absolute().parent
    cwd = Path.cwd()
    while Path(os.path.realpath(folder)) != root and root in Path(os.path.realpath(folder)).parents:
        if looks_like_git_dir(folder):
            problems.append(_git_dir_problem(os.path.relpath(folder / "HEAD", cwd), False))
        if os.path.lexists(folder / ".git"):
            problems.append(_git_dir_problem(os.path.relpath(folder / ".git", cwd), True))
        folder = folder.parent
    return problems


def _inside(path: Path, root: Path) -> bool:
    """``path`` is ``root`` or below it (both absolute and resolved): compared as strings, which
    is what `root in path.parents` says, without making every parent a Path (20,000 files)."""
    inner, outer = str(path), str(root)
    return inner == outer or inner.startswith(outer if outer.endswith(os.sep) else outer + os.sep)


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


def read_bounded(path: Path, display: str, root: Path, limit: int = MAX_FILE_BYTES, *,
                 folder: Path | None = None) -> SourceFile:
    """Read one file if it is a regular file inside ``root`` of at most ``limit`` bytes; otherwise
    say why not (without blocking: a FIFO is never opened for a blocking read). ``folder``: the
    resolved folder ``path`` is in, when the caller resolved it already (a walk: once per folder,
    not once per file); a file that is no symlink then needs one `lstat`, not one per component."""
    info: os.stat_result | None = None
    real = None
    if folder is not None:
        try:
            info = os.lstat(path)
        except OSError as exc:
            return SourceFile(display, b"", f"cannot read: {exc.strerror}")
        if not stat.S_ISLNK(info.st_mode):
            real = folder / path.name
        else:
            info = None  # a symlink: resolved below like any path
    if real is None:
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError) as exc:  # dangling symlink, loop
            return SourceFile(display, b"", f"cannot read: {getattr(exc, 'strerror', None) or 'broken or looping symlink'}")
    if not _inside(real, root):
        return SourceFile(display, b"", f"is a symlink to {real}, outside the project {root}",
                          "specs are read only from inside the project; copy the file in instead")
    if info is None:
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
    found: dict[str, tuple[Path, Path, Path | None]] = {}
    problems: list[SourceFile] = []
    for raw in paths:
        path = Path(raw)
        try:
            mode = os.stat(path).st_mode
        except OSError:
            raise ForgeError(f"{_printable(raw)}: no such file or folder") from None
        root = project_root(path)
        problems += _git_dirs_above(path, root)
        if stat.S_ISDIR(mode):
            for base, dirs, names in os.walk(path):
                if looks_like_git_dir(Path(base)):
                    problems.append(_git_dir_problem(os.path.normpath(os.path.join(base, "HEAD")), False))
                if ".git" in dirs + names and Path(os.path.realpath(base)) != root:
                    problems.append(_git_dir_problem(os.path.normpath(os.path.join(base, ".git")), True))
                dirs[:] = sorted(d for d in dirs if not _hidden(d))
                resolved = Path(os.path.realpath(base))  # os.walk follows no symlinked folder: resolved once
                for name in names:
                    if _is_spec_file(name):
                        full = Path(base) / name
                        found[str(full)] = (full, root, resolved)
                        if len(found) > MAX_FILES:
                            raise ForgeError(f"more than {MAX_FILES:,} spec files under {_printable(raw)}; "
                                             "at most that many are read in one run (see docs/security.md)")
        else:
            found[str(path)] = (path, root, None)  # named on the command line: read (or refused) below
    if problems:
        return list({p.path: p for p in problems}.values())  # nothing is read from such a tree
    if not found:
        raise ForgeError(f"no spec files (*.yaml, *.yml) under {', '.join(_printable(p) for p in paths)}")
    files: list[SourceFile] = []
    total = 0
    for display, (path, root, folder) in sorted(found.items()):
        source = read_bounded(path, display, root, folder=folder)
        total += len(source.data)
        if total > MAX_TOTAL_BYTES:
            raise ForgeError(f"the spec files hold more than {MAX_TOTAL_BYTES:,} bytes; at most that many are "
                             "read in one run (see docs/security.md)")
        files.append(source)
    return _budget(files)


def _printable(text: str) -> str:
    """``text`` with control characters shown as escapes (file names are user input too)."""
    return "".join(ch if ch.isprintable() or ch == " " else repr(ch)[1:-1] for ch in text)


def _git_dirs_at(entries: Iterable[TreeEntry], repo: Repository, rev: str) -> list[SourceFile]:
    """The folders of a revision's listing that hold a git directory of their own."""
    below: dict[str, set[str]] = {}
    for entry in entries:
        parts = PurePosixPath(entry.path).parts
        for depth in range(len(parts)):
            below.setdefault("/".join(parts[:depth]), set()).add(parts[depth])
    cwd = Path.cwd()
    problems = []
    for folder, names in sorted(below.items()):
        lower = {n.lower() for n in names}
        if "HEAD" in names and names & set(GIT_DIR_PARTS):
            problems.append(_git_dir_problem(os.path.relpath(repo.top / folder / "HEAD", cwd), False))
        if ".git" in lower:
            problems.append(_git_dir_problem(os.path.relpath(repo.top / folder / ".git", cwd), True))
    return [SourceFile(p.path, b"", f"{p.problem} (at revision {_printable(rev)})", p.hint) for p in problems]


def _relative(raw: str, top: Path) -> str | None:
    """``raw`` (relative to the working directory) as a path in ``top``'s tree, read lexically: a
    symlink in the work tree does not move where a revision is read."""
    rel = os.path.relpath(os.path.abspath(raw), top)
    if rel == os.curdir:
        return ""
    return None if rel == os.pardir or rel.startswith(os.pardir + os.sep) else PurePosixPath(Path(rel)).as_posix()


def files_from_git(paths: list[str], rev: str) -> list[SourceFile]:
    """Spec files under ``paths`` as they were at git revision ``rev`` of the working directory's
    repository."""
    try:
        repo = open_repository(needed_by="--rev")
    except NotInRepository:
        raise ForgeError(f"{_printable(paths[0] if paths else '.')}: not inside a git repository (needed by --rev): "
                         f"forgectl reads the repository of the working directory, {_printable(os.getcwd())}, "
                         "which is in none") from None
    commit = repo.commit(rev)
    cwd = Path.cwd()
    files: dict[str, SourceFile] = {}
    wanted: dict[str, TreeEntry] = {}
    problems: list[SourceFile] = []
    total = 0
    for raw in paths or ["."]:
        rel = _relative(raw, repo.top)
        if rel is None:
            raise ForgeError(f"{_printable(raw)}: outside the git repository {repo.top} (forgectl reads the "
                             "repository of the working directory)")
        listing = repo.tree(commit, [rel] if rel else [], rev=rev)
        items = [e for e in listing if not rel or e.path == rel or e.path.startswith(rel + "/")]
        problems += _git_dirs_at((e for e in items if e.path != rel), repo, rev)
        matched = False
        for item in items:
            if item.type != "blob":  # submodules (commit entries) are not spec files
                continue
            parts = item.path.split("/")
            if any(_hidden(p) for p in parts[len(rel.split("/")) if rel else 0:-1]) or (
                item.path != rel and not _is_spec_file(parts[-1])
            ):
                continue
            matched = True
            display = os.path.relpath(repo.top / item.path, cwd)
            if display in files or display in wanted:
                continue
            if len(files) + len(wanted) >= MAX_FILES:
                raise ForgeError(f"more than {MAX_FILES:,} spec files at revision {_printable(rev)}; at most that "
                                 "many are read in one run (see docs/security.md)")
            size = item.size or 0
            if item.is_symlink:
                files[display] = SourceFile(display, b"", "is a symlink in git; spec files must be regular files")
            elif size > MAX_FILE_BYTES:
                files[display] = SourceFile(display, b"", f"file is {size:,} bytes; spec files may be at most "
                                            f"{MAX_FILE_BYTES:,}", "split it into several files")
            else:
                total += size
                if total > MAX_TOTAL_BYTES:
                    raise ForgeError(f"the spec files at revision {_printable(rev)} hold more than "
                                     f"{MAX_TOTAL_BYTES:,} bytes; at most that many are read in one run")
                wanted[display] = item
        if not matched and not problems:
            raise ForgeError(f"{_printable(raw)}: no spec files at revision {_printable(rev)}")
    if problems:
        return list({p.path: p for p in problems}.values())  # nothing is read from such a tree
    order = sorted(wanted)
    for display, data in zip(order, repo.blobs([wanted[d].oid for d in order], rev=rev), strict=True):
        files[display] = SourceFile(display, data)
    return _budget([files[p] for p in sorted(files)])


def revision_of(paths: list[str], rev: str | None, *, repository: str | Path | None = None) -> str | None:
    """The commit the specs come from: ``rev`` resolved, else the working tree's HEAD with
    `-dirty` when it has uncommitted changes — in the working directory's repository (or the one
    whose work tree holds ``repository``: for a harness that drives a repository it made, never a
    path a spec names); None outside one, or when the specs are not in it."""
    try:
        repo = open_repository(repository)
    except NotInRepository:
        return None
    if _relative((paths or ["."])[0], repo.top) is None:
        return None
    if rev:
        return repo.commit(rev)[:12]
    head = repo.head()
    if head is None:
        return None
    return head[:12] + ("-dirty" if repo.dirty() else "")
