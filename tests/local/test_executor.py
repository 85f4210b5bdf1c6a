"""The local executor follows Argo's semantics by asking Argo's code: the rendered retry rule and
`depends` expressions are evaluated by Argo's evaluator (forge-judge), not by a list of exit codes
or a regular expression of ours.

Steps here are tiny `python -c` programs so the semantics, not the runtimes, are under test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.targets.local.executor import WorkflowExecutor
from reconciler.targets.local.state import StateDB
from renderers.workflow import _retry


def _step(name: str, code: str) -> dict[str, Any]:
    return {"name": name, "retryStrategy": {**_retry(2), "backoff": {"duration": "10ms", "factor": "1"}},
            "container": {"image": "x", "command": ["python", "-c", code], "args": []}}


def _workflow(name: str, steps: list[dict[str, Any]], depends: dict[str, str]) -> dict[str, Any]:
    tasks = [{"name": s["name"], "template": s["name"], **({"depends": depends[s["name"]]} if s["name"] in depends else {})}
             for s in steps]
    return {"metadata": {"name": name}, "spec": {"entrypoint": "main", "parallelism": 1,
                                                 "templates": [{"name": "main", "dag": {"tasks": tasks}}, *steps]}}


def _counting(tmp_path: Path, name: str, codes: list[int]) -> str:
    """A program that exits with codes[n] on its n-th run (counting in a file)."""
    counter = tmp_path / f"{name}.count"
    return (f"import pathlib,sys; p=pathlib.Path({str(counter)!r}); n=int(p.read_text()) if p.exists() else 0; "
            f"p.write_text(str(n+1)); print('attempt', n+1); sys.exit({codes!r}[min(n, {len(codes) - 1})])")


@pytest.fixture
def executor(tmp_path: Path) -> WorkflowExecutor:
    db = StateDB(tmp_path / "state.db")
    return WorkflowExecutor(db, tmp_path / "state", tmp_path / "ws", tmp_path, sys.executable)


def _attempts(tmp_path: Path, name: str) -> int:
    return int((tmp_path / f"{name}.count").read_text())


@pytest.mark.parametrize(("code", "runs"), [(2, 1), (3, 1), (5, 1), (1, 3), (4, 3), (137, 3)])
def test_retries_are_what_argo_decides_for_the_rendered_rule(executor: WorkflowExecutor, tmp_path: Path, code: int, runs: int) -> None:
    # permanent exits (digest, thresholds, failed upstream) run once; others are retried up to the
    # limit (2 retries: 3 runs) — 4 among them: a rejected variant is a verdict now, no exit code
    outcome = executor.run(_workflow("wf", [_step("s", _counting(tmp_path, "s", [code]))], {}))
    assert outcome.phase == "Failed"
    assert _attempts(tmp_path, "s") == runs


def test_a_transient_failure_is_retried_and_succeeds(executor: WorkflowExecutor, tmp_path: Path) -> None:
    outcome = executor.run(_workflow("wf", [_step("s", _counting(tmp_path, "s", [1, 0]))], {}))
    assert outcome.phase == "Succeeded" and _attempts(tmp_path, "s") == 2


def test_depends_is_evaluated_by_argo(executor: WorkflowExecutor, tmp_path: Path) -> None:
    steps = [_step("a", "pass"), _step("b", "pass"), _step("on-failure", "pass"), _step("c", "pass")]
    depends = {"b": "a.Succeeded", "on-failure": "a.Failed", "c": "(b.Succeeded || on-failure.Succeeded)"}
    outcome = executor.run(_workflow("wf", steps, depends))
    assert outcome.steps == {"a": "succeeded", "b": "succeeded", "on-failure": "omitted", "c": "succeeded"}
    assert outcome.phase == "Succeeded"
    assert json.loads(json.dumps(outcome.steps)) == outcome.steps  # plain values, as status shows them
