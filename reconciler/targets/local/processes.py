"""Processes the local target starts: spawned in their own session (they outlive `forgectl`),
recorded by PID *and* start time (so a recycled PID is never mistaken for ours), stopped by
process group, never by name."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence


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


def spawn(name: str, kind: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | Path, log: str | Path,
          info: dict[str, Any] | None = None) -> ProcessRecord:
    """Start ``argv`` detached in its own session, output appended to ``log``."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(env), cwd=str(cwd), start_new_session=True)
    ticks = None
    for _ in range(50):
        ticks = start_ticks(proc.pid)
        if ticks is not None:
            break
        time.sleep(0.01)
    return ProcessRecord(name, kind, proc.pid, ticks or -1, list(argv), str(log), dict(info or {}))


def stop(record: ProcessRecord, timeout: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after ``timeout``."""
    if not alive(record):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(record.pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(record.pid, sig)
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            try:
                os.waitpid(record.pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if not alive(record):
                return
            time.sleep(0.05)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
