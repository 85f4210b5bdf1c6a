"""``python -m runtimes benchmark``: measure every variant of a model version on this node.

For each variant (PyTorch bundles — fp32, pruned, torch.ao INT8 — and ONNX Runtime bundles —
``onnx``, ``onnx-int8``):

- **accuracy** (and the task's other metrics) on the whole held-out split, through the same loader
  the servers use, so every variant is scored by one code path;
- **latency and throughput** per batch size: each variant is called on a batch of held-out rows
  for ``seconds`` in total, in alternating rounds across all variants (a busy or throttled CPU
  then slows every variant alike instead of whichever ran last); p50/p99/mean of the per-call
  times, and throughput = rows answered per second of calls;
- **memory**: a child forked before any model is loaded (the runtimes already imported) loads the
  variant and runs the largest batch; the figure is its peak resident memory (``VmHWM``, reset
  at its start) above its resident memory at the start (``memoryBytes``), plus that peak itself
  (``peakRssBytes``).

Both runtimes use ``threads`` CPU threads (``torch.set_num_threads`` and ONNX Runtime's
``intra_op_num_threads``), inter-op parallelism off. The node's CPU, core count and the library
versions are recorded with the results (``hardware``): on a cluster the step runs on a node of
the hardware target's kind (arm64 for ARM and Jetson targets); a Jetson's GPU is measured by the
TensorRT engine build, not here. Writes ``output/benchmark.json`` and ``metrics.json``. A variant
its step rejected (:mod:`runtimes.verdicts`) is not measured; ``benchmark.json`` names it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtimes._step import in_workspace, parse_config, read_json, run_step, write_json
from runtimes.verdicts import split
from specs.compression import Benchmark
from specs.stepconfig import BenchmarkConfig

log = logging.getLogger("forge.benchmark")
ROUNDS = 5
PROBE_TIMEOUT = 300
ONNX_KINDS = ("onnx", "onnx-int8")


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux ≥ 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _loader(folder: Path, threads: int) -> tuple[Callable[[Any], Any], dict[str, Any], str]:
    """(callable on a torch tensor, bundle info, runtime name) of a variant folder."""
    info = read_json(folder / "model.json")
    if info.get("kind") in ONNX_KINDS:
        from runtimes.export import onnx_callable, onnx_session

        return onnx_callable(onnx_session(folder / info.get("file", "model.onnx"), threads)), info, "onnxruntime"
    from runtimes.models import load_bundle

    model, info = load_bundle(folder)
    return model, info, "pytorch"


def _batch(x: Any, size: int) -> Any:
    """``size`` held-out rows (repeated when the split is smaller)."""
    import torch

    if len(x) >= size:
        return x[:size].contiguous()
    reps = -(-size // len(x))
    return torch.cat([x] * reps)[:size].contiguous()


def _fast_call(fn: Callable[[Any], Any], runtime: str, batch: Any) -> Callable[[], Any]:
    """A no-argument call of one variant on one batch, without per-call conversions."""
    if runtime == "onnxruntime":
        array = batch.numpy()
        return lambda: fn(array)
    return lambda: fn(batch)


def probe(folder: Path, threads: int, batch: Any) -> dict[str, Any]:
    """Peak memory of loading one variant and running a batch, in a forked child of this process
    (which has imported its runtimes and loaded no model yet): the child's peak resident memory
    (VmHWM, reset at the start) above its resident memory at the start."""
    import torch

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, report on the pipe, leave without running any cleanup
        code = 0
        result: dict[str, Any]
        try:
            os.close(read_fd)
            baseline = _status_kb("VmRSS") or 0
            reset = _reset_peak()
            fn, _, runtime = _loader(folder, threads)
            call = _fast_call(fn, runtime, batch)
            with torch.inference_mode():
                for _ in range(3):
                    call()
            peak = _status_kb("VmHWM") or 0
            result = {"baselineRssBytes": baseline, "peakRssBytes": peak, "memoryBytes": max(0, peak - baseline), "peakReset": reset}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent as the probe's error
            result, code = {"error": f"memory probe failed: {type(exc).__name__}: {exc}"}, 1
        os.write(write_fd, json.dumps(result).encode())
        os._exit(code)
    os.close(write_fd)
    chunks = []
    deadline = time.monotonic() + PROBE_TIMEOUT
    timed_out = False
    while True:
        ready, _, _ = select.select([read_fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            break
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    if timed_out:
        return {"error": f"memory probe gave no answer in {PROBE_TIMEOUT} s"}
    try:
        return json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        return {"error": "memory probe failed: no result"}


def hardware(threads: int, target: str) -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "cpu model", "hardware")):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {"torch": torch.__version__}
    try:
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    note = None
    if target in ("jetson-orin", "nvidia-gpu"):
        note = f"CPU figures of this node; the {target} GPU is measured by the TensorRT engine build"
    elif (target == "arm64") != (platform.machine() in ("aarch64", "arm64")):
        note = f"measured on a {platform.machine()} node, not on the {target} target"
    return {"cpu": cpu, "machine": platform.machine(), "cores": os.cpu_count(), "threads": threads, "hardwareTarget": target,
            "versions": versions, **({"note": note} if note else {})}


def _percentile(sorted_times: list[float], q: float) -> float:
    return sorted_times[min(len(sorted_times) - 1, int(round(q * (len(sorted_times) - 1))))]


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(BenchmarkConfig, argv, "python -m runtimes benchmark")
    import torch

    from runtimes.data import load_prepared

    settings = config.settings
    threads = settings.threads
    torch.set_num_threads(threads)
    data_dir = in_workspace(config.data)
    prepared = load_prepared(data_dir, ("test",))
    # The variants a step rejected are not measured (the register step records why); a folder
    # with neither a bundle nor a verdict fails the step.
    folders, rejected = split({name: in_workspace(folder) for name, folder in sorted(config.variants.items())})
    for name, why in rejected.items():
        log.info("not measured: variant %s was rejected (%s)", name, why.reason)

    memory = _probe_memory(folders, prepared, threads, max(settings.batch_sizes))
    loaded, results, xs = _load_and_measure(folders, prepared, threads, memory, max(settings.batch_sizes))
    _time_batches(settings, loaded, xs, results)
    doc = {"model": config.model, "version": config.version, "hardware": hardware(threads, config.hardware_target),
           "settings": settings.model_dump(mode="json", by_alias=True), "rounds": ROUNDS,
           "measuredAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "variants": results,
           "rejected": sorted(rejected)}
    out = in_workspace(config.output)
    write_json(out / "benchmark.json", doc)
    first = str(settings.batch_sizes[0])
    write_json(out / "metrics.json", {name: {"accuracy": r.get("accuracy"), "p50Ms": r["batches"][first]["p50Ms"],
                                             "p99Ms": r["batches"][first]["p99Ms"]} for name, r in results.items()})
    return 0


def _probe_memory(folders: dict[str, Path], prepared: Any, threads: int, largest: int) -> dict[str, dict[str, Any]]:
    """Each variant's memory at the largest batch, probed one at a time in a child process
    before this process loads any model (so no variant's figure holds another's weights)."""
    from runtimes.learn import split_rows

    if any(read_json(f / "model.json").get("kind") in ONNX_KINDS for f in folders.values()):
        import onnxruntime  # noqa: F401 - before the probes fork: a runtime's import is not a variant's memory
    memory = {}
    for name, folder in folders.items():  # one at a time, before this process loads any model
        info = read_json(folder / "model.json")
        x, _ = split_rows(prepared, "test", info.get("architecture", {}).get("contextLength")).head(largest)
        memory[name] = probe(folder, threads, _batch(x, largest))
    log.info("memory: %s", ", ".join(f"{n} {m.get('memoryBytes', 0) / 2**20:.1f} MiB" for n, m in memory.items()))
    return memory


#: Each variant loaded as it is served: (its callable, its model.json, its runtime).
_Loaded = dict[str, tuple[Callable[[Any], Any], dict[str, Any], str]]


def _load_and_measure(folders: dict[str, Path], prepared: Any, threads: int, memory: dict[str, dict[str, Any]],
                      largest: int) -> tuple[_Loaded, dict[str, dict[str, Any]], dict[str, Any]]:
    """Load every variant as it is served and measure its accuracy on the test split (a sharded
    one streamed a batch at a time): (the loaded callables with their model.json and runtime, each
    variant's result so far — size, parameters, metrics, memory —, each variant's first ``largest``
    test inputs, which the timed batches are cut from)."""
    from runtimes.learn import measure_rows, split_rows

    loaded: _Loaded = {}
    results: dict[str, dict[str, Any]] = {}
    xs: dict[str, Any] = {}
    for name, folder in folders.items():
        fn, info, runtime = _loader(folder, threads)
        loaded[name] = (fn, info, runtime)
        ctx = info.get("architecture", {}).get("contextLength")
        test = split_rows(prepared, "test", ctx)
        xs[name] = test.head(largest)[0]
        weights = folder / info.get("file", "model.pt")
        metrics = measure_rows(fn, test, info["task"])
        results[name] = {"runtime": runtime, "kind": info["kind"], "sizeBytes": weights.stat().st_size,
                         "parameters": info.get("parameters"), **{k: v for k, v in metrics.items() if isinstance(v, float)},
                         **{k: v for k, v in memory[name].items() if k in ("memoryBytes", "peakRssBytes", "error")},
                         "batches": {}}
        log.info("%s (%s, %s): accuracy %s", name, runtime, info["kind"], metrics.get("accuracy"))
    return loaded, results, xs


def _time_batches(settings: Benchmark, loaded: _Loaded, xs: dict[str, Any], results: dict[str, dict[str, Any]]) -> None:
    """Latency and throughput at each batch size into ``results[name]["batches"]``: after a
    warm-up, ``ROUNDS`` rounds that alternate the variants (each for its share of
    ``settings.seconds``, at least 3 calls), so load from elsewhere falls on all of them alike."""
    import torch

    per_round = settings.seconds / ROUNDS
    with torch.inference_mode():
        for size in settings.batch_sizes:
            calls = {n: _fast_call(fn, runtime, _batch(xs[n], size)) for n, (fn, _, runtime) in loaded.items()}
            times: dict[str, list[float]] = {n: [] for n in calls}
            for call in calls.values():  # warm-up
                for _ in range(3):
                    call()
            for _ in range(ROUNDS):
                for name, call in calls.items():
                    deadline = time.perf_counter() + per_round
                    count = 0
                    while count < 3 or time.perf_counter() < deadline:
                        start = time.perf_counter()
                        call()
                        times[name].append(time.perf_counter() - start)
                        count += 1
            for name, samples in times.items():
                ordered = sorted(samples)
                total = sum(samples)
                results[name]["batches"][str(size)] = {
                    "p50Ms": round(1000 * _percentile(ordered, 0.5), 4), "p99Ms": round(1000 * _percentile(ordered, 0.99), 4),
                    "meanMs": round(1000 * total / len(samples), 4), "throughput": round(size * len(samples) / total, 1),
                    "calls": len(samples)}
            log.info("batch %d: %s", size, ", ".join(f"{n} p50 {results[n]['batches'][str(size)]['p50Ms']:.3f} ms"
                                                      for n in sorted(results)))


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
