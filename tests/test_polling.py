"""The polling helper tests use instead of fixed sleeps."""

from __future__ import annotations

import itertools

import pytest

from tests.polling import WaitTimeout, holds_for, wait_until


def test_returns_the_first_truthy_value() -> None:
    answers = iter([None, 0, [], "ready"])
    assert wait_until(lambda: next(answers), timeout=5, what="the answer", interval=0) == "ready"


def test_names_what_it_waited_for_and_the_last_value() -> None:
    calls = itertools.count()
    with pytest.raises(WaitTimeout, match=r"waiting for the server \(last: 0\)") as err:
        wait_until(lambda: next(calls) * 0, timeout=0.2, what="the server", interval=0.01)
    assert "0.2s" in str(err.value)


def test_ignored_exceptions_mean_not_yet_others_propagate() -> None:
    attempts = iter([ConnectionRefusedError("not listening"), ConnectionRefusedError("not listening"), "up"])

    def probe() -> str:
        value = next(attempts)
        if isinstance(value, Exception):
            raise value
        return value

    assert wait_until(probe, timeout=5, what="the port", interval=0, ignore=(ConnectionError,)) == "up"
    with pytest.raises(KeyError):
        wait_until(lambda: {}["x"], timeout=5, what="a key", ignore=(ConnectionError,))
    with pytest.raises(WaitTimeout, match="ConnectionRefusedError"):
        wait_until(lambda: (_ for _ in ()).throw(ConnectionRefusedError()), timeout=0.1, what="x", interval=0.01,
                   ignore=(ConnectionError,))


def test_holds_for_fails_as_soon_as_the_condition_breaks() -> None:
    holds_for(lambda: True, 0.1, "always", interval=0.01)
    values = iter([1, 1, 0, 1])
    with pytest.raises(AssertionError, match=r"the count stopped holding within 5s \(got 0\)"):
        holds_for(lambda: next(values), 5, "the count", interval=0)
