"""A canary that degrades late (issue 35): `faultInjection.after` / `afterRequests` delay an
Endpoint's injected faults — checked with their file and line, and honoured by the serving
runtime's telemetry (which both servers ask before each inference request)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtimes.serving.telemetry import Telemetry
from specs.stepconfig import ServeConfig
from tests.foundation.test_invalid_corpus import Case, doc
from tests.foundation.test_invalid_corpus import test_invalid_document as check_invalid

ENDPOINT = "modelRef: base-model\nfaultInjection:\n"

LATE = [
    Case("fault-delay-without-fault", doc("Endpoint", ENDPOINT + "  after: 40s\n"), 8,
         "`after` and `afterRequests` delay a fault: set `errorRate` or `addedLatencyMs` too"),
    Case("fault-after-not-a-duration", doc("Endpoint", ENDPOINT + "  errorRate: 0.05\n  after: soon\n"), 9, "'soon' does not match the expected format"),
    Case("fault-after-requests-zero", doc("Endpoint", ENDPOINT + "  errorRate: 0.05\n  afterRequests: 0\n"), 9,
         "greater than or equal to 1"),
]


@pytest.mark.parametrize("case", LATE, ids=[c.id for c in LATE])
def test_a_late_fault_is_checked_at_its_line(case: Case, tmp_path: Path) -> None:
    check_invalid(case, tmp_path)


def _telemetry(**faults: Any) -> Telemetry:
    config = ServeConfig.model_validate({"endpoint": "digits", "model": "digits-mlp", "version": "v2", "variant": "base",
                                         "role": "canary", "modelDir": "m", "faultInjection": faults})
    return Telemetry(config)


def test_faults_begin_after_the_requests_answered_healthy() -> None:
    tel = _telemetry(errorRate=1.0, afterRequests=3)
    assert [tel.faulty() for _ in range(5)] == [False, False, False, True, True]


def test_faults_begin_after_the_time_since_the_model_was_loaded() -> None:
    tel = _telemetry(errorRate=1.0, after="40s")
    tel.set_serving({})
    assert not tel.faulty()
    tel._serving_since -= 41  # forty-one seconds later
    assert tel.faulty()


def test_with_both_delays_the_later_one_decides_and_without_any_faults_start_at_once() -> None:
    both = _telemetry(errorRate=1.0, after="40s", afterRequests=1)
    both.set_serving({})
    assert [both.faulty(), both.faulty()] == [False, False]  # the second request: the count is met, not the time
    assert _telemetry(errorRate=1.0).faulty()


def test_an_endpoint_without_a_delay_renders_as_before() -> None:
    from specs.endpoint import FaultInjection

    assert FaultInjection.model_validate({"errorRate": 0.5}).model_dump(mode="json", by_alias=True) == {
        "errorRate": 0.5, "addedLatencyMs": 0.0}
