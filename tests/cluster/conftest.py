"""The node tests' one cluster with a node per session (tests/cluster/nodekit.py says how modules use it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster import nodekit


@pytest.fixture(scope="session")
def shared_node(pytestconfig: pytest.Config, request: pytest.FixtureRequest) -> Iterator[nodekit.SharedNode]:
    """One cluster with a node for every node test of the session, started on first use."""
    with nodekit.shared_node(pytestconfig, request.session.items) as shared:
        yield shared


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that stops the shared node runs after every other test (the node is theirs first)."""
    last = [item for item in items if item.get_closest_marker("stops_shared_node")]
    if last:
        items[:] = [item for item in items if item not in last] + last
