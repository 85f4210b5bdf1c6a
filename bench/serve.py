"""bench/serve: dynamic batching vs batch size 1, end to end over HTTP (Open Inference v2).

    python bench/serve.py [--concurrency 16] [--seconds 15] [--max-batch 16] [--max-latency-ms 5]

A small transformer classifier (``runtimes.models:transformer_classifier``: 4 layers, width 256,
32 byte tokens, 2 classes; weights initialised, not trained — inference cost is what is measured)
is served by the real ``python -m runtimes serve`` twice on 127.0.0.1: once with MLServer's
adaptive batching, once without. A closed-loop load generator keeps ``--concurrency`` requests in
flight (one row each) for ``--seconds`` per server (bounded in count and time, loopback only).
Prints the figures, then as its last line:
``{"concurrency", "throughput_ratio", "p99_ms_batched", "p99_ms_unbatched", "rps_batched", "rps_unbatched", ...}``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from urllib.parse import urlparse

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from runtimes.benchsupport import ROOT, ensure_runtime_env  # noqa: E402

MAX_REQUESTS = 200_000


def build_model(ws: str, seq_len: int) -> None:
    import torch

    from runtimes.models import build_model as build, save_bundle

    torch.manual_seed(0)
    arch = {"type": "custom", "entrypoint": "runtimes.models:transformer_classifier",
            "options": {"layers": 4, "dModel": 256, "heads": 4, "seqLen": seq_len, "vocabSize": 256}}
    info = {"model": "tiny-encoder", "version": "bench", "architecture": arch, "task": "classification", "inputKind": "tokens",
            "numClasses": 2, "classes": ["neg", "pos"], "transform": {}}
    model = build(arch, info).eval()
    from pathlib import Path

    save_bundle(Path(ws) / "model", model, info)


def start_server(ws: str, batching: dict) -> tuple[subprocess.Popen, str]:
    config = {"endpoint": "bench", "model": "tiny-encoder", "version": "bench", "modelDir": "model", "host": "127.0.0.1", "port": 0, "batching": batching}
    env = dict(os.environ, FORGE_WORKSPACE=ws, PYTHONPATH=str(ROOT), FORGE_LOG_LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "runtimes", "serve", "--config-json", json.dumps(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    for line in proc.stdout:
        if '"serving"' in line:
            return proc, json.loads(line)["url"]
    raise SystemExit("server did not start")


def load(url: str, concurrency: int, seconds: float, seq_len: int) -> dict:
    parsed = urlparse(url)
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    sent = [0]

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
        mine = []
        while time.monotonic() < deadline:
            with lock:
                if sent[0] >= MAX_REQUESTS:
                    break
                sent[0] += 1
            body = json.dumps({"inputs": [{"name": "tokens", "shape": [1, seq_len], "datatype": "INT64",
                                           "data": [rng.randrange(32, 127) for _ in range(seq_len)]}]})
            start = time.perf_counter()
            conn.request("POST", "/v2/models/tiny-encoder/infer", body, {"content-type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                errors[0] += 1
            mine.append(time.perf_counter() - start)
        conn.close()
        with lock:
            latencies.extend(mine)

    # warm-up
    worker_threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    t0 = time.perf_counter()
    for t in worker_threads:
        t.start()
    for t in worker_threads:
        t.join()
    elapsed = time.perf_counter() - t0
    latencies.sort()
    n = len(latencies)
    return {"requests": n, "errors": errors[0], "rps": n / elapsed, "p50_ms": 1000 * latencies[n // 2], "p99_ms": 1000 * latencies[min(n - 1, int(n * 0.99))]}


def batch_histogram(url: str) -> float:
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("forge_batch_size_sum"):
            total = float(line.split()[-1])
        elif line.startswith("forge_batch_size_count"):
            count = float(line.split()[-1])
    return total / count if count else 0.0


def main() -> None:
    ensure_runtime_env()
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--max-latency-ms", type=float, default=5.0)
    parser.add_argument("--seq-len", type=int, default=32)
    args = parser.parse_args()
    ws = tempfile.mkdtemp(prefix="forge-bench-serve-")
    build_model(ws, args.seq_len)
    results = {}
    for name, batching in (("unbatched", {"enabled": False}), ("batched", {"enabled": True, "maxBatchSize": args.max_batch, "maxLatencyMs": args.max_latency_ms})):
        proc, url = start_server(ws, batching)
        try:
            load(url, args.concurrency, 2.0, args.seq_len)  # warm-up
            results[name] = load(url, args.concurrency, args.seconds, args.seq_len)
            results[name]["mean_batch"] = batch_histogram(url)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        r = results[name]
        print(f"{name:9}: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:6.1f} ms  p99 {r['p99_ms']:6.1f} ms  mean batch {r['mean_batch']:.2f}  "
              f"({r['requests']} requests, {r['errors']} errors)", file=sys.stderr)
    b, u = results["batched"], results["unbatched"]
    print(json.dumps({
        "concurrency": args.concurrency,
        "throughput_ratio": round(b["rps"] / u["rps"], 3),
        "p99_ms_batched": round(b["p99_ms"], 1),
        "p99_ms_unbatched": round(u["p99_ms"], 1),
        "rps_batched": round(b["rps"], 1),
        "rps_unbatched": round(u["rps"], 1),
        "mean_batch_batched": round(b["mean_batch"], 2),
        "errors": b["errors"] + u["errors"],
        "device": "cuda" if __import__("torch").cuda.is_available() else "cpu",
    }))


if __name__ == "__main__":
    main()
