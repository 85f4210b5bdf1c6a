"""A git server for the controller's tests and benchmark: a bare repository served by Debian's
`git daemon` on 127.0.0.1 (git://), and a work tree the caller commits the specs in and pushes to
it (file://); or the same repository over smart HTTP by git's own `git http-backend`, behind Basic
authentication (:func:`serve_http`)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


GIT_HTTP_BACKEND = "/usr/lib/git-core/git-http-backend"


@dataclass
class HttpGitServer:
    """Git's own `git http-backend` (smart HTTP) behind a small threaded HTTP server on 127.0.0.1
    that refuses any request without the one Basic ``Authorization`` it was given (401, as a forge
    asks for a token): ``url`` serves the repositories under ``base``."""

    url: str
    server: Any
    thread: threading.Thread

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def serve_http(base: Path, username: str, password: str) -> HttpGitServer:
    """:class:`HttpGitServer` for the repositories under ``base``, accepting ``username``:``password``."""
    import base64
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    wanted = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _cgi(self) -> None:
            if self.headers.get("Authorization") != wanted:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="forge-tests"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path, _, query = self.path.partition("?")
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            env = {"PATH": "/usr/bin:/bin", "GIT_PROJECT_ROOT": str(base), "GIT_HTTP_EXPORT_ALL": "1",
                   "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(base), "REQUEST_METHOD": self.command, "PATH_INFO": path,
                   "QUERY_STRING": query, "CONTENT_TYPE": self.headers.get("Content-Type") or "",
                   "CONTENT_LENGTH": str(len(body)), "REMOTE_USER": username, "REMOTE_ADDR": "127.0.0.1",
                   "GIT_PROTOCOL": self.headers.get("Git-Protocol") or ""}
            if self.headers.get("Content-Encoding"):
                env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
            done = subprocess.run([GIT_HTTP_BACKEND], input=body, env=env, capture_output=True, timeout=60)
            head, _, payload = done.stdout.partition(b"\r\n\r\n")
            status = 200
            headers = []
            for line in head.decode(errors="replace").split("\r\n"):
                key, _, value = line.partition(":")
                if key.lower() == "status":
                    status = int(value.strip().split()[0])
                elif key:
                    headers.append((key, value.strip()))
            self.send_response(status)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = _cgi
        do_POST = _cgi

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return HttpGitServer(f"http://127.0.0.1:{server.server_address[1]}", server, thread)
