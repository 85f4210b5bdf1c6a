"""``python -m runtimes serve``: a model server speaking the Open Inference (v2) protocol, on MLServer.

- ``POST /v2/models/<model>/infer`` with one input tensor (``FP32`` features ``[N, F]`` or
  ``INT64`` tokens ``[N, T]``); outputs ``probabilities`` and ``label`` (see ``serving.core``).
- Batching: with ``batching.p99TargetMs`` set, Forge's load-adaptive batcher
  (``serving.batcher``: no hold at low load, batches that fill at high load, holds bounded by
  ``maxLatencyMs`` and the budget); without it, MLServer's adaptive batching
  (``batching.maxBatchSize`` → ``max_batch_size``, ``batching.maxLatencyMs`` →
  ``max_batch_time``); with ``batching.enabled`` false, one request per model call.
- Backend: ``backend.select: fastest`` serves the registered variant of the version with the
  best measured throughput within ``backend.maxAccuracyDrop`` points of the base
  (``serving.select``); ``backend.threads`` intra-op threads (default: the CPUs the process may
  use). ``GET /forge/serving`` says what runs and why (JSON); so does the ``serving`` line.
- ``GET /metrics`` on the same port: the ``forge_*`` series (``serving.telemetry``). MLServer's own
  metrics server is switched off; its gRPC server listens on a free port (Forge does not use it).
- Fault injection (``faultInjection``): added latency on every inference request, and HTTP 500
  for the fraction ``errorRate`` of them — for rollback drills.
- Shadow (``mirror``): a copy of the requests answered 200 goes to the shadow's server after the
  answer was sent, and the two answers are compared (``serving.mirror``).
- Once listening it prints ``{"event": "serving", "url": "http://HOST:PORT", ...}`` on stdout
  (``port: 0`` picks a free port, so that line is how a caller learns it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

from runtimes._step import emit, in_workspace, parse_config, run_step
from runtimes.errors import StepFailed
from runtimes.ports import free_ports
from specs.stepconfig import ServeConfig

log = logging.getLogger("forge.serve")



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
        if path == "/forge/serving":
            from runtimes.serving.mlserver_model import STATE

            batcher = STATE.get("batcher")
            body = json.dumps({**tel.serving, **({"batcherState": batcher.describe()} if batcher else {})}).encode()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        if not tel.is_inference(path):
            return await self.app(scope, receive, send)
        return await self._inference(scope, receive, send)

    async def _inference(self, scope: dict, receive: Any, send: Any) -> None:
        """An inference request: the injected faults first (latency, then a 500 instead of the
        model), then the model; its status, latency and — for a 200 the model computed — where
        the time went are recorded. While it has not reached the batcher it is counted
        ``inbound`` (the batcher may hold a batch open for it)."""
        from runtimes.serving.mlserver_model import CURRENT, STATE

        tel = self.telemetry
        start = time.perf_counter()
        status = [500]
        timing: dict[str, Any] = {"start": start}
        batcher = STATE.get("batcher")
        if batcher is not None:  # accepted, not yet at the batcher: it may hold a batch for it
            timing["inbound"] = True
            batcher.inbound += 1
        token = CURRENT.set(timing)
        mirror = tel.mirror
        # With a mirror, the request's body and the answer are kept to copy and compare them.
        request_body: list[bytes] = []
        answer: list[bytes] = []

        async def receive_wrapper() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                request_body.append(message.get("body", b""))
            return message

        async def send_wrapper(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body" and mirror is not None:
                answer.append(message.get("body", b""))
            await send(message)

        try:
            faulty = tel.faulty()  # counted here: `afterRequests` delays the faults
            if faulty and tel.added_latency_s:
                await asyncio.sleep(tel.added_latency_s)
            if faulty and tel.inject_error():
                body = json.dumps({"error": "injected fault (faultInjection.errorRate)"}).encode()
                await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body})
                return
            await self.app(scope, receive_wrapper if mirror is not None else receive, send_wrapper)
            if mirror is not None and status[0] == 200:
                headers = dict(scope.get("headers") or ())
                query = (scope.get("query_string") or b"").decode("latin-1")
                path = scope.get("path", "") + (f"?{query}" if query else "")
                mirror.offer(path, b"".join(request_body), headers.get(b"content-type", b"").decode("latin-1"),
                             b"".join(answer))
        finally:
            if timing.pop("inbound", False) and batcher is not None:
                batcher.inbound -= 1
            end = time.perf_counter()
            tel.observe_request(status[0], end - start)
            if status[0] == 200 and "computed" in timing:
                tel.observe_phases(timing, end)
            CURRENT.reset(token)


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(ServeConfig, argv, "python -m runtimes serve")
    # Before torch loads OpenMP: its worker threads sleep between batches instead of spinning.
    # A spinning pool takes the CPUs the event loop needs to decode the next requests, and on a
    # shared node (other pods, other processes) a batch waits for threads that lost their core:
    # the small bench model at batch 1 on 2 busy cores took 218-611 ms spinning, 22-32 ms passive.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from runtimes.learn import torch_env

    torch_env()
    from mlserver import MLServer
    from mlserver.settings import ModelParameters, ModelSettings, Settings

    from runtimes.serving.telemetry import Telemetry

    served_dir, selection = resolve_variant(config)
    model_dir = in_workspace(served_dir)
    if not (model_dir / "model.json").exists():
        raise StepFailed(f"no model to serve at {model_dir} (missing model.json)")
    from runtimes.serving import mlserver_model
    from runtimes.serving.core import cpu_budget

    telemetry = Telemetry(config)
    batching = config.batching
    mode = "off" if not batching.enabled else "adaptive" if batching.p99_target_ms else "mlserver"
    threads = (config.backend.threads if config.backend and config.backend.threads else None) or cpu_budget()
    mlserver_model.STATE.update(
        telemetry=telemetry, threads=threads,
        batching={"mode": mode, "maxBatchSize": batching.max_batch_size, "maxWaitS": batching.max_latency_ms / 1000.0,
                  "p99TargetS": batching.p99_target_ms / 1000.0 if batching.p99_target_ms else None})
    picked = free_ports(config.host, 2)
    port = config.port or picked[0]
    settings = Settings(
        host=config.host,
        http_port=port,
        grpc_port=next(p for p in picked if p != port),  # a given port may be one the kernel picked
        metrics_endpoint=None,
        parallel_workers=0,
        load_models_at_startup=False,
        debug=False,
    )
    batching = config.batching
    model_settings = ModelSettings(
        name=config.model,
        implementation="runtimes.serving.mlserver_model.ForgeModel",
        parameters=ModelParameters(uri=served_dir, version=config.version),
        max_batch_size=batching.max_batch_size if mode == "mlserver" else 0,
        max_batch_time=batching.max_latency_ms / 1000.0 if mode == "mlserver" else 0.0,
    )
    # MLServer(settings) attaches its SIGTERM/SIGINT handlers (its graceful stop, which ends its
    # gRPC server too) to the current event loop: the loop that serves must be that one, or a
    # SIGTERM stops uvicorn only and the process waits on its gRPC server until it is killed.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server = MLServer(settings)
    server._rest_server._app.add_middleware(TelemetryMiddleware, telemetry=telemetry)
    batcher = {"off": "off", "mlserver": f"mlserver (up to {batching.max_batch_size} rows / {batching.max_latency_ms:g} ms)",
               "adaptive": f"adaptive (up to {batching.max_batch_size} rows, hold ≤ {batching.max_latency_ms:g} ms, "
                           f"p99 budget {batching.p99_target_ms:g} ms)" if batching.p99_target_ms else ""}[mode]
    log.info("serving %s %s (variant %s, role %s) on %s:%d; batching %s; %s", config.model, config.version, selection["variant"],
             config.role, config.host, port, batcher, selection["reason"])

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
        core = mlserver_model.STATE["core"]
        serving = {"model": config.model, "version": config.version, "role": config.role,
                   "variant": selection["variant"], "endpointVariant": config.variant, "select": selection["select"],
                   "reason": selection["reason"], "backend": core.backend, "kind": core.info.get("kind"),
                   "threads": core.threads, "batcher": mode, "modelDir": served_dir}
        telemetry.set_serving({**serving, "candidates": selection.get("candidates", [])})
        emit("serving", url=f"http://{host}:{port}", protocol="v2", **serving)

    async def serve() -> None:
        asyncio.get_running_loop().create_task(announce())
        await server.start([model_settings])

    try:
        loop.run_until_complete(serve())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    if not mlserver_model.STATE.get("ready"):
        raise StepFailed(f"the model at {config.model_dir} failed to load: {mlserver_model.STATE.get('error', 'see the log above')}")
    return 0


def resolve_variant(config: ServeConfig) -> tuple[str, dict[str, Any]]:
    """(workspace folder to serve, the selection): the config's folder, or with ``backend.select:
    fastest`` the fastest variant of the version within the accuracy bound (``serving.select``),
    from the registry record beside it (``registry/<model>/<version>/registry.json``)."""
    from pathlib import PurePosixPath

    from runtimes.serving.select import choose_variant

    backend = config.backend
    if backend is None or backend.select == "variant":
        return config.model_dir, {"variant": config.variant, "select": "variant", "reason": "the Endpoint's variant"}
    version_dir = PurePosixPath(config.model_dir).parent
    record_path = in_workspace(str(version_dir / "registry.json"))
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError) as exc:
        return config.model_dir, {"variant": config.variant, "select": "fastest",
                                  "reason": f"no registry record to choose by ({record_path}: {exc}): serving the Endpoint's variant"}
    batch = config.batching.max_batch_size if config.batching.enabled else 1
    choice = choose_variant(record, config.variant, backend.max_accuracy_drop, batch)
    folder = str(version_dir / choice["variant"])
    return folder, {**choice, "select": "fastest"}


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
