"""The MLServer runtime class (imported by MLServer by its dotted path) over the serving core."""

from __future__ import annotations

import asyncio
import contextvars
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse

from runtimes._step import in_workspace
from runtimes.serving.batcher import AdaptiveBatcher
from runtimes.serving.core import ServingCore

#: Set by ``runtimes.serve`` before the server starts: the process's Telemetry (``telemetry``), how
#: to batch (``batching``: ``{"mode": "adaptive"|"off"|"mlserver", "maxBatchSize", "maxWaitS",
#: "p99TargetS"}``), ``threads``; set here: ``ready``/``error``, the ``core`` and the ``batcher``.
STATE: dict[str, Any] = {}
#: The timing marks of the request being handled (set by the HTTP middleware, same task).
CURRENT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("forge_request_timing", default=None)


class ForgeModel(MLModel):
    """Runs the Forge serving core; model calls go to one worker thread so the event loop keeps
    accepting (and batching) requests while the model computes. With ``batching.mode`` ``adaptive``
    (the Endpoint states ``p99TargetMs``) or ``off``, requests go through Forge's batcher
    (``runtimes.serving.batcher``; ``off`` is the same with batches of one and no hold); with
    ``mlserver``, MLServer's adaptive batching has already merged them."""

    async def load(self) -> bool:
        try:
            self._core = ServingCore(in_workspace(self.settings.parameters.uri), STATE.get("threads"))
        except Exception as exc:
            STATE["error"] = str(exc)
            raise
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forge-infer")
        self._telemetry = STATE["telemetry"]
        batching = STATE.get("batching") or {"mode": "mlserver"}
        self._batcher = None
        if batching["mode"] in ("adaptive", "off"):
            adaptive = batching["mode"] == "adaptive"
            telemetry, core = self._telemetry, self._core

            def run(rows: Any) -> Any:
                telemetry.observe_batch(len(rows))
                return core.predict_rows(rows)

            self._batcher = AdaptiveBatcher(run, self._executor, max_batch_size=batching["maxBatchSize"] if adaptive else 1,
                                            max_wait_s=batching.get("maxWaitS", 0.0), p99_target_s=batching.get("p99TargetS"),
                                            adaptive=adaptive)
        STATE["core"], STATE["batcher"] = self._core, self._batcher
        self.ready = True
        STATE["ready"] = True
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        if not payload.inputs:
            raise MLServerError("the request has no inputs", status_code=400)
        arr = NumpyCodec.decode_input(payload.inputs[0])
        try:
            rows = self._core.prepare(arr)
        except ValueError as exc:
            raise MLServerError(str(exc), status_code=400) from None
        try:
            if self._batcher is not None:
                timing = CURRENT.get()
                if timing is None:
                    timing = {"start": time.perf_counter()}
                elif timing.pop("inbound", False):
                    self._batcher.inbound -= 1
                outputs = await self._batcher.submit(rows, timing)
            else:
                self._telemetry.observe_batch(int(rows.shape[0]) if rows.ndim else 1)
                loop = asyncio.get_running_loop()
                outputs = await loop.run_in_executor(self._executor, self._core.predict_rows, rows)
        except ValueError as exc:
            raise MLServerError(str(exc), status_code=400) from None
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output(name, value) for name, value in outputs.items()],
        )
