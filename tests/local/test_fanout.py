"""Fan-outs expand as Argo v4.0.5's controller expands them (reconciler/targets/local/fanout.py):
node names `name(index:desc)`, `{{item}}` substituted, and the local executor runs every item, a
nested DAG at most its `parallelism` at a time, dependents after the whole group."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.targets.local import fanout
from reconciler.targets.local.executor import WorkflowExecutor
from reconciler.targets.local.state import StateDB


def test_items_are_named_and_substituted_as_argo_does() -> None:
    task = {"name": "t", "template": "x", "withItems": ["a", 2, {"b": "y", "a": 1}],
            "arguments": {"parameters": [{"name": "p", "value": "{{item}}"}, {"name": "q", "value": "{{item.a}}"}]}}
    out = fanout.expand(task)
    assert out is not None
    assert [t["name"] for t in out] == ["t(0:a)", "t(1:2)", "t(2:a:1,b:y)"]
    assert [t["arguments"]["parameters"][0]["value"] for t in out] == ["a", "2", '{"b":"y","a":1}']
    assert out[2]["arguments"]["parameters"][1]["value"] == "1"
    assert all("withItems" not in t for t in out)


def test_sequences_and_params() -> None:
    seq = fanout.expand({"name": "s", "template": "x", "withSequence": {"count": "3", "start": "5"}})
    assert seq is not None and [t["name"] for t in seq] == ["s(0:5)", "s(1:6)", "s(2:7)"]
    fmt = fanout.items_of({"withSequence": {"start": "1", "end": "3", "format": "w%02d"}})
    assert fmt == ["w01", "w02", "w03"]
    assert fanout.items_of({"withSequence": {"count": "0"}}) == []
    param = fanout.expand({"name": "p", "template": "x", "withParam": '["x(1)", 3]'})
    assert param is not None and [t["name"] for t in param] == ["p(0:x1)", "p(1:3)"]
    with pytest.raises(fanout.FanOutError, match="JSON list"):
        fanout.items_of({"withParam": "{not json"})


def _pod(name: str, code: str) -> dict[str, Any]:
    return {"name": name, "inputs": {"parameters": [{"name": "n"}]},
            "container": {"image": "x", "command": ["python", "-c", code], "args": ["{{inputs.parameters.n}}"]}}


def test_a_nested_fan_out_runs_every_item_within_its_parallelism(tmp_path: Path) -> None:
    log = tmp_path / "log"
    code = (f"import sys, time, os; open({str(log)!r}, 'a').write(f'start {{sys.argv[1]}} {{time.time()}}\\n'); "
            f"time.sleep(0.4); open({str(log)!r}, 'a').write(f'end {{sys.argv[1]}} {{time.time()}}\\n')")
    after = f"import pathlib; pathlib.Path({str(tmp_path / 'after')!r}).write_text(open({str(log)!r}).read())"
    workflow = {"metadata": {"name": "wf"}, "spec": {"entrypoint": "main", "parallelism": 4, "templates": [
        {"name": "main", "dag": {"tasks": [{"name": "fan", "template": "fan"},
                                           {"name": "after", "template": "after", "depends": "fan.Succeeded"}]}},
        {"name": "fan", "parallelism": 2, "dag": {"tasks": [
            {"name": "item", "template": "pod", "withSequence": {"count": "5"},
             "arguments": {"parameters": [{"name": "n", "value": "{{item}}"}]}}]}},
        _pod("pod", code),
        {"name": "after", "container": {"image": "x", "command": ["python", "-c", after], "args": []}},
    ]}}
    executor = WorkflowExecutor(StateDB(tmp_path / "state.db"), tmp_path / "state", tmp_path / "ws", tmp_path, sys.executable,
                                max_parallel=4)
    outcome = executor.run(workflow)
    assert outcome.phase == "Succeeded", outcome.message
    assert {f"item({i}:{i})" for i in range(5)} <= set(outcome.steps)
    events = sorted((float(t), kind, n) for kind, n, t in (line.split() for line in log.read_text().splitlines()))
    assert sorted(n for _, kind, n in events if kind == "start") == ["0", "1", "2", "3", "4"]
    running = most = 0
    for _, kind, _n in events:
        running += 1 if kind == "start" else -1
        most = max(most, running)
    assert most == 2  # the fan-out template's parallelism, under the Workflow's 4
    assert (tmp_path / "after").read_text().count("end ") == 5  # the dependent ran after every item
