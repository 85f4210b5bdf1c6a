"""``python -m runtimes serve-seldon``: the same model behind the seldon-core 1.17.1 Python wrapper
(Seldon v1 protocol), for Seldon Core v1 deployments. Runs in its own environment/image
(``forge-serve-seldon``: seldon-core pins old Flask, jsonschema<4, protobuf<4, numpy<2).

- ``POST /api/v1.0/predictions`` (also ``/predict``) with ``{"data": {"ndarray": [[...], ...]}}``;
  the answer's ``data.ndarray`` holds the class probabilities, ``data.names`` the class names.
- ``GET /metrics``: the same ``forge_*`` series as the v2 server (``serving.telemetry``).
- Fault injection as in the v2 server. The Seldon v1 wrapper has no dynamic batching: each
  request is one model call (``batching`` is ignored, and the log says so).
- The Flask app is the wrapper's own (``seldon_core.wrapper.get_rest_microservice``), served by a
  threaded WSGI server on ``host:port``; prints ``{"event": "serving", "url": …}`` when listening.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import numpy as np

from runtimes._step import emit, in_workspace, parse_config, run_step
from runtimes.errors import StepFailed
from specs.stepconfig import ServeConfig

log = logging.getLogger("forge.serve-seldon")


class ForgeSeldonModel:
    """A seldon-core user model over the Forge serving core."""

    def __init__(self, core: Any, telemetry: Any):
        self.core, self.telemetry = core, telemetry

    def class_names(self) -> list[str]:
        return list(self.core.classes)

    def predict(self, X: Any, features_names: Any = None, meta: Any = None) -> np.ndarray:
        arr = np.asarray(X)
        self.telemetry.observe_batch(int(arr.shape[0]) if arr.ndim else 1)
        out = self.core.predict(arr)
        return next(iter(out.values())) if "probabilities" not in out else out["probabilities"]

    def init_metadata(self) -> dict[str, Any]:
        return {"name": self.core.info.get("model", "model"), "versions": [str(self.core.info.get("version", ""))], "platform": "forge"}


def build_app(config: ServeConfig) -> Any:
    from flask import Response, g, jsonify, request
    from seldon_core.metrics import SeldonMetrics
    from seldon_core.wrapper import get_rest_microservice

    from runtimes.serving.core import ServingCore
    from runtimes.serving.telemetry import Telemetry

    model_dir = in_workspace(config.model_dir)
    if not (model_dir / "model.json").exists():
        raise StepFailed(f"no model to serve at {model_dir} (missing model.json)")
    telemetry = Telemetry(config)
    user_model = ForgeSeldonModel(ServingCore(model_dir), telemetry)
    app = get_rest_microservice(user_model, SeldonMetrics())

    @app.route("/metrics", methods=["GET"])
    def forge_metrics() -> Any:
        return Response(telemetry.exposition(), mimetype=telemetry.content_type.split(";")[0])

    @app.before_request
    def before() -> Any:
        if not telemetry.is_inference(request.path):
            return None
        g.forge_start = time.perf_counter()
        faulty = telemetry.faulty()  # counted here: `afterRequests` delays the faults
        if faulty and telemetry.added_latency_s:
            time.sleep(telemetry.added_latency_s)
        if faulty and telemetry.inject_error():
            response = jsonify({"status": {"code": 500, "info": "injected fault (faultInjection.errorRate)", "status": "FAILURE"}})
            response.status_code = 500
            return response
        return None

    @app.after_request
    def after(response: Any) -> Any:
        start = getattr(g, "forge_start", None)
        if start is not None:
            telemetry.observe_request(response.status_code, time.perf_counter() - start)
        return response

    return app


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(ServeConfig, argv, "python -m runtimes serve-seldon")
    if config.mirror is not None:
        # The copies and their comparison are the v2 server's (runtimes/serving/mirror.py).
        raise StepFailed("`mirror` is served by `python -m runtimes serve` (the v2 protocol), not by the Seldon v1 wrapper")
    from werkzeug.serving import make_server

    app = build_app(config)
    if config.batching.enabled:
        log.info("batching: the Seldon v1 wrapper has no dynamic batching; each request is one model call")
    server = make_server(config.host, config.port, app, threaded=True)
    host = "127.0.0.1" if config.host in ("0.0.0.0", "") else config.host
    log.info("serving %s %s (variant %s, role %s) on %s:%d, Seldon v1 protocol", config.model, config.version, config.variant, config.role, config.host, server.server_port)
    emit("serving", url=f"http://{host}:{server.server_port}", model=config.model, version=config.version, protocol="seldon")
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
