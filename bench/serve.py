"""bench/serve: dynamic batching vs batch size 1, end to end over HTTP (Open Inference v2).

    python bench/serve.py [--device cpu|cuda] [--models small,large] [--concurrency N] [--seconds S]
                          [--max-batch N] [--max-latency-ms MS] [--out FILE] [--budget-s S]

Each model is served by the real ``python -m runtimes serve`` twice on 127.0.0.1: once with
MLServer's adaptive batching, once without. A closed-loop load generator keeps ``--concurrency``
requests in flight (one row each) for ``--seconds`` per server (bounded in count and time,
loopback only), after a 2 s warm-up. Models (``runtimes.models:transformer_classifier``, weights
initialised, not trained — inference cost is what is measured):

- ``small``: 4 layers, width 256, 32 byte tokens, 2 classes (the CPU figure in the README);
- ``large``: 12 layers, width 768, 12 heads, 128 tokens (~85M parameters).

``--device cuda`` serves on the GPU (``FORGE_SERVE_DEVICE=cuda``; the default there: both models,
64 in flight, batches up to 64); on a machine without one it says so and exits 0. Defaults on the
CPU: the small model, 16 in flight, batches up to 16. A model whose run fails is recorded with
its error and the others go on; ``--budget-s`` skips what would overrun. Prints the figures,
then as its last line a JSON object: the first model's figures at the top level
(``{"concurrency", "throughput_ratio", "p99_ms_batched", "p99_ms_unbatched", "rps_batched",
"rps_unbatched", ...}``) and every model's under ``models``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from runtimes.benchsupport import ROOT, ensure_runtime_env  # noqa: E402

MAX_REQUESTS = 200_000
MODELS = {
    "small": {"layers": 4, "dModel": 256, "heads": 4, "seqLen": 32},
    "large": {"layers": 12, "dModel": 768, "heads": 12, "seqLen": 128},
}


def log(message: str) -> None:
    sys.stderr.write(f"[serve {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def build_model(ws: str, name: str, shape: dict[str, int]) -> int:
    import torch

    from runtimes.models import build_model as build, count_parameters, save_bundle

    torch.manual_seed(0)
    arch = {"type": "custom", "entrypoint": "runtimes.models:transformer_classifier",
            "options": {**shape, "vocabSize": 256}}
    info = {"model": f"bench-{name}", "version": "bench", "architecture": arch, "task": "classification", "inputKind": "tokens",
            "numClasses": 2, "classes": ["neg", "pos"], "transform": {}}
    model = build(arch, info).eval()
    save_bundle(Path(ws) / name, model, info)
    return count_parameters(model)


def start_server(ws: str, name: str, batching: dict, device: str, timeout: float = 180) -> tuple[subprocess.Popen, str, Path]:
    config = {"endpoint": "bench", "model": f"bench-{name}", "version": "bench", "modelDir": name, "host": "127.0.0.1", "port": 0, "batching": batching}
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, FORGE_WORKSPACE=ws, PYTHONPATH=pythonpath, FORGE_LOG_LEVEL="WARNING", FORGE_SERVE_DEVICE=device)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    errlog = Path(ws) / f"server-{name}-{'batched' if batching.get('enabled') else 'unbatched'}.log"
    proc = subprocess.Popen([sys.executable, "-m", "runtimes", "serve", "--config-json", json.dumps(config)],
                            stdout=subprocess.PIPE, stderr=errlog.open("w"), text=True, env=env, cwd=ROOT, start_new_session=True)
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line is None:
            break
        if '"serving"' in line:
            return proc, json.loads(line)["url"], errlog
    stop(proc)
    raise RuntimeError(f"server did not start (exit {proc.returncode}): {errlog.read_text()[-1500:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def load(url: str, model: str, concurrency: int, seconds: float, seq_len: int) -> dict:
    parsed = urlparse(url)
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    sent = [0]

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        bodies = [json.dumps({"inputs": [{"name": "tokens", "shape": [1, seq_len], "datatype": "INT64",
                                          "data": [rng.randrange(32, 127) for _ in range(seq_len)]}]}) for _ in range(8)]
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
        mine = []
        n = 0
        while time.monotonic() < deadline:
            with lock:
                if sent[0] >= MAX_REQUESTS:
                    break
                sent[0] += 1
            start = time.perf_counter()
            conn.request("POST", f"/v2/models/{model}/infer", bodies[n % len(bodies)], {"content-type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            n += 1
            if resp.status != 200:
                errors[0] += 1
            mine.append(time.perf_counter() - start)
        conn.close()
        with lock:
            latencies.extend(mine)

    worker_threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    t0 = time.perf_counter()
    for t in worker_threads:
        t.start()
    for t in worker_threads:
        t.join()
    elapsed = time.perf_counter() - t0
    latencies.sort()
    n = len(latencies)
    if n == 0:
        raise RuntimeError("no request completed")
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


def measure(ws: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    shape = MODELS[name]
    params = build_model(ws, name, shape)
    results: dict[str, Any] = {}
    for mode, batching in (("unbatched", {"enabled": False}),
                           ("batched", {"enabled": True, "maxBatchSize": args.max_batch, "maxLatencyMs": args.max_latency_ms})):
        proc, url, _ = start_server(ws, name, batching, args.device)
        try:
            load(url, f"bench-{name}", args.concurrency, 2.0, shape["seqLen"])  # warm-up (CUDA init, allocator, caches)
            results[mode] = load(url, f"bench-{name}", args.concurrency, args.seconds, shape["seqLen"])
            results[mode]["mean_batch"] = batch_histogram(url)
        finally:
            stop(proc)
        r = results[mode]
        log(f"{name} {mode:9}: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:6.1f} ms  p99 {r['p99_ms']:6.1f} ms  mean batch {r['mean_batch']:.2f}  "
            f"({r['requests']} requests, {r['errors']} errors)")
    b, u = results["batched"], results["unbatched"]
    return {
        "concurrency": args.concurrency,
        "throughput_ratio": round(b["rps"] / u["rps"], 3),
        "p99_ms_batched": round(b["p99_ms"], 1),
        "p99_ms_unbatched": round(u["p99_ms"], 1),
        "p50_ms_batched": round(b["p50_ms"], 1),
        "p50_ms_unbatched": round(u["p50_ms"], 1),
        "rps_batched": round(b["rps"], 1),
        "rps_unbatched": round(u["rps"], 1),
        "mean_batch_batched": round(b["mean_batch"], 2),
        "errors": b["errors"] + u["errors"],
        "max_batch": args.max_batch,
        "max_latency_ms": args.max_latency_ms,
        "parameters": params,
        "seq_len": shape["seqLen"],
        "layers": shape["layers"],
        "d_model": shape["dModel"],
    }


def main() -> None:
    ensure_runtime_env()
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--models", default=None, help="comma-separated: small, large (default: small on cpu, both on cuda)")
    parser.add_argument("--concurrency", type=int, default=None, help="requests in flight (default 16 on cpu, 64 on cuda)")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--max-batch", type=int, default=None, help="largest batch (default 16 on cpu, 64 on cuda)")
    parser.add_argument("--max-latency-ms", type=float, default=5.0)
    parser.add_argument("--out", help="also write the JSON object to this file")
    parser.add_argument("--budget-s", type=float, default=None, help="skip models that would end after this many seconds")
    args = parser.parse_args()
    gpu = args.device == "cuda"
    args.models = args.models or ("small,large" if gpu else "small")
    args.concurrency = args.concurrency or (64 if gpu else 16)
    args.max_batch = args.max_batch or (64 if gpu else 16)
    started = time.monotonic()

    import torch

    out: dict[str, Any] = {"bench": "serve", "device": args.device}
    if gpu and not torch.cuda.is_available():
        log("no CUDA device here: the GPU serving figures are skipped")
        out["skipped"] = "no CUDA device on this machine"
        emit(out, args.out)
        return
    if gpu:
        out["gpu_name"] = torch.cuda.get_device_name(0)
    ws = tempfile.mkdtemp(prefix="forge-bench-serve-")
    models: dict[str, Any] = {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        needs = 2 * (15 + 2 + args.seconds)  # two servers: start, warm-up, measure
        left = (args.budget_s - (time.monotonic() - started)) if args.budget_s else float("inf")
        if name not in MODELS:
            models[name] = {"error": f"unknown model {name!r}; expected one of {', '.join(MODELS)}"}
            continue
        if left < needs:
            log(f"{name}: skipped, {left:.0f} s left of the budget, needs about {needs:.0f} s")
            models[name] = {"skipped": f"time budget: {left:.0f} s left, needs ~{needs:.0f} s"}
            continue
        try:
            models[name] = measure(ws, name, args)
        except Exception as exc:  # noqa: BLE001 - fail soft: record it, measure the next model
            log(f"{name}: error {type(exc).__name__}: {exc}")
            models[name] = {"error": f"{type(exc).__name__}: {exc}"}
    first = next(iter(models.values()), {})
    out.update({k: v for k, v in first.items()})
    out["models"] = models
    out["elapsed_s"] = round(time.monotonic() - started, 1)
    emit(out, args.out)


def emit(result: dict[str, Any], path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
