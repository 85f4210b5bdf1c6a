"""pytest plugin: a real kube-apiserver + etcd + CRDs and a real Prometheus for Forge's tests.

Register it once, in the top-level ``tests/conftest.py``::

    pytest_plugins = ["tests.cluster_fixtures"]

Fixtures (see docs/test-cluster.md):

* ``kube_cluster`` (session) -> :class:`tests.Cluster`: ``.kubeconfig``, ``.server``,
  ``.api_client(kubeconfig=None)``, ``.version()``, ``.user_kubeconfig(user, groups)``.
* ``k8s_api`` (session) -> ``kubernetes.client.ApiClient`` for the admin.
* ``namespace`` (function) -> ``str``: a fresh namespace, emptied and removed after the test.
* ``restricted_kubeconfig`` (function) -> ``pathlib.Path``: a kubeconfig whose user ``forgectl``
  holds exactly docs/rbac/forgectl-role.yaml in ``namespace`` (its default namespace).
* ``prometheus`` (function) -> :class:`tests.Prometheus`: one server per session,
  reset for each test (running again, no targets, no series): ``.url``, ``.set_targets()``,
  ``.pause()``/``.resume()`` for outage tests, ``.query()``, ``.wait_for_targets()``.
  ``prometheus_server`` (session) is the same object without the reset.

Tests that use ``kube_cluster`` (directly or through another fixture) are marked ``cluster``
and tests that use ``prometheus`` are marked ``prometheus`` automatically, so
``pytest -m "not cluster"`` runs without building or starting anything.

Environment: ``FORGE_KUBECONFIG_EXTERNAL=<path>`` uses that cluster instead of starting one
(it must already have the CRDs; ``restricted_kubeconfig`` is then skipped, it needs the client
CA); ``FORGE_CACHE`` moves the build cache.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.cluster import Cluster
from devkit.common import ClusterError
from devkit.gobuild import ensure_binaries
from devkit.namespaces import delete_namespace
from devkit.prometheus import Prometheus, ensure_prometheus
from devkit.rbac import FORGECTL_GROUP, FORGECTL_USER, bind_forgectl, install_forgectl_rbac

_started: list[str] = []  # one line per component started by this session, for the summary


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _started:
        terminalreporter.write_sep("-", "forge test cluster")
        for line in _started:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & {"kube_cluster", "k8s_api", "namespace", "restricted_kubeconfig"}:
            item.add_marker(pytest.mark.cluster)
        if names & {"prometheus", "prometheus_server"}:
            item.add_marker(pytest.mark.prometheus)


@contextlib.contextmanager
def _uncaptured(config: pytest.Config) -> Iterator[None]:
    """Let the first build's progress reach the terminal (it can take minutes)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        yield
        return
    with capman.global_and_fixture_disabled():
        yield


@pytest.fixture(scope="session")
def kube_cluster(pytestconfig: pytest.Config) -> Iterator[Cluster]:
    external = Cluster.external_from_env()
    if external is not None:
        yield external
        return
    with _uncaptured(pytestconfig):
        ensure_binaries()
    state_dir = tempfile.mkdtemp(prefix="forge-test-cluster-")
    cluster = Cluster.start(state_dir, die_with_parent=True, log=lambda msg: None)
    _started.append(f"kube-apiserver {cluster.versions['KUBERNETES_VERSION']} + etcd {cluster.versions['ETCD_VERSION']} "
                    f"+ {len(cluster.crds)} CRDs ready in {cluster.start_seconds:.1f} s at {cluster.server}")
    _started.extend("  note: " + n for n in cluster.notes if "refused by the module proxy" not in n)
    refused = sorted({n.split(" is refused")[0] for n in cluster.notes if "refused by the module proxy" in n})
    if refused:
        _started.append("  note: refused by the module proxy, taken from checksum-verified reference copies: "
                        + ", ".join(refused))
    try:
        yield cluster
    finally:
        cluster.stop(quiet=True)


@pytest.fixture(scope="session")
def k8s_api(kube_cluster: Cluster):
    client = kube_cluster.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def namespace(kube_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{base}-{uuid.uuid4().hex[:6]}"
    raw = kube_cluster.raw_client()
    body = {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"forge.dev/test": "true"}}}
    status, resp = raw.request("POST", "/api/v1/namespaces", json.dumps(body).encode())
    if status != 201:
        raise ClusterError(f"creating namespace {name}: HTTP {status}: {resp}")
    try:
        yield name
    finally:
        if not kube_cluster.external:
            delete_namespace(kube_cluster, name)
        else:
            raw.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture(scope="session")
def _forgectl_rbac(kube_cluster: Cluster) -> None:
    if kube_cluster.external:
        pytest.skip("restricted_kubeconfig needs the client CA of a cluster started by the tests")
    install_forgectl_rbac(kube_cluster)


@pytest.fixture
def restricted_kubeconfig(kube_cluster: Cluster, namespace: str, _forgectl_rbac: None) -> Path:
    """Kubeconfig for user ``forgectl`` (group ``forge:controllers``) bound to ClusterRole
    ``forgectl`` in ``namespace`` only, plus cluster-wide ``forgectl-namespace-reader``."""
    bind_forgectl(kube_cluster, namespace)
    path = kube_cluster.user_kubeconfig(FORGECTL_USER, [FORGECTL_GROUP], namespace)
    _wait_allowed(kube_cluster, path, namespace)
    return path


def _wait_allowed(cluster: Cluster, kubeconfig: Path, namespace: str, timeout: float = 10.0) -> None:
    """RBAC is served from an informer cache: wait until the new binding is visible."""
    from kubernetes import client

    api = cluster.api_client(kubeconfig)
    try:
        authz = client.AuthorizationV1Api(api)
        review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                namespace=namespace, verb="create", group="argoproj.io", resource="workflows")))
        deadline = time.monotonic() + timeout
        while not authz.create_self_subject_access_review(review).status.allowed:
            if time.monotonic() > deadline:
                raise ClusterError(f"RoleBinding forgectl in {namespace} not effective after {timeout} s")
            time.sleep(0.05)
    finally:
        api.close()


@pytest.fixture(scope="session")
def prometheus_server(pytestconfig: pytest.Config) -> Iterator[Prometheus]:
    """The session's Prometheus as is (no per-test reset): for session/module-scoped fixtures."""
    with _uncaptured(pytestconfig):
        ensure_prometheus()  # apt-get install on first use
    prom = Prometheus.start(die_with_parent=True)
    _started.append(f"prometheus at {prom.url} (1 s scrape interval)")
    try:
        yield prom
    finally:
        prom.stop()


@pytest.fixture
def prometheus(prometheus_server: Prometheus) -> Prometheus:
    """The session's Prometheus, running, with no scrape targets and no stored series."""
    prometheus_server.reset()
    return prometheus_server
