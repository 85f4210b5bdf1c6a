"""Ownership metadata on every rendered object, and the stable hashing it relies on."""

from __future__ import annotations

import hashlib
import json
import weakref
from typing import Any

from specs import Document

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "forgectl"
PREFIX = "forge.dev/"
KIND = PREFIX + "kind"
NAME = PREFIX + "name"
ENVIRONMENT = PREFIX + "environment"
SPEC_DIGEST = PREFIX + "spec-digest"
GIT_REVISION = PREFIX + "git-revision"
MODEL_VERSION = PREFIX + "model-version"
ENDPOINT = PREFIX + "endpoint"
VARIANT = PREFIX + "variant"
ROLE = PREFIX + "role"
PRUNE = PREFIX + "prune"
STEP = PREFIX + "step"
#: On a SeldonDeployment whose experiment is sticky: `header:<name>` or `cookie:<name>`. Seldon v1
#: has no per-user routing; the local target's router hashes on it.
STICKY = PREFIX + "sticky"
#: On a SeldonDeployment whose traffic another router splits (`gatewayAPI`: its HTTPRoute); absent: Seldon's own.
TRAFFIC_ROUTER = PREFIX + "traffic-router"
#: On a Workflow: how many distillation teachers deep it is (0: none). Teachers apply first, so
#: the local target, which runs a Workflow to its end during apply, never waits on a later one.
TRAINING_STAGE = PREFIX + "training-stage"


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the bytes every digest in Forge is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(value: Any) -> str:
    """sha256 hex of ``value``'s canonical JSON."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


#: spec_digest by document identity: documents are frozen, and one is rendered into several objects
#: (an Endpoint into four), each carrying its digest. An entry lives as long as its document.
_SPEC_DIGESTS: dict[int, tuple[weakref.ref[Document], str]] = {}


def spec_digest(doc: Document) -> str:
    """Digest of a spec document's meaningful content (apiVersion, kind, name, labels, spec)."""
    key = id(doc)
    cached = _SPEC_DIGESTS.get(key)
    if cached is not None and cached[0]() is doc:
        return cached[1]
    data = doc.model_dump(mode="json", by_alias=True)
    data["metadata"].pop("annotations", None)
    value = digest(data)

    def forget(_: object) -> None:
        _SPEC_DIGESTS.pop(key, None)

    _SPEC_DIGESTS[key] = (weakref.ref(doc, forget), value)
    return value


def owner_metadata(
    doc: Document, *, name: str, namespace: str, environment: str, revision: str | None,
    labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`metadata` of an object rendered from ``doc``: the user's labels, then Forge's ownership
    labels (which win), and the spec digest and git revision as annotations."""
    all_labels = {**doc.metadata.labels, **(labels or {})}
    all_labels.update({MANAGED_BY: MANAGER, KIND: doc.kind, NAME: doc.name, ENVIRONMENT: environment})
    all_annotations = {**doc.metadata.annotations, **(annotations or {}), SPEC_DIGEST: spec_digest(doc)}
    if revision:
        all_annotations[GIT_REVISION] = revision
    return {
        "name": name,
        "namespace": namespace,
        "labels": dict(sorted(all_labels.items())),
        "annotations": dict(sorted(all_annotations.items())),
    }


def owner_selector(environment: str) -> str:
    """Label selector of every object Forge owns in ``environment``."""
    return f"{MANAGED_BY}={MANAGER},{ENVIRONMENT}={environment}"
