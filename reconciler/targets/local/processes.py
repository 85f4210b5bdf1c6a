"""Local processes: the one layer that starts, watches and stops them, for the local target and
for the development harness (``devkit``: the test cluster, its Prometheus, the benchmarks).

- ``spawn``: in its own session (a server outlives `forgectl`), output appended to a log, recorded
  by PID *and* start time (so a recycled PID is never mistaken for ours); ``die_with_parent`` for
  the processes that must not outlive their parent (workflow steps, the test cluster's servers);
- ``stop`` / ``stop_pid``: by process group and PID, SIGTERM then SIGKILL — never by name;
- ports (``free_port``, ``port_free``), ``log_tail``, ``plain_env``, ``ensure_package`` (Debian's
  package, installed with apt-get when its binary is missing);
- Prometheus's lifecycle: ``prometheus_argv`` and ``start_server`` (spawn on a port, wait until it
  answers, try another port when the chosen one was taken meanwhile).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ProcessRecord:
    """A process Forge started."""

    name: str
    kind: str
    pid: int
    start_ticks: int
    argv: list[str]
    log: str
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Plain data for the state DB."""
        return asdict(self)


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    state = fields[0]
    if state in ("Z", "X"):
        return None
    return int(fields[19])


def alive(record: ProcessRecord) -> bool:
    """True while the recorded process (same PID, same start time) runs."""
    return start_ticks(record.pid) == record.start_ticks


def running(pid: int, ticks: int) -> bool:
    """True while ``pid`` runs and is the process that started at ``ticks`` (reaps it first when
    it is our child and has exited)."""
    with suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    return start_ticks(pid) == ticks


def die_with_parent() -> None:
    """``preexec_fn``: SIGKILL the child when its parent dies (no orphans).

    SIGKILL, not SIGTERM: a workflow step is resumed by the next apply anyway, and a test
    kube-apiserver whose etcd got SIGTERM at the same moment spends minutes in its graceful
    shutdown, retrying etcd.
    """
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn(name: str, kind: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
          cwd: str | Path | None = None, log: str | Path, info: dict[str, Any] | None = None,
          die_with_parent: bool = False) -> ProcessRecord:
    """Start ``argv`` detached in its own session, output appended to ``log`` (``env``: this
    process's environment when None; ``cwd``: this process's folder when None)."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(env) if env is not None else None, cwd=str(cwd) if cwd is not None else None,
                                start_new_session=True, preexec_fn=_die_with_parent_fn if die_with_parent else None)
    ticks = None
    for _ in range(50):
        ticks = start_ticks(proc.pid)
        if ticks is not None:
            break
        time.sleep(0.01)
    return ProcessRecord(name, kind, proc.pid, ticks or -1, list(argv), str(log), dict(info or {}))


_die_with_parent_fn = die_with_parent  # spawn's keyword of the same name hides the function


def stop(record: ProcessRecord, timeout: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after ``timeout``."""
    stop_pid(record.pid, record.start_ticks, timeout)


def stop_pid(pid: int, ticks: int, timeout: float = 10.0) -> None:
    """:func:`stop` for a PID and its start time (``ticks``): nothing when that process is gone."""
    if not running(pid, ticks):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            if not running(pid, ticks):
                return
            time.sleep(0.05)


# -- ports, logs, environment, packages ---------------------------------------------------------


# Ports handed to servers come from below the kernel's ephemeral range and above what people
# configure by hand; kept under 30000, where Kubernetes' NodePorts begin (kube-proxy's rules
# would carry a connection to such a port away to a Service).
PORT_POOL = (20000, 30000)
# A port handed out is not handed out again for this long: time enough for the server it was for
# to bind it (after which the bind check below sees it taken).
PORT_LEASE_S = 600.0


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _pool() -> range:
    """PORT_POOL less the kernel's ephemeral range, where a machine's range was set wide."""
    low, high = PORT_POOL
    eph_low, eph_high = _ephemeral_range()
    if eph_low <= low < eph_high:
        low = eph_high + 1
    if low < eph_low < high:
        high = eph_low
    return range(low, max(low, high))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds now and that no caller on this machine was
    handed in the last ``PORT_LEASE_S`` seconds.

    Not the kernel's pick (``bind(("127.0.0.1", 0))``): that port comes from the ephemeral range,
    the one the kernel also hands every other bind to port 0 and every outgoing connection, so
    between this check and the server's own bind another process can take it — a kubelet then
    exits with "address already in use", which is how a CI run's node failed to start while the
    rest of the suite ran beside it. Ports from ``PORT_POOL`` are never the kernel's pick, and a
    lease file shared by every process of this user (under ``flock``) keeps two callers from
    being handed the same one."""
    pool = _pool()
    if len(pool) < 100:  # a machine whose ephemeral range covers the pool: the kernel's pick
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    leases_path = Path(tempfile.gettempdir()) / f"forge-ports-{os.getuid()}.json"
    with open(leases_path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        now = time.time()
        try:
            leases = {int(k): float(v) for k, v in json.loads(leases_path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            leases = {}
        leases = {port: until for port, until in leases.items() if until > now}
        for _ in range(len(pool)):
            port = random.choice(pool)
            if port not in leases and port_free(port):
                break
        else:
            raise OSError(f"no free port in {pool.start}-{pool.stop - 1} on 127.0.0.1")
        leases[port] = now + PORT_LEASE_S
        tmp = leases_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(leases))
        tmp.replace(leases_path)
        return port


def port_free(port: int) -> bool:
    """Whether a server could bind ``port`` now: with SO_REUSEADDR (HAProxy and Prometheus set
    it), so connections of a stopped server still in TIME_WAIT do not hold the port."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def log_tail(path: str | Path, offset: int = 0, limit: int = 3000) -> str:
    """The last ``limit`` characters of ``path`` written after byte ``offset``; "(no log)" without one."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")[-limit:]
    except OSError:
        return "(no log)"


def plain_env() -> dict[str, str]:
    """The few variables a server needs from ours (PATH, HOME, locale, time zone)."""
    return {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TZ")}


class MissingPackage(RuntimeError):
    """A binary is missing and its package could not be installed (a message for the user)."""


def ensure_package(binary: str, package: str, *, error: type[Exception] = MissingPackage,
                   log: Callable[[str], None] | None = None) -> str:
    """Path of ``binary`` (or of its name on PATH); installs Debian's ``package`` with apt-get
    (through ``sudo -n`` when not root) when it is missing. Failures raise ``error``."""
    if os.access(binary, os.X_OK):
        return binary
    found = shutil.which(Path(binary).name)
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise error(f"{binary} is missing and apt-get is not available: install the {package} package")
    sudo: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            raise error(f"{binary} is missing: run `sudo apt-get install -y {package}`")
        sudo = ["sudo", "-n"]
    if log is not None:
        log(f"installing Debian's {package} package (apt-get; first time only)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]):
        proc = subprocess.run(sudo + cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise error(f"{binary} is missing and `{' '.join(cmd)}` failed "
                        f"(install the {package} package yourself): {proc.stderr.strip()[-1500:]}")
    found = binary if os.access(binary, os.X_OK) else shutil.which(Path(binary).name)
    if not found:
        raise error(f"apt-get installed {package} but {binary} is not there")
    return found


# -- servers: Prometheus ------------------------------------------------------------------------


PROMETHEUS = "/usr/bin/prometheus"  # Debian's package


def prometheus_argv(exe: str, directory: str | Path, port: int, *, retention: str,
                    admin_api: bool = False) -> list[str]:
    """Prometheus serving ``<directory>/prometheus.yml`` on 127.0.0.1:``port``, data in
    ``<directory>/data``, reloadable (``--web.enable-lifecycle``)."""
    d = Path(directory)
    return [exe, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle",
            *(["--web.enable-admin-api"] if admin_api else []),
            f"--storage.tsdb.retention.time={retention}", "--log.level=warn"]


class ServerNotStarted(RuntimeError):
    """A server exited, or did not answer in time; ``tail`` is the end of its log."""

    def __init__(self, message: str, tail: str) -> None:
        super().__init__(message)
        self.tail = tail


def start_server(name: str, kind: str, argv: Callable[[int], Sequence[str]], ready_url: Callable[[int], str], *,
                 log: str | Path, port: int | None = None, attempts: int = 3, timeout: float = 30.0,
                 env: Mapping[str, str] | None = None, cwd: str | Path | None = None, die_with_parent: bool = False,
                 on_spawn: Callable[[ProcessRecord], None] = lambda record: None,
                 on_failed: Callable[[ProcessRecord], None] = lambda record: None) -> ProcessRecord:
    """Spawn ``argv(port)`` and wait until ``ready_url(port)`` answers 200.

    ``port`` when given and free, else a free one. A server that exits or is not ready within
    ``timeout`` is stopped (then ``on_failed``); when its log says its address was in use (taken
    between choosing and binding), it is tried again on a new port, ``attempts`` times in all.
    ``on_spawn`` sees the record as soon as it runs (to record it before waiting); the port is
    ``record.info["port"]``.
    """
    last = ""
    for attempt in range(attempts):
        if attempt or not port or not port_free(port):
            port = free_port()
        offset = Path(log).stat().st_size if Path(log).exists() else 0
        record = spawn(name, kind, argv(port), env=env, cwd=cwd, log=log, info={"port": port},
                       die_with_parent=die_with_parent)
        on_spawn(record)
        deadline = time.monotonic() + timeout
        exited = False
        while time.monotonic() < deadline:
            if not alive(record):
                exited = True
                break
            with suppress(OSError):
                with urllib.request.urlopen(ready_url(port), timeout=1) as resp:
                    if resp.status == 200:
                        return record
            time.sleep(0.05)
        last = log_tail(log, offset)
        stop(record)
        on_failed(record)
        if "address already in use" not in last:
            raise ServerNotStarted(f"{kind} {'exited' if exited else f'not ready in {timeout:g} s'}; "
                                   f"its log ({log}) ends with:\n{last}", last)
    raise ServerNotStarted(f"{kind} could not bind a port in {attempts} attempts; its log ({log}) ends with:\n{last}", last)
