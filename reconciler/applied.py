"""What an apply records on each object it writes: the digest of the desired manifest Forge sent
(the annotation `forge.dev/desired-digest`), so a plan can tell from an object's metadata alone
whether Forge would send it the same thing again.

The digest is taken over the canonical JSON of the desired object without that annotation and
without the provenance annotations (the git revision: stamping a new revision alone changes no
object, see :data:`reconciler.plan.diff.PROVENANCE_ANNOTATIONS`). It is added by the target at
apply time, not by the renderers: it describes a write, not the specs, so rendered manifests,
goldens and the plan's `after`s stay as they are, and the local target, which has no metadata
read to make cheap, never carries it. The plan's diff ignores it like any provenance annotation.

A matching digest says Forge sent this desired state last; it does not say nobody edited the object
since (a drift made outside Forge keeps the annotation). That is what the full compare is for:
`forgectl diff` and `forgectl plan --refresh` (docs/targets.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from renderers.labels import GIT_REVISION, PREFIX, digest

#: The annotation an apply records on each object it writes.
DESIRED_DIGEST = PREFIX + "desired-digest"
#: Annotations left out of the digest: itself, and where the object came from (not what it is).
NOT_DIGESTED = frozenset({DESIRED_DIGEST, GIT_REVISION})


def desired_digest(obj: Mapping[str, Any]) -> str:
    """The digest of a desired manifest as an apply would record it (sha256 of the canonical JSON
    of ``obj`` less :data:`NOT_DIGESTED` annotations and any `resourceVersion` a write carries)."""
    meta = dict(obj.get("metadata") or {})
    meta.pop("resourceVersion", None)
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in NOT_DIGESTED}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    return digest({**obj, "metadata": meta})


def with_desired_digest(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` (a shallow copy) with its :data:`DESIRED_DIGEST` annotation set: what a target sends."""
    meta = dict(obj.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), DESIRED_DIGEST: desired_digest(obj)}
    return {**obj, "metadata": meta}


def recorded_digest(live: Mapping[str, Any]) -> str | None:
    """The digest the last apply recorded on a live object (its metadata is enough), or None."""
    return ((live.get("metadata") or {}).get("annotations") or {}).get(DESIRED_DIGEST)
