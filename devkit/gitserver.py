"""A git server for the controller's tests and benchmark: a bare repository served by Debian's
`git daemon` on 127.0.0.1 (git://), and a work tree the caller commits the specs in and pushes to
it (file://)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIT_DAEMON = "/usr/lib/git-core/git-daemon"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1",
                               "GIT_AUTHOR_NAME": "Forge Tests", "GIT_AUTHOR_EMAIL": "tests@forge.invalid",
                               "GIT_COMMITTER_NAME": "Forge Tests", "GIT_COMMITTER_EMAIL": "tests@forge.invalid"})
    return done.stdout.strip()


@dataclass
class GitServer:
    """``url``: what the controller fetches; ``work``: the developer's clone."""

    url: str
    work: Path
    bare: Path
    process: subprocess.Popen[bytes]

    def push(self, message: str) -> str:
        """Commit everything in the work tree and push it; the commit's id."""
        git("add", "-A", ".", cwd=self.work)
        git("commit", "--quiet", "--allow-empty", "-m", message, cwd=self.work)
        git("push", "--quiet", "origin", "HEAD:main", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work)

    def edit(self, name: str, old: str, new: str) -> None:
        path = self.work / name
        text = path.read_text()
        assert old in text, (name, old)
        path.write_text(text.replace(old, new))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)

    def restart(self) -> None:
        """Serve again on the same port (after :meth:`stop`: a git server that was down)."""
        self.process = _serve(self.bare.parent, int(self.url.split(":")[2].split("/")[0]))


def start_git_server(tmp: Path, example: str = "quickstart") -> GitServer:
    """The example in a work tree (not committed yet), a bare repository, and `git daemon` serving it."""
    bare = tmp / "srv" / "specs.git"
    bare.parent.mkdir(parents=True)
    git("init", "--quiet", "--bare", "--initial-branch=main", str(bare), cwd=tmp)
    work = tmp / "work"
    shutil.copytree(ROOT / "examples" / example, work)
    git("init", "--quiet", "--initial-branch=main", cwd=work)
    git("remote", "add", "origin", bare.as_uri(), cwd=work)
    port = free_port()
    return GitServer(f"git://127.0.0.1:{port}/specs.git", work, bare, _serve(bare.parent, port))


def _serve(base: Path, port: int) -> subprocess.Popen[bytes]:
    """`git daemon` exporting every repository under ``base`` on 127.0.0.1:``port``, once it listens."""
    process = subprocess.Popen([GIT_DAEMON, "--reuseaddr", "--export-all", f"--base-path={base}",
                                "--listen=127.0.0.1", f"--port={port}", str(base)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"git daemon did not listen on 127.0.0.1:{port} within 10 s")
        time.sleep(0.05)
    return process
