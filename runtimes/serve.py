"""``python -m runtimes serve``: a model server speaking the Open Inference (v2) protocol, on MLServer.

- ``POST /v2/models/<model>/infer`` with one input tensor (``FP32`` features ``[N, F]`` or
  ``INT64`` tokens ``[N, T]``); outputs ``probabilities`` and ``label`` (see ``serving.core``).
- Dynamic batching is MLServer's adaptive batching: ``batching.maxBatchSize`` →
  ``max_batch_size``, ``batching.maxLatencyMs`` → ``max_batch_time``; disabled when
  ``batching.enabled`` is false.
- ``GET /metrics`` on the same port: the ``forge_*`` series (``serving.telemetry``). MLServer's own
  metrics server is switched off; its gRPC server listens on a free port (Forge does not use it).
- Fault injection (``faultInjection``): added latency on every inference request, and HTTP 500
  for the fraction ``errorRate`` of them — for rollback drills.
- Once listening it prints ``{"event": "serving", "url": "http://HOST:PORT", ...}`` on stdout
  (``port: 0`` picks a free port, so that line is how a caller learns it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import time
from typing import Any

from runtimes._step import emit, in_workspace, parse_config, run_step
from runtimes.errors import StepFailed
from specs.stepconfig import ServeConfig

log = logging.getLogger("forge.serve")



def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", 0))
        return s.getsockname()[1]


class TelemetryMiddleware:
    """ASGI middleware: per-request metrics, fault injection and ``GET /metrics``."""

    def __init__(self, app: Any, telemetry: Any):
        self.app, self.telemetry = app, telemetry

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        tel = self.telemetry
        if path == "/metrics":
            body = tel.exposition()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", tel.content_type.encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        if not tel.is_inference(path):
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = [500]

        async def send_wrapper(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if tel.added_latency_s:
                await asyncio.sleep(tel.added_latency_s)
            if tel.inject_error():
                body = json.dumps({"error": "injected fault (faultInjection.errorRate)"}).encode()
                await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body})
                return
            await self.app(scope, receive, send_wrapper)
        finally:
            tel.observe_request(status[0], time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(ServeConfig, argv, "python -m runtimes serve")
    from runtimes.learn import torch_env

    torch_env()
    from mlserver import MLServer
    from mlserver.settings import ModelParameters, ModelSettings, Settings

    from runtimes.serving.telemetry import Telemetry

    model_dir = in_workspace(config.model_dir)
    if not (model_dir / "model.json").exists():
        raise StepFailed(f"no model to serve at {model_dir} (missing model.json)")
    from runtimes.serving import mlserver_model

    telemetry = Telemetry(config)
    mlserver_model.STATE["telemetry"] = telemetry
    port = config.port or free_port(config.host)
    settings = Settings(
        host=config.host,
        http_port=port,
        grpc_port=free_port(config.host),
        metrics_endpoint=None,
        parallel_workers=0,
        load_models_at_startup=False,
        debug=False,
    )
    batching = config.batching
    model_settings = ModelSettings(
        name=config.model,
        implementation="runtimes.serving.mlserver_model.ForgeModel",
        parameters=ModelParameters(uri=config.model_dir, version=config.version),
        max_batch_size=batching.max_batch_size if batching.enabled else 0,
        max_batch_time=batching.max_latency_ms / 1000.0 if batching.enabled else 0.0,
    )
    server = MLServer(settings)
    server._rest_server._app.add_middleware(TelemetryMiddleware, telemetry=telemetry)
    log.info("serving %s %s (variant %s, role %s) on %s:%d; batching %s", config.model, config.version, config.variant, config.role, config.host, port,
             f"up to {batching.max_batch_size} rows / {batching.max_latency_ms:g} ms" if batching.enabled else "off")

    async def announce() -> None:
        host = "127.0.0.1" if config.host in ("0.0.0.0", "") else config.host
        for _ in range(600):
            try:
                _, writer = await asyncio.open_connection(host, port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.1)
        while not mlserver_model.STATE.get("ready"):
            await asyncio.sleep(0.1)
        emit("serving", url=f"http://{host}:{port}", model=config.model, version=config.version, protocol="v2")

    async def serve() -> None:
        asyncio.get_running_loop().create_task(announce())
        await server.start([model_settings])

    asyncio.run(serve())
    if not mlserver_model.STATE.get("ready"):
        raise StepFailed(f"the model at {config.model_dir} failed to load: {mlserver_model.STATE.get('error', 'see the log above')}")
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
