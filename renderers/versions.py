"""Content-addressed identities: model versions and the cache key of every workflow step.

A step's key digests what determines its output — its config (which holds the dataset digest
and hyperparameters), the runtime image (code version) and the keys of the steps it consumes — so
an unchanged key is a cache hit (Argo `memoize`, and the local target's step cache) and a changed
key explains *why* a step re-runs.
"""

from __future__ import annotations

from typing import Any

from renderers.labels import digest
from renderers.scheduling import schedule_resources
from specs import Environment, Model, SpecSet

VERSION_LENGTH = 12


def step_key(step: str, config: dict[str, Any], image: str, upstream: list[str]) -> str:
    """The cache key of one step."""
    return digest({"step": step, "config": config, "image": image, "upstream": sorted(upstream)})


def model_version(specs: SpecSet, model: Model, env: Environment, _seen: frozenset[str] = frozenset()) -> str:
    """Version of a Model: a digest of everything its workflow depends on — its spec, its dataset's
    digest, its compression, its teachers' versions, the runtime version, and where it trains.

    Where it trains is the accelerator and the job's width (GPUs, nodes) that
    `schedule_resources` derives from the pool: they change the result (global batch, numerics)
    and, because Argo never re-runs a Workflow whose spec is updated in place, a different width
    must be a new Workflow. Pure placement (node selector, tolerations, priority) is not part of
    the version: it changes where the next run lands, not what it produces."""
    dataset = specs.dataset_of(model)
    compression = specs.compression_of(model)
    compute = specs.compute_of(model, env)
    schedule = schedule_resources(model, dataset, compute)
    teachers = {}
    if compression is not None:
        for name in specs.teachers_of(compression):
            teacher = specs.get(Model, name)
            if teacher is not None and name != model.name and name not in _seen:
                teachers[name] = model_version(specs, teacher, env, _seen | {model.name})
    return digest(
        {
            "model": model.spec.result_dump(),
            "dataset": dataset.spec.digest,
            "compression": compression.spec.model_dump(mode="json", by_alias=True) if compression else None,
            "teachers": teachers,
            "runtime": env.spec.image_tag,
            "training": {"accelerator": compute.spec.accelerator.type, "resource": schedule.resource_name,
                         "gpus": schedule.gpus, "nodes": schedule.nodes},
        }
    )[:VERSION_LENGTH]
