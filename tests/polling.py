"""Waiting in tests: poll a condition under a deadline instead of sleeping a fixed time.

A fixed `time.sleep(n)` before an assertion is either too long (slow tests) or too short on a
busy machine (flaky tests), and it says nothing about what is awaited. `wait_until` asks the
condition itself, as often as `interval`, and fails naming what it waited for and the last value
it saw — the deadline only bounds a failure, it is never the thing under test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold before the deadline."""


def wait_until(predicate: Callable[[], T], timeout: float, what: str, *, interval: float = 0.1,
               ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``predicate`` until it returns something truthy, and return that value.

    ``ignore``: exceptions that mean "not yet" (e.g. ``ConnectionError`` while a server starts);
    any other exception propagates at once. After ``timeout`` seconds, raise :class:`WaitTimeout`
    naming ``what`` and the last value (or exception) seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
        except ignore as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def holds_for(predicate: Callable[[], object], seconds: float, what: str, *, interval: float = 0.05) -> None:
    """Check that ``predicate`` stays truthy for ``seconds`` (asked every ``interval``), failing
    as soon as it does not. For "nothing more happens" (no copy reaches a removed shadow), which
    no deadline can prove: the window is the claim, and it is named."""
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if not value:
            raise AssertionError(f"{what} stopped holding within {seconds:g}s (got {value!r})")
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)
