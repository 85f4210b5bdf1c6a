"""The node tests' one cluster with a node (tests/cluster/nodekit.py says how modules use it).

All node tests live in this package, so the fixture is package-scoped: started by the first test
that asks, stopped after the package's last test, so the rest of the suite does not run beside an
idle node and its controllers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster import nodekit


@pytest.fixture(scope="package")
def shared_node(pytestconfig: pytest.Config, request: pytest.FixtureRequest) -> Iterator[nodekit.SharedNode]:
    """One cluster with a node for every node test of the session, started on first use."""
    with nodekit.shared_node(pytestconfig, request.session.items) as shared:
        yield shared


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that stops the shared node runs right after the last other test that uses it (the
    node is theirs first)."""
    last = [item for item in items if item.get_closest_marker("stops_shared_node")]
    if not last:
        return
    rest = [item for item in items if item not in last]
    users = [i for i, item in enumerate(rest) if "shared_node" in getattr(item, "fixturenames", ())]
    at = users[-1] + 1 if users else len(rest)
    items[:] = rest[:at] + last + rest[at:]
