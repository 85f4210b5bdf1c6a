"""A Prometheus that answers badly, for the rollout fault drills (issue 35): a small HTTP server of
the harness in front of the real one (:mod:`devkit.prometheus`), on its own loopback port, that
passes every request through — until a drill sets a :class:`Fault`. Then it answers the analysis
queries (every query but the canary's liveness queries, :func:`is_liveness`) with NaN, +Inf, an
empty vector or HTTP 503, or answers *every* query as the real Prometheus did at one moment (its
evaluation time and samples frozen there: a query cache that stopped moving).

The controller under test is pointed at :attr:`BadDataPrometheus.url` (the Environment's
`prometheus.url`) and cannot tell it from a Prometheus: the answers are Prometheus's HTTP API, and
what is passed through is the real server's own answer. Every answer is logged
(:attr:`BadDataPrometheus.answers`), so a drill counts what it served how. Loopback only.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Fault(str, Enum):
    """How the analysis queries are answered."""

    #: the real Prometheus's answer
    NONE = "none"
    #: one sample, NaN (a 0/0 rate)
    NAN = "nan"
    #: one sample, +Inf (a rate divided by 0)
    INF = "inf"
    #: an empty vector (no series match)
    EMPTY = "empty"
    #: HTTP 503 with Prometheus's error body (overloaded, or a proxy in front of it failing)
    UNAVAILABLE = "503"
    #: every query, liveness included, evaluated at the moment the fault was set: the same
    #: evaluation time and samples forever
    FROZEN = "frozen"


_COUNTED = re.compile(r"forge_requests_total\{[^{}]*\}\[[0-9a-z]+\]")


def is_liveness(query: str) -> bool:
    """Whether ``query`` is one of the controller's liveness queries
    (:func:`reconciler.metrics.analysis.liveness_queries`), which the value faults leave alone —
    they are about what the analysis query answers, the canary being alive."""
    return query.startswith(("timestamp(", "up and on(job, instance) ")) or bool(_COUNTED.fullmatch(query))


@dataclass(frozen=True)
class Answer:
    """One answer the server gave: when (wall clock), under which fault, to which query."""

    at: float
    fault: Fault
    query: str
    status: int


class BadDataPrometheus:
    """The server; :meth:`set` chooses the fault, :meth:`close` stops it."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.fault = Fault.NONE
        #: the evaluation time of every answer under :attr:`Fault.FROZEN`
        self.frozen_at = 0.0
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 — http.server's name
                outer._handle(self, None)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                outer._handle(self, self.rfile.read(length) if length else b"")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="bad-data-prometheus", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, fault: Fault) -> None:
        """Answer from now on under ``fault`` (:attr:`Fault.FROZEN` freezes at this moment)."""
        with self._lock:
            if fault is Fault.FROZEN and self.fault is not Fault.FROZEN:
                self.frozen_at = time.time()
            self.fault = fault

    def served(self, fault: Fault, since: float = 0.0, analysis: bool = True) -> int:
        """How many queries were answered under ``fault`` since ``since`` (wall clock): the analysis
        queries, or (``analysis`` False) the liveness ones."""
        return sum(1 for a in list(self.answers)
                   if a.fault is fault and a.at >= since and is_liveness(a.query) is not analysis)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    # -- one request ----------------------------------------------------------------------
    def _handle(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> None:
        parsed = urllib.parse.urlsplit(handler.path)
        params = urllib.parse.parse_qsl(parsed.query, keep_blank_values=True)
        if body:
            params += urllib.parse.parse_qsl(body.decode(), keep_blank_values=True)
        query = next((v for k, v in params if k == "query"), "")
        with self._lock:
            fault, frozen_at = self.fault, self.frozen_at
        if parsed.path != "/api/v1/query" or not query:
            fault = Fault.NONE  # readiness, admin, range queries: passed through
        elif fault not in (Fault.NONE, Fault.FROZEN) and is_liveness(query):
            fault = Fault.NONE
        if fault is Fault.FROZEN:
            params = [(k, v) for k, v in params if k != "time"] + [("time", f"{frozen_at:.3f}")]
        if fault in (Fault.NONE, Fault.FROZEN):
            status, payload, ctype = self._forward(parsed.path, params)
        elif fault is Fault.UNAVAILABLE:
            status, ctype = 503, "application/json"
            payload = json.dumps({"status": "error", "errorType": "unavailable",
                                  "error": "injected: the query engine is unavailable"}).encode()
        else:
            result = [] if fault is Fault.EMPTY else [{"metric": {}, "value": [time.time(), "NaN" if fault is Fault.NAN else "+Inf"]}]
            status, ctype = 200, "application/json"
            payload = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        if query:
            self.answers.append(Answer(time.time(), fault, query, status))
        try:
            handler.send_response(status)
            handler.send_header("content-type", ctype)
            handler.send_header("content-length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up first (its timeout, while the real server hung): as with Prometheus

    def _forward(self, path: str, params: list[tuple[str, str]]) -> tuple[int, bytes, str]:
        """The real Prometheus's answer to ``path`` with ``params`` (a GET): status, body, type."""
        url = f"{self.upstream}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                return resp.status, resp.read(), resp.headers.get("content-type", "application/json")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), exc.headers.get("content-type", "application/json")
        except OSError as exc:  # the real one down: what a proxy in front of it answers
            return 502, json.dumps({"status": "error", "errorType": "unavailable", "error": str(exc)}).encode(), "application/json"
