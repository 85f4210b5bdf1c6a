"""A real one-node Kubernetes (containerd, kubelet, scheduler, controller-manager, kube-proxy)
joined to the test cluster's API server. See docs/test-cluster.md, "The node"."""

from devkit.node.node import Node, NodeError, default_state_dir

__all__ = ["Node", "NodeError", "default_state_dir"]
