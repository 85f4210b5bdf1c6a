"""A tiny HTTPS client (stdlib) for start-up: readiness, CRD installation, RBAC."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class RawClient:
    """Requests as a client certificate, JSON in and out."""

    def __init__(self, server: str, ca: Path, cert: Path, key: Path):
        self.server = server.rstrip("/")
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.ctx.load_cert_chain(str(cert), str(key))

    def request(self, method: str, path: str, body: bytes | None = None,
                content_type: str = "application/json", timeout: float = 30.0) -> tuple[int, Any]:
        req = urllib.request.Request(self.server + path, data=body, method=method)
        req.add_header("Accept", "application/json")
        if body is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as resp:
                status, data = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, data = e.code, e.read()
        try:
            return status, json.loads(data) if data else None
        except json.JSONDecodeError:
            return status, data.decode(errors="replace")
