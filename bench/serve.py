"""bench/serve: serving speed end to end over HTTP (Open Inference v2) — backends, batching, a load sweep.

    python bench/serve.py [--seconds S] [--reps R] [--inflight 1,4,16,64] [--budget-ms 150]
                          [--max-batch 16] [--max-latency-ms 5] [--threads N] [--device cpu|cuda]
                          [--models small[,large]] [--out FILE] [--budget-s S] [--quick]

What it does, for each model (``small``: ``runtimes.models:transformer_classifier``, 4 layers,
width 256, 32 byte tokens, 2 classes — the README's figure; ``large``: 12 layers, width 768, 128
tokens, ~85M parameters):

1. **A model with an accuracy to keep.** The classifier is trained (400 steps of 64 rows) on a
   synthetic task (is the majority of a row's bytes ≥ 79?), so "accuracy" means something; then
   the variants the registry offers are built by the product's own code: ``base`` (fp32
   PyTorch), ``int8`` (torch.ao dynamic INT8 of every Linear, the compress step's recipe for
   sequence models), ``base-onnx`` (``runtimes.export.export_onnx``) and ``base-onnx-int8``
   (``runtimes.export.quantize_int8``: ONNX Runtime static QDQ INT8).
2. **Backends in-process** (no HTTP): each variant's ``ServingCore`` (the server's own class) on
   batches of 1 and ``--max-batch`` rows, alternating rounds; accuracy on 2,048 held-out rows.
   This is also the model called directly, to compare with the HTTP path. The figures are
   written as the version's registry record (the ``benchmark`` step's format), so that:
3. **Servers**: the real ``python -m runtimes serve`` on 127.0.0.1: *batched* with ``backend.select:
   fastest`` (it picks the variant from that record, within 1 pt of the base's accuracy, at its
   batch size) and the load-adaptive batcher (``batching.p99TargetMs`` = ``--budget-ms``);
   *unbatched* (``batching.enabled: false``) serving the same variant, so the batching ratio
   compares one backend; plus, at 16 in flight only, the fp32 ``base`` batched the same way and
   the chosen variant under MLServer's own fixed-window batching.
4. **Sweep**: a closed-loop client keeps N requests in flight (one row each) for ``--seconds``
   per run; for each repetition and each N of ``--inflight``, batched and unbatched run one after
   the other, their order alternating between repetitions (interleaved, so a busier moment of a
   shared machine hits both). Per point: throughput, p50, p99 (median over repetitions and the
   spread, (max − min) / median), the batched/unbatched throughput ratio per repetition (median,
   spread), and the knee (the first N whose median p99 exceeds the budget). Each run also reads
   the servers' ``forge_request_phase_seconds`` (decode, queue, compute, encode; mean per request).

The client is a raw keep-alive HTTP/1.1 socket per in-flight slot (pre-encoded bodies, a minimal
response parser) in threads, so that the client costs the shared CPUs as little as possible.
Prints the tables, then as its last line a JSON object: the first model's medians and spreads at
the top level and every model's under ``models``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.cli import emit  # noqa: E402
from bench.runtime_env import ROOT, ensure_runtime_env  # noqa: E402
from devkit.common import stop_group  # noqa: E402

MAX_REQUESTS = 500_000
MODELS = {
    "small": {"layers": 4, "dModel": 256, "heads": 4, "seqLen": 32},
    "large": {"layers": 12, "dModel": 768, "heads": 12, "seqLen": 128},
}
VARIANTS = ("base", "int8", "base-onnx", "base-onnx-int8")
ACCURACY_BOUND_PT = 1.0


def log(message: str) -> None:
    sys.stderr.write(f"[serve {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


# -- the model and its variants --------------------------------------------------------------------
def synthetic(n: int, seq_len: int, seed: int) -> tuple[Any, Any]:
    """Rows of printable bytes and their labels (1 when most bytes are ≥ 79)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.integers(32, 127, size=(n, seq_len), dtype=np.int64)
    y = ((x >= 79).sum(axis=1) * 2 > seq_len).astype(np.int64)
    return x, y


def build_variants(ws: Path, name: str, shape: dict[str, int], train_steps: int, train_seconds: float) -> dict[str, Any]:
    import numpy as np
    import torch

    from runtimes.export import _bundle, export_onnx, quantize_int8
    from runtimes.models import build_model as build
    from runtimes.models import count_parameters, save_bundle

    torch.manual_seed(0)
    arch = {"type": "custom", "entrypoint": "runtimes.models:transformer_classifier", "options": {**shape, "vocabSize": 256}}
    info = {"model": f"bench-{name}", "version": "bench", "architecture": arch, "task": "classification", "inputKind": "tokens",
            "numClasses": 2, "classes": ["low", "high"], "transform": {}}
    model = build(arch, info)
    x, y = synthetic(20_000, shape["seqLen"], seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    started, steps = time.monotonic(), 0
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    while steps < train_steps and time.monotonic() - started < train_seconds:
        idx = torch.randint(0, len(xt), (64,))
        loss = torch.nn.functional.cross_entropy(model(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    model.eval()
    version = ws / "registry" / f"bench-{name}" / "bench"
    save_bundle(version / "base", model, {**info, "variant": "base"})
    from torch.ao import quantization as tq

    torch.backends.quantized.engine = "x86" if "x86" in torch.backends.quantized.supported_engines else torch.backends.quantized.engine
    q = tq.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    save_bundle(version / "int8", q, {**info, "variant": "int8", "quantization": {"recipe": "dynamic", "engine": torch.backends.quantized.engine,
                                                                                     "backend": "torch-ao"}}, kind="int8")
    example = torch.from_numpy(x[:2])
    built = {"base": True, "int8": True}
    try:
        export_onnx(model, example, version / "base-onnx" / "model.onnx", 18)
        _bundle(version / "base-onnx", {**info, "format": "forge-model/v1"}, "onnx", {"variant": "base-onnx", "source": "base"})
        built["base-onnx"] = True
        calibration = x[:256]
        work = ws / "onnx-work"
        work.mkdir(exist_ok=True)
        quantize_int8(version / "base-onnx" / "model.onnx", version / "base-onnx-int8" / "model.onnx", calibration, "x86-avx2", work)
        _bundle(version / "base-onnx-int8", {**info, "format": "forge-model/v1"}, "onnx-int8", {"variant": "base-onnx-int8", "source": "base"})
        built["base-onnx-int8"] = True
    except Exception as exc:  # noqa: BLE001 - recorded; the torch backends are still measured
        log(f"{name}: ONNX export/quantization failed: {type(exc).__name__}: {exc}")
    return {"version_dir": version, "parameters": count_parameters(model), "train_steps": steps, "built": [v for v in VARIANTS if built.get(v)],
            "info": info, "np": np}


def measure_backends(version: Path, variants: list[str], shape: dict[str, int], max_batch: int, threads: int, seconds: float) -> dict[str, Any]:
    """Each variant's ServingCore in this process: accuracy, and batch-1 / batch-N latency and
    throughput in alternating rounds."""
    from runtimes.serving.core import ServingCore

    xh, yh = synthetic(2048, shape["seqLen"], seed=2)
    cores = {v: ServingCore(version / v, threads) for v in variants}
    out: dict[str, Any] = {}
    for v, core in cores.items():
        labels = core.predict_rows(xh)["label"]
        out[v] = {"runtime": core.backend, "kind": core.info["kind"], "accuracy": round(float((labels == yh).mean()), 4), "times": {}}
    batches = [1, max_batch]
    rounds = 5
    for _ in range(rounds):
        for b in batches:
            rows = xh[:b].copy()
            for v, core in cores.items():
                core.predict_rows(rows)  # warm
                t_end = time.perf_counter() + seconds / (rounds * len(batches))
                times = out[v]["times"].setdefault(str(b), [])
                while time.perf_counter() < t_end:
                    t0 = time.perf_counter()
                    core.predict_rows(rows)
                    times.append(time.perf_counter() - t0)
    for v in variants:
        figures = {}
        for b, times in out[v].pop("times").items():
            times.sort()
            figures[b] = {"p50Ms": round(1000 * times[len(times) // 2], 4), "p99Ms": round(1000 * times[int(len(times) * 0.99)], 4),
                          "throughput": round(int(b) * len(times) / sum(times), 1), "calls": len(times)}
        out[v]["batches"] = figures
    return out


def write_record(version: Path, model: str, backends: dict[str, Any]) -> None:
    """The version's registry record, in the register step's format (benchmark figures per variant)."""
    variants = {v: {"path": str(version / v), "kind": f["kind"],
                    "benchmark": {"runtime": f["runtime"], "kind": f["kind"], "accuracy": f["accuracy"], "batches": f["batches"]}}
                for v, f in backends.items()}
    (version / "registry.json").write_text(json.dumps({"model": model, "version": "bench", "variants": variants}, indent=2))


# -- servers ------------------------------------------------------------------------------------
def start_server(ws: Path, name: str, tag: str, variant: str, batching: dict, backend: dict | None, device: str,
                 timeout: float = 180) -> tuple[subprocess.Popen, str, dict]:
    config = {"endpoint": "bench", "model": f"bench-{name}", "version": "bench", "variant": variant,
              "modelDir": f"registry/bench-{name}/bench/{variant}", "host": "127.0.0.1", "port": 0, "batching": batching,
              **({"backend": backend} if backend else {})}
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, FORGE_WORKSPACE=str(ws), PYTHONPATH=pythonpath, FORGE_LOG_LEVEL="WARNING", FORGE_SERVE_DEVICE=device)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    errlog = ws / f"server-{name}-{tag}.log"
    proc = subprocess.Popen([sys.executable, "-m", "runtimes", "serve", "--config-json", json.dumps(config)],
                            stdout=subprocess.PIPE, stderr=errlog.open("w"), text=True, env=env, cwd=ROOT, start_new_session=True)
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
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
            event = json.loads(line)
            return proc, event["url"], event
    stop_group(proc)
    raise RuntimeError(f"server {tag} did not start (exit {proc.returncode}): {errlog.read_text()[-1500:]}")


# -- the client -----------------------------------------------------------------------------------
class Conn:
    """One keep-alive HTTP/1.1 connection: send pre-encoded requests, read status and body."""

    def __init__(self, host: str, port: int):
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def roundtrip(self, request: bytes) -> int:
        self.sock.sendall(request)
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            rest += chunk
        self.buf = rest[length:]
        return status

    def close(self) -> None:
        self.sock.close()


def requests_for(host: str, port: int, model: str, seq_len: int, seed: int, n: int = 16) -> list[bytes]:
    x, _ = synthetic(n, seq_len, seed)
    out = []
    for row in x:
        body = json.dumps({"inputs": [{"name": "tokens", "shape": [1, seq_len], "datatype": "INT64", "data": [int(v) for v in row]}]}).encode()
        out.append(f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return out


def load(url: str, model: str, inflight: int, seconds: float, seq_len: int) -> dict[str, Any]:
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", int(parsed.port or 80)
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    sent = [0]
    start_gate = threading.Barrier(inflight + 1)
    deadline = [0.0]

    def worker(seed: int) -> None:
        bodies = requests_for(host, port, model, seq_len, seed)
        conn = Conn(host, port)
        mine: list[float] = []
        n = 0
        start_gate.wait()
        try:
            while time.perf_counter() < deadline[0]:
                with lock:
                    if sent[0] >= MAX_REQUESTS:
                        break
                    sent[0] += 1
                t0 = time.perf_counter()
                status = conn.roundtrip(bodies[n % len(bodies)])
                mine.append(time.perf_counter() - t0)
                n += 1
                if status != 200:
                    errors[0] += 1
        finally:
            conn.close()
            with lock:
                latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(1000 + i,)) for i in range(inflight)]
    for t in threads:
        t.start()
    deadline[0] = time.perf_counter() + seconds
    t0 = time.perf_counter()
    start_gate.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    latencies.sort()
    n = len(latencies)
    if n == 0:
        raise RuntimeError("no request completed")
    return {"requests": n, "errors": errors[0], "rps": n / elapsed, "p50_ms": 1000 * latencies[n // 2],
            "p99_ms": 1000 * latencies[min(n - 1, int(n * 0.99))]}


def scrape(url: str) -> dict[str, float]:
    """``forge_request_phase_seconds`` sums and counts, and ``forge_batch_size`` sum and count."""
    parsed = urlparse(url)
    conn = Conn(parsed.hostname or "127.0.0.1", int(parsed.port or 80))
    try:
        sock = conn.sock
        sock.sendall(f"GET /metrics HTTP/1.1\r\nHost: {parsed.netloc}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        conn.close()
    text = data.partition(b"\r\n\r\n")[2].decode(errors="replace")
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("forge_request_phase_seconds_sum") or line.startswith("forge_request_phase_seconds_count"):
            phase = line.split('phase="', 1)[1].split('"', 1)[0]
            kind = "sum" if "_sum" in line.split("{", 1)[0] else "count"
            out[f"{phase}_{kind}"] = float(line.split()[-1])
        elif line.startswith("forge_batch_size_sum"):
            out["batch_sum"] = float(line.split()[-1])
        elif line.startswith("forge_batch_size_count"):
            out["batch_count"] = float(line.split()[-1])
    return out


def measured_run(url: str, model: str, inflight: int, seconds: float, seq_len: int) -> dict[str, Any]:
    before = scrape(url)
    result = load(url, model, inflight, seconds, seq_len)
    after = scrape(url)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    phases = {}
    for phase in ("decode", "queue", "compute", "encode"):
        count = delta.get(f"{phase}_count", 0.0)
        if count:
            phases[phase] = round(1000 * delta[f"{phase}_sum"] / count, 3)
    result["phases_ms"] = phases
    result["mean_batch"] = round(delta["batch_sum"] / delta["batch_count"], 2) if delta.get("batch_count") else None
    return result


# -- statistics -----------------------------------------------------------------------------------
def summary(values: list[float]) -> dict[str, float]:
    med = statistics.median(values)
    return {"median": round(med, 3), "spread": round((max(values) - min(values)) / med, 4) if med else 0.0,
            "min": round(min(values), 3), "max": round(max(values), 3)}


def measure(ws: Path, name: str, args: argparse.Namespace) -> dict[str, Any]:
    shape = MODELS[name]
    model = f"bench-{name}"
    log(f"{name}: training ({args.train_steps} steps, at most {args.train_seconds:g} s) and building the variants")
    built = build_variants(ws, name, shape, args.train_steps, args.train_seconds)
    version = built["version_dir"]
    log(f"{name}: {built['parameters']:,} parameters, {built['train_steps']} training steps; variants {', '.join(built['built'])}")
    backends = measure_backends(version, built["built"], shape, args.max_batch, args.threads, args.backend_seconds)
    write_record(version, model, backends)
    base_acc = backends["base"]["accuracy"]
    for v, f in backends.items():
        b1, bn = f["batches"]["1"], f["batches"][str(args.max_batch)]
        log(f"  in-process {v:15} {f['runtime']:12} accuracy {f['accuracy']:.4f} ({100 * (f['accuracy'] - base_acc):+.2f} pt)  "
            f"batch 1: p50 {b1['p50Ms']:.3f} ms {b1['throughput']:8.0f}/s   batch {args.max_batch}: p50 {bn['p50Ms']:.3f} ms {bn['throughput']:8.0f}/s")
    within = {v: f for v, f in backends.items() if 100 * (base_acc - f["accuracy"]) <= ACCURACY_BOUND_PT}
    best_fast = max((v for v in within if v != "base"), key=lambda v: within[v]["batches"][str(args.max_batch)]["throughput"], default=None)
    backend_ratio = (round(within[best_fast]["batches"][str(args.max_batch)]["throughput"] / backends["base"]["batches"][str(args.max_batch)]["throughput"], 3)
                     if best_fast else None)

    budget = args.budget_ms
    batched_cfg = {"enabled": True, "maxBatchSize": args.max_batch, "maxLatencyMs": args.max_latency_ms, "p99TargetMs": budget}
    select = {"select": "fastest", "maxAccuracyDrop": ACCURACY_BOUND_PT, **({"threads": args.threads} if args.threads else {})}
    servers: dict[str, tuple[subprocess.Popen, str, dict]] = {}
    results: dict[str, Any] = {"backends": backends, "parameters": built["parameters"], "seq_len": shape["seqLen"], "layers": shape["layers"],
                               "d_model": shape["dModel"], "train_steps": built["train_steps"], "budget_ms": budget, "max_batch": args.max_batch,
                               "max_latency_ms": args.max_latency_ms, "in_process_fastest_vs_fp32": backend_ratio,
                               "in_process_fastest": best_fast, "accuracy_bound_pt": ACCURACY_BOUND_PT}
    pinned = {k: v for k, v in select.items() if k != "select"}  # select: variant (the default)
    try:
        for tag, batching in (("batched", batched_cfg), ("unbatched", {"enabled": False}), ("fp32-batched", batched_cfg),
                              ("mlserver-window", {k: v for k, v in batched_cfg.items() if k != "p99TargetMs"})):
            if args.quick and tag in ("fp32-batched", "mlserver-window"):
                continue
            # The batched server chooses (select: fastest, at its batch size); the others serve the
            # same variant — so the batching ratios compare one backend — but fp32-batched, the base.
            variant, backend = ("base", select) if tag == "batched" else ("base" if tag == "fp32-batched" else results["served_variant"], pinned)
            servers[tag] = start_server(ws, name, tag, variant, batching, backend, args.device)
            if tag == "batched":
                results["served_variant"] = servers[tag][2].get("variant")
            ev = servers[tag][2]
            log(f"  server {tag:15} serves {ev.get('variant')} ({ev.get('backend')}, {ev.get('threads')} threads, batcher {ev.get('batcher')}): {ev.get('reason')}")
        results["served_backend"] = servers["batched"][2].get("backend")
        results["selection_reason"] = servers["batched"][2].get("reason")
        results["threads"] = servers["batched"][2].get("threads")
        for _, url, _ in servers.values():  # warm-up: allocator, caches, the compute-time fit
            load(url, model, 16, 1.5, shape["seqLen"])
        runs: dict[str, dict[int, list[dict]]] = {}
        for rep in range(args.reps):
            for n in args.inflight:
                order = ["batched", "unbatched"] if (rep + n) % 2 == 0 else ["unbatched", "batched"]
                if n == 16:
                    order += [t for t in ("fp32-batched", "mlserver-window") if t in servers]
                for tag in order:
                    r = measured_run(servers[tag][1], model, n, args.seconds, shape["seqLen"])
                    runs.setdefault(tag, {}).setdefault(n, []).append(r)
                    log(f"  rep {rep + 1} {n:3} in flight {tag:15} {r['rps']:7.1f} req/s  p50 {r['p50_ms']:6.1f}  p99 {r['p99_ms']:6.1f} ms  "
                        f"batch {r['mean_batch']}  phases {r['phases_ms']}  errors {r['errors']}")
    finally:
        for proc, _, _ in servers.values():
            stop_group(proc)

    sweep: dict[str, Any] = {}
    for tag, by_n in runs.items():
        sweep[tag] = {}
        for n, rs in sorted(by_n.items()):
            sweep[tag][str(n)] = {"rps": summary([r["rps"] for r in rs]), "p50_ms": summary([r["p50_ms"] for r in rs]),
                                  "p99_ms": summary([r["p99_ms"] for r in rs]),
                                  "mean_batch": statistics.median([r["mean_batch"] or 0 for r in rs]),
                                  "errors": sum(r["errors"] for r in rs),
                                  "phases_ms": {p: round(statistics.median([r["phases_ms"].get(p, 0.0) for r in rs]), 3)
                                                for p in ("decode", "queue", "compute", "encode") if any(p in r["phases_ms"] for r in rs)}}
    ratios = {}
    for n in args.inflight:
        per_rep = [b["rps"] / u["rps"] for b, u in zip(runs["batched"][n], runs["unbatched"][n])]
        ratios[str(n)] = summary(per_rep)
        ratios[str(n)]["per_rep"] = [round(x, 3) for x in per_rep]
    knee = {tag: next((n for n in args.inflight if sweep[tag][str(n)]["p99_ms"]["median"] > budget), None) for tag in ("batched", "unbatched")}
    results.update(sweep=sweep, throughput_ratios=ratios, knee=knee)
    top = "16" if "16" in ratios else str(args.inflight[-1])  # what bench/device-run.sh summarises
    results.update(throughput_ratio=ratios[top]["median"], p99_ms_batched=sweep["batched"][top]["p99_ms"]["median"], headline_inflight=int(top))
    if "fp32-batched" in runs and 16 in args.inflight:
        per_rep = [b["rps"] / f["rps"] for b, f in zip(runs["batched"][16], runs["fp32-batched"][16])]
        results["served_fastest_vs_fp32_at_16"] = summary(per_rep)
    if "mlserver-window" in runs and 16 in args.inflight:
        per_rep = [b["rps"] / m["rps"] for b, m in zip(runs["batched"][16], runs["mlserver-window"][16])]
        results["adaptive_vs_mlserver_window_at_16"] = summary(per_rep)
    # in-process vs HTTP at 1 in flight (unbatched): the framework's share of a request
    direct = backends.get(results["served_variant"] or "base", backends["base"])["batches"]["1"]["p50Ms"]
    if 1 in args.inflight:
        http = sweep["unbatched"]["1"]["p50_ms"]["median"]
        results["framework_overhead_at_1"] = {"direct_p50_ms": direct, "http_p50_ms": http, "overhead_ms": round(http - direct, 3),
                                              "phases_ms": sweep["unbatched"]["1"]["phases_ms"]}
        results["batching_adds_p50_ms_at_1"] = round(sweep["batched"]["1"]["p50_ms"]["median"] - http, 3)
    print_tables(name, results, args)
    return results


def print_tables(name: str, r: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\n== {name}: serving {r.get('served_variant')} ({r.get('served_backend')}, {r.get('threads')} threads); "
          f"budget p99 {r['budget_ms']:g} ms; {args.reps} repetitions × {args.seconds:g} s per point; medians (spread)")
    print(f"{'in flight':>9} | {'batched req/s':>18} {'p50 ms':>8} {'p99 ms':>15} {'batch':>5} | {'unbatched req/s':>18} {'p50 ms':>8} {'p99 ms':>15} | {'ratio':>14}")
    for n in args.inflight:
        b, u, q = r["sweep"]["batched"][str(n)], r["sweep"]["unbatched"][str(n)], r["throughput_ratios"][str(n)]
        print(f"{n:>9} | {b['rps']['median']:>9.1f} ({100 * b['rps']['spread']:4.1f} %) {b['p50_ms']['median']:>8.1f} "
              f"{b['p99_ms']['median']:>7.1f} ({100 * b['p99_ms']['spread']:3.0f} %) {b['mean_batch']:>5.1f} | "
              f"{u['rps']['median']:>9.1f} ({100 * u['rps']['spread']:4.1f} %) {u['p50_ms']['median']:>8.1f} "
              f"{u['p99_ms']['median']:>7.1f} ({100 * u['p99_ms']['spread']:3.0f} %) | {q['median']:>6.2f}× ({100 * q['spread']:4.1f} %)")
    print(f"knee (first in-flight count whose median p99 > {r['budget_ms']:g} ms): batched {r['knee']['batched']}, unbatched {r['knee']['unbatched']}")
    for n in args.inflight:
        for tag in ("batched", "unbatched"):
            print(f"  phases at {n:>2} in flight, {tag:9}: {r['sweep'][tag][str(n)]['phases_ms']} (ms, mean per request)")
    if "framework_overhead_at_1" in r:
        f = r["framework_overhead_at_1"]
        print(f"model called directly: p50 {f['direct_p50_ms']:.3f} ms; through MLServer over HTTP at 1 in flight: p50 {f['http_p50_ms']:.2f} ms "
              f"(+{f['overhead_ms']:.2f} ms); batching adds {r['batching_adds_p50_ms_at_1']:+.2f} ms to p50 at 1 in flight")
    if r.get("in_process_fastest_vs_fp32") is not None:
        print(f"in-process at batch {r['max_batch']}: {r['in_process_fastest']} {r['in_process_fastest_vs_fp32']:.2f}× fp32 PyTorch (within {r['accuracy_bound_pt']:g} pt)")
    for key, label in (("served_fastest_vs_fp32_at_16", "served at 16 in flight, batched: chosen variant vs fp32 PyTorch"),
                       ("adaptive_vs_mlserver_window_at_16", "served at 16 in flight: adaptive batcher vs MLServer's window")):
        if key in r:
            print(f"{label}: {r[key]['median']:.2f}× (spread {100 * r[key]['spread']:.1f} %)")


def main() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: as the server runs the model (runtimes/serve.py)
    ensure_runtime_env()
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--models", default=None, help="comma-separated: small, large (default: small on cpu, both on cuda)")
    parser.add_argument("--inflight", default="1,4,16,64", help="requests in flight per sweep point")
    parser.add_argument("--concurrency", type=int, default=None, help="one sweep point only (same as --inflight N)")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per run")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of the sweep (interleaved)")
    parser.add_argument("--budget-ms", type=float, default=150.0, help="the p99 budget (batching.p99TargetMs)")
    parser.add_argument("--max-batch", type=int, default=None, help="largest batch (default 16 on cpu, 64 on cuda)")
    parser.add_argument("--max-latency-ms", type=float, default=5.0, help="longest hold (batching.maxLatencyMs)")
    parser.add_argument("--threads", type=int, default=None, help="model threads (backend.threads; default: the server's own choice)")
    parser.add_argument("--train-steps", type=int, default=400, help="training steps of the bench model (batch 64)")
    parser.add_argument("--train-seconds", type=float, default=120.0, help="at most this long")
    parser.add_argument("--backend-seconds", type=float, default=4.0, help="in-process measuring time per variant")
    parser.add_argument("--quick", action="store_true", help="no fp32/MLServer-window comparison servers")
    parser.add_argument("--out", help="also write the JSON object to this file")
    parser.add_argument("--budget-s", type=float, default=None, help="skip models that would end after this many seconds")
    args = parser.parse_args()
    gpu = args.device == "cuda"
    args.models = args.models or ("small,large" if gpu else "small")
    args.max_batch = args.max_batch or (64 if gpu else 16)
    args.inflight = [args.concurrency] if args.concurrency else [int(x) for x in args.inflight.split(",") if x.strip()]
    started = time.monotonic()

    import torch

    out: dict[str, Any] = {"bench": "serve", "device": args.device, "load_before": os.getloadavg()[0], "cpus": os.cpu_count()}
    if gpu and not torch.cuda.is_available():
        log("no CUDA device here: the GPU serving figures are skipped")
        out["skipped"] = "no CUDA device on this machine"
        emit(out, args.out)
        return
    if gpu:
        out["gpu_name"] = torch.cuda.get_device_name(0)
    ws = Path(tempfile.mkdtemp(prefix="forge-bench-serve-"))
    models: dict[str, Any] = {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        runs = len(args.inflight) * 2 + (0 if args.quick else 2)
        needs = args.train_seconds + 30 + args.reps * runs * (args.seconds + 0.5)
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
    out["load_after"] = os.getloadavg()[0]
    first = next(iter(models.values()), {})
    out.update(headline(first))
    out["models"] = models
    out["elapsed_s"] = round(time.monotonic() - started, 1)
    emit(out, args.out)


def headline(r: dict[str, Any]) -> dict[str, Any]:
    """The first model's figures the README quotes (medians and spreads)."""
    if "sweep" not in r:
        return {k: v for k, v in r.items() if k in ("error", "skipped")}
    out: dict[str, Any] = {"served_variant": r.get("served_variant"), "served_backend": r.get("served_backend"), "budget_ms": r["budget_ms"],
                           "knee": r["knee"], "in_process_fastest_vs_fp32": r.get("in_process_fastest_vs_fp32")}
    if "16" in r["throughput_ratios"]:
        b = r["sweep"]["batched"]["16"]
        out.update(throughput_ratio_16=r["throughput_ratios"]["16"]["median"], throughput_ratio_16_spread=r["throughput_ratios"]["16"]["spread"],
                   rps_batched_16=b["rps"]["median"], rps_batched_16_spread=b["rps"]["spread"], p99_ms_batched_16=b["p99_ms"]["median"],
                   rps_unbatched_16=r["sweep"]["unbatched"]["16"]["rps"]["median"], p99_ms_unbatched_16=r["sweep"]["unbatched"]["16"]["p99_ms"]["median"])
    if "batching_adds_p50_ms_at_1" in r:
        out["batching_adds_p50_ms_at_1"] = r["batching_adds_p50_ms_at_1"]
    for key in ("served_fastest_vs_fp32_at_16", "adaptive_vs_mlserver_window_at_16"):
        if key in r:
            out[key] = r[key]["median"]
    return out


if __name__ == "__main__":
    main()
