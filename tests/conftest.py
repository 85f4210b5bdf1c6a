"""Shared test set-up. The real cluster and Prometheus fixtures live in tests/cluster_fixtures.py."""

pytest_plugins = ["tests.cluster_fixtures"]
