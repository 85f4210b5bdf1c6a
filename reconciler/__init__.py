"""Forge's control plane: loading specs, diffing desired against live state, planning, applying,
and driving rollouts. Only the target modules talk to a cluster, git or Prometheus."""
