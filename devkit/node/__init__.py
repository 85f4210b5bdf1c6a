"""A real one-node Kubernetes (containerd, kubelet, scheduler, controller-manager, kube-proxy)
joined to the test cluster's API server (node: Node, NodeError, default_state_dir), with the
controllers it runs: Argo (argo), Seldon (seldon), the Prometheus Operator (promop), Traefik as the
Gateway API implementation (traefik), Forge's runtime image (runtime_image). See
docs/test-cluster.md, "The node". This package imports none of its modules on purpose: each of them
imports the package first."""
