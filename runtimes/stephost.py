"""The step host: one interpreter of the runtime environment with torch imported once, forking the
process of each workflow step the local target runs.

A fresh ``python -m runtimes train …`` spends about 2.4 s of CPU importing torch (numpy with it)
on a 2-core machine before its first line of work, and six of the quick-start's eight steps do
so. The local target's executor (``reconciler.targets.local.stephost``) starts this host once per
workflow run; it imports :data:`PRELOAD` and then, for each step, forks. The child is the step's
process: its own session, environment, folder, output and exit status, dying with the host (which
dies with its ``forgectl``), running ``python -m <module> <args>`` through :mod:`runpy` as the
interpreter's ``-m`` does. It differs from a fresh interpreter only in what was settled before the
fork — the interpreter's start-up settings and what the preloaded libraries read when imported
(thread and allocator settings, ``PYTHON*``) — so the executor sends only steps whose such
variables equal the host's (``specs.stephost.startup_settings``), and starts the others itself.
numpy's global random state, seeded from the OS when numpy is imported, is seeded again in each
child, as a fresh process would have it.

The packets the two exchange, and which variables decide whether a step may run here, are
``specs.stephost``. The host ends when its socket closes; its children die with it
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import runpy
import select
import signal
import socket
import sys
from dataclasses import dataclass

from specs.stephost import PACKET_BYTES, Exited, Packet, Ready, Spawned, StepRequest, decode, encode

#: What the host imports once: what most steps import first, and what costs the most to import.
PRELOAD = ("numpy", "torch")

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Forked:
    """In a forked child: the step it is, the descriptor its stdout goes to, and its stderr's
    (``errors``; None when stderr goes where stdout does, as in a workflow step's log)."""

    request: StepRequest
    output: int
    errors: int | None = None


def _send(sock: socket.socket, packet: Packet) -> None:
    sock.send(encode(packet))


def _die_with(parent: int) -> None:
    """SIGKILL this process when ``parent`` ends (and at once when it has ended already)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, Exited(pid, os.waitstatus_to_exitcode(status)))


def serve(sock: socket.socket) -> Forked | None:
    """Fork a process for each request until the socket closes (None), or, in a forked child,
    return its request: the caller runs it with nothing of the host's loop on the stack."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_write)
    _send(sock, Ready(os.getpid()))
    host = os.getpid()
    while True:
        try:
            readable, _, _ = select.select([sock.fileno(), wake_read], [], [])
        except InterruptedError:  # pragma: no cover (PEP 475 retries select)
            continue
        if wake_read in readable:
            while True:
                try:
                    if not os.read(wake_read, 512):
                        break
                except BlockingIOError:
                    break
            _reap(sock)
        if sock.fileno() not in readable:
            continue
        data, fds, _, _ = socket.recv_fds(sock, PACKET_BYTES, 2)
        if not data:
            return None  # the executor is done (or gone)
        request = decode(data)
        if not isinstance(request, StepRequest) or len(fds) not in (1, 2):
            raise ValueError(f"expected a step and its output descriptors, got {request!r} with {len(fds)}")
        forked = Forked(request, fds[0], fds[1] if len(fds) == 2 else None)
        sys.stdout.flush()  # nothing the host wrote is written again by a child
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (wake_read, wake_write):
                os.close(fd)
            sock.close()
            _die_with(host)
            return forked
        os.close(forked.output)
        if forked.errors is not None:
            os.close(forked.errors)
        _send(sock, Spawned(pid))


def run_step(forked: Forked) -> None:
    """In the forked child: become the step's process and run its module as ``python -m`` would.
    Its exit status is the interpreter's, as for any ``python -m``: SystemExit's code, 1 after an
    uncaught exception's traceback, 0 otherwise."""
    request = forked.request
    os.setsid()
    os.dup2(forked.output, 1)
    os.dup2(forked.output if forked.errors is None else forked.errors, 2)
    os.close(forked.output)
    if forked.errors is not None:
        os.close(forked.errors)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    # `python -m` puts the working folder first on the path; the rest came from PYTHONPATH, which
    # is the host's (a start-up setting)
    sys.path[0] = os.getcwd()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    module, *args = request.argv
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m runtimes.stephost --fd N``: N is this end of the executor's socket pair."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "--fd":
        print("usage: python -m runtimes.stephost --fd N", file=sys.stderr)
        return 2
    sock = socket.socket(fileno=int(args[1]))
    for name in PRELOAD:
        importlib.import_module(name)
    forked = serve(sock)
    if forked is None:
        return 0
    run_step(forked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
