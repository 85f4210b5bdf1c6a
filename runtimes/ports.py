"""Free TCP ports for a step's own servers (the serve step's HTTP and gRPC servers, DeepSpeed's
one-process rendezvous)."""

from __future__ import annotations

import contextlib
import socket


def free_ports(host: str, count: int) -> list[int]:
    """``count`` different TCP ports free on ``host`` now: each socket stays bound until all are
    picked — one closed before the next bind may be handed out again (the HTTP and gRPC servers
    were once given one port, and the second bind failed)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
