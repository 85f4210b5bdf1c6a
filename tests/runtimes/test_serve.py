"""Both serving paths answer real requests over HTTP on 127.0.0.1, with forge_* metrics and
fault injection; the load-adaptive batcher and the choice of the fastest registered variant."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import threading

import pytest

from devkit.runtime_steps import Runner
from runtimes.ports import free_ports
from runtimes.serving.select import choose_variant
from tests.runtimes.helpers import ROOT, get_text, post_json

pytestmark = pytest.mark.runtime

# Two digits of the test split (an 8x8 image each, raw 0..16 values): a 0 and a 1.
ZERO = [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0, 0, 8, 8, 0,
        0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0, 0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0]
ONE = [0, 0, 0, 12, 13, 5, 0, 0, 0, 0, 0, 11, 16, 9, 0, 0, 0, 0, 3, 15, 16, 6, 0, 0, 0, 7, 15, 16, 16, 2, 0, 0,
       0, 0, 1, 16, 16, 3, 0, 0, 0, 0, 1, 16, 16, 6, 0, 0, 0, 0, 1, 16, 16, 6, 0, 0, 0, 0, 0, 11, 16, 10, 0, 0]


def _serve_config(model_dir: str, **extra: object) -> dict:
    return {"endpoint": "digits", "namespace": "ml", "model": "digits-mlp", "version": "v1", "variant": "base", "role": "canary",
            "modelDir": model_dir, "host": "127.0.0.1", "port": 0, **extra}


def _count(metrics: str, code: str) -> float:
    match = re.search(r'forge_requests_total\{([^}]*code="' + code + r'"[^}]*)\} ([0-9.e+]+)', metrics)
    return float(match.group(2)) if match else 0.0


def test_the_http_and_grpc_ports_are_picked_together_and_differ() -> None:
    # picked one after the other, a port closed before the next bind could be handed out twice
    ports = free_ports("0.0.0.0", 64)
    assert len(set(ports)) == 64 and all(p > 0 for p in ports)


def test_mlserver_v2_answers_and_exposes_forge_metrics(digits: Runner, server_factory) -> None:
    server = server_factory(digits, "serve", _serve_config("models/base", batching={"enabled": True, "maxBatchSize": 8, "maxLatencyMs": 2}))
    status, body = post_json(f"{server.url}/v2/models/digits-mlp/infer",
                             {"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32", "data": ZERO + ONE}]})
    assert status == 200, body
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["label"]["data"] == [0, 1]
    assert outputs["probabilities"]["shape"] == [2, 10]
    bad, _ = post_json(f"{server.url}/v2/models/digits-mlp/infer", {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]})
    assert bad == 400
    metrics = get_text(f"{server.url}/metrics")
    labels = 'forge_endpoint="digits",forge_namespace="ml",forge_role="canary",forge_variant="base",forge_version="v1"'
    assert f'forge_requests_total{{code="200",{labels}}} 1.0' in metrics
    assert f'forge_requests_total{{code="500",{labels}}} 0.0' in metrics  # there from the start: error rate 0, not no data
    assert _count(metrics, "400") == 1.0
    assert "forge_request_duration_seconds_bucket" in metrics and "forge_batch_size_bucket" in metrics


def test_mlserver_fault_injection_answers_500_and_counts_it(digits: Runner, server_factory) -> None:
    server = server_factory(digits, "serve", _serve_config("models/base", faultInjection={"errorRate": 1.0, "addedLatencyMs": 20}))
    status, _ = post_json(f"{server.url}/v2/models/digits-mlp/infer", {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": ZERO}]})
    assert status == 500
    metrics = get_text(f"{server.url}/metrics")
    assert _count(metrics, "500") == 1.0
    assert re.search(r'forge_request_duration_seconds_bucket\{[^}]*le="0.01"[^}]*\} 0.0', metrics)  # ≥ 20 ms added


def test_seldon_wrapper_answers_and_exposes_forge_metrics(digits: Runner, seldon_python: str, server_factory) -> None:
    seldon = Runner(seldon_python, digits.workspace)
    server = server_factory(seldon, "serve-seldon", _serve_config("models/base"))
    status, body = post_json(f"{server.url}/api/v1.0/predictions", {"data": {"ndarray": [ZERO, ONE]}})
    assert status == 200, body
    probs = body["data"]["ndarray"]
    assert [max(range(10), key=row.__getitem__) for row in probs] == [0, 1]
    assert body["data"]["names"] == [str(i) for i in range(10)]
    metrics = get_text(f"{server.url}/metrics")
    assert _count(metrics, "200") == 1.0 and 'forge_role="canary"' in metrics


def test_seldon_wrapper_fault_injection(digits: Runner, seldon_python: str, server_factory) -> None:
    seldon = Runner(seldon_python, digits.workspace)
    server = server_factory(seldon, "serve-seldon", _serve_config("models/base", faultInjection={"errorRate": 1.0}))
    status, _ = post_json(f"{server.url}/api/v1.0/predictions", {"data": {"ndarray": [ZERO]}})
    assert status == 500
    assert _count(get_text(f"{server.url}/metrics"), "500") == 1.0


# -- the fastest variant within the accuracy bound --------------------------------------------------
def _record(**variants: tuple[str, float | None, dict[str, float]]) -> dict:
    return {"variants": {name.replace("_", "-"): {"kind": kind, "benchmark": {"accuracy": acc, "runtime": "x",
                                                                            "batches": {b: {"throughput": t} for b, t in tp.items()}}}
                         for name, (kind, acc, tp) in variants.items()}}


def test_choose_variant_takes_the_fastest_within_the_bound_at_the_served_batch_size() -> None:
    record = _record(base=("state_dict", 0.97, {"1": 100, "64": 1000}), int8=("int8", 0.965, {"1": 90, "64": 3000}),
                     base_onnx=("onnx", 0.97, {"1": 400, "64": 2000}), pruned=("state_dict", 0.95, {"1": 900, "64": 9000}),
                     engine=("tensorrt", 0.97, {"1": 99999, "64": 99999}))
    at_16 = choose_variant(record, "base", 1.0, 16)  # 16 is nearer 64 than 1 on a log scale
    assert at_16["variant"] == "int8" and "3,000 rows/s at batch 64" in at_16["reason"] and "3.00× the base" in at_16["reason"]
    assert choose_variant(record, "base", 1.0, 1)["variant"] == "base-onnx"  # without batching, batch-1 figures
    excluded = {r["variant"]: r.get("excluded", "") for r in at_16["candidates"]}
    assert "loses 2.00 pt" in excluded["pruned"] and "not servable" in excluded["engine"] and not excluded["int8"]
    assert choose_variant(record, "base", 0.4, 16)["variant"] == "base-onnx"  # int8's 0.5 pt is over a 0.4 pt bound
    assert choose_variant(record, "base", 5.0, 16)["variant"] == "pruned"


def test_choose_variant_falls_back_to_the_endpoints_variant_without_figures() -> None:
    unmeasured = {"variants": {"base": {"kind": "state_dict"}, "int8": {"kind": "int8"}}}
    choice = choose_variant(unmeasured, "int8", 1.0, 16)
    assert choice["variant"] == "int8" and "serving the Endpoint's variant 'int8'" in choice["reason"]
    no_base = _record(int8=("int8", 0.9, {"1": 10}))
    assert choose_variant(no_base, "int8", 1.0, 1)["variant"] == "int8"  # no base accuracy to compare with


# -- the load-adaptive batcher, in the runtime environment ---------------------------------------
BATCHER_SCRIPT = textwrap.dedent("""
    import asyncio, json, time
    from concurrent.futures import ThreadPoolExecutor
    import numpy as np
    from runtimes.serving.batcher import AdaptiveBatcher

    def run(rows):
        # a model: 100 ms a batch + 10 ms a row (long beside the few ms a loaded machine adds to a sleep)
        time.sleep(0.1 + 0.01 * len(rows))
        return {"double": rows * 2}

    async def main():
        batcher = AdaptiveBatcher(run, ThreadPoolExecutor(1), max_batch_size=8, max_wait_s=0.05, p99_target_s=0.5)
        low = []
        for i in range(6):  # low load: one request every 100 ms
            timing = {"start": time.perf_counter()}
            out = await batcher.submit(np.array([[i]]), timing)
            assert out["double"].tolist() == [[2 * i]]
            low.append(timing["batch"])
            await asyncio.sleep(0.1)
        holds_low = batcher.holds
        timings = [{"start": time.perf_counter()} for _ in range(20)]  # a burst: 20 at once
        outs = await asyncio.gather(*(batcher.submit(np.array([[i]]), t) for i, t in enumerate(timings)))
        assert [o["double"].tolist() for o in outs] == [[[2 * i]] for i in range(20)]
        burst = sorted({(t["dispatched"], t["batch"]) for t in timings})
        # a budget the fitted compute time does not allow whole batches of 8 within
        tight = AdaptiveBatcher(run, ThreadPoolExecutor(1), max_batch_size=64, max_wait_s=0.025, p99_target_s=0.5)
        for n in (1, 4, 8, 1, 4, 8):
            await asyncio.gather(*(tight.submit(np.array([[0]]), {"start": time.perf_counter()}) for _ in range(n)))
        print(json.dumps({"low": low, "holds_low": holds_low, "burst": [b for _, b in burst],
                          "tight_max": tight.effective_max(), "state": batcher.describe()}))

    asyncio.run(main())
""")


def test_adaptive_batcher_holds_nothing_at_low_load_and_fills_batches_in_a_burst(runtime_python: str) -> None:
    proc = subprocess.run([runtime_python, "-c", BATCHER_SCRIPT], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["low"] == [1] * 6 and result["holds_low"] == 0  # every lone request ran at once
    assert result["burst"] == [8, 8, 4]  # the burst runs as full batches of maxBatchSize
    # 10 ms a row, 100 ms a batch: within half of a 500 ms budget (250 - 100) / 10 = 15 rows fit, not 64
    assert 8 <= result["tight_max"] <= 16, result
    assert result["state"]["computePerRowMs"] == pytest.approx(10.0, abs=5.0)


def test_adaptive_batching_server_exports_where_the_time_goes(digits: Runner, server_factory) -> None:
    batching = {"enabled": True, "maxBatchSize": 8, "maxLatencyMs": 5, "p99TargetMs": 100}
    server = server_factory(digits, "serve", _serve_config("models/base", batching=batching))
    url = f"{server.url}/v2/models/digits-mlp/infer"
    for _ in range(3):  # one at a time: never held, batches of one request
        status, body = post_json(url, {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": ONE}]})
        assert status == 200 and body["outputs"][1]["data"] == [1]
    answers: list[int] = []

    def client() -> None:
        for _ in range(5):
            status, body = post_json(url, {"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32", "data": ZERO + ONE}]})
            answers.append(status)
            assert {o["name"]: o for o in body["outputs"]}["label"]["data"] == [0, 1]  # each gets its own rows back

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [200] * 40
    metrics = get_text(f"{server.url}/metrics")
    for phase in ("decode", "queue", "compute", "encode"):
        assert re.search(r'forge_request_phase_seconds_count\{[^}]*phase="' + phase + r'"[^}]*\} 43.0', metrics), phase
    assert re.search(r'forge_serving_info\{[^}]*backend="pytorch"[^}]*batcher="adaptive"[^}]*\} 1.0', metrics)
    serving = json.loads(get_text(f"{server.url}/forge/serving"))
    assert serving["batcher"] == "adaptive" and serving["variant"] == "base" and serving["batcherState"]["p99TargetMs"] == 100


@pytest.fixture(scope="module")
def registered(digits: Runner) -> Runner:
    """The digits MLP exported to ONNX, benchmarked and registered as version v9, as a Workflow does."""
    digits.run("export", {"step": "export", "model": "digits-mlp", "source": "base", "modelDir": "models/base", "data": "data/digits",
                          "hardwareTarget": "x86-avx2", "maxAbsDiff": 1e-4, "maxAccuracyDrop": 1.0, "output": "exports/serve"}, timeout=600)
    variants = {"base": "models/base", "base-onnx": "exports/serve/onnx"}
    digits.run("benchmark", {"step": "benchmark", "model": "digits-mlp", "version": "v9", "variants": variants, "data": "data/digits",
                             "hardwareTarget": "x86-avx2", "settings": {"batchSizes": [1, 16], "seconds": 0.2, "threads": 1},
                             "output": "bench-serve"}, timeout=600)
    digits.run("register", {"step": "register", "model": "digits-mlp", "version": "v9", "variants": variants,
                            "output": "registry/digits-mlp/v9", "benchmark": "bench-serve"})
    return digits


def test_an_endpoint_naming_an_onnx_export_serves_it_on_onnx_runtime(registered: Runner, server_factory) -> None:
    """`variant: base-onnx`: the folder the renderer names for it (registry/<model>/<version>/<variant>)
    holds the export step's graph, which the server runs on ONNX Runtime under the Endpoint's labels."""
    config = _serve_config("registry/digits-mlp/v9/base-onnx", version="v9", variant="base-onnx",
                           batching={"enabled": True, "maxBatchSize": 8, "maxLatencyMs": 2})
    server = server_factory(registered, "serve", config)
    serving = json.loads(get_text(f"{server.url}/forge/serving"))
    assert (serving["variant"], serving["backend"], serving["kind"]) == ("base-onnx", "onnxruntime", "onnx"), serving
    status, body = post_json(f"{server.url}/v2/models/digits-mlp/infer",
                             {"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32", "data": ZERO + ONE}]})
    assert status == 200 and {o["name"]: o for o in body["outputs"]}["label"]["data"] == [0, 1], body
    metrics = get_text(f"{server.url}/metrics")
    assert re.search(r'forge_serving_info\{[^}]*backend="onnxruntime"[^}]*\} 1.0', metrics)
    assert 'forge_requests_total{code="200",forge_endpoint="digits",forge_namespace="ml",forge_role="canary",' \
           'forge_variant="base-onnx",forge_version="v9"} 1.0' in metrics


def test_backend_select_fastest_serves_the_measured_fastest_variant(registered: Runner, server_factory) -> None:
    record = registered.read("registry/digits-mlp/v9/registry.json")
    throughput = {name: v["benchmark"]["batches"]["16"]["throughput"] for name, v in record["variants"].items()}
    fastest = max(throughput, key=throughput.__getitem__)
    config = _serve_config("registry/digits-mlp/v9/base", version="v9", batching={"enabled": True, "maxBatchSize": 16, "maxLatencyMs": 5,
                                                                                   "p99TargetMs": 150},
                           backend={"select": "fastest", "maxAccuracyDrop": 1.0, "threads": 1})
    server = server_factory(registered, "serve", config)
    serving = json.loads(get_text(f"{server.url}/forge/serving"))
    assert serving["variant"] == fastest and serving["endpointVariant"] == "base" and serving["threads"] == 1
    assert serving["backend"] == ("onnxruntime" if fastest == "base-onnx" else "pytorch")
    assert "fastest of 2 variants within 1 pt" in serving["reason"]
    status, body = post_json(f"{server.url}/v2/models/digits-mlp/infer",
                             {"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32", "data": ZERO + ONE}]})
    assert status == 200 and {o["name"]: o for o in body["outputs"]}["label"]["data"] == [0, 1]
    metrics = get_text(f"{server.url}/metrics")
    assert f'served_variant="{fastest}"' in metrics and 'forge_variant="base"' in metrics  # series keep the Endpoint's labels
    # what `forgectl status` shows for the endpoint (it asks through the router's address the same way)
    from reconciler.observe.status import render_text, served_backend

    shown = served_backend(server.url)
    assert shown is not None and shown["variant"] == fastest and shown["role"] == "canary" and shown["version"] == "v9"
    text = render_text({"environment": "dev", "target": "local", "workflows": [], "models": [],
                        "endpoints": [{"endpoint": "digits", "url": server.url, "serving": shown, "stable": "v9", "canary": None,
                                       "weights": None, "rollout": None}]})
    assert f"serves {fastest} on {serving['backend']} (threads 1, batcher adaptive; canary v9): fastest of 2 variants" in text
    assert served_backend("http://127.0.0.1:9") is None  # nothing listening: no line, no error


def test_the_onnx_runtime_backend_serves_an_exported_bundle(registered: Runner, server_factory) -> None:
    server = server_factory(registered, "serve", _serve_config("registry/digits-mlp/v9/base-onnx", version="v9", variant="base-onnx",
                                                               batching={"enabled": False}))
    status, body = post_json(f"{server.url}/v2/models/digits-mlp/infer",
                             {"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32", "data": ZERO + ONE}]})
    outputs = {o["name"]: o for o in body["outputs"]}
    assert status == 200 and outputs["label"]["data"] == [0, 1] and outputs["probabilities"]["shape"] == [2, 10]
    assert sum(outputs["probabilities"]["data"][:10]) == pytest.approx(1.0, abs=1e-5)
    serving = json.loads(get_text(f"{server.url}/forge/serving"))
    assert serving["backend"] == "onnxruntime" and serving["batcher"] == "off" and serving["kind"] == "onnx"
