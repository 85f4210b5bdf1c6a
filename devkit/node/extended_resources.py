"""GPUs on a CPU node: the node advertises extended resources (``nvidia.com/gpu: 8``, …) and the labels
of the pools' flavors, so Kueue's quota arithmetic and the scheduler's fit are real while the containers
never touch a device.

This is Kubernetes' own way to advertise a node-level extended resource ("Advertise Extended Resources
for a Node" in its docs): a patch of the Node's ``status.capacity``. The kubelet keeps a capacity it
does not manage (it rewrites only cpu, memory, pods, hugepages, ephemeral storage and its device
plugins' resources) and derives ``allocatable`` from every capacity entry, so the patch sets both, and
they stay until the node stops. Other node modules' pods ask no such resource and are unaffected.
"""

from __future__ import annotations

from collections.abc import Mapping

from kubernetes import client

from devkit.node.node import Node


def advertise(node: Node, resources: Mapping[str, str], labels: Mapping[str, str] | None = None) -> None:
    """Give ``node`` the extended ``resources`` (name → quantity, in both capacity and allocatable)
    and the node ``labels`` (e.g. the ones a pool's ``nodeSelector`` names)."""
    api = node.api()
    try:
        core = client.CoreV1Api(api)
        if labels:
            core.patch_node(node.name, {"metadata": {"labels": dict(labels)}})
        core.patch_node_status(node.name, {"status": {"capacity": dict(resources), "allocatable": dict(resources)}})
    finally:
        api.close()


def advertised(node: Node) -> dict[str, str]:
    """The node's allocatable resources as the API server reports them (quantities as strings)."""
    api = node.api()
    try:
        status = client.CoreV1Api(api).read_node(node.name).status
        return dict(status.allocatable or {})
    finally:
        api.close()
