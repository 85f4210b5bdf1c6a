"""Runtime steps as processes of a runtime environment, run as the rendered steps run them
(``PYTHONPATH=<checkout> <runtime python> -m runtimes <step> --config-json …``): :class:`Runner`
runs one step to its end in a workspace, :class:`Server` keeps a model server running and stops it.

Shared by the tests (tests/conftest.py's ``digits`` and ``server_factory``; the runtime, local
target, trust, experiment and rollout tests) and the benches (bench/rollback_latency.py,
bench/rollout_faults.py). The digits dataset and model they run are in :mod:`devkit.digits`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


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
        proc = subprocess.run(self.command(step, config, *extra), capture_output=True, text=True, env=self.env(), cwd=ROOT, timeout=timeout)
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
