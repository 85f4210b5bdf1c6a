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

from reconciler.diagnostics import Diagnostic, clip


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
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_NODES = 100_000
MAX_DEPTH = 64

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


class _Builder:
    """Builds Python values from a composed node, recording positions."""

    def __init__(self, doc: RawDocument, diagnostics: list[Diagnostic]) -> None:
        self.doc = doc
        self.diagnostics = diagnostics
        self.count = 0
        self.constructor = yaml.constructor.SafeConstructor()

    def build(self, node: Node, path: Path, depth: int) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise _TooLarge(path, f"document expands to more than {MAX_NODES} values (an alias bomb?)")
        if depth > MAX_DEPTH:
            raise _TooLarge(path, f"document is nested deeper than {MAX_DEPTH} levels")
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
            return self.constructor.construct_object(node, deep=True)
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
                    key = str(self.constructor.construct_object(key_node))
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


def _tag_name(tag: str) -> str:
    return "`!!" + tag.removeprefix("tag:yaml.org,2002:") + "`" if tag.startswith("tag:yaml.org,2002:") else f"`{tag}`"


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "problem", None) or exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "Exceeds the limit" in text and "digits" in text:
        return "the integer has more than 4300 digits"
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


def parse_documents(text: str, file: str) -> tuple[list[RawDocument], list[Diagnostic]]:
    """Every non-empty document of a YAML stream, with positions, and the problems found."""
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
            node = loader.get_node()
            if node is None or (isinstance(node, ScalarNode) and node.tag == "tag:yaml.org,2002:null"):
                index += 1
                continue
            line, col = _pos(node)
            doc = RawDocument(file, index, line, col, None)
            try:
                doc.data = _Builder(doc, diagnostics).build(node, (), 0)
            except _TooLarge as exc:
                # Point at the top-level key whose value blew up: an alias's own mark is where
                # the anchor was defined, which is not where the problem is.
                l2, c2 = doc.position(exc.path[:1])
                diagnostics.append(Diagnostic(file, l2, c2, exc.message, _dotted(exc.path[:1])))
                doc.data = None
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
