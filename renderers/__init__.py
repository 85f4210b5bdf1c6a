"""Renderers: specs → Kubernetes manifests (Argo Workflows, Seldon deployments, Prometheus objects).

Pure functions: no I/O, no clock, no randomness (search trials come from a generator seeded by the
spec itself), so the same specs always give byte-identical manifests. They import only `specs`.
"""

from renderers.bundle import RenderContext, ServingState, render
from renderers.errors import RenderError
from renderers.scheduling import Schedule, SchedulingError, schedule_resources

__all__ = ["RenderContext", "RenderError", "Schedule", "SchedulingError", "ServingState", "render", "schedule_resources"]
