"""A git server for the controller's tests and benchmark: a bare repository served by Debian's
`git daemon` on 127.0.0.1 (git://), and a work tree the caller commits the specs in and pushes to
it (file://); or the same repository over smart HTTP by git's own `git http-backend`, behind Basic
authentication (:func:`serve_http`); or over ssh by Debian's OpenSSH server, accepting one public
key (:func:`serve_ssh`)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devkit.debs import debian_package
from reconciler.targets.local.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
GIT_DAEMON = "/usr/lib/git-core/git-daemon"


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

    def tag(self, name: str, *, annotated: bool = False) -> str:
        """Tag the work tree's HEAD ``name`` (an annotated tag with ``annotated``) and push the tag;
        the commit it names."""
        git("tag", *(("-a", "-m", name) if annotated else ()), name, cwd=self.work)
        git("push", "--quiet", "origin", f"refs/tags/{name}", cwd=self.work)
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
    _wait_listening(process, port, "git daemon")
    return process


def _wait_listening(process: subprocess.Popen[bytes], port: int, what: str, log: Path | None = None) -> None:
    """Return once something listens on 127.0.0.1:``port``; kill ``process`` and raise (with the
    end of its ``log``) when it exits or 10 s pass first."""
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait(10)
            said = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
            raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within 10 s{': ' + said if said else ''}")
        time.sleep(0.05)


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


def serve_http(base: Path, username: str, password: str, *, tls: tuple[Path, Path] | None = None,
               client_ca: Path | None = None) -> HttpGitServer:
    """:class:`HttpGitServer` for the repositories under ``base``, accepting ``username``:``password``;
    over https with ``tls`` (the server's certificate file and its key file), and with ``client_ca``
    only from clients whose certificate that CA issued (the TLS handshake refuses the others)."""
    import base64
    import ssl
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
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*tls)
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(client_ca)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return HttpGitServer(f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}", server, thread)


@dataclass
class SshGitServer:
    """Debian's OpenSSH server on 127.0.0.1:``port`` accepting one public key for ``user``, whose
    git runs the repositories under ``base``: ``url(name)`` is the ssh:// URL of one, and
    ``known_hosts`` the line a client must trust (the server's own host key)."""

    port: int
    user: str
    base: Path
    known_hosts: str
    process: subprocess.Popen[bytes]
    log: Path

    def url(self, name: str) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}{self.base / name}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def ssh_keypair(folder: Path, name: str) -> tuple[str, str]:
    """(private key, public key line) of a new ed25519 pair made by ssh-keygen in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True)
    return path.read_text(), (folder / f"{name}.pub").read_text().strip()


def serve_ssh(base: Path, authorized_key: str, state: Path) -> SshGitServer:
    """:class:`SshGitServer` for the repositories under ``base``, logging in whoever holds the
    private half of ``authorized_key`` (public keys only: no password, no forwarding, no tty).

    sshd comes from Debian's ``openssh-server`` package, extracted and cached
    (:func:`devkit.debs.debian_package`), never installed: an installed package would start a
    system sshd on every address. Run by root, sshd needs its privilege-separation user and
    ``/run/sshd``; both are given to it in a mount namespace of its own (a ``passwd`` with that user
    bound over ``/etc/passwd``, a tmpfs on ``/run``), so the host is not changed. Run by another
    user, sshd logs in that user only and needs neither."""
    server, _ = debian_package("openssh-server")
    libwrap, _ = debian_package("libwrap0")  # sshd links libwrap.so.0, which is not on every host
    state.mkdir(parents=True, exist_ok=True)
    host_key = state / "host_key"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "forge-test-sshd", "-f", str(host_key)],
                       check=True)
    (state / "authorized_keys").write_text(authorized_key.strip() + "\n")
    port = free_port()
    user = pwd.getpwuid(os.geteuid()).pw_name
    (state / "sshd_config").write_text("\n".join([
        "ListenAddress 127.0.0.1", f"Port {port}", f"HostKey {host_key}",
        f"AuthorizedKeysFile {state / 'authorized_keys'}", f"PidFile {state / 'sshd.pid'}",
        "StrictModes no",  # the state folder is a test's temporary folder
        "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password", f"AllowUsers {user}", "DisableForwarding yes", "PermitTTY no",
        "PermitUserEnvironment no", "LogLevel VERBOSE", ""]))
    sshd = [str(server / "usr" / "sbin" / "sshd"), "-D", "-e", "-f", str(state / "sshd_config")]
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(libwrap / "usr" / "lib" / "x86_64-linux-gnu")}
    if os.geteuid() == 0:
        passwd = Path("/etc/passwd").read_text()
        if not any(line.startswith("sshd:") for line in passwd.splitlines()):
            passwd += "sshd:x:65534:65534:sshd privilege separation:/run/sshd:/usr/sbin/nologin\n"
        (state / "passwd").write_text(passwd)
        # unshare and sh exec: the PID started is sshd's own.
        inner = (f"mount --bind {state / 'passwd'} /etc/passwd && mount -t tmpfs -o mode=0755 forge-sshd /run && "
                 "mkdir -m 0755 /run/sshd && exec \"$@\"")
        sshd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner, "sshd", *sshd]
    log = state / "sshd.log"
    with log.open("wb") as out:
        process = subprocess.Popen(sshd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
    _wait_listening(process, port, "sshd", log)
    key_type, key = (state / "host_key.pub").read_text().split()[:2]
    return SshGitServer(port, user, base, f"[127.0.0.1]:{port} {key_type} {key}", process, log)
