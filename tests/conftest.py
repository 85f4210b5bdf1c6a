"""Shared test set-up. The real cluster and Prometheus fixtures live in tests/cluster_fixtures.py."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.cluster_fixtures"]


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
