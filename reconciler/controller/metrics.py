"""The controller's own metrics (`/metrics`), registered once per process in their own registry
(as fluxcd/pkg `runtime/controller/metrics.go`): sync duration and result by source, how long a
walk of the rollouts takes, the last applied revision as an info metric, each endpoint's rollout
phase and step, errors by typed cause, git fetch duration, and whether this replica leads each
source's environment; and the process's own CPU seconds and resident memory (prometheus_client's
process collector, as controller-runtime exports them), which its idle footprint is read from."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector
from prometheus_client.exposition import generate_latest

#: Rollout phases a gauge is kept for (one series per phase, 1 for the current one).
_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


@dataclass
class ControllerMetrics:
    """Every metric of one controller process."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, …
        self.sync_seconds = Histogram("forge_controller_sync_duration_seconds", "Duration of one sync (fetch, load, plan, apply).",
                                      ["source", "result"], buckets=_BUCKETS, registry=r)
        self.syncs = Counter("forge_controller_syncs", "Syncs by source and result.", ["source", "result"], registry=r)
        self.fetch_seconds = Histogram("forge_controller_git_fetch_duration_seconds", "Duration of one git fetch.",
                                       ["source"], buckets=_BUCKETS, registry=r)
        self.walk_seconds = Histogram("forge_controller_rollout_walk_duration_seconds",
                                      "Duration of one walk of the rollout and experiment controllers (every endpoint once).",
                                      ["source"], buckets=_BUCKETS, registry=r)
        self.errors = Counter("forge_controller_errors", "Errors by source and typed cause.", ["source", "cause"], registry=r)
        self.applied = Info("forge_controller_last_applied_revision", "The revision last applied, by source.", ["source"],
                            registry=r)
        self.ready = Gauge("forge_controller_sync_ready", "1 while the source's Sync is Ready (its last sync succeeded), "
                           "0 while it is not; written by the leader.", ["source"], registry=r)
        self.leader = Gauge("forge_controller_leader", "1 while this replica holds the source's environment Lease.",
                            ["source"], registry=r)
        self.rollout_phase = Gauge("forge_controller_rollout_phase", "1 for the endpoint's current rollout phase.",
                                   ["source", "endpoint", "phase"], registry=r)
        self.rollout_step = Gauge("forge_controller_rollout_step", "The endpoint's rollout step (1-based).",
                                  ["source", "endpoint"], registry=r)
        self.rollout_weight = Gauge("forge_controller_rollout_canary_weight", "The endpoint's canary traffic (%).",
                                    ["source", "endpoint"], registry=r)
        self._phases: dict[tuple[str, str], str] = {}

    def rollout(self, source: str, endpoint: str, phase: str, step: int, weight: int) -> None:
        """Record an endpoint's rollout: the gauge of its former phase goes to 0."""
        before = self._phases.get((source, endpoint))
        if before is not None and before != phase:
            self.rollout_phase.labels(source, endpoint, before).set(0)
        self._phases[(source, endpoint)] = phase
        self.rollout_phase.labels(source, endpoint, phase).set(1)
        self.rollout_step.labels(source, endpoint).set(step + 1)
        self.rollout_weight.labels(source, endpoint).set(weight)

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
