"""The MLServer runtime class (imported by MLServer by its dotted path) over the serving core."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse

from runtimes._step import in_workspace
from runtimes.serving.core import ServingCore

#: Set by ``runtimes.serve`` before the server starts: the process's Telemetry; ``ready``/``error``.
STATE: dict[str, Any] = {}


class ForgeModel(MLModel):
    """Runs the Forge serving core; model calls go to one worker thread so the event loop keeps
    accepting (and adaptively batching) requests while the model computes."""

    async def load(self) -> bool:
        try:
            self._core = ServingCore(in_workspace(self.settings.parameters.uri))
        except Exception as exc:
            STATE["error"] = str(exc)
            raise
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forge-infer")
        self._telemetry = STATE["telemetry"]
        self.ready = True
        STATE["ready"] = True
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        if not payload.inputs:
            raise MLServerError("the request has no inputs", status_code=400)
        arr = NumpyCodec.decode_input(payload.inputs[0])
        self._telemetry.observe_batch(int(arr.shape[0]) if arr.ndim else 1)
        loop = asyncio.get_running_loop()
        try:
            outputs = await loop.run_in_executor(self._executor, self._core.predict, arr)
        except ValueError as exc:
            raise MLServerError(str(exc), status_code=400) from None
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output(name, value) for name, value in outputs.items()],
        )
