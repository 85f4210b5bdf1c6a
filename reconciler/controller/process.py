"""The controller process: read the configuration, start the HTTP endpoints, run the loop until
SIGTERM or SIGINT, then give every Lease back (the other replica takes over at its next retry,
instead of after the Lease's duration)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from reconciler.controller.config import load_config
from reconciler.controller.credentials import WebhookSecret
from reconciler.controller.manager import Manager
from reconciler.controller.server import serve
from reconciler.diagnostics import ForgeError

log = logging.getLogger("forge.controller")


def file_secret(path: Path) -> bytes:
    """The webhook's secret from a file (``webhook.secretFile``, a controller run on a host): read
    once, at start."""
    try:
        secret = path.read_bytes()[:4097].strip()
    except OSError as exc:
        raise ForgeError(f"{path}: cannot read the webhook secret ({exc.strerror})") from None
    if not secret or len(secret) > 4096:
        raise ForgeError(f"{path}: the webhook secret must be 1 to 4096 bytes")
    return secret


def run_controller(config_path: str, *, on_listening: Callable[[str], None] | None = None) -> int:
    """Run the controller the file at ``config_path`` configures until SIGTERM/SIGINT; 0 then.
    ``on_listening`` gets the HTTP address once it is served."""
    config = load_config(config_path)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    webhook = None
    if config.webhook is not None:
        webhook = WebhookSecret()
        if config.webhook.secret_file is not None:
            webhook.value = file_secret(Path(config.webhook.secret_file))
    manager = Manager(config, webhook=webhook)
    loop = threading.Thread(target=manager.run, name="forge-controller", daemon=True)
    server = serve(manager, loop.is_alive, webhook, config.http.address, config.http.port)
    host, port = server.server_address[:2]
    address = f"http://{host!s}:{port}"
    log.info("serving /healthz, /readyz, /metrics%s at %s as %s", " and POST /hooks/git" if webhook else "", address,
             manager.identity)
    if on_listening is not None:
        on_listening(address)

    def stop(signum: int, frame: object) -> None:
        log.info("signal %d: stopping, giving the Leases back", signum)
        manager.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    loop.start()
    while loop.is_alive():
        loop.join(0.5)
    server.shutdown()
    return 0
