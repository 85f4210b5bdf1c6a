"""Shadow mirroring by the live model server (runtimes/serving/mirror.py): the comparison of two
Open Inference answers, and two real `serve` processes — a live one copying what it answered to a
shadow — with the copies counted and compared in the live server's own metrics."""

from __future__ import annotations

import time

import pytest

from devkit.runtime_steps import Runner
from reconciler.metrics.prometheus import Prometheus
from reconciler.metrics.shadow import shadow_figures
from runtimes.serving.mirror import compare
from specs.rollout import BUILTIN_TEMPLATES, fill_placeholders
from tests.polling import wait_until
from tests.runtimes.helpers import get_text, post_json, series_value
from tests.runtimes.test_serve import ONE, ZERO, _serve_config


def _answer(labels: list[int], probabilities: list[float] | None = None, nested: bool = False) -> dict:
    outputs = [{"name": "label", "shape": [len(labels)], "datatype": "INT64", "data": labels}]
    if probabilities is not None:
        data: list = [probabilities[i:i + 2] for i in range(0, len(probabilities), 2)] if nested else probabilities
        outputs.insert(0, {"name": "probabilities", "shape": [len(labels), 2], "datatype": "FP32", "data": data})
    return {"model_name": "m", "outputs": outputs}


def test_compare_counts_rows_with_the_same_label_and_the_largest_probability_difference() -> None:
    result = compare(_answer([0, 1, 1], [0.9, 0.1, 0.2, 0.8, 0.4, 0.6]), _answer([0, 1, 0], [0.8, 0.2, 0.2, 0.8, 0.7, 0.3]))
    assert result is not None and (result.rows, result.agreed) == (3, 2)
    assert result.max_delta == pytest.approx(0.3)
    # a client's nesting by shape reads the same; no probabilities: the labels alone
    nested = compare(_answer([1], [0.2, 0.8], nested=True), _answer([1], [0.25, 0.75]))
    assert nested is not None and nested.agreed == 1 and nested.max_delta == pytest.approx(0.05)
    assert compare(_answer([1]), _answer([1])) == type(nested)(1, 1, None)


def test_answers_that_cannot_be_compared_are_none() -> None:
    assert compare(_answer([0, 1]), _answer([0])) is None  # other row counts
    assert compare(_answer([0]), {"outputs": [{"name": "prediction", "data": [0.3]}]}) is None  # no label
    assert compare({"error": "x"}, _answer([0])) is None
    assert compare(_answer([]), _answer([])) is None  # nothing to compare


@pytest.mark.runtime
@pytest.mark.prometheus
def test_a_live_server_copies_what_it_answered_to_the_shadow_and_compares(digits: Runner, server_factory, prometheus) -> None:
    shadow = server_factory(digits, "serve", {**_serve_config("models/base"), "role": "shadow"})
    live = server_factory(digits, "serve", {**_serve_config("models/base"), "role": "stable",
                                             "mirror": {"url": shadow.url, "percent": 100}})
    prometheus.set_targets([live.url.removeprefix("http://")])
    prometheus.wait_for_targets(1)
    sent = 40
    for i in range(sent):
        time.sleep(0.1)  # over some 4 s: several scrapes see the copies' counters rise
        status, body = post_json(f"{live.url}/v2/models/digits-mlp/infer",
                                 {"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32", "data": ZERO + ONE}]})
        assert status == 200 and {o["name"]: o for o in body["outputs"]}["label"]["data"] == [0, 1], (i, body)
    bad, _ = post_json(f"{live.url}/v2/models/digits-mlp/infer", {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]})
    assert bad == 400  # not answered: not copied

    def copies() -> str | None:
        metrics = get_text(f"{live.url}/metrics")
        return metrics if series_value(metrics, "forge_shadow_requests_total", outcome="compared") >= sent else None

    metrics = wait_until(copies, 30, "every answered request copied and compared")
    assert series_value(metrics, "forge_shadow_requests_total", outcome="compared") == sent
    for outcome in ("failed", "unreadable", "dropped"):
        assert series_value(metrics, "forge_shadow_requests_total", outcome=outcome) == 0, outcome
    # the same model: every row the same label, no difference in the probabilities
    assert series_value(metrics, "forge_shadow_rows_total", agreement="agreed", forge_role="stable") == 2 * sent
    assert series_value(metrics, "forge_shadow_rows_total", agreement="disagreed") == 0
    assert series_value(metrics, "forge_shadow_probability_delta_count") == sent
    assert series_value(metrics, "forge_shadow_probability_delta_bucket", le="0.0001") == sent
    assert series_value(metrics, "forge_shadow_duration_seconds_count") == sent
    # the shadow answered the copies: its own count, under its own role
    shadow_metrics = get_text(f"{shadow.url}/metrics")
    assert series_value(shadow_metrics, "forge_requests_total", code="200", forge_role="shadow") == sent
    # the gate's template reads the agreement from Prometheus: every row the same label
    query = fill_placeholders(BUILTIN_TEMPLATES["shadow-agreement"],
                              {"endpoint": "digits", "namespace": "ml", "version": "v1", "role": "canary", "window": "30s"})
    result = wait_until(lambda: prometheus.query(query), 30, "the shadow-agreement query to have a value")
    assert float(result[0]["value"][1]) == 1.0, result
    # what `rollout status` shows of a cluster's shadow: the same counts, read back from Prometheus
    figures = wait_until(lambda: (f := shadow_figures(Prometheus(prometheus.url), "digits", "ml")) and f["compared"] == sent and f,
                         30, "the copies' counters scraped")
    assert figures["mirrored"] == figures["answered"] == sent and figures["failed"] == figures["skipped"] == 0, figures
    assert figures["agreement"] == 1.0 and figures["meanProbabilityDistance"] == 0.0, figures
    assert 0 < figures["meanLatencySeconds"] < 5, figures


@pytest.mark.runtime
def test_a_shadow_that_does_not_answer_costs_callers_nothing(digits: Runner, server_factory) -> None:
    # Nothing listens on the shadow's port (a port just freed): every copy fails, every caller is answered.
    probe = server_factory(digits, "serve", _serve_config("models/base"))
    gone = probe.url
    probe.stop()
    live = server_factory(digits, "serve", {**_serve_config("models/base"), "role": "stable",
                                             "mirror": {"url": gone, "percent": 50, "timeoutMs": 500}})
    sent = 60
    for _ in range(sent):
        status, _ = post_json(f"{live.url}/v2/models/digits-mlp/infer",
                              {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": ZERO}]})
        assert status == 200

    seen: list[float] = []

    def settled() -> str | None:
        """The metrics once two reads a second apart count the same copies (none outstanding)."""
        metrics = get_text(f"{live.url}/metrics")
        seen.append(sum(series_value(metrics, "forge_shadow_requests_total", outcome=o) for o in ("failed", "dropped")))
        return metrics if len(seen) > 1 and seen[-1] == seen[-2] > 0 else None

    metrics = wait_until(settled, 30, "the copies' outcomes", interval=1.0)
    failed = series_value(metrics, "forge_shadow_requests_total", outcome="failed")
    assert series_value(metrics, "forge_shadow_requests_total", outcome="compared") == 0
    # percent 50 of 60: within the binomial 99.9 % interval (about 17..43)
    assert 17 <= failed + series_value(metrics, "forge_shadow_requests_total", outcome="dropped") <= 43, metrics
    assert series_value(metrics, "forge_requests_total", code="500") == 0
