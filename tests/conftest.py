"""Shared test set-up. The real cluster and Prometheus fixtures live in tests/cluster_fixtures.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from devkit.digits import DIGITS_DATASET, train_config
from devkit.runtime_steps import Runner, Server

pytest_plugins = ["tests.cluster_fixtures"]


# No terminal size from the caller: a test that needs a width sets COLUMNS itself. A pytest
# started by a process that loaded GNU readline (a pytest-xdist worker, by its pytest) inherits
# COLUMNS=80 and LINES=24, which readline writes into the C environment, and rich fixes a
# console's width from COLUMNS when the console is made: on importing forgectl, which a test
# directory's conftest does before any test's CliRunner sets its own COLUMNS. This conftest is
# imported before any other.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="Rewrite the golden files under tests/renderers/golden/ from the current renderers.",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when the run was asked to refresh golden files (`scripts/test --update-golden`)."""
    return bool(request.config.getoption("--update-golden"))


# -- the runtime environments and a trained digits model, shared by the runtime, local-target and
# rollout tests (session-scoped, so digits is trained once per run) -------------------------------

def _env_python(kind: str) -> str:
    from reconciler.errors import TargetNotAvailable
    from reconciler.runtimeenv import runtime_python as resolve
    try:
        return resolve(kind)
    except TargetNotAvailable as exc:
        pytest.fail(str(exc))


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
    # Stopped side by side: each may take its whole SIGTERM grace (15 s) before the SIGKILL.
    with ThreadPoolExecutor(max(1, len(servers))) as pool:
        list(pool.map(Server.stop, servers))
