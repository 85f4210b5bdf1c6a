"""Content-addressed identities: model versions and the cache key of every workflow step.

A step's key digests what determines its output — its config (which holds the dataset digest
and hyperparameters), the runtime image (code version) and the keys of the steps it consumes — so
an unchanged key is a cache hit (Argo `memoize`, and the local target's step cache) and a changed
key explains *why* a step re-runs.
"""

from __future__ import annotations

from typing import Any

from renderers.labels import digest
from specs import Model, SpecSet

VERSION_LENGTH = 12


def step_key(step: str, config: dict[str, Any], image: str, upstream: list[str]) -> str:
    """The cache key of one step."""
    return digest({"step": step, "config": config, "image": image, "upstream": sorted(upstream)})


def model_version(specs: SpecSet, model: Model, image_tag: str, _seen: frozenset[str] = frozenset()) -> str:
    """Version of a Model: a digest of everything its workflow depends on — its spec, its dataset's
    digest, its compression, its teachers' versions and the runtime version."""
    dataset = specs.dataset_of(model)
    compression = specs.compression_of(model)
    teachers = {}
    if compression is not None:
        for name in specs.teachers_of(compression):
            teacher = specs.get(Model, name)
            if teacher is not None and name != model.name and name not in _seen:
                teachers[name] = model_version(specs, teacher, image_tag, _seen | {model.name})
    return digest(
        {
            "model": model.spec.model_dump(mode="json", by_alias=True),
            "dataset": dataset.spec.digest,
            "compression": compression.spec.model_dump(mode="json", by_alias=True) if compression else None,
            "teachers": teachers,
            "runtime": image_tag,
        }
    )[:VERSION_LENGTH]
