"""Pure field-level diff of a desired manifest against its live object.

What counts as a difference is decided by what Forge manages, not by a list of ignored fields:

* a field Forge renders must be present in the live object with the same value (fields the API
  server defaults or other controllers add around it are not Forge's business);
* a field the live object's `managedFields` say `forgectl` owns, but which Forge no longer
  renders, is a removal (server-side apply would remove it);
* where that still reports a change, the caller can settle it with a server-side dry-run apply
  (:func:`same_after_apply`): if applying would leave the object as it is, there is no change.

How a changed value reads (:func:`value_diff`): a long one-line string (a PromQL query, a step's
JSON config in `args`) as the tokens around each change, a multi-line string (a manifest held as
text) as a unified diff, so a reviewer sees the difference rather than two equal-looking prefixes.

Nothing here does I/O.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from reconciler.applied import NOT_DIGESTED
from reconciler.budgets import MAX_COMPARED, MAX_TOKEN_PAIRS, MAX_TOKEN_PAIRS_TOTAL, Spent

MANAGER = "forgectl"
#: Annotations that describe where an object came from rather than what it is: stamping a new
#: git revision alone must not rewrite every object, and the digest an apply records
#: (:mod:`reconciler.applied`) is about the write, not the object. The same set the digest leaves out.
PROVENANCE_ANNOTATIONS = NOT_DIGESTED
#: Metadata the server maintains on every object.
VOLATILE_METADATA = frozenset(
    {"managedFields", "resourceVersion", "generation", "uid", "creationTimestamp", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds", "ownerReferences", "finalizers"}
)

Op = Literal["add", "remove", "change"]


@dataclass(frozen=True)
class FieldChange:
    """One changed field: where (dotted path), how, and the values before and after."""

    op: Op
    path: str
    old: Any = None
    new: Any = None

    def to_json(self, spent: Spent | None = None) -> dict[str, Any]:
        """A plain dict for saved plans and `--output json` (with `valueDiff` where the values are
        strings too long or too many lines to compare by eye; ``spent``: the plan's budget of
        token pairs, see :func:`value_diff`)."""
        out = {"op": self.op, "path": self.path, "old": self.old, "new": self.new}
        shown = value_diff(self.old, self.new, spent)
        if shown is not None:
            out["valueDiff"] = shown
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FieldChange:
        """Inverse of :meth:`to_json`."""
        return cls(data["op"], data["path"], data.get("old"), data.get("new"))


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    safe = key if key.replace("-", "").replace("_", "").isalnum() else json.dumps(key)
    return f"{path}.{safe}" if path else safe


def _equal_scalars(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def _dotted(parts: tuple[str | int, ...]) -> str:
    path = ""
    for part in parts:
        path = _join(path, part)
    return path


def _compare(desired: Any, live: Any, parts: tuple[str | int, ...], out: list[FieldChange]) -> None:
    # Paths are built only where a difference is found: most of a large plan is equal objects.
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            out.append(FieldChange("change", _dotted(parts), live, desired))
            return
        for key, value in desired.items():
            if key not in live:
                out.append(FieldChange("add", _dotted(parts + (key,)), None, value))
            elif value is not live[key] and value != live[key]:
                _compare(value, live[key], parts + (key,), out)
    elif isinstance(desired, list):
        if isinstance(live, list) and _named(desired) and _named(live) and len(live) != len(desired):
            _compare_named(desired, live, parts, out)
            return
        if not isinstance(live, list) or len(live) != len(desired):
            out.append(FieldChange("change", _dotted(parts), live, desired))
            return
        for i, (want, have) in enumerate(zip(desired, live)):
            if want != have:
                _compare(want, have, parts + (i,), out)
    elif not _equal_scalars(desired, live):
        out.append(FieldChange("change", _dotted(parts), live, desired))


def _named(items: list[Any]) -> bool:
    names = [i.get("name") for i in items if isinstance(i, dict)]
    return len(names) == len(items) and all(isinstance(n, str) for n in names) and len(set(names)) == len(names)


def _compare_named(desired: list[Any], live: list[Any], parts: tuple[str | int, ...], out: list[FieldChange]) -> None:
    """Lists of named items (predictors, containers, templates) whose length changed: say which
    item came or went, rather than that the whole list differs."""
    have = {item["name"]: (i, item) for i, item in enumerate(live)}
    want = {item["name"] for item in desired}
    for i, item in enumerate(desired):
        if item["name"] not in have:
            out.append(FieldChange("add", f"{_dotted(parts + (i,))}(name={item['name']})", None, item))
        elif item != have[item["name"]][1]:
            _compare(item, have[item["name"]][1], parts + (i,), out)
    for name, (i, item) in have.items():
        if name not in want:
            out.append(FieldChange("remove", f"{_dotted(parts + (i,))}(name={name})", item, None))


def comparable(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an object a diff looks at: labels, annotations (less provenance) and every
    top-level field but `status`."""
    meta = obj.get("metadata", {})
    out: dict[str, Any] = {
        "metadata": {
            "labels": dict(meta.get("labels") or {}),
            "annotations": {k: v for k, v in (meta.get("annotations") or {}).items() if k not in PROVENANCE_ANNOTATIONS},
        }
    }
    for key, value in obj.items():
        if key not in ("apiVersion", "kind", "metadata", "status"):
            out[key] = value
    return out


def owned_paths(live: Mapping[str, Any], manager: str = MANAGER) -> set[tuple[str, ...]]:
    """Leaf field paths that ``manager`` owns by server-side apply, from `managedFields`.

    Lists keyed by `k:`/`v:`/`i:` entries are treated as one leaf at the list's path: Forge always
    renders whole lists, so the list as a whole is what it owns."""
    paths: set[tuple[str, ...]] = set()

    def walk(node: Mapping[str, Any], prefix: tuple[str, ...]) -> None:
        children = {k: v for k, v in node.items() if k != "."}
        if not children:
            paths.add(prefix)
            return
        if any(not k.startswith("f:") for k in children):
            paths.add(prefix)
            return
        for key, child in children.items():
            walk(child or {}, prefix + (key[2:],))

    for entry in live.get("metadata", {}).get("managedFields") or []:
        if entry.get("manager") == manager and entry.get("operation") == "Apply":
            walk(entry.get("fieldsV1") or {}, ())
    return {p for p in paths if p}


def _present(obj: Any, path: tuple[str, ...]) -> bool:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return False
        obj = obj[key]
    return True


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def _removed(desired: Any, live: Any, parts: tuple[str | int, ...], out: list[FieldChange]) -> None:
    # Like _compare: an equal subtree has nothing removed, and a path is built only where a key went.
    if isinstance(desired, dict) and isinstance(live, dict):
        for key, value in live.items():
            if key not in desired:
                out.append(FieldChange("remove", _dotted(parts + (key,)), value, None))
            elif (want := desired[key]) is not value and want != value:
                _removed(want, value, parts + (key,), out)


def field_diff(desired: Mapping[str, Any], live: Mapping[str, Any], manager: str = MANAGER, *, exact: bool = False) -> list[FieldChange]:
    """Every difference between ``desired`` and ``live`` that applying ``desired`` would make.
    With ``exact``, fields only ``live`` has are removals too (two renders compared in a pull
    request, where no server adds defaults)."""
    if desired is live:  # one object (a pull request's base and head recalled from one render cache)
        return []
    out: list[FieldChange] = []
    want = comparable(desired)
    have = comparable(live)
    _compare(want, have, (), out)
    if exact:
        _removed(want, have, (), out)
        return out
    for path in sorted(owned_paths(live, manager)):
        if path[0] in ("apiVersion", "kind", "status") or (path[0] == "metadata" and path[1:2] not in (("labels",), ("annotations",))):
            continue
        if path[:2] == ("metadata", "annotations") and len(path) > 2 and path[2] in PROVENANCE_ANNOTATIONS:
            continue
        if not _present(want, path) and _present(have, path):
            out.append(FieldChange("remove", ".".join(path), _get(have, path), None))
    return out


def strip_volatile(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object without server-maintained metadata and status, for whole-object comparisons."""
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k not in VOLATILE_METADATA}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in PROVENANCE_ANNOTATIONS}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    return {**{k: v for k, v in obj.items() if k not in ("metadata", "status")}, "metadata": meta}


def same_after_apply(dry_run_result: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """True when a server-side dry-run apply of the desired object leaves ``live`` as it is: the
    apparent differences were the server's own normalisation (defaults, pruning, formats)."""
    return strip_volatile(dry_run_result) == strip_volatile(live)


#: A one-line string longer than this is compared token by token (the views cut values here).
INLINE_LIMIT = 120
#: Characters of unchanged text shown either side of a change in a token-level diff.
CONTEXT = 32
#: Changes this close (characters of unchanged text between them) are shown as one hunk.
MERGE_GAP = 12
#: Hunks shown per value; the rest are counted.
MAX_HUNKS = 8
#: Lines of a unified diff shown per value; the rest are counted.
MAX_LINES = 60
#: Lines of unchanged text shown either side of a change in a unified diff.
LINE_CONTEXT = 2

#: Tokens of code-like text: identifiers, numbers with their unit (`0.005`, `1e-3`, `10m`), runs of
#: white space, and any other single character (`{`, `"`, `=~`'s parts).
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?[A-Za-z]*|\s+|.", re.S)


def tokens(text: str) -> list[str]:
    """``text`` split into the tokens a token-level diff compares."""
    return _TOKEN.findall(text)


def _clip_left(text: str) -> str:
    if len(text) <= CONTEXT:
        return text
    cut = text[-CONTEXT:]
    parts = tokens(cut)
    return "…" + ("".join(parts[1:]) if len(parts) > 1 else cut)


def _clip_right(text: str) -> str:
    if len(text) <= CONTEXT:
        return text
    cut = text[:CONTEXT]
    parts = tokens(cut)
    return ("".join(parts[:-1]) if len(parts) > 1 else cut) + "…"


def _common_ends(a: list[str], b: list[str]) -> tuple[int, int]:
    """Lengths of the common prefix and of the common suffix (not overlapping it) of ``a`` and ``b``."""
    start = 0
    while start < len(a) and start < len(b) and a[start] == b[start]:
        start += 1
    end = 0
    while end < len(a) - start and end < len(b) - start and a[len(a) - 1 - end] == b[len(b) - 1 - end]:
        end += 1
    return start, end


def _affordable(mid_a: list[str], mid_b: list[str], spent: Spent, unit: str = "tokens") -> str:
    """Whether difflib may compare ``mid_a`` with ``mid_b`` (its matcher is quadratic in their
    lengths): "" and the pairs charged to ``spent``, else the note saying why not."""
    pairs = len(mid_a) * len(mid_b)
    if sum(map(len, mid_a)) + sum(map(len, mid_b)) > MAX_COMPARED:
        return f"the changed part is longer than {MAX_COMPARED:,} characters: shown whole, before and after"
    if pairs > MAX_TOKEN_PAIRS:
        return (f"the changed part ({len(mid_a):,} and {len(mid_b):,} {unit}) is too long to compare {unit[:-1]} by "
                f"{unit[:-1]} (at most {MAX_TOKEN_PAIRS:,} pairs): shown whole, before and after")
    if spent.token_pairs + pairs > MAX_TOKEN_PAIRS_TOTAL:
        return (f"this plan's budget for comparing long values ({MAX_TOKEN_PAIRS_TOTAL:,} pairs) is spent: "
                "shown whole, before and after")
    spent.token_pairs += pairs
    return ""


def _opcodes(a: list[str], b: list[str], spent: Spent) -> tuple[list[tuple[str, int, int, int, int]], str]:
    """difflib's opcodes over the middle of ``a`` and ``b`` (common prefix and suffix removed
    first: one edit in a long string costs linear time), and a note when the middle was too long
    to compare within the budgets (one `replace` of it all then)."""
    start, end = _common_ends(a, b)
    mid_a, mid_b = a[start:len(a) - end], b[start:len(b) - end]
    ops: list[tuple[str, int, int, int, int]] = []
    if start:
        ops.append(("equal", 0, start, 0, start))
    note = _affordable(mid_a, mid_b, spent) if mid_a and mid_b else ""
    if note or not (mid_a and mid_b):
        ops.append(("replace", start, start + len(mid_a), start, start + len(mid_b)))
    else:
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, mid_a, mid_b, autojunk=False).get_opcodes():
            ops.append((tag, i1 + start, i2 + start, j1 + start, j2 + start))
    if end:
        ops.append(("equal", len(a) - end, len(a), len(b) - end, len(b)))
    return ops, note


def token_hunks(old: str, new: str) -> list[dict[str, str]]:
    """The changes between two one-line strings as hunks `{before, old, new, after}`: the changed
    tokens with up to :data:`CONTEXT` characters of unchanged text either side (cut at a token,
    `…` where cut). Changes at most :data:`MERGE_GAP` characters apart share a hunk."""
    return _token_hunks(old, new, None)[0]


def _token_hunks(old: str, new: str, spent: Spent | None) -> tuple[list[dict[str, str]], str]:
    """:func:`token_hunks`, and a note when the changed part was too long to compare token by
    token within the budgets (one hunk then holds it whole)."""
    a, b = tokens(old), tokens(new)
    ops, note = _opcodes(a, b, spent if spent is not None else Spent())
    # Group the edits, merging those separated by a short equal run.
    groups: list[list[tuple[str, int, int, int, int]]] = []
    for op in ops:
        if op[0] == "equal" or (op[1] == op[2] and op[3] == op[4]):
            continue
        if groups:
            last = groups[-1][-1]
            between = "".join(a[last[2]:op[1]])
            if len(between) <= MERGE_GAP:
                groups[-1].append(op)
                continue
        groups.append([op])
    hunks = []
    for group in groups:
        first, last = group[0], group[-1]
        hunks.append({
            "before": _clip_left("".join(a[:first[1]])),
            "old": "".join(a[first[1]:last[2]]),
            "new": "".join(b[first[3]:last[4]]),
            "after": _clip_right("".join(a[last[2]:])),
        })
    return hunks, note


def _line_range(start: int, stop: int) -> str:
    """A unified diff's range (`88,5`, `88` for one line, `87,0` for none), as difflib writes it."""
    length = stop - start
    if length == 1:
        return f"{start + 1}"
    return f"{start + 1 if length else start},{length}"


def line_diff(old: str, new: str) -> list[list[str]]:
    """A unified diff of two multi-line strings as `[mark, line]` pairs: mark `@@` (a hunk's
    header), ` ` (context), `-` or `+`; two lines of context."""
    return _line_diff(old, new, None)[0]


def _line_diff(old: str, new: str, spent: Spent | None) -> tuple[list[list[str]], str]:
    """:func:`line_diff` within the budgets: two values whose lines are too many to compare whole
    are compared between their common first and last lines only (linear time for one edit); when
    those are still too many, they are shown whole, before and after, and the note says so."""
    spent = spent if spent is not None else Spent()
    a, b = old.splitlines(), new.splitlines()
    lo = 0
    note = ""
    if len(a) * len(b) <= MAX_TOKEN_PAIRS and not _affordable(a, b, spent, "lines"):
        groups = list(difflib.SequenceMatcher(None, a, b).get_grouped_opcodes(LINE_CONTEXT))
    else:
        start, end = _common_ends(a, b)
        lo, keep = max(0, start - LINE_CONTEXT), max(0, end - LINE_CONTEXT)
        a, b = a[lo:len(a) - keep], b[lo:len(b) - keep]
        head, tail = start - lo, end - keep  # the context lines kept either side
        note = _affordable(a[head:len(a) - tail], b[head:len(b) - tail], spent, "lines")
        if note:
            groups = [[("equal", 0, head, 0, head), ("replace", head, len(a) - tail, head, len(b) - tail),
                       ("equal", len(a) - tail, len(a), len(b) - tail, len(b))]]
        else:
            groups = list(difflib.SequenceMatcher(None, a, b).get_grouped_opcodes(LINE_CONTEXT))
    out: list[list[str]] = []
    for group in groups:
        first, last = group[0], group[-1]
        out.append(["@@", f"-{_line_range(first[1] + lo, last[2] + lo)} +{_line_range(first[3] + lo, last[4] + lo)}"])
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [[" ", line] for line in a[i1:i2]]
                continue
            out += [["-", line] for line in a[i1:i2]]
            out += [["+", line] for line in b[j1:j2]]
    return out, note


def value_diff(old: Any, new: Any, spent: Spent | None = None) -> dict[str, Any] | None:
    """How to show a change of ``old`` to ``new`` when the two values do not read well side by
    side: strings with a line break → `{"kind": "lines", "lines": [[mark, text], …]}` (a unified
    diff); strings longer than :data:`INLINE_LIMIT` → `{"kind": "tokens", "hunks": [{before, old,
    new, after}, …]}`. None otherwise (the values are shown as they are). Lists are capped
    (`more` counts what was left out). Comparing costs at most :data:`MAX_TOKEN_PAIRS` pairs of
    tokens (or lines) per value and :data:`MAX_TOKEN_PAIRS_TOTAL` for all values charged to
    ``spent`` (one plan); past that the changed part is shown whole and `note` says why."""
    if not isinstance(old, str) or not isinstance(new, str) or old == new:
        return None
    if "\n" in old or "\n" in new:
        lines, note = _line_diff(old, new, spent)
        shown: dict[str, Any] = {"kind": "lines", "lines": lines[:MAX_LINES], "more": max(0, len(lines) - MAX_LINES)}
    elif len(old) <= INLINE_LIMIT and len(new) <= INLINE_LIMIT:
        return None
    else:
        hunks, note = _token_hunks(old, new, spent)
        shown = {"kind": "tokens", "hunks": hunks[:MAX_HUNKS], "more": max(0, len(hunks) - MAX_HUNKS)}
    if note:
        shown["note"] = note
    return shown
