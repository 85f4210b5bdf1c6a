"""Git, run one closed way: every git command Forge runs goes through :meth:`Repository.run`.

Which repository: exactly one, the one the working directory is in (a caller that knows better —
the rollback write-back, which runs on merged specs — names a folder itself). It is found by
`git rev-parse` run from there, with bare repositories refused (`safe.bareRepository=explicit`),
never by walking up from a path a spec or an argument names. Before git runs at all, the folders
git would look at are checked here (:func:`_check_before_git`): a folder that merely looks like a
git directory is refused, and so are the files git reads without a bound or would block on
(a `commondir` or `HEAD` that is a FIFO or a device, `objects/info/alternates`).

How: git sees none of the caller's environment but `PATH` (no `GIT_DIR`, `GIT_CONFIG_PARAMETERS`,
`GIT_EXTERNAL_DIFF` …), no system or global configuration, and on top of the repository's own
configuration the :data:`OVERRIDES` (the command-line scope, which wins): no fsmonitor, no hooks,
no replace objects, no transport of any kind (`GIT_ALLOW_PROTOCOL` empty beats every
`protocol.<name>.allow`), so no remote helper, lazy fetch, ssh or credential helper can run. The
repository's own configuration cannot be skipped, so what in it would make git read other files
or run commands is refused (`include.*`, `includeIf.*`, `extensions.*` but `objectFormat` and
`worktreeConfig`) or neutralised (every `filter.<driver>` it defines gets empty commands). Blobs
are read by object id with `git cat-file --batch` (no textconv, no filters), never through a work
tree. Each command has a time and a memory bound; every failure is a :class:`GitError` (what
failed, on which revision), never a traceback.
"""

from __future__ import annotations

import base64
import os
import shlex
import ssl
import stat
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reconciler.diagnostics import ForgeError, printable

#: Seconds one git command may take; a hang (a FIFO git opened) ends as a GitError.
GIT_TIMEOUT = 60
#: Bytes of data memory one git command may use (RLIMIT_DATA): a file git reads to its end, such
#: as a `/dev/zero` it was pointed at, ends as a GitError instead of taking the machine's memory.
GIT_MEMORY = 2 * 1024**3
#: Largest `.git` file, `commondir` or `gitdir` file read (git's own paths, a line each).
_SMALL_FILE = 4096

#: Configuration every git command gets on its command line (the scope that wins over the
#: repository's own), and why.
OVERRIDES: tuple[tuple[str, str], ...] = (
    ("safe.bareRepository", "explicit"),   # a folder that looks like a bare repository is not one
    ("core.fsmonitor", "false"),           # a hook git would run on reading the index
    ("core.hooksPath", "/dev/null"),       # no hook of any kind (reference-transaction, post-commit …)
    ("core.useReplaceRefs", "false"),      # refs/replace/* must not swap a commit for another
    ("core.commitGraph", "false"),         # a commit-graph file's trees are not the commits'
    ("core.attributesFile", "/dev/null"),
    ("core.excludesFile", "/dev/null"),
    ("core.untrackedCache", "false"),
    ("core.pager", "cat"),
    ("core.packedGitLimit", "1g"),         # pack windows within GIT_MEMORY's neighbourhood
    ("core.packedGitWindowSize", "256m"),
    ("protocol.allow", "never"),           # (GIT_ALLOW_PROTOCOL="" already refuses every transport)
    ("credential.helper", ""),
    ("submodule.recurse", "false"),
    ("diff.ignoreSubmodules", "all"),
    ("status.submoduleSummary", "false"),
    ("gc.auto", "0"),                      # the write-back's commit starts no background gc
    ("maintenance.auto", "false"),
    ("commit.gpgSign", "false"),           # no gpg program either
)

#: The environment every git command gets (with `PATH`, and the overrides as GIT_CONFIG_COUNT).
ENVIRONMENT: dict[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_SYSTEM": "/dev/null",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_NO_LAZY_FETCH": "1",
    "GIT_ALLOW_PROTOCOL": "",              # an empty allow-list: no transport, whatever the config says
    "GIT_PROTOCOL_FROM_USER": "0",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_GRAFT_FILE": "/dev/null",         # no grafted parents
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_OPTIONAL_LOCKS": "0",             # `status` refreshes the index in memory only: nothing written
    "GIT_LITERAL_PATHSPECS": "1",          # a path is a path, never `:(magic)`
    "GIT_PAGER": "cat",
    "LC_ALL": "C",
}

#: Repository-format extensions a repository may declare; any other is refused (partialClone:
#: missing objects would be fetched; refStorage and the like: files this module does not check).
ALLOWED_EXTENSIONS = frozenset({"objectformat", "worktreeconfig"})


#: Besides `HEAD`, the entries that make a folder a git directory (see :func:`looks_like_git_dir`).
GIT_DIR_PARTS = ("objects", "refs", "commondir")


class GitError(ForgeError):
    """A git command failed, or a repository was refused: the message says what, and on which
    revision."""


class NotInRepository(GitError):
    """The folder git was asked about is in no work tree."""


@dataclass(frozen=True)
class TreeEntry:
    """One `git ls-tree -r -l` line: ``size`` is None for a submodule (a commit entry)."""

    mode: str
    type: str
    oid: str
    size: int | None
    path: str

    @property
    def is_symlink(self) -> bool:
        return self.mode == "120000"


def looks_like_git_dir(folder: Path) -> bool:
    """True when ``folder`` holds what makes git take a folder for a repository — `HEAD` with
    `objects/` and `refs/`, or with a `commondir` naming where they are — or part of it (`HEAD`
    with any one of them, of whatever type): erring towards a refusal."""
    return os.path.lexists(folder / "HEAD") and any(os.path.lexists(folder / name) for name in GIT_DIR_PARTS)


def _env(config: Sequence[tuple[str, str]]) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", os.defpath), **ENVIRONMENT}
    if "SUDO_UID" in os.environ:  # git's own ownership rule reads it
        env["SUDO_UID"] = os.environ["SUDO_UID"]
    env["GIT_CONFIG_COUNT"] = str(len(config))
    for i, (key, value) in enumerate(config):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


#: How git is started: under `sh`'s `ulimit -d` (RLIMIT_DATA, in KiB), set in the child before it
#: becomes git — no `preexec_fn`, which is unsafe while other threads run (the rollout controller's
#: write-back). The arguments are positional parameters, never parsed by the shell.
_LAUNCH = ("/bin/sh", "-c", f'ulimit -d {GIT_MEMORY // 1024} && exec git --no-pager "$@"', "git")


def _first_line(stderr: bytes) -> str:
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    at = next((i for i, line in enumerate(lines) if line.startswith(("fatal:", "error:"))), None)
    if at is None:
        return printable((lines or ["no message"])[0])[:500]
    said = lines[at]
    if at > 0 and said.startswith("fatal: Could not read from remote repository"):
        # git's line hides why; the transport's own line before it says it (ssh: a refused key,
        # an unknown or changed host key). Neither ever holds a key.
        said = f"{said} ({lines[at - 1]})"
    return printable(said)[:500]


def _git(args: Sequence[str], *, cwd: Path, config: Sequence[tuple[str, str]], what: str,
         input: bytes | None = None, env: dict[str, str] | None = None,
         timeout: float = GIT_TIMEOUT) -> subprocess.CompletedProcess[bytes]:
    """Run ``git args`` closed (see the module docstring); a failure to start or a timeout is a
    GitError naming ``what``; the exit status is the caller's to judge."""
    try:
        return subprocess.run([*_LAUNCH, *args], cwd=cwd, env={**_env(config), **(env or {})}, input=input,
                              capture_output=True, timeout=timeout, check=False,
                              stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise GitError(f"{what}: git did not answer in {timeout:g} s") from None
    except OSError as exc:
        raise GitError(f"{what}: cannot run git ({exc.strerror or exc})") from None


# -- what git would read before any check of ours could run ------------------------------------------

def _regular(path: Path, what: str, limit: int | None = None) -> None:
    """Refuse ``path`` unless it is a regular file (a symlink to one is fine) of at most ``limit``
    bytes: git would block on a FIFO or read a device to no end."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise GitError(f"{printable(str(path))}: cannot read {what} ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise GitError(f"{printable(str(path))}: {what} is not a regular file; forgectl refuses the repository")
    if limit is not None and info.st_size > limit:
        raise GitError(f"{printable(str(path))}: {what} is {info.st_size:,} bytes; forgectl refuses the repository")


def _read_small(path: Path, what: str) -> str:
    _regular(path, what, _SMALL_FILE)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        return os.read(fd, _SMALL_FILE + 1).decode(errors="replace").strip()
    finally:
        os.close(fd)


def _check_git_dir(git_dir: Path) -> Path:
    """Check the files git reads from ``git_dir`` (and its common folder) without a bound or
    would block on; return the common folder. A `commondir` may only be a linked worktree's
    (``<common>/worktrees/<name>``); alternates are refused."""
    def optional(name: str, folder: Path) -> None:
        if os.path.lexists(folder / name):
            _regular(folder / name, name)

    _regular(git_dir / "HEAD", "HEAD", _SMALL_FILE)
    common = git_dir
    if os.path.lexists(git_dir / "commondir"):
        pointed = _read_small(git_dir / "commondir", "commondir")
        common = Path(os.path.normpath(git_dir / pointed))
        if git_dir.parent.name != "worktrees" or Path(os.path.normpath(git_dir.parent.parent)) != common:
            raise GitError(f"{printable(str(git_dir / 'commondir'))}: points to {printable(pointed)}, not to the "
                           "repository this worktree belongs to; forgectl refuses the repository")
        _regular(common / "HEAD", "HEAD", _SMALL_FILE)
    for name in ("config.worktree", "index", "gitdir", "shallow"):
        optional(name, git_dir)
    for name in ("config", "packed-refs", "shallow"):
        optional(name, common)
    alternates = common / "objects" / "info" / "alternates"
    if os.path.lexists(alternates):
        raise GitError(f"{printable(str(alternates))}: the repository borrows objects from another one; forgectl "
                       "reads only self-contained repositories (`git repack -a -d`, then remove the file)")
    return common


def _check_before_git(start: Path) -> None:
    """What git's discovery from ``start`` would open, checked first: each folder from ``start``
    up to the first holding `.git` (a folder, or a `gitdir:` file) must not look like a git
    directory itself, and the git directory found passes :func:`_check_git_dir`."""
    for folder in (start, *start.parents):
        dot_git = folder / ".git"
        if os.path.lexists(dot_git):
            if os.path.isfile(dot_git):
                line = _read_small(dot_git, "the .git file")
                if not line.startswith("gitdir:"):
                    raise GitError(f"{printable(str(dot_git))}: not a `gitdir:` file; forgectl refuses the repository")
                target = Path(os.path.normpath(folder / line.removeprefix("gitdir:").strip()))
            else:
                target = dot_git
            if os.path.isdir(target) and looks_like_git_dir(target):
                _check_git_dir(target)
                return
            continue  # not a repository: git looks further up, and so do we
        if looks_like_git_dir(folder):
            raise GitError(f"{printable(str(folder))} looks like a git directory (HEAD, objects/, refs/); forgectl "
                           "reads only the repository of a work tree: run it from the work tree")


# -- the repository ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Repository:
    """One work tree's repository, opened by :func:`open_repository`."""

    top: Path
    git_dir: Path
    common_dir: Path
    config: tuple[tuple[str, str], ...] = field(default=OVERRIDES, repr=False)

    def run(self, *args: str, what: str, input: bytes | None = None, env: dict[str, str] | None = None,
            timeout: float = GIT_TIMEOUT, config: Sequence[tuple[str, str]] = ()) -> bytes:
        """``git args`` on this repository (GIT_DIR and GIT_WORK_TREE set, no discovery again), with
        ``config`` after the repository's overrides; its output, or a GitError saying ``what``
        failed and git's first line."""
        done = _git(args, cwd=self.top, config=(*self.config, *config), what=what, input=input, timeout=timeout,
                    env={"GIT_DIR": str(self.git_dir), "GIT_WORK_TREE": str(self.top), **(env or {})})
        if done.returncode != 0:
            raise GitError(f"{what}: {_first_line(done.stderr)}")
        return done.stdout

    def commit(self, rev: str) -> str:
        """The full id of the commit ``rev`` names — anything `git rev-parse` understands, reflog
        dates (`HEAD@{yesterday}`) included — or a ForgeError."""
        check_revision(rev)
        done = _git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"], cwd=self.top,
                    config=self.config, what=f"resolving revision {rev!r}",
                    env={"GIT_DIR": str(self.git_dir), "GIT_WORK_TREE": str(self.top)})
        oid = done.stdout.decode(errors="replace").strip()
        if done.returncode != 0 or not oid:
            raise ForgeError(f"unknown git revision {rev!r} in {printable(str(self.top))}")
        return oid

    def head(self) -> str | None:
        """HEAD's commit id; None in a repository with no commit yet."""
        try:
            return self.commit("HEAD")
        except ForgeError:
            return None

    def dirty(self) -> bool:
        """Whether tracked files differ from HEAD (index or work tree; untracked files and
        submodules not counted). Nothing is written: the index is refreshed in memory only."""
        out = self.run("status", "--porcelain=v1", "-z", "--untracked-files=no", "--ignore-submodules=all",
                       "--no-renames", what="checking the work tree for uncommitted changes")
        return bool(out.strip(b"\0"))

    def tree(self, commit: str, paths: Iterable[str], *, recursive: bool = True, rev: str = "") -> list[TreeEntry]:
        """The entries under ``paths`` (relative to the top; none: everything) at ``commit``."""
        args = ["ls-tree", "-l", "-z", "--full-tree", *(["-r"] if recursive else []), commit, "--", *paths]
        what = f"listing the files at revision {printable(rev or commit)}"
        out = self.run(*args, what=what)
        entries = []
        for record in out.split(b"\0"):
            if not record:
                continue
            meta, _, raw_path = record.partition(b"\t")
            mode, kind, oid, size = meta.decode(errors="replace").split()
            path = raw_path.decode(errors="replace")
            if size != "-" and not size.isdigit():  # git writes BAD for an object it cannot read
                raise GitError(f"{what}: {printable(path)}: object {oid} is missing or corrupt")
            entries.append(TreeEntry(mode, kind, oid, None if size == "-" else int(size), path))
        return entries

    def entry(self, commit: str, path: str, *, rev: str = "") -> TreeEntry | None:
        """The tree entry at ``path`` in ``commit``, or None."""
        found = [e for e in self.tree(commit, [path], recursive=False, rev=rev) if e.path == path]
        return found[0] if found else None

    def blobs(self, oids: Sequence[str], *, rev: str = "") -> list[bytes]:
        """The contents of the blobs ``oids``, read from the object database as stored (`git
        cat-file --batch`: no textconv, no filters, no work tree)."""
        if not oids:
            return []
        what = f"reading the spec files at revision {printable(rev)}" if rev else "reading blobs"
        out = self.run("cat-file", "--batch", what=what, input="".join(f"{oid}\n" for oid in oids).encode())
        found, at = [], 0
        for oid in oids:
            end = out.find(b"\n", at)
            header = out[at:end if end >= 0 else len(out)].decode(errors="replace").split()
            if len(header) != 3 or header[1] != "blob":
                raise GitError(f"{what}: object {oid} is {' '.join(header[1:]) or 'missing'}")
            size = int(header[2])
            if len(out) < end + 1 + size:
                raise GitError(f"{what}: object {oid} ended early")
            found.append(out[end + 1:end + 1 + size])
            at = end + 1 + size + 1
        return found


def check_revision(rev: str) -> str:
    """Refuse revisions that could be read as options or hold control characters."""
    if not rev or rev.startswith("-") or len(rev) > 256 or printable(rev) != rev:
        raise ForgeError(f"invalid git revision {rev!r}")
    return rev


def _caller_safe_directories() -> list[str]:
    """`safe.directory` as the caller's own system and global configuration say (protected
    configuration: a repository cannot set it), asked only when git refused a repository as
    owned by someone else."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM",
                                                                                     "GIT_CONFIG_NOSYSTEM")}
    values = []
    for scope in ("--system", "--global"):
        try:
            done = subprocess.run(["git", "config", scope, "--get-all", "-z", "safe.directory"], cwd="/", env=env,
                                  capture_output=True, timeout=GIT_TIMEOUT, check=False, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            values += [v.decode(errors="surrogateescape") for v in done.stdout.split(b"\0") if v]
    return values


def _config_overrides(config: Sequence[tuple[str, str]], top: Path, git_dir: Path) -> tuple[tuple[str, str], ...]:
    """Refuse what in the repository's own configuration makes git read other files or fetch;
    return the overrides that neutralise every filter driver it defines."""
    done = _git(["config", "--no-includes", "--list", "-z", "--show-scope"], cwd=top, config=config,
                what="reading the repository's configuration", env={"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(top)})
    if done.returncode != 0:
        raise GitError(f"reading the repository's configuration: {_first_line(done.stderr)}")
    fields = done.stdout.split(b"\0")
    filters: list[str] = []
    for scope, item in zip(fields[::2], fields[1::2], strict=False):
        if scope.decode() not in ("local", "worktree"):
            continue
        key = item.partition(b"\n")[0].decode(errors="surrogateescape")
        section, _, rest = key.partition(".")
        name = rest.rpartition(".")[0]
        section = section.lower()
        if section in ("include", "includeif"):
            raise GitError(f"{printable(str(git_dir / 'config'))}: sets {printable(key)}; forgectl refuses a repository "
                           "whose configuration includes other files")
        if section == "extensions" and rest.lower() not in ALLOWED_EXTENSIONS:
            raise GitError(f"{printable(str(git_dir / 'config'))}: sets {printable(key)}; forgectl refuses repositories "
                           "with that extension (it allows objectFormat and worktreeConfig only; a partial clone "
                           "would fetch missing objects: clone it whole)")
        if section == "filter" and name and name not in filters:
            filters.append(name)
    return tuple((f"filter.{name}.{var}", value) for name in filters
                 for var, value in (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false")))


def open_repository(start: str | Path | None = None, *, needed_by: str = "") -> Repository:
    """The repository whose work tree holds ``start`` (default: the working directory), checked
    and closed as the module docstring says. :class:`NotInRepository` when there is none,
    :class:`GitError` when it is refused."""
    folder = Path(os.path.abspath(start if start is not None else os.getcwd()))
    because = f" (needed by {needed_by})" if needed_by else ""
    if not folder.is_dir():
        raise NotInRepository(f"{printable(str(folder))}: not a folder{because}")
    _check_before_git(folder)
    config: tuple[tuple[str, str], ...] = OVERRIDES
    args = ["rev-parse", "--path-format=absolute", "--show-toplevel", "--absolute-git-dir", "--git-common-dir"]
    done = _git(args, cwd=folder, config=config, what="finding the git repository")
    if done.returncode != 0 and b"dubious ownership" in done.stderr:
        config += tuple(("safe.directory", value) for value in _caller_safe_directories())
        done = _git(args, cwd=folder, config=config, what="finding the git repository")
    if done.returncode != 0:
        message = _first_line(done.stderr)
        if "not a git repository" in message:
            raise NotInRepository(f"{printable(str(folder))} is not inside a git repository{because}")
        if "dubious ownership" in message:
            message += (" (forgectl reads no global configuration but `safe.directory` from your own system and "
                        "global configuration; run it as the repository's owner or list the folder there)")
        raise GitError(f"finding the git repository from {printable(str(folder))}: {message}")
    lines = done.stdout.decode(errors="surrogateescape").splitlines()
    if len(lines) != 3:
        raise GitError(f"finding the git repository from {printable(str(folder))}: unexpected answer from git")
    top, git_dir, common_dir = (Path(os.path.normpath(line)) for line in lines)
    if os.path.realpath(_check_git_dir(git_dir)) != os.path.realpath(common_dir):
        raise GitError(f"{printable(str(git_dir))}: git's common folder {printable(str(common_dir))} is not the one "
                       "its files name; forgectl refuses the repository")
    config += _config_overrides(config, top, git_dir)
    return Repository(top, git_dir, common_dir, config)


# -- remote operations: the in-cluster controller's fetch of a configured source, and its push of -------
# -- a write-back branch where the source allows it ------------------------------------------------------

#: The URL schemes a configured source may be fetched over; each one is also the only transport git
#: is allowed for that fetch (GIT_ALLOW_PROTOCOL). scp-like `host:path` addresses are refused (say
#: `ssh://host/path`): without a scheme, git would pick the transport itself.
FETCH_SCHEMES = frozenset({"https", "http", "ssh", "git", "file"})
#: Where a fetched branch is kept in the cache repository (a ref of ours: nothing checks it out).
FETCHED_REF = "refs/forge/source"


def _fetch_scheme(url: str) -> str:
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in FETCH_SCHEMES or printable(url) != url or url.startswith("-"):
        raise GitError(f"source URL {printable(url)!r}: not fetched; a source is a URL with one of the schemes "
                       f"{', '.join(sorted(FETCH_SCHEMES))} (ssh as ssh://host/path)")
    return scheme.lower()


@dataclass(frozen=True)
class GitCredentials:
    """What a source's fetch authenticates with (from a Kubernetes Secret, never a spec): a user
    name and password or a bearer token for http(s), a private key and the server's known host
    keys for ssh; for https, the PEM certificates of a private certificate authority to trust
    besides the system's (``ca_cert``) and a client certificate with its key for a server that asks
    one (``client_cert``, ``client_key``). Never printed (``repr`` names which parts are set, not
    their values)."""

    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    bearer_token: str | None = field(default=None, repr=False)
    identity: str | None = field(default=None, repr=False)
    known_hosts: str | None = field(default=None, repr=False)
    ca_cert: str | None = field(default=None, repr=False)
    client_cert: str | None = field(default=None, repr=False)
    client_key: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        held = [n for n in ("username", "password", "bearer_token", "identity", "known_hosts", "ca_cert", "client_cert",
                            "client_key") if getattr(self, n)]
        return f"GitCredentials({', '.join(held) or 'none'})"

    def tls(self, folder: Path) -> list[tuple[str, str]]:
        """git's configuration for this https fetch's TLS: the CA bundle (`http.sslCAInfo`) and the
        client certificate and key (`http.sslCert`, `http.sslKey`), as 0600 files in ``folder``."""
        config = [("http.sslCAInfo", str(_ca_bundle(self.ca_cert, folder)))] if self.ca_cert else []
        if (self.client_cert is None) != (self.client_key is None):
            raise GitError("a client certificate (tls.crt) needs its key (tls.key), and a key its certificate")
        if self.client_cert is not None and self.client_key is not None:
            config += [("http.sslCert", str(_private_file(folder / "tls.crt", self.client_cert))),
                       ("http.sslKey", str(_private_file(folder / "tls.key", self.client_key)))]
        return config


def _private_file(path: Path, text: str) -> Path:
    """``text`` written to a new file ``path`` that only this user may read (0600), ending in a newline."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text if text.endswith("\n") else text + "\n")
    return path


def _ca_bundle(ca_cert: str, folder: Path) -> Path:
    """A file in ``folder`` holding the system's trusted certificates (when it has a bundle) and
    then ``ca_cert``. git's `http.sslCAInfo` replaces the system bundle; Flux's sources add the
    Secret's CA to the system's pool instead, so a source trusted by a public CA stays trusted."""
    system = ssl.get_default_verify_paths().cafile
    trusted = Path(system).read_text(errors="replace") if system and Path(system).is_file() else ""
    return _private_file(folder / "ca.crt", (trusted.rstrip("\n") + "\n" if trusted else "") + ca_cert)


def _authenticated(scheme: str, credentials: GitCredentials, folder: Path) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The configuration and environment that hand ``credentials`` to git for a fetch over
    ``scheme``: an `http.extraHeader` (Basic or Bearer) in the environment's GIT_CONFIG_*, and for
    https a private CA and a client certificate (:meth:`GitCredentials.tls`), or an ssh command
    reading the key and known hosts from files in ``folder`` (0600) — never in argv."""
    if (credentials.ca_cert or credentials.client_cert or credentials.client_key) and scheme != "https":
        raise GitError(f"a certificate authority or client certificate (ca.crt, tls.crt) is for an https source, "
                       f"not {scheme}://")
    if scheme in ("http", "https"):
        config = credentials.tls(folder)
        if credentials.bearer_token:
            return [*config, ("http.extraHeader", f"Authorization: Bearer {credentials.bearer_token}")], {}
        if credentials.password is not None:
            pair = f"{credentials.username or 'git'}:{credentials.password}".encode()
            return [*config, ("http.extraHeader", f"Authorization: Basic {base64.b64encode(pair).decode()}")], {}
        if config:  # TLS alone: a private CA, or a client certificate as the credential
            return config, {}
        raise GitError(f"credentials for an {scheme} source need a password (with a username) or a bearerToken")
    if scheme == "ssh":
        if not credentials.identity or not credentials.known_hosts:
            raise GitError("credentials for an ssh source need an identity (private key) and known_hosts")
        key = _private_file(folder / "identity", credentials.identity)
        hosts = _private_file(folder / "known_hosts", credentials.known_hosts)
        command = ("ssh -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes "
                   f"-o UserKnownHostsFile={shlex.quote(str(hosts))} -i {shlex.quote(str(key))}")
        return [], {"GIT_SSH_COMMAND": command}
    raise GitError(f"a {scheme}:// source takes no credentials (https, http or ssh do)")


def _ref_name(kind: str, name: str) -> str:
    """``name`` checked as a branch or tag name (git's own rules, `git check-ref-format`'s subset)."""
    check_revision(name)
    problem = ref_name_problem(name)
    if problem is not None:
        raise GitError(f"source {kind} {printable(name)!r} is not a {kind} name: {problem}")
    return name


def _remote(cache: Path, url: str, credentials: GitCredentials | None, timeout: float, what: str, *args: str) -> bytes:
    """Run one remote git command (``args``, ending with the URL) in the cache repository at
    ``cache`` (made here, with no work tree, the first time), closed as :func:`fetch_source` says."""
    scheme = _fetch_scheme(url)
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / ".git").is_dir():
        done = _git(["init", "--quiet", str(cache)], cwd=cache, config=OVERRIDES, what=f"making the cache {cache}")
        if done.returncode != 0:
            raise GitError(f"making the cache repository {printable(str(cache))}: {_first_line(done.stderr)}")
    repo = open_repository(cache, needed_by="the controller's fetch")
    with tempfile.TemporaryDirectory(prefix="forge-fetch-") as folder:
        config, env = _authenticated(scheme, credentials, Path(folder)) if credentials is not None else ([], {})
        return repo.run(*args, what=what, timeout=timeout, config=config,
                        env={"GIT_ALLOW_PROTOCOL": scheme, "GIT_SSH_COMMAND": "ssh -o BatchMode=yes", **env})


def fetch_source(cache: Path, url: str, branch: str, *, timeout: float, credentials: GitCredentials | None = None,
                 tag: str | None = None) -> str:
    """Fetch ``branch`` of ``url`` (or its ``tag``, when given) into the cache repository at
    ``cache`` (made here, with no work tree checked out, the first time) and return the fetched
    commit (an annotated tag's commit). The in-cluster controller's
    remote operation (a write-back's :func:`mirror_branch` and :func:`push_branch` besides, where
    its source allows them), as closed as everything else here: the repository and its configuration
    are Forge's own (nothing of the remote's configuration or hooks is ever read), the only
    transport allowed is the URL's own scheme, no other tags, no submodules, no credential helper or
    prompt, and the whole fetch is bounded by ``timeout`` seconds. ``credentials`` (a Secret's,
    :class:`GitCredentials`) reach git through its environment and files of this fetch alone. The fetched revision is then read
    like any other (:meth:`Repository.tree`, :meth:`Repository.blobs`: blobs by id, no checkout)."""
    _fetch_scheme(url)
    ref = f"refs/tags/{_ref_name('tag', tag)}" if tag is not None else f"refs/heads/{_ref_name('branch', branch)}"
    what = f"fetching {printable(tag if tag is not None else branch)} of {printable(url)}"
    _remote(cache, url, credentials, timeout, what, "fetch", "--quiet", "--no-tags", "--no-recurse-submodules",
            "--no-write-fetch-head", "--force", "--", url, f"+{ref}:{FETCHED_REF}")
    return open_repository(cache, needed_by="the controller's fetch").commit(FETCHED_REF)


def remote_tags(cache: Path, url: str, *, timeout: float, credentials: GitCredentials | None = None) -> list[str]:
    """The tag names ``url`` has (`git ls-remote --tags --refs`, closed like :func:`fetch_source`)."""
    out = _remote(cache, url, credentials, timeout, f"listing the tags of {printable(url)}",
                  "ls-remote", "--tags", "--refs", "--", url)
    return sorted(line.split("\trefs/tags/", 1)[1] for line in out.decode(errors="replace").splitlines()
                  if "\trefs/tags/" in line)


def newest_tag(cache: Path, url: str, tags: Sequence[str], *, timeout: float,
               credentials: GitCredentials | None = None) -> str:
    """Of ``tags`` (one version's, which semver cannot order), the one whose commit's committer
    date is the newest, as Flux's source-controller orders them (the greater name on equal dates):
    each fetched like :func:`fetch_source`."""
    dated = []
    for tag in tags:
        commit = fetch_source(cache, url, "main", timeout=timeout, credentials=credentials, tag=tag)
        out = open_repository(cache, needed_by="the controller's fetch").run(
            "show", "--no-patch", "--format=%ct", commit, "--", what=f"reading the date of tag {printable(tag)}")
        dated.append((int(out.decode().strip() or 0), tag))
    return max(dated)[1]


def mirror_branch(cache: Path, url: str, branch: str, *, timeout: float,
                  credentials: GitCredentials | None = None) -> str | None:
    """Make ``refs/heads/BRANCH`` of the cache repository what ``url`` has on that branch (fetched
    over it) or, when ``url`` has no such branch, remove it; return its commit, or None. A
    write-back starts from the branch as the source has it now (merged, deleted or moved by
    people since), never from an earlier copy. Closed like :func:`fetch_source`."""
    ref = f"refs/heads/{_ref_name('branch', branch)}"
    listed = _remote(cache, url, credentials, timeout, f"looking for branch {printable(branch)} of {printable(url)}",
                     "ls-remote", "--heads", "--", url, ref)
    repo = open_repository(cache, needed_by="the controller's write-back")
    if not any(line.split(b"\t", 1)[-1] == ref.encode() for line in listed.splitlines()):
        repo.run("update-ref", "-d", ref, what=f"removing {ref} (the source has no such branch)")
        return None
    # --update-head-ok: the cache checks nothing out, whatever its HEAD names
    _remote(cache, url, credentials, timeout, f"fetching branch {printable(branch)} of {printable(url)}",
            "fetch", "--quiet", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head", "--update-head-ok",
            "--force", "--", url, f"+{ref}:{ref}")
    return repo.commit(ref)


def push_branch(cache: Path, url: str, branch: str, *, timeout: float, credentials: GitCredentials | None = None) -> None:
    """Push ``refs/heads/BRANCH`` of the cache repository to the same branch of ``url``: made there,
    or moved forward — never forced, so a branch someone moved meanwhile refuses it (the next
    write-back starts again from theirs). Closed like :func:`fetch_source`; no hook runs."""
    ref = f"refs/heads/{_ref_name('branch', branch)}"
    _remote(cache, url, credentials, timeout, f"pushing branch {printable(branch)} to {printable(url)}",
            "push", "--quiet", "--no-verify", "--recurse-submodules=no", "--", url, f"{ref}:{ref}")


#: What `git check-ref-format` refuses anywhere in a name (git's refs.c, `check_refname_component`).
_REF_FORBIDDEN = (" ", "~", "^", ":", "?", "*", "[", "\\", "..", "@{", "//")


def ref_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a branch or tag name (`git check-ref-format --branch` rules, checked
    here without running git), None when it can."""
    if name == "@":
        return "`@` alone is not allowed"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "it holds a control character"
    bad = next((f for f in _REF_FORBIDDEN if f in name), None)
    if bad is not None:
        return f"it holds {bad!r}"
    for prefix in ("/", "-"):
        if name.startswith(prefix):
            return f"it begins with {prefix!r}"
    for suffix in ("/", "."):
        if name.endswith(suffix):
            return f"it ends with {suffix!r}"
    part = next((part for part in name.split("/") if part.startswith(".") or part.endswith(".lock")), None)
    if part is not None:
        return f"its part {part!r} begins with '.' or ends with '.lock'"
    return None
