"""YAML → plain data, keeping the source position of every key and value.

PyYAML composes a node graph that knows its marks; we build the Python values ourselves from that
graph so that every value's path (``("spec", "hyperparameters", "learningRate")``) maps to its line
and column, duplicate keys are reported instead of silently overwritten, and hostile input (alias
bombs, deep nesting, huge files, bad bytes) becomes a diagnostic rather than a hang or a traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from reconciler.budgets import (
    MAX_ALIAS_VALUES,
    MAX_ALIAS_VALUES_PER_DOCUMENT,
    MAX_BASE60_PARTS,
    MAX_DEPTH,
    MAX_DOCUMENTS,
    MAX_DOCUMENTS_PER_FILE,
    MAX_FILE_BYTES,
    MAX_INT_DIGITS,
    MAX_NODES,
    MAX_VALUES,
    Spent,
    exceeded,
)
from reconciler.diagnostics import Diagnostic, clip

__all__ = ["MAX_DEPTH", "MAX_FILE_BYTES", "MAX_NODES", "RawDocument", "decode", "parse_documents"]


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]  # a base chosen at run time
    """libyaml's parser when PyYAML was built with it (about 3× faster on large repositories), with
    YAML 1.2's floats: `1e-3` is a number, as Kubernetes (and JSON) read it, not the string PyYAML's
    YAML 1.1 rules make of it — a string that strict validation would then refuse."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
#: What constructing a scalar may raise on hostile input besides YAMLError: `!!int abc`, an integer
#: longer than Python converts (4300 digits), `!!timestamp 2024-13-45`, `!!float x`.
_SCALAR_ERRORS = (yaml.YAMLError, ValueError, TypeError, OverflowError, ArithmeticError)
_PLAIN_COLLECTIONS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
#: The smallest integer with more than MAX_INT_DIGITS decimal digits.
_INT_LIMIT = 10**MAX_INT_DIGITS

Path = tuple[str | int, ...]
Position = tuple[int, int]


@dataclass
class RawDocument:
    """One YAML document as plain data, with the position of each value and each mapping key."""

    file: str
    index: int
    line: int
    column: int
    data: Any
    values: dict[Path, Position] = field(default_factory=dict)
    keys: dict[Path, Position] = field(default_factory=dict)

    def position(self, path: Path, *, key: bool = False) -> Position:
        """Line and column of ``path`` (its key when ``key``), else of its nearest ancestor."""
        table = self.keys if key else self.values
        if path in table:
            return table[path]
        for cut in range(len(path) - 1, -1, -1):
            prefix = path[:cut]
            if prefix in self.values:
                return self.values[prefix]
        return (self.line, self.column)


class _TooLarge(Exception):
    def __init__(self, path: Path, message: str) -> None:
        self.path = path
        self.message = message


class _RunSpent(_TooLarge):
    """A budget of the whole run is spent: reading stops here (no later document or file)."""


class _Builder:
    """Builds Python values from a composed node, recording positions. Every value is counted
    before it is built: against the document's budgets, and the run's (``spent``); a value reached
    again through an alias (`*name`) counts as an alias expansion too."""

    def __init__(self, doc: RawDocument, diagnostics: list[Diagnostic], spent: Spent) -> None:
        self.doc = doc
        self.diagnostics = diagnostics
        self.spent = spent
        self.count = 0
        self.aliased = 0
        self.seen: set[int] = set()
        self.expanding = 0  # > 0 while building a node reached again through an alias
        self.constructor = yaml.constructor.SafeConstructor()

    def _count(self, node: Node, path: Path, again: bool) -> None:
        self.count += 1
        self.spent.values += 1
        self.seen.add(id(node))
        if again or self.expanding:
            self.aliased += 1
            self.spent.alias_values += 1
        if self.count > MAX_NODES:
            raise _TooLarge(path, f"document expands to more than {MAX_NODES} values (an alias bomb?)")
        if self.aliased > MAX_ALIAS_VALUES_PER_DOCUMENT:
            raise _TooLarge(path, exceeded("alias expansion per document", MAX_ALIAS_VALUES_PER_DOCUMENT, "values")
                            + "; write the values out, or anchor less")
        if self.spent.alias_values > MAX_ALIAS_VALUES:
            raise _RunSpent(path, exceeded("alias expansion per run", MAX_ALIAS_VALUES, "values") + "; stopped reading here")
        if self.spent.values > MAX_VALUES:
            raise _RunSpent(path, exceeded("YAML values per run", MAX_VALUES, "values") + "; stopped reading here")

    def build(self, node: Node, path: Path, depth: int) -> Any:
        again = id(node) in self.seen
        self._count(node, path, again)
        if depth > MAX_DEPTH:
            raise _TooLarge(path, f"document is nested deeper than {MAX_DEPTH} levels")
        if again:
            self.expanding += 1
            try:
                return self._build(node, path, depth)
            finally:
                self.expanding -= 1
        return self._build(node, path, depth)

    def _build(self, node: Node, path: Path, depth: int) -> Any:
        self.doc.values.setdefault(path, _pos(node))
        if isinstance(node, (MappingNode, SequenceNode)) and node.tag not in _PLAIN_COLLECTIONS:
            # `!!python/object:…`, `!!set`, `!!omap`, `!Ref`: never constructed, and not silently
            # read as a plain mapping either.
            self._error(node, path, f"cannot read this value as {_tag_name(node.tag)}: only plain mappings and "
                                    "lists are allowed in specs")
            return None
        if isinstance(node, MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, SequenceNode):
            return [self.build(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
        try:
            return _scalar(self.constructor, node)
        except _SCALAR_ERRORS as exc:
            self._error(node, path, f"cannot read this value as {_tag_name(node.tag)}: {_reason(exc)}")
            return None

    def _mapping(self, node: MappingNode, path: Path, depth: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                self._error(key_node, path, "a mapping key must be a plain string, not a list or mapping")
                continue
            key = key_node.value
            if key_node.tag != "tag:yaml.org,2002:str" and key_node.tag != "tag:yaml.org,2002:merge":
                try:
                    key = str(_scalar(self.constructor, key_node))
                except _SCALAR_ERRORS as exc:
                    self._error(key_node, path, f"cannot read this key as {_tag_name(key_node.tag)}: {_reason(exc)}")
                    continue
            if key in result:
                first = self.doc.keys[path + (key,)]
                self._error(
                    key_node, path + (key,), f"duplicate key `{key}` (first defined on line {first[0]})",
                    hint="remove one of the two; YAML would silently keep only the last",
                )
                continue
            self.doc.keys[path + (key,)] = _pos(key_node)
            result[key] = self.build(value_node, path + (key,), depth + 1)
        return result

    def _error(self, node: Node, path: Path, message: str, hint: str = "") -> None:
        line, col = _pos(node)
        self.diagnostics.append(Diagnostic(self.doc.file, line, col, clip(message), clip(_dotted(path)), hint))


def _scalar(constructor: yaml.constructor.SafeConstructor, node: Node) -> Any:
    """The value of a scalar node, refusing (ValueError) before the work what PyYAML would build in
    more than linear time — a base-60 number (`1:2:3:…`) of many parts, a decimal integer of more
    digits than Python converts — and after it an integer of any base (0x…, 0o…, 0b…) too large to
    print (its digits counted as decimal)."""
    if node.tag in (_INT, _FLOAT):
        text = node.value.replace("_", "")
        if ":" in text:
            parts = text.count(":") + 1
            if parts > MAX_BASE60_PARTS:
                raise ValueError(f"a base-60 number of {parts:,} parts; at most {MAX_BASE60_PARTS} are read")
            if len(text) > MAX_INT_DIGITS:
                raise ValueError(f"the integer has more than {MAX_INT_DIGITS} digits")
        elif node.tag == _INT and len(text.lstrip("+-")) > MAX_INT_DIGITS and text.lstrip("+-")[:1] in "123456789":
            raise ValueError(f"the integer has more than {MAX_INT_DIGITS} digits")
    value = constructor.construct_object(node, deep=True)
    if isinstance(value, int) and not isinstance(value, bool) and not -_INT_LIMIT < value < _INT_LIMIT:
        raise ValueError(f"the integer has more than {MAX_INT_DIGITS} digits")
    return value


def _tag_name(tag: str) -> str:
    return "`!!" + tag.removeprefix("tag:yaml.org,2002:") + "`" if tag.startswith("tag:yaml.org,2002:") else f"`{tag}`"


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "problem", None) or exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "Exceeds the limit" in text and "digits" in text:
        return f"the integer has more than {MAX_INT_DIGITS} digits"
    return clip(text, 200)


def _pos(node: Node) -> Position:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def _dotted(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def decode(data: bytes, file: str) -> tuple[str | None, list[Diagnostic]]:
    """Decode a spec file's bytes as UTF-8 (a BOM is allowed), or say where it is not."""
    if len(data) > MAX_FILE_BYTES:
        return None, [
            Diagnostic(file, 1, 1, f"file is {len(data):,} bytes; spec files may be at most {MAX_FILE_BYTES:,}",
                       hint="split it into several files")
        ]
    try:
        return data.decode("utf-8-sig"), []
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        return None, [
            Diagnostic(file, line, col, f"file is not valid UTF-8 (byte 0x{data[exc.start]:02x})",
                       hint="save the file as UTF-8")
        ]


def parse_documents(text: str, file: str, spent: Spent | None = None) -> tuple[list[RawDocument], list[Diagnostic]]:
    """Every non-empty document of a YAML stream, with positions, and the problems found. ``spent``
    carries the run's budgets across files (a fresh one when not given); once one of them is spent
    (:attr:`Spent.exhausted`), reading stops."""
    spent = spent if spent is not None else Spent()
    documents: list[RawDocument] = []
    diagnostics: list[Diagnostic] = []
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        return [], [Diagnostic(file, line, 1, "file contains a NUL character; is it binary?")]
    index = 0
    loader = None
    try:
        loader = _Loader(text)
        while loader.check_node():
            # Composing costs the document's bytes; what it expands to is counted as it is built.
            # Every document counts, an empty one (`---`) too: each costs a parse.
            node = loader.get_node()
            spent.documents += 1
            line, col = _pos(node) if node is not None else (1, 1)
            if index >= MAX_DOCUMENTS_PER_FILE:
                diagnostics.append(Diagnostic(file, line, col, exceeded(
                    "documents per file", MAX_DOCUMENTS_PER_FILE, "documents") + "; split the file"))
                break
            if spent.documents > MAX_DOCUMENTS:
                spent.exhausted = "documents per run"
                diagnostics.append(Diagnostic(file, line, col, exceeded(
                    "documents per run", MAX_DOCUMENTS, "documents") + "; stopped reading here"))
                break
            if node is None or (isinstance(node, ScalarNode) and node.tag == "tag:yaml.org,2002:null"):
                index += 1
                continue
            doc = RawDocument(file, index, line, col, None)
            try:
                doc.data = _Builder(doc, diagnostics, spent).build(node, (), 0)
            except _TooLarge as exc:
                # Point at the top-level key whose value blew up: an alias's own mark is where
                # the anchor was defined, which is not where the problem is.
                l2, c2 = doc.position(exc.path[:1])
                diagnostics.append(Diagnostic(file, l2, c2, exc.message, _dotted(exc.path[:1])))
                doc.data = None
                if isinstance(exc, _RunSpent):
                    spent.exhausted = exc.message
                    documents.append(doc)
                    break
            documents.append(doc)
            index += 1
    except yaml.MarkedYAMLError as exc:
        diagnostics.append(_yaml_error(exc, file, text))
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow
        line = text[: exc.position].count("\n") + 1
        col = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        diagnostics.append(
            Diagnostic(file, line, col, f"character {exc.character!r} is not allowed in YAML",
                       hint="remove control characters; is this file binary?")
        )
    except yaml.YAMLError as exc:  # errors without a mark
        diagnostics.append(Diagnostic(file, 1, 1, f"invalid YAML: {exc}"))
    except RecursionError:
        diagnostics.append(Diagnostic(file, 1, 1, f"document is nested deeper than {MAX_DEPTH} levels"))
    finally:
        if loader is not None:
            loader.dispose()
    if not documents and not diagnostics:
        diagnostics.append(
            Diagnostic(file, 1, 1, "file holds no document",
                       hint="a spec file needs apiVersion, kind, metadata and spec; delete empty files")
        )
    return documents, diagnostics


def _yaml_error(exc: yaml.MarkedYAMLError, file: str, text: str) -> Diagnostic:
    mark = exc.problem_mark or exc.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    at = text[mark.index] if mark is not None and 0 <= mark.index < len(text) else ""
    problem = exc.problem or "syntax error"
    message = f"invalid YAML: {problem}"
    if exc.context:
        message += f" ({exc.context}"
        if exc.context_mark and exc.context_mark is not mark:
            message += f" on line {exc.context_mark.line + 1}"
        message += ")"
    hint = ""
    if at == "\t" or "\\t" in problem:
        hint = "YAML indentation must use spaces, not tabs"
    elif "mapping values are not allowed" in problem:
        hint = "a value containing ': ' must be quoted, or the indentation is off"
    return Diagnostic(file, line, col, message, hint=hint)
