"""Both serving paths answer real requests over HTTP on 127.0.0.1, with forge_* metrics and
fault injection."""

from __future__ import annotations

import re

import pytest

from tests.runtimes.helpers import Runner, get_text, post_json

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
    match = re.search(r'forge_requests_total\{([^}]*code="%s"[^}]*)\} ([0-9.e+]+)' % code, metrics)
    return float(match.group(2)) if match else 0.0


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
