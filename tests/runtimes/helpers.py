"""Helpers of the runtime tests (the fixtures are in conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: sha256 of scikit-learn's digits in Forge's canonical array encoding (runtimes.data).
DIGITS_DIGEST = "sha256:4eca0a80f7990df18560bf7c80f03e0893a8868820f1ee4405e0402527902353"

DIGITS_DATASET = {
    "source": {"uri": "sklearn://digits", "format": "sklearn"},
    "version": "1.0",
    "digest": DIGITS_DIGEST,
    "splits": {"train": 0.7, "validation": 0.1, "test": 0.2, "seed": 7},
    "cleaning": [{"op": "deduplicate"}, {"op": "clip", "min": 0, "max": 16}],
    "labeling": {"classes": [str(i) for i in range(10)]},
}

DIGITS_MODEL = {
    "datasetRef": "digits",
    "architecture": {"type": "mlp", "hiddenSizes": [256, 128]},
    "hyperparameters": {"learningRate": 0.002, "batchSize": 64, "epochs": 30, "optimizer": "adamw", "weightDecay": 0.0001, "seed": 7},
    "evaluation": {"thresholds": [{"metric": "accuracy", "min": 0.95}]},
}




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


def train_config(output: str, model: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"step": "train", "model": "digits-mlp", "version": "v1", "spec": model or DIGITS_MODEL, "data": "data/digits", "output": output, **extra}


def events(stdout: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


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


def post_json(url: str, body: Any, timeout: float = 30) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def get_text(url: str, timeout: float = 30) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()
