"""The executor's side of the step host (``runtimes.stephost``): one interpreter of the runtime
environment that imported torch once and forks each workflow step, so a step does not spend its
first 2.4 s of CPU importing it again.

The executor starts the host on the first step that may run in it — ``python -m …`` of the same
interpreter, with the host's start-up settings (``specs.stephost.startup_settings``) — and stops it
when the workflow run ends. A forked step is a process like any other: its own session, the
environment, folder and arguments the Workflow gives it, its output in its log, its exit status
(``Popen.returncode``'s convention), killed by PID; it dies with the host, which dies with
``forgectl``. When the host cannot start, or ends, the executor starts its steps as processes of
their own, as it does for the steps the host does not take.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol

from reconciler.targets.local.processes import die_with_parent
from specs.stephost import PACKET_BYTES, Exited, Ready, Spawned, StepRequest, decode, encode, startup_settings

#: How long the host may take to import its libraries (a cold page cache on a slow disk).
READY_SECONDS = 300.0


def enabled(env: Mapping[str, str]) -> bool:
    """Whether steps may be forked by a host: not with ``FORGE_STEP_HOST=off`` (every step a
    fresh interpreter; docs/local-target.md, "Workflow steps")."""
    return env.get("FORGE_STEP_HOST", "on") != "off"


class StepProcess(Protocol):
    """What the executor uses of a step's process: ``subprocess.Popen``, or a step the host forked."""

    @property
    def pid(self) -> int: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...

    def wait(self) -> int: ...


class HostedStep:
    """A step's process forked by the host (the executor is not its parent: the host reaps it)."""

    def __init__(self, host: StepHost, pid: int, stdout: IO[bytes], stderr: IO[bytes] | None = None) -> None:
        self._host = host
        self.pid = pid
        self.stdout: IO[bytes] | None = stdout
        self.stderr = stderr
        """Its stderr apart (:meth:`StepHost.spawn`'s ``separate_stderr``); None when it goes to ``stdout``."""

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status once it ended: the code, or minus the signal that killed it;
        ``subprocess.TimeoutExpired`` when it has not ended within ``timeout`` seconds."""
        return self._host.wait(self.pid, timeout)


class StepHost:
    """The host of one workflow run, started on first use (see the module docstring)."""

    def __init__(self, python: str, env: Mapping[str, str], cwd: Path, log: Path) -> None:
        self.python = python
        self._env = dict(env)
        self._settings = startup_settings(env)
        self._cwd = cwd
        self._log = log
        self.failure: str | None = None
        """Why the host does not take steps (it could not start, or ended); None while it does."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._request = threading.Lock()  # a request at a time: each Spawned answers the last one
        self._spawned: queue.Queue[int | None] = queue.Queue()
        self._ended = threading.Condition()
        self._codes: dict[int, int] = {}
        self._gone = False
        self._keeper: threading.Thread | None = None
        self._closed = threading.Event()

    def accepts(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether the host can run ``argv`` with ``env`` as a fresh interpreter would."""
        return (self.failure is None and len(argv) > 2 and argv[0] == self.python and argv[1] == "-m"
                and startup_settings(env) == self._settings)

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, *,
              separate_stderr: bool = False) -> HostedStep | None:
        """Fork ``argv`` (``python -m MODULE ARGS``) in the host, its stderr to its stdout or, with
        ``separate_stderr``, to a pipe of its own; None when the host cannot (the caller starts
        the process itself)."""
        pipes = [os.pipe() for _ in range(2 if separate_stderr else 1)]
        with self._request:
            pid = self._request_step(StepRequest(tuple(argv[2:]), dict(env), str(cwd)), [w for _, w in pipes])
        for _, write in pipes:
            os.close(write)
        if pid is None:
            for read, _ in pipes:
                os.close(read)
            return None
        streams = [os.fdopen(read, "rb") for read, _ in pipes]
        return HostedStep(self, pid, streams[0], streams[1] if separate_stderr else None)

    def _request_step(self, request: StepRequest, fds: list[int]) -> int | None:
        """Send one request with its output descriptors; the forked process's PID, or None."""
        if self._sock is None and not self._start():
            return None
        assert self._sock is not None
        try:
            socket.send_fds(self._sock, [encode(request)], fds)
        except OSError as exc:
            self.failure = f"the step host took no request: {exc}"
            return None
        return self._spawned.get()

    def wait(self, pid: int, timeout: float | None = None) -> int:
        """The exit status of a step the host forked, once it ended (SIGKILL's when the host
        ended first: its steps die with it); ``subprocess.TimeoutExpired`` after ``timeout``."""
        with self._ended:
            if not self._ended.wait_for(lambda: pid in self._codes or self._gone, timeout):
                raise subprocess.TimeoutExpired(f"step {pid}", timeout or 0.0)
            return self._codes.pop(pid, -signal.SIGKILL)

    def close(self) -> None:
        """Stop the host (its steps, if any still ran, die with it)."""
        sock, proc = self._sock, self._proc
        if sock is not None:
            sock.shutdown(socket.SHUT_WR)  # the host reads its end and leaves; the reader then reads ours
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._closed.set()
        if self._reader is not None:
            self._reader.join(timeout=10)
        if self._keeper is not None:
            self._keeper.join(timeout=10)
        if sock is not None:
            sock.close()

    def _start(self) -> bool:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._log.parent.mkdir(parents=True, exist_ok=True)
        started = threading.Event()

        def keep() -> None:
            # PR_SET_PDEATHSIG fires when the *thread* that started the host ends, not only the
            # process: the host is started by this thread, which lives until close(), never by the
            # step's thread that first asked for it (it ends with its step).
            try:
                with open(self._log, "ab") as out:
                    self._proc = subprocess.Popen(
                        [self.python, "-m", "runtimes.stephost", "--fd", str(theirs.fileno())], stdin=subprocess.DEVNULL,
                        stdout=out, stderr=subprocess.STDOUT, env=self._env, cwd=str(self._cwd),
                        pass_fds=(theirs.fileno(),), start_new_session=True, preexec_fn=die_with_parent)
            except OSError as exc:
                self.failure = f"the step host did not start: {exc}"
            finally:
                theirs.close()
                started.set()
            if self._proc is not None:
                self._closed.wait()

        self._keeper = threading.Thread(target=keep, name="step-host-keeper", daemon=True)
        self._keeper.start()
        started.wait()
        if self._proc is None:
            ours.close()
            return False
        ours.settimeout(READY_SECONDS)
        try:
            first = decode(ours.recv(PACKET_BYTES) or b"null")
        except (OSError, ValueError) as exc:
            first = None
            self.failure = f"the step host did not get ready ({exc}); its log: {self._log}"
        if not isinstance(first, Ready):
            self.failure = self.failure or f"the step host did not get ready; its log: {self._log}"
            ours.close()
            self._proc.kill()
            self._proc.wait()
            self._closed.set()
            return False
        ours.settimeout(None)
        self._sock = ours
        self._reader = threading.Thread(target=self._read, args=(ours,), name="step-host", daemon=True)
        self._reader.start()
        return True

    def _read(self, sock: socket.socket) -> None:
        """Hand each packet to whoever waits for it, until the host's end of the socket closes."""
        while True:
            try:
                data = sock.recv(PACKET_BYTES)
            except OSError:
                data = b""
            if not data:
                break
            packet = decode(data)
            if isinstance(packet, Spawned):
                self._spawned.put(packet.pid)
            elif isinstance(packet, Exited):
                with self._ended:
                    self._codes[packet.pid] = packet.code
                    self._ended.notify_all()
        self.failure = self.failure or f"the step host ended; its log: {self._log}"
        with self._ended:
            self._gone = True
            self._ended.notify_all()
        self._spawned.put(None)
