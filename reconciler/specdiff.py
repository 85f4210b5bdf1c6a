"""The field-level difference of two versions of a spec (pure): each change with the path a
reviewer reads (list items paired by name: `metrics[success-rate].min`) and the path by index that
finds its line in the file.

A ground-floor value module: the plan's reasons (a hyperparameter changed → retrain), the
pull-request plan's spec changes and `forgectl models diff` (what changed between two registered
versions) all read spec differences the same way, from here.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Keys that name the items of a spec list (metrics and variants by `name`, thresholds by
#: `metric`, cleaning steps by `op`, stages by `type`), tried in this order; the first one every
#: item has, as a string, and no two items share, pairs the two versions of the list.
NAME_KEYS = ("name", "metric", "op", "type")
ABSENT = "∅"


@dataclass(frozen=True)
class SpecChange:
    """One difference between two versions of a spec: the path as a reviewer reads it (list items
    by name: `metrics[success-rate].min`), the same path by index into the newer document (or the
    older one when the item is gone, ``in_old``) to find its line, and the two values."""

    op: str  # add | remove | change
    path: str
    keys: tuple[str | int, ...]
    old: Any
    new: Any
    in_old: bool = False

    def line(self) -> str:
        """"`path` old → new"."""
        return f"`{self.path}` {_fmt(self.old)} → {_fmt(self.new)}"


def _fmt(value: Any) -> str:
    if value is _MISSING:
        return ABSENT
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


class _Missing:
    def __repr__(self) -> str:
        return ABSENT


_MISSING: Any = _Missing()


def _name_key(items: list[Any]) -> str | None:
    if not items or not all(isinstance(i, dict) for i in items):
        return None
    for key in NAME_KEYS:
        names = [i.get(key) for i in items]
        if all(isinstance(n, str) for n in names) and len(set(names)) == len(names):
            return key
    return None


def _label(path: str, key: str | int, named: bool = False) -> str:
    if named or isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _walk(old: Any, new: Any, path: str, keys: tuple[str | int, ...], old_keys: tuple[str | int, ...],
          out: list[SpecChange]) -> None:
    if old is None and isinstance(new, (dict, list)) and new:
        old = type(new)()
    if new is None and isinstance(old, (dict, list)) and old:
        new = type(old)()
    if isinstance(old, dict) and isinstance(new, dict):
        for k in [*new, *(k for k in old if k not in new)]:
            a, b = old.get(k, _MISSING), new.get(k, _MISSING)
            if a is _MISSING and b is None or b is _MISSING and a is None:
                continue  # an unset optional field is not a change
            if a != b:
                _walk(a, b, _label(path, k), keys + (k,), old_keys + (k,), out)
        return
    if isinstance(old, list) and isinstance(new, list):
        named_old, named_new = _name_key(old), _name_key(new)
        key = named_new if not old else named_old if not new else named_old if named_old == named_new else None
        if key is not None:
            before = {item[key]: (i, item) for i, item in enumerate(old)}
            after = {item[key]: (i, item) for i, item in enumerate(new)}
            for name, (i, item) in after.items():
                if name not in before:
                    out.append(SpecChange("add", _label(path, name, True), keys + (i,), _MISSING, item))
                elif before[name][1] != item:
                    _walk(before[name][1], item, _label(path, name, True), keys + (i,), old_keys + (before[name][0],), out)
            for name, (i, item) in before.items():
                if name not in after:
                    out.append(SpecChange("remove", _label(path, name, True), old_keys + (i,), item, _MISSING, in_old=True))
            return
        if all(isinstance(i, dict) for i in old + new) and old and new:
            # Unnamed items (canary steps): aligned as a sequence, so a step taken out reads as
            # that step removed, not as every later step changed.
            seq_a = [json.dumps(i, sort_keys=True) for i in old]
            seq_b = [json.dumps(i, sort_keys=True) for i in new]
            for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, seq_a, seq_b, autojunk=False).get_opcodes():
                if tag == "equal":
                    continue
                pairs = min(i2 - i1, j2 - j1)
                for k in range(pairs):
                    _walk(old[i1 + k], new[j1 + k], _label(path, j1 + k), keys + (j1 + k,), old_keys + (i1 + k,), out)
                for i in range(i1 + pairs, i2):
                    out.append(SpecChange("remove", _label(path, i), old_keys + (i,), old[i], _MISSING, in_old=True))
                for j in range(j1 + pairs, j2):
                    out.append(SpecChange("add", _label(path, j), keys + (j,), _MISSING, new[j]))
            return
    if old is _MISSING:
        out.append(SpecChange("add", path, keys, old, new))
    elif new is _MISSING:
        out.append(SpecChange("remove", path, old_keys, old, new, in_old=True))
    else:
        out.append(SpecChange("change", path, keys, old, new))


def spec_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[SpecChange]:
    """Every difference between two versions of a spec (plain dicts, as dumped by alias), lists
    of named items paired by name (see :data:`NAME_KEYS`), other lists of mappings by position,
    lists of scalars compared whole. Values absent on one side are :data:`ABSENT` when shown."""
    out: list[SpecChange] = []
    _walk(dict(old), dict(new), "", (), (), out)
    return out


def spec_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """"`path` old → new" for every difference between two spec dicts (see :func:`spec_diff`)."""
    return [c.line() for c in spec_diff(old, new)]
