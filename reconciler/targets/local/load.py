"""A bounded traffic generator for local endpoints (``forgectl load ENDPOINT``): Open Inference (v2)
requests with a digits-shaped input (one row of 64 features, values 0..16) at a fixed rate, so the
rollout gates have data in a demo.

Bounded on purpose: only to a loopback address, at most :data:`MAX_RATE` requests per second, at
most :data:`MAX_SECONDS` seconds and :data:`MAX_CONCURRENCY` connections; it stops early when
``stop`` is set. Requests are scheduled open-loop (request *i* at ``start + i/rate``); a worker
that falls behind sends at once, so with slow answers the rate is capped by ``concurrency``.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import threading
import time
import urllib.parse
from collections import Counter
from typing import Any

MAX_RATE = 1000.0
MAX_SECONDS = 3600.0
MAX_CONCURRENCY = 64
LOOPBACK = ("127.0.0.1", "localhost", "::1")

# Two digits of the test split (8x8 images, raw 0..16 values): a 0 and a 1.
_ZERO = [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0, 0, 8, 8, 0,
         0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0, 0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0]
_ONE = [0, 0, 0, 12, 13, 5, 0, 0, 0, 0, 0, 11, 16, 9, 0, 0, 0, 0, 3, 15, 16, 6, 0, 0, 0, 7, 15, 16, 16, 2, 0, 0,
        0, 0, 1, 16, 16, 3, 0, 0, 0, 0, 1, 16, 16, 6, 0, 0, 0, 0, 1, 16, 16, 6, 0, 0, 0, 0, 0, 11, 16, 10, 0, 0]


class LoadError(ValueError):
    """Arguments the generator refuses (a message for the user)."""


def digits_request(rng: random.Random) -> dict[str, Any]:
    """One v2 inference request: a known digit with a little noise, clipped to 0..16."""
    base = _ZERO if rng.random() < 0.5 else _ONE
    data = [float(min(16.0, max(0.0, v + rng.uniform(-1.0, 1.0)))) for v in base]
    return {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": data}]}


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


def generate(url: str, model: str, *, rate: float = 20.0, seconds: float = 30.0, concurrency: int = 4,
             timeout: float = 10.0, stop: threading.Event | None = None, seed: int | None = None) -> dict[str, Any]:
    """Send about ``rate * seconds`` inference requests to ``url``/v2/models/``model``/infer.

    Returns ``{"requests", "ok", "failed", "by_status": {"200": n, "500": n, "error:<Exc>": n},
    "by_version": {version: n}, "latency_ms": {"p50", "p90", "p99", "max"}, "seconds", "rate"}``.
    ``by_version`` counts the answers' ``model_version`` (how the router split the traffic)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in LOOPBACK:
        raise LoadError(f"load goes only to a local endpoint (http://127.0.0.1:PORT), not {url!r}")
    if not 0 < rate <= MAX_RATE:
        raise LoadError(f"rate must be in (0, {MAX_RATE:g}] requests per second, not {rate:g}")
    if not 0 < seconds <= MAX_SECONDS:
        raise LoadError(f"seconds must be in (0, {MAX_SECONDS:g}], not {seconds:g}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise LoadError(f"concurrency must be 1..{MAX_CONCURRENCY}, not {concurrency}")
    host, port = parts.hostname, parts.port or 80
    path = f"{parts.path.rstrip('/')}/v2/models/{urllib.parse.quote(model, safe='')}/infer"
    total = max(1, int(rate * seconds))
    stop = stop or threading.Event()
    lock = threading.Lock()
    next_index = [0]
    statuses: Counter[str] = Counter()
    versions: Counter[str] = Counter()
    latencies: list[float] = []
    start = time.monotonic()
    deadline = start + seconds + timeout

    def worker(worker_seed: int) -> None:
        rng = random.Random(worker_seed)
        conn: http.client.HTTPConnection | None = None
        while not stop.is_set():
            with lock:
                i = next_index[0]
                if i >= total:
                    break
                next_index[0] += 1
            due = start + i / rate
            while not stop.is_set() and time.monotonic() < due:
                stop.wait(min(0.05, max(0.0, due - time.monotonic())))
            if stop.is_set() or time.monotonic() > deadline:
                break
            body = json.dumps(digits_request(rng)).encode()
            t0 = time.perf_counter()
            key, version = "", None
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, port, timeout=timeout)
                conn.request("POST", path, body=body, headers={"content-type": "application/json"})
                resp = conn.getresponse()
                payload = resp.read()
                key = str(resp.status)
                if resp.status == 200:
                    with_version = json.loads(payload)
                    version = with_version.get("model_version") if isinstance(with_version, dict) else None
                if resp.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException, ValueError) as exc:
                key = f"error:{type(exc).__name__}"
                if conn is not None:
                    conn.close()
                conn = None
            elapsed = time.perf_counter() - t0
            with lock:
                statuses[key] += 1
                if version:
                    versions[str(version)] += 1
                latencies.append(elapsed)
        if conn is not None:
            conn.close()

    base_seed = seed if seed is not None else random.randrange(1 << 30)
    threads = [threading.Thread(target=worker, args=(base_seed + n,), daemon=True, name=f"forge-load-{n}")
               for n in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    ordered = sorted(latencies)
    requests = sum(statuses.values())
    ok = sum(n for k, n in statuses.items() if k.startswith("2"))
    return {
        "url": url,
        "model": model,
        "requests": requests,
        "ok": ok,
        "failed": requests - ok,
        "by_status": dict(sorted(statuses.items())),
        "by_version": dict(sorted(versions.items())),
        "latency_ms": {name: (round(v * 1000, 2) if v is not None else None)
                       for name, v in (("p50", _percentile(ordered, 0.5)), ("p90", _percentile(ordered, 0.9)),
                                       ("p99", _percentile(ordered, 0.99)), ("max", ordered[-1] if ordered else None))},
        "seconds": round(elapsed, 3),
        "rate": round(requests / elapsed, 2) if elapsed > 0 else 0.0,
    }
