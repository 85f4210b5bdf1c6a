"""A cluster with one node, started and stopped as a unit: what the node tests' session
(tests/cluster/nodekit.py) and the benches that need real controllers (bench/queue_day.py) start.
One node per machine: :meth:`Node.start` waits up to ``wait_for_other`` seconds for another."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from devkit.cluster import Cluster
from devkit.node.node import Node


@contextlib.contextmanager
def cluster_with_node(prefix: str, *, node_prefix: str | None = None, extra_images: Sequence[tuple[str, str]] = (),
                      wait_for_other: float = 0.0, log: Callable[[str], None] | None = None,
                      starting: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
                      ) -> Iterator[tuple[Cluster, Node]]:
    """kube-apiserver + etcd with the CRDs in ``<prefix>-cluster-*`` and a node in
    ``<node_prefix>*`` (default ``<prefix>-*``) importing ``extra_images``; both die with this
    process and are stopped by their PIDs on exit. ``starting`` wraps the node's start (pytest
    shows its progress through it)."""
    cluster = Cluster.start(tempfile.mkdtemp(prefix=f"{prefix}-cluster-"), node=True,
                            die_with_parent=True, log=lambda m: None)
    node = None
    try:
        with starting():
            node = Node.start(cluster, tempfile.mkdtemp(prefix=node_prefix or f"{prefix}-"), die_with_parent=True,
                              extra_images=list(extra_images), wait_for_other=wait_for_other,
                              **({"log": log} if log is not None else {}))
        yield cluster, node
    finally:
        if node is not None:
            node.stop(quiet=True)
        cluster.stop(quiet=True)
