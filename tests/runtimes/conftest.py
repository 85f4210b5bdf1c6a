"""Fixtures of the runtime tests: the cached runtime environments and a trained digits model.

The tests run under the light control-plane venv (no torch) and execute the runtimes as
subprocesses with the runtime environment's Python, exactly as the rendered steps do:
``PYTHONPATH=<repo root> <runtime python> -m runtimes <step> --config-json …``.
"""

from __future__ import annotations

import subprocess
from typing import Any, Iterator

import pytest

from tests.runtimes.helpers import DIGITS_DATASET, ROOT, Runner, Server, train_config


def _env_python(kind: str) -> str:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "runtime-env"), kind], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        pytest.fail(f"scripts/runtime-env {kind} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def runtime_python() -> str:
    """Python of the cached main runtime environment (built on first use)."""
    return _env_python("main")


@pytest.fixture(scope="session")
def seldon_python() -> str:
    """Python of the cached seldon-core environment (built on first use)."""
    return _env_python("seldon")


@pytest.fixture(scope="session")
def digits(runtime_python: str, tmp_path_factory: pytest.TempPathFactory) -> Runner:
    """A workspace with digits prepared (``data/digits``) and the MLP trained (``models/base``)."""
    runner = Runner(runtime_python, tmp_path_factory.mktemp("digits-ws"))
    runner.run("prepare", {"step": "prepare", "dataset": "digits", "spec": DIGITS_DATASET, "output": "data/digits"})
    runner.run("train", train_config("models/base"), timeout=600)
    return runner


@pytest.fixture
def server_factory() -> Iterator[Any]:
    servers: list[Server] = []

    def start(runner: Runner, step: str, config: dict[str, Any]) -> Server:
        server = Server(runner, step, config).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
