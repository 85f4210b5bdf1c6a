"""What the node tests' module fixtures share: root, pytest's output capture, a cluster with a node.

    with node_cluster(pytestconfig, "forge-x-test", wait_for_other=900,
                      build=lambda: x.images()) as (cluster, node):
        with shown(pytestconfig):
            ...  # start controllers on the node, output shown
        yield ...

The root check comes first (these tests fail without root, they do not skip); ``build`` runs next,
its output shown (a first build takes minutes), and returns the extra images for the node; then
the cluster (with the CRDs, ``node=True`` so the ServiceAccount admission plugin is on) and the
node start. On the way out the node stops, then the cluster, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager

import pytest

from devkit.cluster import Cluster
from devkit.node.node import Node


def shown(pytestconfig: pytest.Config) -> AbstractContextManager[object]:
    """Pytest's output capture off (progress of builds and starts reaches the terminal)."""
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")
    return capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()


@contextlib.contextmanager
def node_cluster(pytestconfig: pytest.Config, prefix: str, *, wait_for_other: float,
                 node_prefix: str | None = None,
                 build: Callable[[], Sequence[tuple[str, str]] | None] = lambda: None,
                 ) -> Iterator[tuple[Cluster, Node]]:
    """A cluster in a temp dir ``<prefix>-cluster-*`` and a node in ``<node_prefix>*`` (default
    ``<prefix>-*``) with the images ``build`` returns, waiting up to ``wait_for_other`` seconds for
    another node on this machine to stop."""
    if os.geteuid() != 0:
        pytest.fail("the node needs root (containerd, runc, iptables, cgroups); this test does not skip")
    with shown(pytestconfig):
        extra_images = list(build() or ())
    cluster = Cluster.start(tempfile.mkdtemp(prefix=f"{prefix}-cluster-"), node=True,
                            die_with_parent=True, log=lambda m: None)
    n = None
    try:
        with shown(pytestconfig):
            n = Node.start(cluster, tempfile.mkdtemp(prefix=node_prefix or f"{prefix}-"), die_with_parent=True,
                           extra_images=extra_images, wait_for_other=wait_for_other)
        yield cluster, n
    finally:
        if n is not None:
            n.stop(quiet=True)
        cluster.stop(quiet=True)
