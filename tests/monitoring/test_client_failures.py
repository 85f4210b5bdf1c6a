"""The Prometheus client names how a query failed (issue 35's hung-Prometheus drill): a server that
accepts the connection and never answers (what a SIGSTOPped Prometheus is to a client: the kernel
still accepts into its listen backlog) reads as a timeout, a closed port as a refused connection —
both `unreachable` to the analysis, told apart for the person reading the rollout's reason. Real
sockets on loopback, the real client."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from reconciler.metrics.prometheus import Prometheus, PrometheusUnavailable


@pytest.fixture
def silent() -> Iterator[str]:
    """A listening socket nobody accepts from: connections land in the backlog, no answer comes."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def closed_port() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def test_a_hung_server_is_a_timeout_bounded_by_the_client(silent: str) -> None:
    began = time.monotonic()
    with pytest.raises(PrometheusUnavailable) as err:
        Prometheus(silent, timeout=0.5).value("up")
    assert f"{silent}: timed out (no answer within 0.5 s): " in str(err.value)
    assert time.monotonic() - began < 5  # two attempts of 0.5 s and a short pause, never the OS's own timeouts


def test_a_closed_port_is_a_refused_connection() -> None:
    url = closed_port()
    with pytest.raises(PrometheusUnavailable) as err:
        Prometheus(url, timeout=0.5).series("up")
    assert f"{url}: connection refused: " in str(err.value)
