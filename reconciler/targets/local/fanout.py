"""Argo's expansion of a DAG task's `withItems`, `withSequence` and `withParam`, and its
substitution of `{{item}}` and `{{inputs.parameters.*}}`, for the local executor (pure).

Written after Argo Workflows v4.0.5's controller, which is the reference: `expandTask`
(workflow/controller/dag.go) takes the items from `withItems`, or parses `withParam` as a JSON list,
or counts `withSequence` (`expandSequence`: `start`/`end` or `count`, each item the number printed
with `format`, default `%d`, as a string); `processItem` (operator.go) names each expanded task
`generateNodeName(name, index, desc)` = ``name(index:desc)`` with the parentheses of ``desc``
removed — ``desc`` is the item itself for a string or number, the item's JSON for a list, and for
a map its ``key:value`` pairs sorted and joined by commas — and substitutes ``{{item}}`` (a map's
or list's JSON; a string's text) and ``{{item.KEY}}`` in the task.
"""

from __future__ import annotations

import json
import re
from typing import Any

from reconciler.diagnostics import ForgeError


class FanOutError(ForgeError):
    """A fan-out Argo would refuse (a `withParam` that is not a JSON list, a bad sequence)."""


def _go_value(value: Any) -> str:
    """``fmt.Sprintf("%v", v)`` of a value decoded from JSON (numbers print as Go prints float64)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def items_of(task: dict[str, Any]) -> list[Any] | None:
    """The items a task fans out over, or None when it does not fan out."""
    if task.get("withItems"):
        return list(task["withItems"])
    if task.get("withParam"):
        try:
            items = json.loads(task["withParam"])
        except ValueError as exc:
            raise FanOutError(f"withParam value could not be parsed as a JSON list: {task['withParam']}: {exc}") from None
        if not isinstance(items, list):
            raise FanOutError(f"withParam value could not be parsed as a JSON list: {task['withParam']}")
        return items
    seq = task.get("withSequence")
    if seq is not None:
        try:
            start = int(str(seq.get("start", 0)))
            if "end" in seq:
                end = int(str(seq["end"]))
            elif "count" in seq:
                count = int(str(seq["count"]))
                if count == 0:
                    return []
                end = start + count - 1
            else:
                raise FanOutError("neither end nor count was specified in withSequence")
        except ValueError as exc:
            raise FanOutError(f"withSequence: {exc}") from None
        fmt = seq.get("format") or "%d"
        step = 1 if start <= end else -1
        return [fmt % i for i in range(start, end + step, step)]
    return None


def node_name(name: str, index: int, item: Any) -> str:
    """Argo's name of the task expanded from ``item`` (``generateNodeName``)."""
    if isinstance(item, dict):
        desc = ",".join(sorted(f"{k}:{_go_value(v)}" for k, v in item.items()))
    else:
        desc = _go_value(item)
    return f"{name}({index}:{desc.replace('(', '').replace(')', '')})"


def substitute(obj: Any, values: dict[str, str]) -> Any:
    """``obj`` with every ``{{name}}`` of ``values`` replaced in its strings (Argo's simple tags;
    tags it does not know are left as they are)."""
    if isinstance(obj, str):
        return re.sub(r"\{\{\s*([^{}]+?)\s*\}\}", lambda m: values.get(m[1], m[0]), obj)
    if isinstance(obj, list):
        return [substitute(v, values) for v in obj]
    if isinstance(obj, dict):
        return {k: substitute(v, values) for k, v in obj.items()}
    return obj


def expand(task: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The tasks a fan-out task expands to (named as Argo names them, `{{item}}` substituted), or
    None when it does not fan out."""
    items = items_of(task)
    if items is None:
        return None
    base = {k: v for k, v in task.items() if k not in ("withItems", "withParam", "withSequence")}
    out = []
    for index, item in enumerate(items):
        values = {"item": item if isinstance(item, str) else _go_value(item)}
        if isinstance(item, dict):
            values.update({f"item.{k}": _go_value(v) for k, v in item.items()})
        out.append({**substitute(base, values), "name": node_name(task["name"], index, item)})
    return out


def inputs(template: dict[str, Any], arguments: dict[str, Any]) -> dict[str, str]:
    """``{"inputs.parameters.NAME": value}`` of a template called with ``arguments`` (a parameter's
    `value` there, else the template's `default`)."""
    given = {p["name"]: str(p.get("value", "")) for p in (arguments.get("parameters") or [])}
    values = {}
    for p in (template.get("inputs") or {}).get("parameters") or []:
        value = given.get(p["name"], p.get("default"))
        if value is not None:
            values[f"inputs.parameters.{p['name']}"] = str(value)
    return values
