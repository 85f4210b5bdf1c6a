"""The plan's render cache: an unchanged Model's Workflow or Endpoint's objects are looked up on
disk instead of rendered (:class:`renderers.bundle.RenderMemo`), with the digest each object's
apply records (:mod:`reconciler.applied`) stored beside it, so the plan's digest compare costs a
lookup too.

An entry is found by a digest of the unit's own document (all of it, annotations included), the
Environment's, the facts of the render (namespace, revision, what the endpoint serves) and the
code that renders (:func:`code_version`: the renderers', the specs' and the digest's source, the
Python and pydantic versions). It holds the documents the render read through the SpecSet (the
dataset, the compute pool, the policy, a teacher…) with their digests; it is answered only while
every one of them is unchanged. So a changed spec re-renders its own objects and those of the
units that read it, a new renderer or Environment re-renders everything, and a damaged pack is
ignored (:mod:`reconciler.packcache`).

The cache is kept in ``$FORGE_CACHE/render/`` (default ``~/.cache/forge``), one pack per
Environment and namespace, outside every repository.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import pydantic

import renderers
import specs as specs_package
from reconciler import applied
from reconciler.applied import desired_digest
from reconciler.packcache import Pack, cache_root
from reconciler.resources import ObjectRef
from renderers.bundle import Used
from renderers.labels import digest
from specs import KINDS, Document, Environment, SpecSet

__all__ = ["RenderCache", "code_version"]


@lru_cache(maxsize=1)
def code_version() -> str:
    """A digest of what decides a render's output besides its inputs: the source of `renderers/`,
    `specs/` and :mod:`reconciler.applied` (the recorded digest), and the Python and pydantic
    versions (a spec's JSON dump is pydantic's)."""
    h = hashlib.sha256(f"{sys.version}\0{pydantic.VERSION}\0".encode())
    roots = [Path(renderers.__file__).parent, Path(specs_package.__file__).parent]
    for path in sorted(p for root in roots for p in root.rglob("*.py")) + [Path(applied.__file__)]:
        h.update(str(path.relative_to(path.parents[1])).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:32]


class RenderCache:
    """A :class:`renderers.bundle.RenderMemo` on disk for one Environment and namespace; :meth:`save`
    after the render. :attr:`digests` holds the recorded digest of every object recalled or kept."""

    def __init__(self, environment: Environment, namespace: str, folder: Path | None = None, *,
                 pack: Pack | None = None) -> None:
        self.environment = environment
        self.namespace = namespace
        self.folder = folder or cache_root() / "render"
        self.pack = pack or Pack(self.folder, {"environment": environment.name, "namespace": namespace}, code_version())
        self.digests: dict[ObjectRef, str] = {}
        #: Units answered from the cache, and units rendered and stored, by this render.
        self.recalled = 0
        self.kept = 0
        self._doc_digests: dict[int, tuple[Document, str]] = {}
        #: What :meth:`recall` answered, by key: asked again (a Model's version before the render,
        #: then its Workflow in it) it answers at once and counts once.
        self._answered: dict[str, tuple[list[dict[str, Any]], Any]] = {}

    def another(self, environment: Environment, namespace: str) -> RenderCache:
        """The cache of another render in the same run (a pull request renders its base, its head
        and the head against the cluster): on this one's pack when the Environment's name and the
        namespace are the same (one read, one write), with its own digests and answers. Its
        :meth:`save` is needed only when the scope differs; saving a shared pack twice writes once."""
        if (environment.name, namespace) == (self.environment.name, self.namespace):
            return RenderCache(environment, namespace, self.folder, pack=self.pack)
        return RenderCache(environment, namespace, self.folder)

    def document_digest(self, doc: Document) -> str:
        """Digest of all of ``doc`` (annotations too: they reach the rendered objects), over
        pydantic's own JSON of it: its field order is the model's, so the same document gives the
        same bytes under one :func:`code_version` (a mapping written in another key order only
        misses the cache); several times faster than the canonical JSON of its dump."""
        known = self._doc_digests.get(id(doc))
        if known is not None and known[0] is doc:
            return known[1]
        value = hashlib.sha256(doc.model_dump_json(by_alias=True).encode()).hexdigest()
        self._doc_digests[id(doc)] = (doc, value)
        return value

    def _key(self, unit: Document, facts: Mapping[str, Any]) -> str:
        return digest({"unit": [unit.kind, unit.name, self.document_digest(unit)],
                       "environment": self.document_digest(self.environment), "facts": dict(facts)})

    def _read_digest(self, specs: SpecSet, kind: str, name: str) -> str | None:
        doc = specs.get(KINDS[kind], name) if kind in KINDS else None
        return self.document_digest(doc) if doc is not None else None

    def recall(self, unit: Document, facts: Mapping[str, Any], specs: SpecSet) -> tuple[list[dict[str, Any]], Any] | None:
        """The entry of this unit, document and facts, if every document it read is unchanged."""
        key = self._key(unit, facts)
        answered = self._answered.get(key)
        if answered is not None:
            return answered
        entry = self.pack.get(key)
        if not _well_formed(entry):
            return None
        for kind, name, recorded in entry["used"]:
            if self._read_digest(specs, kind, name) != recorded:
                return None
        objects: list[dict[str, Any]] = entry["objects"]
        for obj, value in zip(objects, entry["digests"], strict=True):
            self.digests[ObjectRef.of(obj)] = value
        self.recalled += 1
        self._answered[key] = objects, entry["note"]
        return self._answered[key]

    def keep(self, unit: Document, facts: Mapping[str, Any], used: Used, objects: list[dict[str, Any]], note: Any,
             specs: SpecSet) -> None:
        """Store what the unit rendered, the documents it read (with their digests in ``specs``)
        and each object's recorded digest."""
        self.kept += 1
        values = [desired_digest(obj) for obj in objects]
        for obj, value in zip(objects, values, strict=True):
            self.digests[ObjectRef.of(obj)] = value
        self.pack.put(self._key(unit, facts), {
            "used": [[kind, name, self._read_digest(specs, kind, name)] for kind, name in used],
            "objects": objects, "digests": values, "note": note})

    def save(self) -> None:
        """Write the entries this render used (:meth:`reconciler.packcache.Pack.save`)."""
        self.pack.save()


def _well_formed(entry: Any) -> bool:
    """An entry of the shape :meth:`RenderCache.keep` writes (a pack whose digest matches may still
    come from an older writer: nothing in it is used unless its shape is right)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("used"), list) or not isinstance(entry.get("objects"), list):
        return False
    if not isinstance(entry.get("digests"), list) or len(entry["digests"]) != len(entry["objects"]) or "note" not in entry:
        return False
    return (all(isinstance(u, list) and len(u) == 3 and isinstance(u[0], str) and isinstance(u[1], str) for u in entry["used"])
            and all(isinstance(o, dict) and isinstance(o.get("kind"), str) and isinstance(o.get("metadata"), dict)
                    and isinstance(o["metadata"].get("name"), str) for o in entry["objects"])
            and all(isinstance(d, str) for d in entry["digests"]))
