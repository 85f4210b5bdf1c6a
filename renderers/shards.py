"""A sharded Dataset's preparation as an Argo fan-out: one memoized task per group of shards,
bounded by the fan-out's own `parallelism`, then the join (renderers/workflow.py names it
`prepare-data`, the step every later step reads its data from).

    pipeline ─▶ prepare-shards   (a DAG template, `parallelism: shards.parallelism`)
                  └─ group        withItems: [group identity, …] → memoized-prepare-group(key)
                                     └─ prepare-group (the pod: `python -m runtimes prepare-group --group {{item}}`)
             ─▶ prepare-data      join-shards: manifest, root digest checked against the spec

Why `withItems` of the groups' identities rather than `withSequence` or `withParam`: the shards are
pinned in the spec, so the fan-out's width and every group's identity are known when the Workflow
is rendered (the plan names the groups that re-prepare), and each item carries what its memoize
key needs — a `withSequence` item is only a number, which cannot key a cache by the group's
content, and `withParam` exists for lists produced at run time, which this one is not. The key is
`<namespace>-prepare-group-<image>-<group identity>`: a group whose shards, position and settings
are unchanged is a cache hit in any later version of the data set.

Why a DAG template of its own: Argo's template-level `parallelism` bounds the running children of
that template, so the groups are bounded by `shards.parallelism` without changing how many
training trials run at once (the Workflow's `parallelism`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specs.dataset import DatasetSpec

FAN_OUT_TASK = "prepare-shards"
ITEM_TASK = "group"
GROUP_TEMPLATE = "prepare-group"
MEMOIZED_GROUP_TEMPLATE = "memoized-prepare-group"
CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
#: Read from the Secret when present (an S3-compatible store's address, its region, a temporary credential's token).
OPTIONAL_KEYS = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_SESSION_TOKEN")


@dataclass(frozen=True)
class FanOut:
    """The groups of a fan-out step: each item's identity, and how many run at once."""

    items: tuple[str, ...]
    parallelism: int


def image_tag(image: str) -> str:
    """Eight hex digits of the image: a group prepared by another runtime image is not a hit."""
    return hashlib.sha256(image.encode()).hexdigest()[:8]


def credentials_env(spec: DatasetSpec) -> list[dict[str, Any]]:
    """The S3 credentials of an `s3://` source, from its Secret only (keys named as the AWS SDKs
    and Arrow read them); nothing for other sources."""
    shards = spec.source.shards
    if shards is None or shards.credentials_secret is None:
        return []
    ref = shards.credentials_secret
    env = [{"name": k, "valueFrom": {"secretKeyRef": {"name": ref, "key": k}}} for k in CREDENTIAL_KEYS]
    env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": ref, "key": k, "optional": True}}} for k in OPTIONAL_KEYS]
    return env


def fan_out_templates(fan_out: FanOut, pod: dict[str, Any], namespace: str, image: str,
                      cache_configmap: str) -> list[dict[str, Any]]:
    """The fan-out's DAG template, the memoized wrapper of one group and the group's pod template
    (``pod``: the step's rendered template, named GROUP_TEMPLATE, whose container already passes
    ``--group {{inputs.parameters.group}}``)."""
    group_param = [{"name": "group"}]
    pod = {k: v for k, v in pod.items() if k != "outputs"}  # a group reports through group.json
    pod.update(name=GROUP_TEMPLATE, inputs={"parameters": group_param})
    wrapper = {
        "name": MEMOIZED_GROUP_TEMPLATE,
        "inputs": {"parameters": group_param},
        "memoize": {"key": f"{namespace}-{GROUP_TEMPLATE}-{image_tag(image)}-{{{{inputs.parameters.group}}}}",
                    "maxAge": "8760h", "cache": {"configMap": {"name": cache_configmap}}},
        "dag": {"tasks": [{"name": GROUP_TEMPLATE, "template": GROUP_TEMPLATE,
                           "arguments": {"parameters": [{"name": "group", "value": "{{inputs.parameters.group}}"}]}}]},
    }
    dag = {
        "name": FAN_OUT_TASK,
        "parallelism": fan_out.parallelism,
        "dag": {"tasks": [{"name": ITEM_TASK, "template": MEMOIZED_GROUP_TEMPLATE, "withItems": list(fan_out.items),
                           "arguments": {"parameters": [{"name": "group", "value": "{{item}}"}]}}]},
    }
    return [dag, wrapper, pod]


def fan_out_steps(templates: Mapping[str, Mapping[str, Any]], template: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(node name, memoize key, pod template) of each item of a fan-out DAG template rendered by
    :func:`fan_out_templates`, with the item substituted as Argo substitutes it; empty for any
    other template."""
    out = []
    for task in (template.get("dag") or {}).get("tasks", []):
        wrapper = templates.get(task.get("template", ""), {})
        inner = (wrapper.get("dag") or {}).get("tasks", [])
        if "withItems" not in task or "memoize" not in wrapper or len(inner) != 1:
            continue
        pod = dict(templates.get(inner[0]["template"], {}))
        for i, item in enumerate(task["withItems"]):
            key = wrapper["memoize"]["key"].replace("{{inputs.parameters.group}}", str(item))
            out.append((f"{task['name']}({i}:{item})", key, pod))
    return out
