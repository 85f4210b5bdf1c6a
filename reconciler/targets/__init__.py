"""Targets: where rendered manifests become live (see `base.Target`)."""
