"""Model servers' ``/metrics`` without the models: the serving runtime's own
:class:`runtimes.serving.telemetry.Telemetry` (the same metric names, labels and buckets, built from
the same ServeConfig a rendered predictor passes), fed with a fixed pattern of requests.

Run with the runtime environment's Python, ``PYTHONPATH=<repo root>``::

    python -m tests.monitoring.exporter <servers.json> <ports.json>

``servers.json``: ``[{"config": <ServeConfig JSON>, "errorEvery": N, "seconds": S}, …]``: each
server answers 20 requests a second, every N-th with HTTP 500 (0: never), each taking S seconds.
``ports.json`` is written (atomically) once every server listens: the port of each, in order.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from runtimes.serving.telemetry import Telemetry
from specs.stepconfig import ServeConfig


def _server(telemetry: Telemetry) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = telemetry.exposition()
            self.send_response(200)
            self.send_header("Content-Type", telemetry.content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


def _traffic(telemetry: Telemetry, error_every: int, seconds: float) -> None:
    n = 0
    while True:
        n += 1
        code = 500 if error_every and n % error_every == 0 else 200
        telemetry.observe_request(code, seconds)
        time.sleep(0.05)


def main(servers_path: str, ports_path: str) -> None:
    ports = []
    with open(servers_path) as f:
        specs = json.load(f)
    for spec in specs:
        telemetry = Telemetry(ServeConfig.model_validate(spec["config"]))
        server = _server(telemetry)
        ports.append(server.server_address[1])
        threading.Thread(target=server.serve_forever, daemon=True).start()
        threading.Thread(target=_traffic, args=(telemetry, int(spec["errorEvery"]), float(spec["seconds"])), daemon=True).start()
    tmp = ports_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(ports, f)
    os.replace(tmp, ports_path)
    threading.Event().wait()


if __name__ == "__main__":
    main(*sys.argv[1:3])
