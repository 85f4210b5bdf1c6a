"""The controller's HTTP endpoints: `/healthz` (the loop is alive), `/readyz` (it has run once:
configuration read, API server asked), `/metrics` (:mod:`.metrics`) and `POST /hooks/git`, the
push webhook: a body signed as GitHub signs it (`X-Hub-Signature-256: sha256=HMAC-SHA256(secret,
body)`, compared in constant time) triggers a sync of the sources on the pushed branch at once; a
missing or wrong signature is refused with 401 and triggers nothing; while the secret cannot be read
(its Secret not made yet), 503 says why."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from reconciler.controller.credentials import WebhookSecret
from reconciler.controller.manager import Manager

log = logging.getLogger("forge.controller.http")

#: Largest webhook body read (GitHub caps its payloads at 25 MB; a push's refs fit in far less).
MAX_BODY = 1024 * 1024
SIGNATURE = "X-Hub-Signature-256"


def signature_ok(secret: bytes, body: bytes, header: str | None) -> bool:
    """Whether ``header`` is `sha256=` and the HMAC-SHA256 of ``body`` under ``secret`` (constant time)."""
    if not header or not header.startswith("sha256="):
        return False
    want = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(want.encode(), header.strip().encode())


def pushed_branch(body: bytes) -> str | None:
    """The branch a push event names (`ref: refs/heads/NAME`), or None (every source)."""
    try:
        ref = json.loads(body or b"{}").get("ref")
    except (ValueError, AttributeError):
        return None
    return ref.removeprefix("refs/heads/") if isinstance(ref, str) and ref.startswith("refs/heads/") else None


def serve(manager: Manager, alive: Callable[[], bool], webhook: WebhookSecret | None, address: str,
          port: int) -> ThreadingHTTPServer:
    """Start the endpoints on ``address``:``port`` (0: any free port) in a daemon thread; the server
    (its `server_address` says the port). ``webhook``: the push webhook's secret as the loop keeps
    it (None: no webhook configured)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "forge-controller"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
            log.debug("%s " + format, self.address_string(), *args)

        def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            if self.path == "/healthz":
                ok = alive()
                self._send(200 if ok else 503, b"ok\n" if ok else b"the controller loop has stopped\n")
            elif self.path == "/readyz":
                ready = alive() and manager.ticks > 0
                self._send(200 if ready else 503, b"ok\n" if ready else b"not ready\n")
            elif self.path == "/metrics":
                self._send(200, manager.metrics.exposition(), "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._send(404, b"not found\n")

        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            if self.path != "/hooks/git":
                self._send(404, b"not found\n")
                return
            if webhook is None:
                self._send(404, b"no webhook configured\n")
                return
            secret = webhook.value
            if secret is None:
                self._send(503, f"{webhook.problem}\n".encode())
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY:
                self._send(413, b"body missing or too large\n")
                return
            body = self.rfile.read(length)
            if not signature_ok(secret, body, self.headers.get(SIGNATURE)):
                log.warning("webhook refused: missing or wrong %s", SIGNATURE)
                self._send(401, f"missing or wrong {SIGNATURE}\n".encode())
                return
            triggered = manager.trigger(pushed_branch(body))
            self._send(202, json.dumps({"triggered": triggered}).encode() + b"\n", "application/json")

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="forge-http", daemon=True).start()
    return server
