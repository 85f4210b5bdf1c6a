"""Queued GPU pools for the harnesses that put Kueue to work (tests/cluster/test_kueue_node.py,
tests/cluster/test_runtime_node.py stages 7 and 8, bench/queue_day.py): one place that writes a
`Compute` pool with a `queue` and an Environment for a namespace, and loads them as forgectl loads
specs, so the node tests and the bench measure the same rendered objects."""

from __future__ import annotations

import json
from collections.abc import Mapping

from reconciler.load.loader import load_files
from reconciler.load.sources import SourceFile
from specs import Compute, Environment, SpecSet

#: The node label the fake GPUs come with (devkit.node.extended_resources) and the pools select.
GPU_NODE_LABELS = {"forge.dev/test-gpu": "h100"}


def environment(namespace: str, name: str = "cluster") -> str:
    """A `kubernetes` Environment of ``namespace`` (YAML)."""
    return f"""\
apiVersion: forge.dev/v1alpha1
kind: Environment
metadata: {{name: {name}}}
spec:
  target: kubernetes
  kubernetes: {{namespace: {namespace}}}
"""


def queued_pool(name: str, *, gpus_per_node: int, min_gpus: int, max_gpus: int, quota: int,
                node: tuple[str, str] = ("2", "2Gi"), cohort: str | None = None, borrowing_limit: int | None = None,
                node_labels: Mapping[str, str] = GPU_NODE_LABELS) -> str:
    """A `high` Compute pool of H100s on the nodes labelled ``node_labels``, queued with ``quota``
    GPUs (in ``cohort``, borrowing up to ``borrowing_limit`` more), each job's pod asking ``node``'s
    (cpu, memory) (YAML)."""
    queue = (f"    cohort: {cohort}\n" if cohort else "") + f"    quota: {{gpus: {quota}}}\n"
    if borrowing_limit is not None:
        queue += f"    borrowingLimit: {{gpus: {borrowing_limit}}}\n"
    return f"""\
apiVersion: forge.dev/v1alpha1
kind: Compute
metadata: {{name: {name}}}
spec:
  accelerator: {{type: nvidia-h100-80gb}}
  gpusPerNode: {gpus_per_node}
  minGpus: {min_gpus}
  maxGpus: {max_gpus}
  priority: high
  nodeSelector: {json.dumps(dict(node_labels))}
  node: {{cpu: "{node[0]}", memory: {node[1]}}}
  queue:
""" + queue


def load_pool(text: str, pool: str, filename: str = "pool.yaml") -> tuple[Compute, Environment, SpecSet]:
    """The pool named ``pool`` and the `cluster` Environment of ``text``, loaded and validated as
    forgectl loads specs (a ValueError with the diagnostics when they do not load)."""
    result = load_files([SourceFile(filename, text.encode())])
    if not result.ok:
        raise ValueError(f"{filename}: {result.diagnostics}")
    compute, env = result.specs.get(Compute, pool), result.specs.get(Environment, "cluster")
    if compute is None or env is None:
        raise ValueError(f"{filename}: no Compute {pool!r} and Environment 'cluster'")
    return compute, env, result.specs
