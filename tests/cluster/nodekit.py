"""What the node tests share: root, pytest's output capture, and one cluster with a node per test
session (:class:`SharedNode`, the ``shared_node`` fixture of tests/cluster/conftest.py).

The node is started once, with the images every selected node module asks for: a module says which
by a module-level ``node_images()`` (it builds them the first time and returns (archive, ref) pairs).
Each module then adds the controllers it needs, each started once a session, and works in
namespaces of its own, which it deletes when it is done::

    def node_images() -> list[tuple[str, str]]:
        return promop.images()

    @pytest.fixture(scope="module")
    def stack(shared_node: nodekit.SharedNode) -> Iterator[...]:
        operator, url = shared_node.prometheus()
        with shared_node.namespace("forge-x-test"):
            yield ...

The root check comes first (these tests fail without root, they do not skip); the builds run next,
their output shown (a first build takes minutes); then the cluster (with the CRDs, ``node=True`` so
the ServiceAccount admission plugin is on) and the node start. After the package's last test the
node stops, then the cluster, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devkit.cluster import Cluster
from devkit.node import argo, coredns, kueue, promop, seldon, traefik, training_operator
from devkit.node.controllers import HostController
from devkit.node.node import Node
from devkit.node.session import cluster_with_node
from renderers.monitoring import SCRAPE_INTERVAL_S
from tests.polling import wait_until

T = TypeVar("T")


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
    with cluster_with_node(prefix, node_prefix=node_prefix, extra_images=extra_images, wait_for_other=wait_for_other,
                           starting=lambda: shown(pytestconfig)) as started:
        yield started


class SharedNode:
    """The session's one cluster with a node. Controllers are added to it by the modules that need
    them, each started once (:meth:`once`) and kept running until the session ends."""

    def __init__(self, cluster: Cluster, node: Node, pytestconfig: pytest.Config) -> None:
        self.cluster, self.node, self._config = cluster, node, pytestconfig
        self._started: dict[str, Any] = {}

    def once(self, name: str, start: Callable[[], T]) -> T:
        """What ``start`` returned the first time ``name`` was asked for (its output shown then)."""
        if name not in self._started:
            with shown(self._config):
                self._started[name] = start()
        value: T = self._started[name]
        return value

    def dns(self) -> coredns.ClusterDNS:
        """The cluster's CoreDNS. ``Node.start`` deployed it already (every pod's name server); this
        checks that it still answers and says where."""
        return self.once("dns", lambda: coredns.start(self.node))

    def argo(self) -> argo.ArgoController:
        """Argo's workflow-controller (its executor image comes from a module's ``node_images``)."""
        return self.once("argo", lambda: argo.start(self.cluster, self.node, ["default"], die_with_parent=True))

    def seldon(self) -> HostController:
        """Seldon Core's operator."""
        return self.once("seldon", lambda: seldon.start(self.cluster, self.node, die_with_parent=True))

    def gateway(self) -> traefik.TraefikGateway:
        """Traefik, its GatewayClass and its Gateway (routes from every namespace)."""
        return self.once("traefik", lambda: traefik.start(self.cluster, self.node, die_with_parent=True))

    def prometheus(self) -> tuple[HostController, str]:
        """The Prometheus Operator and the Prometheus it runs (in `monitoring`), and that Prometheus's URL."""
        def start() -> tuple[HostController, str]:
            operator = promop.start(self.cluster, self.node, die_with_parent=True)
            return operator, promop.deploy_prometheus(self.node, controller=operator)
        return self.once("prometheus", start)

    def kueue(self) -> kueue.KueueController:
        """Kueue's controller manager (pods of namespaces labelled ``kueue.MANAGED_NAMESPACES`` are managed)."""
        return self.once("kueue", lambda: kueue.start(self.cluster, self.node, die_with_parent=True))

    def training_operator(self, init_image: str) -> HostController:
        """The Kubeflow Training Operator's manager (the ``pytorchjob`` scheme), its Workers' init
        container in ``init_image``."""
        return self.once("training-operator", lambda: training_operator.start(self.cluster, self.node, init_image,
                                                                              die_with_parent=True))

    @contextlib.contextmanager
    def namespace(self, name: str, labels: Mapping[str, str] | None = None, *, create: bool = True,
                  timeout: float = 120.0) -> Iterator[str]:
        """A namespace of one module (created here unless ``create`` is false: the module applies
        it), deleted after it with everything in it, so the next module neither shares its objects
        nor waits on its CPU."""
        api = self.node.api()
        core = client.CoreV1Api(api)
        try:
            if create:
                core.create_namespace(client.V1Namespace(
                    metadata=client.V1ObjectMeta(name=name, labels=dict(labels or {}))))
            yield name
        finally:
            with contextlib.suppress(ApiException):
                core.delete_namespace(name, grace_period_seconds=1)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    core.read_namespace(name)
                except ApiException as exc:
                    if exc.status == 404:
                        break
                    raise
                time.sleep(1)
            api.close()


def _images_of(modules: Iterable[Any]) -> list[tuple[str, str]]:
    """The (archive, ref) pairs the modules' ``node_images()`` return, each ref once."""
    images: dict[str, str] = {}
    for module in sorted(set(modules), key=lambda m: m.__name__):
        for archive, ref in module.node_images() or ():
            images.setdefault(ref, archive)
    return [(archive, ref) for ref, archive in images.items()]


@contextlib.contextmanager
def shared_node(pytestconfig: pytest.Config, items: Sequence[pytest.Item]) -> Iterator[SharedNode]:
    """The session's cluster with a node, with the images of every module among ``items`` that
    uses the ``shared_node`` fixture (see the module docstring)."""
    modules = [item.module for item in items  # type: ignore[attr-defined]
               if "shared_node" in getattr(item, "fixturenames", ()) and getattr(item, "module", None) is not None
               and hasattr(item.module, "node_images")]  # type: ignore[attr-defined]
    with node_cluster(pytestconfig, "forge-node-session", wait_for_other=900,
                      build=lambda: _images_of(modules)) as (cluster, node):
        yield SharedNode(cluster, node, pytestconfig)


def scraped_since(query: Callable[[str], list[dict[str, Any]]], selector: str, since: float, *,
                  timeout: float = 90) -> None:
    """Wait until Prometheus's counters ``selector`` count everything that happened before ``since``
    (a Unix time, taken once the client's last request was answered).

    A target is scraped every interval (the rendered PodMonitor's :data:`SCRAPE_INTERVAL_S` at
    most), so once any series of ``selector`` holds a sample taken an interval after ``since``,
    every target still scraped has a sample after ``since`` too. A fixed sleep would wait for the
    slowest case every time; this waits one or two intervals."""
    fresh = f"max(timestamp({selector}))"

    def settled() -> bool:
        rows = query(fresh)
        return bool(rows) and float(rows[0]["value"][1]) > since + SCRAPE_INTERVAL_S

    wait_until(settled, timeout, f"a scrape of {selector} after the traffic", interval=1)
