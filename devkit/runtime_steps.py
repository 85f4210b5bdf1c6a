"""Runtime steps as processes of a runtime environment, run as the rendered steps run them
(``PYTHONPATH=<checkout> <runtime python> -m runtimes <step> --config-json …``): :class:`Runner`
runs one step to its end in a workspace, :class:`Server` keeps a model server running and stops it.

A :class:`Runner`'s step is forked by a step host (``reconciler.targets.local.stephost``), as the
local target's executor forks a workflow's steps: one host per runtime interpreter for the whole
test session, which imported torch once, so the some 150 steps the tests run do not import it 150
times (2.4 s of CPU each on a 2-core machine). A step whose start-up settings differ from the
host's, or every step with ``FORGE_STEP_HOST=off``, starts as a fresh interpreter.

Shared by the tests (tests/conftest.py's ``digits`` and ``server_factory``; the runtime, local
target, trust, experiment and rollout tests) and the benches (bench/rollback_latency.py,
bench/rollout_faults.py). The digits dataset and model they run are in :mod:`devkit.digits`.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from reconciler.targets.local import stephost
from reconciler.targets.local.stephost import StepHost
from specs.stephost import startup_settings

ROOT = Path(__file__).resolve().parents[1]

_hosts: dict[tuple[str, tuple[tuple[str, str], ...]], StepHost] = {}
_hosts_lock = threading.Lock()


def _host_for(python: str, env: Mapping[str, str]) -> StepHost | None:
    """The session's step host of ``python`` for steps with ``env``'s start-up settings (started on
    its first step, stopped at exit); None with ``FORGE_STEP_HOST=off``."""
    if not stephost.enabled(env):
        return None
    key = (python, tuple(sorted(startup_settings(env).items())))
    with _hosts_lock:
        if not _hosts:
            atexit.register(_close_hosts)
        if key not in _hosts:
            _hosts[key] = StepHost(python, env, ROOT, ROOT / ".forge" / "step-host.log")
        return _hosts[key]


def _close_hosts() -> None:
    with _hosts_lock:
        for host in _hosts.values():
            host.close()
        _hosts.clear()


def _read_all(stream: IO[bytes], into: list[bytes]) -> threading.Thread:
    """A thread that reads ``stream`` to its end into ``into`` (a pipe read while the step runs)."""
    def read() -> None:
        with stream:
            into.append(stream.read())
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _run_hosted(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    """``subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout)``, the
    step forked by the session's host; None when the host does not take it."""
    host = _host_for(argv[0], env)
    if host is None or not host.accepts(argv, env):
        return None
    step = host.spawn(argv, env, ROOT, separate_stderr=True)
    if step is None:
        return None
    assert step.stdout is not None and step.stderr is not None
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [_read_all(step.stdout, out), _read_all(step.stderr, err)]
    try:
        code = step.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(step.pid, signal.SIGKILL)  # its own session: the step and whatever it started
        step.wait()
        for reader in readers:
            reader.join(timeout=10)
        raise subprocess.TimeoutExpired(list(argv), timeout, b"".join(out), b"".join(err)) from None
    for reader in readers:
        reader.join()
    return subprocess.CompletedProcess(list(argv), code, b"".join(out).decode(errors="replace"),
                                       b"".join(err).decode(errors="replace"))


class Runner:
    """Runs ``python -m runtimes <step>`` in a workspace, as the rendered steps do."""

    def __init__(self, python: str, workspace: Path):
        self.python, self.workspace = python, workspace

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(PYTHONPATH=str(ROOT), FORGE_WORKSPACE=str(self.workspace), FORGE_SOURCE_ROOT=str(self.workspace), FORGE_LOG_LEVEL="INFO")
        return env

    def command(self, step: str, config: dict[str, Any], *extra: str) -> list[str]:
        return [self.python, "-m", "runtimes", step, "--config-json", json.dumps(config), *extra]

    def run(self, step: str, config: dict[str, Any], *extra: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the step to its end (forked by the session's step host when it takes it)."""
        argv, env = self.command(step, config, *extra), self.env()
        proc = _run_hosted(argv, env, timeout) or subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT,
                                                                timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{step} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
        return proc

    def read(self, relative: str) -> Any:
        return json.loads((self.workspace / relative).read_text())


class Server:
    """A model server subprocess; stops it (by its own pid) on exit."""

    def __init__(self, runner: Runner, step: str, config: dict[str, Any]):
        # Its own process group: the seldon-core wrapper forks workers, and stop() ends them all.
        self.proc = subprocess.Popen(runner.command(step, config), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=runner.env(), cwd=ROOT, start_new_session=True)
        self.url = ""

    def __enter__(self) -> Server:
        deadline = time.monotonic() + 180
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if '"serving"' in line:
                self.url = json.loads(line)["url"]
                return self
        self.stop()
        raise AssertionError(f"server did not start:\n{self.proc.stderr.read()[-4000:] if self.proc.stderr else ''}")

    def stop(self) -> None:
        """SIGTERM the server's process group (by the pid we started), SIGKILL what is left."""
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            try:  # the group may outlive its leader (forked workers)
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break

    def __exit__(self, *exc: object) -> None:
        self.stop()
