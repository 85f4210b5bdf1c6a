"""Spec files read before, not parsed again: a file whose bytes (and name) an earlier run parsed
cleanly gives back the plain data of its documents from a pack on disk (:mod:`reconciler.packcache`)
instead of YAML parsing.

Only the parse is skipped. What the cache gives back is the very data the parse produced (an entry
is kept only when it survives JSON exactly: string keys, finite numbers), and every document is
then checked as a parsed one is — the safety scan and the kind's schema validation run on it again,
so what a document means is always what this code version says, and its errors are the same. A
file that had any problem when it was parsed is never kept: bad input is parsed again every time and
gets its file:line diagnostics from the parser. The positions of a cached document's values, which
only a diagnostic or a plan's risk note asks for, are taken by parsing that file again when first
asked (:class:`CachedDocument`). The budgets of the run are spent as the parse spent them, and a
file whose recorded spending would exceed one is parsed (and reported) as usual.

An entry's key is the sha256 of the file's name and bytes and of the parser's source
(:func:`parser_version`); the pack of the specs under some paths lives in ``$FORGE_CACHE/specs/``.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from reconciler import budgets
from reconciler.budgets import MAX_ALIAS_VALUES, MAX_DOCUMENTS, MAX_VALUES, Spent
from reconciler.load import yamlsource
from reconciler.load.sources import SourceFile
from reconciler.load.yamlsource import Position, RawDocument, decode, parse_documents
from reconciler.packcache import Pack, cache_root

__all__ = ["CachedDocument", "ParseCache", "parser_version"]


@lru_cache(maxsize=1)
def parser_version() -> str:
    """A digest of the parser's source (:mod:`reconciler.load.yamlsource`, the budgets it spends)
    and PyYAML's version: a new parser reads no older entry."""
    h = hashlib.sha256(f"{yaml.__version__}\0{yaml.__with_libyaml__}\0".encode())
    for module in (yamlsource, budgets):
        h.update(Path(str(module.__file__)).read_bytes() + b"\0")
    return h.hexdigest()[:32]


@dataclass
class CachedDocument(RawDocument):
    """A document given back by the cache: its data, file and place as parsed; the positions of its
    values are read by parsing ``source`` again the first time one is asked for."""

    source: bytes = b""
    filled: bool = False

    def position(self, path: yamlsource.Path, *, key: bool = False) -> Position:
        if not self.filled:
            self.filled = True
            text, _ = decode(self.source, self.file)
            parsed = parse_documents(text, self.file)[0] if text is not None else []
            again = next((d for d in parsed if d.index == self.index), None)
            if again is not None:
                self.values, self.keys = again.values, again.keys
        return super().position(path, key=key)


def _exact(value: Any, depth: int = 0) -> bool:
    """True when ``value`` comes back from JSON equal and of the same types."""
    if isinstance(value, str) or value is None or isinstance(value, (bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if depth > 200:
        return False
    if isinstance(value, list):
        return all(_exact(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _exact(v, depth + 1) for k, v in value.items())
    return False


class ParseCache:
    """The parses of the spec files under ``paths`` (:meth:`recall` before parsing a file,
    :meth:`keep` after a clean parse, :meth:`save` at the end of the load)."""

    def __init__(self, paths: Sequence[str], folder: Path | None = None) -> None:
        # A path need not be UTF-8 (a file name is bytes): the scope holds its bytes, in hex.
        scope = {"paths": sorted(os.fsencode(os.path.abspath(p)).hex() for p in paths)}
        self.pack = Pack(folder or cache_root() / "specs", scope, parser_version())

    @staticmethod
    def _key(source: SourceFile) -> str:
        return hashlib.sha256(os.fsencode(source.path) + b"\0" + source.data).hexdigest()

    def recall(self, source: SourceFile, spent: Spent) -> list[RawDocument] | None:
        """The documents of ``source`` as an earlier clean parse made them, with the run's budgets
        spent as that parse spent them; None when there is no such entry or it would exceed one."""
        entry = self.pack.get(self._key(source))
        if not isinstance(entry, dict):
            return None
        spend, docs = entry.get("spent"), entry.get("docs")
        if (not isinstance(spend, list) or len(spend) != 3 or not all(isinstance(n, int) for n in spend)
                or not isinstance(docs, list)):
            return None
        values, aliases, documents = spend
        if (spent.values + values > MAX_VALUES or spent.alias_values + aliases > MAX_ALIAS_VALUES
                or spent.documents + documents > MAX_DOCUMENTS):
            return None  # parsed as usual, which reports the budget where it runs out
        out: list[RawDocument] = []
        for doc in docs:
            if not (isinstance(doc, list) and len(doc) == 4 and all(isinstance(n, int) for n in doc[:3])):
                return None
            index, line, column, data = doc
            out.append(CachedDocument(source.path, index, line, column, data, source=source.data))
        spent.values += values
        spent.alias_values += aliases
        spent.documents += documents
        return out

    def keep(self, source: SourceFile, parsed: list[RawDocument], spent: tuple[int, int, int]) -> None:
        """Remember a clean parse of ``source`` (the caller's to say it was clean) and what it spent
        of the run's budgets (values, alias values, documents); kept only when its data survives
        JSON exactly."""
        if all(doc.data is not None and _exact(doc.data) for doc in parsed):
            self.pack.put(self._key(source), {"spent": list(spent),
                                             "docs": [[d.index, d.line, d.column, d.data] for d in parsed]})

    def save(self) -> None:
        """Write the entries this load used."""
        self.pack.save()
