"""Prometheus metrics of a model server and fault injection for rollback drills.

The metric names are part of Forge's contract: the rollout gates' PromQL templates
(``specs.rollout.BUILTIN_TEMPLATES``) query them. Every series carries the labels
``forge_endpoint``, ``forge_namespace``, ``forge_version``, ``forge_variant`` and ``forge_role``
(stable|canary) — ``specs.rollout.SERIES_LABELS``, which says why they are prefixed: no scrape
(the Prometheus Operator's PodMonitor jobs add ``namespace``, ``pod``, ``container``, ``endpoint``,
``job``, ``instance``) can add or rename them, with or without ``honorLabels``.

- ``forge_requests_total{code}``: inference requests by HTTP status code (counter);
- ``forge_request_duration_seconds``: end-to-end latency of an inference request (histogram);
- ``forge_batch_size``: rows per model invocation, after dynamic batching (histogram);
- ``forge_request_phase_seconds{phase}``: where a successful request's time went (histogram), with
  the load-adaptive batcher or without batching: ``decode`` (from the request's arrival at the
  server to its rows reaching the batcher: body read, JSON and the v2 types, the input tensor),
  ``queue`` (waiting for the model: the batch before it, a hold for more arrivals), ``compute`` (the
  forward pass of its batch) and ``encode`` (from the result to the last byte of the response: the
  output tensors, the JSON, the write, and any wait for the event loop); the four add up to the
  request's ``forge_request_duration_seconds``. MLServer's own batching computes batches apart
  from the requests' tasks, so there only the total is recorded;
- ``forge_serving_info{backend, served_variant, threads, batcher}``: 1 — what this server runs
  (``GET /forge/serving`` has the same as JSON, with the reason a variant was chosen);
- with ``mirror`` configured, the ``forge_shadow_*`` series of its copies to the shadow
  (runtimes/serving/mirror.py).

``code="200"`` and ``code="500"`` exist from the start (at 0): a healthy server's error rate is 0,
not "no data", and a server failing every request has a success rate of 0, so the gates and the
``compareToStable`` alerts measure them instead of holding for want of a series.

Fault injection (an Endpoint's ``faultInjection``, for drills): ``addedLatencyMs`` and
``errorRate`` from the first inference request, or — a canary that degrades late — only once
the server has answered ``afterRequests`` inference requests and/or served for ``after`` since its
model was loaded (whichever comes last): healthy for the first steps of a rollout, then failing.

Works with prometheus-client 0.8 (the seldon environment) and current releases.
"""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specs.base import duration_seconds
from specs.rollout import SERIES_LABELS

LABELS = tuple(SERIES_LABELS[k] for k in ("endpoint", "namespace", "version", "variant", "role"))
#: Status codes whose series exist before the first request (see the module docstring).
INITIAL_CODES = ("200", "500")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
PHASE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PHASES = ("decode", "queue", "compute", "encode")


class Telemetry:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, config: Any):
        self.labels = {
            SERIES_LABELS["endpoint"]: config.endpoint,
            SERIES_LABELS["namespace"]: config.namespace,
            SERIES_LABELS["version"]: config.version,
            SERIES_LABELS["variant"]: config.variant,
            SERIES_LABELS["role"]: config.role,
        }
        self.registry = CollectorRegistry()
        self._requests = Counter("forge_requests", "Inference requests by HTTP status code.", (*LABELS, "code"), registry=self.registry)
        self._duration = Histogram("forge_request_duration_seconds", "End-to-end latency of inference requests.", LABELS, buckets=LATENCY_BUCKETS, registry=self.registry)
        self._batch = Histogram("forge_batch_size", "Rows per model invocation (after dynamic batching).", LABELS, buckets=BATCH_BUCKETS, registry=self.registry)
        self._phase = Histogram("forge_request_phase_seconds", "Where a request's time went: decode, queue, compute, encode.",
                                (*LABELS, "phase"), buckets=PHASE_BUCKETS, registry=self.registry)
        self._info = Gauge("forge_serving_info", "What this server runs: backend, served variant, threads, batcher.",
                           (*LABELS, "backend", "served_variant", "threads", "batcher"), registry=self.registry)
        for code in INITIAL_CODES:
            self._requests.labels(**self.labels, code=code)
        #: Copies of the answered requests to the shadow, compared (runtimes/serving/mirror.py), when configured.
        self.mirror = None
        if config.mirror is not None:
            from runtimes.serving.mirror import Mirror

            self.mirror = Mirror(config.mirror, self.registry, self.labels, LATENCY_BUCKETS)
        #: What `GET /forge/serving` answers (set by the server once the model is loaded).
        self.serving: dict[str, Any] = {}
        faults = config.fault_injection
        self.error_rate = float(faults.error_rate) if faults else 0.0
        self.added_latency_s = float(faults.added_latency_ms) / 1000.0 if faults else 0.0
        #: The faults begin after this many inference requests and this long after the model was loaded.
        self.faults_after_requests = (faults.after_requests or 0) if faults else 0
        self.faults_after_s = duration_seconds(faults.after) if faults and faults.after else 0.0
        self._serving_since = time.monotonic()
        self._inference_requests = itertools.count(1)  # next() is atomic: the seldon server's threads share it
        self._rng = random.Random()

    def observe_request(self, code: int, seconds: float) -> None:
        self._requests.labels(**self.labels, code=str(code)).inc()
        self._duration.labels(**self.labels).observe(seconds)

    def observe_batch(self, rows: int) -> None:
        self._batch.labels(**self.labels).observe(rows)

    def observe_phases(self, timing: dict[str, Any], end: float) -> None:
        """The four phases of one request from its timing marks (see the module docstring)."""
        marks = (timing["start"], timing["enqueued"], timing["dispatched"], timing["computed"], end)
        for phase, (a, b) in zip(PHASES, zip(marks, marks[1:])):
            self._phase.labels(**self.labels, phase=phase).observe(max(0.0, b - a))

    def set_serving(self, serving: dict[str, Any]) -> None:
        self.serving = serving
        self._serving_since = time.monotonic()  # the model is loaded: `after` counts from here
        self._info.labels(**self.labels, backend=str(serving.get("backend")), served_variant=str(serving.get("variant")),
                          threads=str(serving.get("threads")), batcher=str(serving.get("batcher"))).set(1)

    def faulty(self) -> bool:
        """Count one inference request and say whether the injected faults apply to it: always
        without a delay, else once ``afterRequests`` were answered and ``after`` has passed."""
        seen = next(self._inference_requests)
        return seen > self.faults_after_requests and time.monotonic() - self._serving_since >= self.faults_after_s

    def inject_error(self) -> bool:
        """True for the fraction ``error_rate`` of requests (answered with HTTP 500)."""
        return self.error_rate > 0 and self._rng.random() < self.error_rate

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def is_inference(self, path: str) -> bool:
        """Requests that count: v2 ``/v2/models/…/infer`` and Seldon ``/predict`` / ``/api/v1.0/predictions``."""
        return path.endswith("/infer") or path in ("/predict", "/api/v1.0/predictions", "/api/v0.1/predictions")
