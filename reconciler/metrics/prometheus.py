"""Prometheus queries for the rollout gates, through `prometheus-api-client`.

A query answers a number, "no data" (None) or raises :class:`PrometheusUnavailable`; the
analysis turns the last two into *inconclusive*, never into a failure by itself. The canary's
liveness needs more than a number: :meth:`MetricSource.series` answers each series with its
labels and its samples' timestamps (:class:`~reconciler.metrics.analysis.Series`).
:class:`MetricSource` is that contract as a type: the controllers depend on it, not on the HTTP
client, so their unit tests can answer queries without a server.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from urllib3 import exceptions as urllib3_exceptions
from urllib3.util.retry import Retry

from reconciler.diagnostics import ForgeError
from reconciler.metrics.analysis import Series


class PrometheusUnavailable(ForgeError):
    """Prometheus could not answer (down, timeout, HTTP error, bad query)."""


class MetricSource(Protocol):
    """Anything that answers an instant PromQL query with one number."""

    def value(self, query: str) -> float | None:
        """The query's value; None when there are no samples (or NaN). Raises
        :class:`PrometheusUnavailable` when the source cannot answer at all."""
        ...

    def series(self, query: str) -> list[Series]:
        """The query's result series by series, each with its samples as ``(timestamp, value)``
        (one for an instant vector, every raw sample for a range selector); empty when there are
        none. Raises :class:`PrometheusUnavailable` as :meth:`value` does."""
        ...


class Prometheus:
    """A Prometheus server's HTTP API (a :class:`MetricSource`)."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        # requests and the client are imported here, not with the module: every plan imports this
        # module (the rollout controller's types) and asks Prometheus nothing (70 ms of imports).
        from prometheus_api_client import PrometheusConnect

        self.url = url.rstrip("/")
        self.timeout = timeout
        # One quick retry at most: a down Prometheus must read as "inconclusive" within seconds.
        self.client = PrometheusConnect(url=self.url, disable_ssl=True, retry=Retry(total=1, backoff_factor=0.1))

    def _query(self, query: str) -> list[dict[str, Any]]:
        import requests
        from prometheus_api_client import PrometheusApiClientException

        try:
            result = self.client.custom_query(query=query, params={"timeout": f"{self.timeout:g}s"}, timeout=self.timeout)
        except (requests.exceptions.RequestException, PrometheusApiClientException, ValueError) as exc:
            raise PrometheusUnavailable(f"{self.url}: {_what_failed(exc, self.timeout)}{exc.__class__.__name__}: "
                                        f"{str(exc)[:200]}") from exc
        return list(result or [])

    def series(self, query: str) -> list[Series]:
        """The query's series with their samples: ``values`` of a matrix (every raw sample of a
        range selector, staleness markers left out by Prometheus), ``value`` of a vector."""
        out = []
        for item in self._query(query):
            raw: list[Any] = item.get("values") or [] if "values" in item else [item.get("value")]
            samples = []
            for point in raw:
                try:
                    samples.append((float(point[0]), float(point[1])))
                except (TypeError, ValueError, IndexError):
                    continue
            out.append(Series({str(k): str(v) for k, v in (item.get("metric") or {}).items()}, tuple(samples)))
        return out

    def value(self, query: str) -> float | None:
        """The query's instant value: a single number, or None when there are no samples.

        Several series (a query without an aggregation) are summed, so a template that forgot a
        `sum()` still answers one number."""
        result = self._query(query)
        if not result:
            return None
        values = []
        for series in result:
            raw = series.get("value", [None, None])[1]
            try:
                values.append(float(raw))
            except (TypeError, ValueError):
                continue
        if not values:
            return None
        total = sum(values)
        return None if math.isnan(total) else total


def _what_failed(exc: BaseException, timeout: float) -> str:
    """A few words first, for people: a hung server (no answer within the timeout) reads apart from
    a refused connection — requests wraps both, after its retry, in a ConnectionError whose text
    names the cause only past the URL, which the message cuts."""
    chain: list[object] = []
    todo: list[object] = [exc]
    while todo:
        cur = todo.pop()
        if cur is None or any(cur is c for c in chain):
            continue
        chain.append(cur)
        todo.extend([getattr(cur, "reason", None), getattr(cur, "__cause__", None), getattr(cur, "__context__", None),
                     *(a for a in getattr(cur, "args", ()) if isinstance(a, BaseException))])
    import requests

    # Refusals first: urllib3's NewConnectionError is (for compatibility) a ConnectTimeoutError.
    if any(isinstance(c, (ConnectionRefusedError, urllib3_exceptions.NewConnectionError)) for c in chain):
        return "connection refused: "
    if any(isinstance(c, (TimeoutError, requests.exceptions.Timeout, urllib3_exceptions.TimeoutError)) for c in chain):
        return f"timed out (no answer within {timeout:g} s): "
    return ""
