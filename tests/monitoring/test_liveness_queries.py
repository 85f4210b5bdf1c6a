"""The canary's liveness queries asked of a real Prometheus (Debian's, scraping every second): what
`reconciler.metrics.analysis.canary_down` reads of a live canary, of one whose server stopped
answering (its scrape fails: `up` 0, staleness markers), and of one whose target was dropped.

The canary here is a tiny HTTP server exposing the serving runtime's counter with its labels;
the unit tests of every case are tests/rollout/test_canary_liveness.py — this checks the PromQL
(the join of `up` with the canary's series, `timestamp()`, the range's raw samples) and the
client's parsing against the real thing.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from reconciler.metrics.analysis import Liveness, Readiness, canary_down, liveness_queries
from reconciler.metrics.prometheus import Prometheus as Client
from tests.polling import wait_until

SERIES = ('forge_requests_total{forge_endpoint="digits",forge_namespace="ns",forge_version="b",forge_variant="base",'
          'forge_role="canary",code="200"} ')


class Canary:
    """`/metrics` with one canary series whose counter grows at each scrape."""

    def __init__(self) -> None:
        count = [0]

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                count[0] += 1
                body = f"# TYPE forge_requests_total counter\n{SERIES}{count[0]}\n".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kill(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def observe(client: Client, since: float) -> Liveness:
    q = liveness_queries(endpoint="digits", namespace="ns", role="canary", reach=5.0)
    return Liveness(Readiness(True, "ready"), q, tuple(client.series(q.counted)), tuple(client.series(q.current)),
                    tuple(client.series(q.up)), since)


def test_the_liveness_queries_see_a_live_canary_then_a_dead_one_then_a_dropped_target(prometheus) -> None:
    canary = Canary()
    try:
        since = time.time()
        prometheus.set_targets([canary.address])
        client = Client(prometheus.url, timeout=5)
        # alive once the range holds a few samples, all scraped after `since`
        live = wait_until(lambda: (obs := observe(client, since)).counted and len(obs.counted[0].samples) >= 3 and obs,
                          timeout=60, what="three samples of the canary in the range")
        assert canary_down(live) is None, canary_down(live)
        [series] = live.counted
        assert series.labels["forge_role"] == "canary" and series.target() == ("forge", canary.address)
        assert len(series.samples) >= 3 and all(t >= since for t, _ in series.samples)
        assert [s.samples[-1][1] for s in live.up] == [1.0]
        canary.kill()  # the next scrape fails: up 0, the series marked stale
        down = wait_until(lambda: canary_down(observe(client, since)), timeout=30, what="the failed scrape to show")
        assert f"the last scrape of {canary.address} failed (up == 0)" in down
        prometheus.set_targets([])  # dropped from service discovery: no `up` at all
        gone = wait_until(lambda: "missing" in (canary_down(observe(client, since)) or "") and canary_down(observe(client, since)),
                          timeout=30, what="the dropped target to show")
        assert f"its scrape target {canary.address} (job forge) is missing" in gone
    finally:
        prometheus.set_targets([])
