"""A load-adaptive batcher with a p99 budget (``batching.p99TargetMs``), in the server's event loop.

MLServer's adaptive batching holds every batch open for ``max_batch_time``, even a lone request
at low load, and forms batches whether or not the model is free, so at high load several small
batches queue behind the one computing. This batcher is work-conserving instead:

- one batch computes at a time (in one worker thread, so the event loop keeps decoding requests);
  everything that arrived while it computed is the next batch, up to ``max_batch_size`` rows — at
  high load batches fill by themselves, at low load a request that finds the model idle runs at once;
- a batch is **held** for more arrivals only when more are known to be coming: requests the server
  has accepted whose bodies are still being decoded (``inbound``, counted by the HTTP middleware),
  or an arrival rate (moving average of the gaps) fast enough that the next request is due before
  one batch's fixed cost would be saved — at most ``max_wait`` after the oldest queued request, and
  never past the budget left to it (``p99_target`` − its time so far − the measured compute time
  of the batch);
- the batch size itself is capped so that the measured compute time of a batch stays within half
  the budget (a ``maxBatchSize`` too large for the budget is not used whole).

Compute time per batch is learned online: a least-squares line ``a + k·rows`` over recent batches
(exponential forgetting). Each request's timing dict gets ``enqueued``, ``dispatched``, ``computed``
(``time.perf_counter()``) and ``batch`` (rows of its batch).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Forgetting factor of the compute-time fit (per batch).
DECAY = 0.95
#: Weight of the newest gap in the arrival-gap moving average (the arrival rate changes fast).
GAP_WEIGHT = 0.2


@dataclass
class _Pending:
    rows: np.ndarray
    timing: dict[str, Any]
    future: asyncio.Future
    started: float = field(default=0.0)


class ComputeModel:
    """Least-squares fit ``seconds ≈ a + k·rows`` of recent batches, exponentially forgotten."""

    def __init__(self) -> None:
        self.w = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def observe(self, rows: int, seconds: float) -> None:
        d = DECAY
        self.w, self.sx, self.sy = d * self.w + 1, d * self.sx + rows, d * self.sy + seconds
        self.sxx, self.sxy = d * self.sxx + rows * rows, d * self.sxy + rows * seconds

    def coefficients(self) -> tuple[float, float]:
        if self.w <= 0:
            return 0.0, 0.0
        mean_x, mean_y = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mean_x * mean_x
        if var <= 1e-9:  # one batch size seen so far: all of it counts as fixed cost
            return max(0.0, mean_y), 0.0
        k = (self.sxy / self.w - mean_x * mean_y) / var
        k = max(0.0, k)
        return max(0.0, mean_y - k * mean_x), k

    def predict(self, rows: int) -> float:
        a, k = self.coefficients()
        return a + k * rows


class AdaptiveBatcher:
    """See the module docstring. ``run`` takes the stacked rows and returns a dict of arrays with
    one row per input row; it runs in ``executor`` (one worker)."""

    def __init__(self, run: Callable[[np.ndarray], dict[str, np.ndarray]], executor: Executor, *, max_batch_size: int,
                 max_wait_s: float, p99_target_s: float | None, adaptive: bool = True) -> None:
        self.run, self.executor = run, executor
        self.max_batch_size = max(1, int(max_batch_size))
        self.max_wait_s = max(0.0, float(max_wait_s)) if adaptive else 0.0
        self.p99_target_s = p99_target_s
        self.queue: deque[_Pending] = deque()
        self.inbound = 0  # requests accepted by HTTP, not yet here (set by the middleware)
        self.compute = ComputeModel()
        self._gap: float | None = None
        self._last_arrival: float | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.holds = 0

    # -- what the middleware and the model call -----------------------------------------------
    async def submit(self, rows: np.ndarray, timing: dict[str, Any]) -> dict[str, np.ndarray]:
        now = time.perf_counter()
        timing["enqueued"] = now
        if self._last_arrival is not None:
            gap = now - self._last_arrival
            self._gap = gap if self._gap is None else (1 - GAP_WEIGHT) * self._gap + GAP_WEIGHT * gap
        self._last_arrival = now
        loop = asyncio.get_running_loop()
        item = _Pending(rows, timing, loop.create_future(), started=float(timing.get("start", now)))
        self.queue.append(item)
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._loop())
        return await item.future

    # -- the loop -------------------------------------------------------------------------------
    def effective_max(self) -> int:
        """``max_batch_size``, lowered so a batch's measured compute stays within half the budget."""
        if not self.p99_target_s:
            return self.max_batch_size
        a, k = self.compute.coefficients()
        if k <= 0:
            return self.max_batch_size
        fit = int((self.p99_target_s / 2 - a) / k)
        return max(1, min(self.max_batch_size, fit))

    def _rows(self) -> int:
        return sum(len(p.rows) for p in self.queue)

    def _hold_until(self, cap: int) -> float | None:
        """When to stop waiting for more rows (a ``perf_counter`` time), or None: dispatch now."""
        if not self.queue or self.max_wait_s <= 0 or self._rows() >= cap:
            return None
        oldest = self.queue[0]
        a, _ = self.compute.coefficients()
        coming = self.inbound > 0 or (self._gap is not None and self._gap < a)
        if not coming:
            return None
        deadline = oldest.timing["enqueued"] + self.max_wait_s
        if self.p99_target_s:
            deadline = min(deadline, oldest.started + self.p99_target_s - self.compute.predict(cap))
        return deadline if deadline > time.perf_counter() else None

    async def _loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self.queue:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=1.0)  # idle: end; the next request starts it again
                except TimeoutError:
                    if not self.queue:
                        return
                continue
            cap = self.effective_max()
            deadline = self._hold_until(cap)
            if deadline is not None:
                self.holds += 1
                while deadline is not None:
                    self._wake.clear()
                    # the next arrival, or the expected gap (1.5×) if nothing is known to be inbound
                    wait = deadline - time.perf_counter()
                    if self.inbound <= 0 and self._gap is not None:
                        wait = min(wait, 1.5 * self._gap)
                    if wait <= 0:
                        break
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=wait)
                    except TimeoutError:
                        break
                    deadline = self._hold_until(cap)
            batch = self._take(cap)
            rows = batch[0].rows if len(batch) == 1 else np.concatenate([p.rows for p in batch])
            dispatched = time.perf_counter()
            for p in batch:
                p.timing["dispatched"] = dispatched
                p.timing["batch"] = len(rows)
            try:
                outputs = await loop.run_in_executor(self.executor, self.run, rows)
            except Exception as exc:  # noqa: BLE001 - every request of the batch gets the error
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            computed = time.perf_counter()
            self.compute.observe(len(rows), computed - dispatched)
            start = 0
            for p in batch:
                n = len(p.rows)
                p.timing["computed"] = computed
                if not p.future.done():
                    p.future.set_result({name: value[start:start + n] for name, value in outputs.items()})
                start += n

    def _take(self, cap: int) -> list[_Pending]:
        """The oldest request and those after it with the same row shape and type, up to ``cap`` rows."""
        first = self.queue.popleft()
        batch, rows = [first], len(first.rows)
        shape, dtype = first.rows.shape[1:], first.rows.dtype
        kept: deque[_Pending] = deque()
        while self.queue and rows < cap:
            p = self.queue.popleft()
            if p.rows.shape[1:] == shape and p.rows.dtype == dtype and rows + len(p.rows) <= cap:
                batch.append(p)
                rows += len(p.rows)
            else:
                kept.append(p)
        kept.extend(self.queue)
        self.queue = kept
        return batch

    def describe(self) -> dict[str, Any]:
        a, k = self.compute.coefficients()
        return {"maxBatchSize": self.max_batch_size, "effectiveMaxBatchSize": self.effective_max(),
                "maxWaitMs": round(self.max_wait_s * 1000, 3),
                "p99TargetMs": round(self.p99_target_s * 1000, 3) if self.p99_target_s else None,
                "computeFixedMs": round(a * 1000, 3), "computePerRowMs": round(k * 1000, 4),
                "arrivalGapMs": round(self._gap * 1000, 3) if self._gap is not None else None, "holds": self.holds}
