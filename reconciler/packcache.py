"""A cache of JSON entries on disk, keyed by content digests, that a run reads and writes whole.

One *pack* is one file holding the entries of one scope (the specs under some paths, the renders of
one Environment): a plan reads its pack once (one pass over its lines, one entry per line) rather
than one file per entry — 10,000 endpoints would be 20,000 files — and writes it back once, with
only the entries this run used, so a pack never grows past what the tree it serves needs. An entry
per line keeps the read's memory at the entries themselves: decoding a 260 MB pack as one JSON
document held the parser's own copy of it beside the result (a 10,000-endpoint plan's peak RSS,
1.8 GB, was that moment).

Why it can be trusted no further than it is checked:

- **Keys are content digests.** Each entry's key is a digest of everything its value depends on
  (the caller's business: the bytes of a spec file, a spec's documents and the renderer code), so
  an entry found is an entry of the same content; the pack's name only groups entries, and a tree
  whose files name another tree's pack can only add entries under its own contents' digests.
- **A damaged pack is ignored, never used.** The first line holds the sha256 of the rest; a pack
  whose digest, format or code version differs reads as empty (everything is recomputed, and the
  next write replaces it).
- **Writes are atomic.** A pack is written to a temporary file in its folder and renamed over the
  old one: a concurrent reader sees the old pack or the new one, never half of one; of two runs
  writing at once the last rename wins, and both packs are whole.
- **Bounded.** A pack over :data:`MAX_PACK_BYTES` is not written; a folder keeps its
  :data:`MAX_PACKS` most recently written packs and removes older ones.

The cache lives in ``$FORGE_CACHE`` (default ``~/.cache/forge``), the folder Forge's heavy builds
use: outside every repository, so nothing a pull request's files say reaches it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from reconciler.heap import gc_paused
from renderers.labels import digest

__all__ = ["FORMAT", "MAX_PACKS", "MAX_PACK_BYTES", "Pack", "cache_root"]

#: The first word of every pack (its format, bumped when the layout changes): 2 is one entry per line.
FORMAT = "forge-pack-2"
#: Bytes of one pack (10,000 endpoints' renders take about 160 MB); a larger one is not written.
MAX_PACK_BYTES = 1024 * 1024 * 1024
#: Packs kept per folder (the most recently written).
MAX_PACKS = 32


def cache_root() -> Path:
    """``$FORGE_CACHE``, else ``~/.cache/forge``."""
    return Path(os.environ.get("FORGE_CACHE") or Path.home() / ".cache" / "forge")


class Pack:
    """The entries of one scope: :meth:`get` what an earlier run stored, :meth:`put` what this run
    computed, :meth:`save` the entries this run used (read or put) in place of the old pack.

    ``version`` names the code that made the values (a digest of it): a pack of another version
    reads as empty."""

    def __init__(self, folder: Path, scope: Mapping[str, Any], version: str) -> None:
        self.path = folder / f"{digest(dict(scope))[:32]}.pack"
        self.version = version
        self._old: dict[str, Any] = self._read()
        self._used: dict[str, Any] = {}
        self.hits = 0
        self.misses = 0

    def _read(self) -> dict[str, Any]:
        entries: dict[str, Any] = {}
        h = hashlib.sha256()
        try:
            with self.path.open("rb") as f:
                fields = f.readline(256).split()
                if len(fields) != 3 or fields[0].decode(errors="replace") != FORMAT or \
                        fields[1].decode(errors="replace") != self.version:
                    return {}
                shared: dict[str, str] = {}
                with gc_paused():  # a pack is tens of thousands of acyclic containers
                    for line in f:  # an entry at a time: never the whole pack decoded at once
                        h.update(line)
                        entry = _decode(line)
                        if not isinstance(entry, dict) or len(entry) != 1:
                            return {}
                        _share_strings(entry, shared.setdefault)
                        entries.update(entry)
        except (OSError, ValueError):  # unreadable, or a line that is no JSON (damaged)
            return {}
        if h.hexdigest().encode() != fields[2]:
            return {}  # damaged: ignored, and replaced by the next save
        return entries

    def get(self, key: str) -> Any:
        """The value stored under ``key`` by an earlier run or put by this one (a pull request's
        head finds what its base's render just stored), or None."""
        value = self._used.get(key)
        if value is None:
            value = self._old.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._used[key] = value
        return value

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON) under ``key`` for the next run."""
        self._used[key] = value
        self._dirty = True

    _dirty = False

    def save(self) -> None:
        """Write the entries this run used, atomically, unless they are exactly the pack read;
        then drop the folder's oldest packs past :data:`MAX_PACKS`. A write that fails (a full or
        read-only disk) leaves the old pack: the cache is an optimisation, never a requirement.

        The body is streamed to the file (a pack of 10,000 endpoints is hundreds of MB: no second
        copy of it in memory) and its digest written into the header after."""
        if not self._dirty and self._used.keys() == self._old.keys():
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".pack-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w+b") as out:
                    prefix = f"{FORMAT} {self.version} ".encode()
                    out.write(prefix + b"0" * 64 + b"\n")
                    start = out.tell()
                    with gc_paused():  # one entry at a time, each by the C encoder, each on its line
                        for key, value in self._used.items():
                            out.write(b"{" + _encode_entry(key, value) + b"}\n")
                            if out.tell() - start > MAX_PACK_BYTES:
                                raise _TooLarge
                    out.seek(start)
                    h = hashlib.sha256()
                    while block := out.read(1 << 20):
                        h.update(block)
                    out.seek(len(prefix))
                    out.write(h.hexdigest().encode())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            # What is on disk now: saving again (several renders share a pack) writes only what is new.
            self._old, self._dirty = dict(self._used), False
            _prune(self.path.parent)
        except (OSError, _TooLarge):
            return


def _decode(body: bytes) -> Any:
    """One line of a pack as JSON: by orjson (several times faster); a line that is not valid UTF-8
    (a file name that is not, written with surrogateescape) by the standard library, so such a
    name comes back as the same str."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body.decode("utf-8", "surrogateescape"))


#: Strings up to this long are shared between a pack's entries (:func:`_share_strings`): the
#: repeated ones (names, labels, images, quantities) are short; a long one is a unit's own.
SHARED_STRING_LENGTH = 64


def _share_strings(value: Any, share: Callable[[str, str], str]) -> None:
    """Replace, in place, each short string value of ``value`` by the one instance ``share`` keeps
    of it (a table's ``setdefault``). A decoder makes a new string for every value, where a render
    reused one: 10,000 endpoints' decoded pack held 880 MiB, 660 MiB with its strings shared, for
    about a second of this walk (mapping keys are shared by orjson itself)."""
    if isinstance(value, dict):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return
    for key, item in items:  # values replaced, no key added: iterating is safe
        if type(item) is str:
            if len(item) <= SHARED_STRING_LENGTH:
                value[key] = share(item, item)
        elif isinstance(item, (dict, list)):
            _share_strings(item, share)


def _encode_entry(key: str, value: Any) -> bytes:
    """``"key":value`` as compact UTF-8 JSON, for :meth:`Pack.save`: by orjson, or by the standard
    library for what orjson refuses (a str with surrogates: a file name that is not UTF-8; a key
    that is no str), which it writes as the same bytes. Never a raw newline (JSON escapes it in a
    string), so an entry is one line."""
    try:
        return orjson.dumps({key: value})[1:-1]
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return (json.dumps({key: value}, separators=(",", ":"), ensure_ascii=False)[1:-1]
                .encode("utf-8", "surrogateescape"))


class _TooLarge(Exception):
    """A pack past :data:`MAX_PACK_BYTES`: not written."""


def _prune(folder: Path) -> None:
    """Remove all but the :data:`MAX_PACKS` most recently written packs of ``folder``."""
    packs = []
    for entry in os.scandir(folder):
        if entry.name.endswith(".pack"):
            try:
                packs.append((entry.stat().st_mtime, entry.path))
            except OSError:
                continue  # removed meanwhile by another run's prune
    for _, path in sorted(packs, reverse=True)[MAX_PACKS:]:
        Path(path).unlink(missing_ok=True)
