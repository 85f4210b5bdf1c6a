"""Shadow mirroring by the live model server: a copy of the requests it answered goes to the
shadow predictor, and the two answers are compared here.

Why in the server and not in the gateway: a gateway's mirror (Istio's `mirror`, the Gateway API's
`RequestMirror` filter, Traefik's Mirroring service) drops the shadow's answers, so nobody can say
whether the shadow agrees with what callers got; and Traefik's Gateway provider implements no
mirror at all. The live server holds both the request and its own answer: after the answer is sent
it posts the same body to the shadow (the same path) from a small thread pool, never on the event
loop that serves callers, and compares the labels row by row and the probabilities.

A copy is made of a request the live server answered 200 (a failed one has nothing to compare
with), of `percent` of them, while fewer than `maxInFlight` copies are outstanding: one more is
dropped and counted, never queued, so a slow shadow costs callers nothing.

Series (with the live server's own labels, so each live predictor reports its copies):

- ``forge_shadow_requests_total{outcome}``: copies by outcome — ``compared`` (answered and
  compared), ``failed`` (refused, non-2xx, timed out), ``unreadable`` (answered, not comparable:
  no ``label`` output, other row counts), ``dropped`` (too many outstanding: never sent);
- ``forge_shadow_rows_total{agreement}``: compared rows whose label the shadow gave the same
  (``agreed``) or not (``disagreed``): the agreement a gate reads
  (``specs.rollout.BUILTIN_TEMPLATES["shadow-agreement"]``);
- ``forge_shadow_probability_delta``: the largest |Δp| between the two answers' probabilities
  of one compared copy (histogram);
- ``forge_shadow_duration_seconds``: the shadow's answer time as the copy saw it (histogram).
"""

from __future__ import annotations

import json
import random
import threading
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

OUTCOMES = ("compared", "failed", "unreadable", "dropped")
AGREEMENTS = ("agreed", "disagreed")
DELTA_BUCKETS = (0.0001, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0)
#: The header marking a copy, as the local router's mirror marks its own.
SHADOW_HEADER = "x-forge-shadow"


@dataclass(frozen=True)
class Comparison:
    """Two Open Inference answers to one request: rows, rows with the same label, the largest
    probability difference (None without probabilities in both)."""

    rows: int
    agreed: int
    max_delta: float | None


def _output(answer: Mapping[str, Any], name: str) -> list[float] | None:
    """The flat `data` of the output named ``name`` of a v2 answer, or None."""
    for out in answer.get("outputs") or ():
        if isinstance(out, Mapping) and out.get("name") == name and isinstance(out.get("data"), list):
            return _flat(out["data"])
    return None


def _flat(data: Sequence[Any]) -> list[float]:
    """A v2 tensor's `data`, flat (a client may nest it by shape)."""
    flat: list[float] = []
    for x in data:
        if isinstance(x, list):
            flat.extend(_flat(x))
        else:
            flat.append(x)
    return flat


def compare(live: Mapping[str, Any], shadow: Mapping[str, Any]) -> Comparison | None:
    """The comparison of two v2 answers (pure), or None when they cannot be compared: a
    ``label`` output missing from either, or a different number of rows."""
    live_labels, shadow_labels = _output(live, "label"), _output(shadow, "label")
    if not live_labels or shadow_labels is None or len(live_labels) != len(shadow_labels):
        return None
    agreed = sum(1 for a, b in zip(live_labels, shadow_labels) if a == b)
    live_p, shadow_p = _output(live, "probabilities"), _output(shadow, "probabilities")
    delta = (max(abs(a - b) for a, b in zip(live_p, shadow_p))
             if live_p and shadow_p and len(live_p) == len(shadow_p) else None)
    return Comparison(len(live_labels), agreed, delta)


class Mirror:
    """Copies of answered requests to the shadow at ``config.url`` (a :class:`specs.stepconfig.
    MirrorConfig`), their outcomes recorded in ``registry`` under ``labels``."""

    def __init__(self, config: Any, registry: CollectorRegistry, labels: Mapping[str, str], latency_buckets: Sequence[float]) -> None:
        self.url = config.url.rstrip("/")
        self.percent = config.percent
        self.max_in_flight = config.max_in_flight
        self.timeout_s = config.timeout_ms / 1000.0
        self.labels = dict(labels)
        names = tuple(self.labels)
        self._outcomes = Counter("forge_shadow_requests", "Copies of answered requests sent to the shadow, by outcome.",
                                 (*names, "outcome"), registry=registry)
        self._rows = Counter("forge_shadow_rows", "Compared rows by whether the shadow gave the live label.",
                             (*names, "agreement"), registry=registry)
        self._delta = Histogram("forge_shadow_probability_delta", "Largest probability difference of a compared copy.",
                                names, buckets=DELTA_BUCKETS, registry=registry)
        self._duration = Histogram("forge_shadow_duration_seconds", "The shadow's answer time, as its copy saw it.",
                                   names, buckets=tuple(latency_buckets), registry=registry)
        for outcome in OUTCOMES:  # at 0 from the start: "no disagreement" is a figure, not a missing series
            self._outcomes.labels(**self.labels, outcome=outcome)
        for agreement in AGREEMENTS:
            self._rows.labels(**self.labels, agreement=agreement)
        self._pool = ThreadPoolExecutor(max_workers=min(8, self.max_in_flight), thread_name_prefix="forge-mirror")
        self._lock = threading.Lock()
        self._in_flight = 0
        self._rng = random.Random()

    def offer(self, path: str, body: bytes, content_type: str, answer: bytes) -> None:
        """Copy one answered request (``path``, ``body``; the live ``answer``) to the shadow, when
        drawn (`percent`) and fewer than `maxInFlight` copies are outstanding; returns at once."""
        if self.percent < 100 and self._rng.random() * 100 >= self.percent:
            return
        with self._lock:
            if self._in_flight >= self.max_in_flight:
                self._outcomes.labels(**self.labels, outcome="dropped").inc()
                return
            self._in_flight += 1
        self._pool.submit(self._copy, path, body, content_type, answer)

    def _copy(self, path: str, body: bytes, content_type: str, answer: bytes) -> None:
        outcome = "failed"
        try:
            request = urllib.request.Request(self.url + path, data=body, method="POST",
                                             headers={"content-type": content_type or "application/json", SHADOW_HEADER: "1"})
            start = perf_counter()
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:  # noqa: S310 (the rendered http:// URL)
                shadow_answer = resp.read()
            self._duration.labels(**self.labels).observe(perf_counter() - start)
            outcome = self._record(answer, shadow_answer)
        except (OSError, ValueError):
            outcome = "failed"  # refused, reset, timed out, or answered non-2xx (HTTPError, an OSError)
        finally:
            self._outcomes.labels(**self.labels, outcome=outcome).inc()
            with self._lock:
                self._in_flight -= 1

    def _record(self, answer: bytes, shadow_answer: bytes) -> str:
        """The outcome of a copy the shadow answered, its comparison recorded."""
        try:
            result = compare(json.loads(answer), json.loads(shadow_answer))
        except (ValueError, TypeError, AttributeError):
            result = None
        if result is None:
            return "unreadable"
        self._rows.labels(**self.labels, agreement="agreed").inc(result.agreed)
        self._rows.labels(**self.labels, agreement="disagreed").inc(result.rows - result.agreed)
        if result.max_delta is not None:
            self._delta.labels(**self.labels).observe(result.max_delta)
        return "compared"
