"""The local target's Prometheus: Debian's ``/usr/bin/prometheus``, started and stopped by Forge,
scraping the model servers and the routers of one state directory.

- Listens on a free 127.0.0.1 port (kept across restarts when still free), data under
  ``<state_dir>/prometheus/data``, ``--web.enable-lifecycle`` so rules reload without a restart.
- One scrape job, ``forge``, whose targets come from file_sd (``targets/forge.json``): changing
  targets is an atomic file replace, picked up within a second, no reload.
- The series get the labels a cluster's Prometheus gives them under the Prometheus Operator, so a
  query means the same here and there: ``honor_labels: false`` as the operator's PodMonitor jobs
  have it, and relabel rules that set the target labels those jobs set — ``namespace``, ``pod``,
  ``container``, ``endpoint`` (the port's name), ``job`` (``<namespace>/<PodMonitor>``) and
  ``instance`` (the address) — from the Kubernetes-SD-style ``__meta_*`` labels :func:`pod_target`
  writes into the file_sd targets. The servers' own labels are ``forge_*`` (see
  ``specs.rollout.SERIES_LABELS``), so nothing is renamed to ``exported_*`` on either side
  (tests/monitoring/test_operator_scrape.py compares the series with the operator's own config).
- Rule files ``rules/<name>.yml`` (the ``spec.groups`` of a rendered PrometheusRule), loaded by
  ``POST /-/reload``; a rule Prometheus rejects is removed again and reported.

State: the process record ``prometheus`` (PID + start time) and the kv entry ``prometheus``
(``{port, dir}``). ``ensure()`` reuses a running one.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path
from typing import Any

from reconciler.targets.local import processes
from reconciler.targets.local.state import StateDB

PROMETHEUS = processes.PROMETHEUS
NAME = "prometheus"
#: The file_sd label that carries a target's ``job`` (the operator writes it as a constant per
#: PodMonitor; one local job scrapes every endpoint, so here it comes with the target).
JOB_META = "__meta_forge_job"
#: Relabel rules of the local scrape job: the target labels of the Prometheus Operator's PodMonitor
#: jobs (prometheus-operator v0.93.0 pkg/prometheus/promcfg.go, generatePodMonitorConfig: namespace,
#: container, pod from Kubernetes SD, then job and endpoint; instance stays the address).
RELABEL_CONFIGS: list[dict[str, Any]] = [
    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
    {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    {"source_labels": [JOB_META], "regex": "(.+)", "target_label": "job"},
    {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "(.+)", "target_label": "endpoint"},
]


def pod_target(address: str, *, namespace: str, pod: str, container: str, port_name: str, job: str,
               labels: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """A file_sd target for a process that stands for a pod's container port: the
    ``__meta_kubernetes_*`` labels Kubernetes SD would give it (and the job), which
    :data:`RELABEL_CONFIGS` turns into the operator's target labels; ``labels`` are added as they are."""
    return address, {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": pod,
                     "__meta_kubernetes_pod_container_name": container,
                     "__meta_kubernetes_pod_container_port_name": port_name, JOB_META: job, **(labels or {})}


class PrometheusError(RuntimeError):
    """The local Prometheus could not be started or configured (a message for the user)."""


class LocalPrometheus:
    """The local target's Prometheus (see the module docstring)."""

    def __init__(self, db: StateDB, state_dir: str | os.PathLike[str], scrape_interval: str = "1s", *,
                 prometheus: str = PROMETHEUS, retention: str = "2d") -> None:
        self.db = db
        self.dir = Path(state_dir) / "prometheus"
        self.scrape_interval, self.binary, self.retention = scrape_interval, prometheus, retention

    @property
    def port(self) -> int | None:
        state = self.db.kv_get(NAME) or {}
        return state.get("port")

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        if not self.port:
            raise PrometheusError("the local Prometheus was never started")
        return f"http://127.0.0.1:{self.port}"

    def running(self) -> bool:
        record = self.db.process(NAME)
        return record is not None and processes.alive(record)

    def ensure(self, timeout: float = 60.0) -> str:
        """Start Prometheus unless it runs; returns its URL. One that runs with another scrape
        configuration (an older Forge's) gets this one, by a reload."""
        if self.running() and self.port:
            if self._write_config():
                self.reload()
            return self.url
        exe = processes.ensure_package(self.binary, "prometheus", error=PrometheusError)
        for sub in ("targets", "rules", "data"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._write_config()
        if not (self.dir / "targets" / "forge.json").exists():
            self.set_targets([])
        log = self.dir / "prometheus.log"
        try:
            processes.start_server(
                NAME, "prometheus", lambda port: processes.prometheus_argv(exe, self.dir, port, retention=self.retention),
                lambda port: f"http://127.0.0.1:{port}/-/ready", log=log, port=self.port, timeout=timeout,
                env=processes.plain_env(), cwd=self.dir, on_spawn=self._recorded, on_failed=lambda _: self.db.forget_process(NAME))
        except processes.ServerNotStarted as exc:
            raise PrometheusError(f"prometheus did not start; its log ({log}) ends with:\n{exc.tail}") from None
        return self.url

    def _recorded(self, record: processes.ProcessRecord) -> None:
        self.db.record_process(record)
        self.db.kv_set(NAME, {"port": record.info["port"], "dir": str(self.dir)})

    def stop(self) -> None:
        """Stop Prometheus (by its recorded PID). Its data and port stay for the next ``ensure()``."""
        record = self.db.process(NAME)
        if record is not None:
            processes.stop(record)
            self.db.forget_process(NAME)

    # -- configuration ----------------------------------------------------------------------------
    def _write_config(self) -> bool:
        """Write ``prometheus.yml``; True when it changed."""
        iv = self.scrape_interval
        config = {
            "global": {"scrape_interval": iv, "evaluation_interval": iv, "scrape_timeout": iv},
            "rule_files": [str(self.dir / "rules" / "*.yml")],
            "scrape_configs": [{
                "job_name": "forge",
                "honor_labels": False,
                "file_sd_configs": [{"files": [str(self.dir / "targets" / "*.json")], "refresh_interval": "1s"}],
                "relabel_configs": RELABEL_CONFIGS,
            }],
        }
        text = json.dumps(config, indent=2) + "\n"
        path = self.dir / "prometheus.yml"
        if path.exists() and path.read_text() == text:
            return False
        _atomic_write(path, text)
        return True

    def set_targets(self, targets: Iterable[tuple[str, dict[str, str]]]) -> None:
        """Replace the scrape targets: ``(host:port, labels)`` each (file_sd; no reload needed)."""
        groups = [{"targets": [where], "labels": {k: str(v) for k, v in labels.items()}} for where, labels in targets]
        (self.dir / "targets").mkdir(parents=True, exist_ok=True)
        _atomic_write(self.dir / "targets" / "forge.json", json.dumps(groups, indent=2, sort_keys=True) + "\n")

    def set_rules(self, name: str, groups: list[dict[str, Any]]) -> None:
        """Write the rule groups (a PrometheusRule's ``spec.groups``) as ``rules/<name>.yml`` and reload;
        an empty list removes the file. Raises when Prometheus rejects them (the file is then removed)."""
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise PrometheusError(f"rule file name {name!r} must be letters, digits, '.', '_' or '-'")
        path = self.dir / "rules" / f"{name}.yml"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not groups:
            with suppress(FileNotFoundError):
                path.unlink()
        else:
            _atomic_write(path, json.dumps({"groups": groups}, indent=2) + "\n")  # JSON is YAML
        if not self.running():
            return  # read at the next start
        try:
            self.reload()
        except PrometheusError:
            with suppress(FileNotFoundError):
                path.unlink()
            with suppress(PrometheusError):
                self.reload()
            raise

    def reload(self) -> None:
        """``POST /-/reload``; raises with Prometheus's message when the configuration is rejected."""
        req = urllib.request.Request(self.url + "/-/reload", method="POST")
        try:
            urllib.request.urlopen(req, timeout=30).close()
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"prometheus rejected the configuration: {exc.read().decode(errors='replace').strip()}") from exc
        except OSError as exc:
            raise PrometheusError(f"prometheus at {self.url} did not answer the reload: {exc}") from exc

    # -- reading ------------------------------------------------------------------------------------
    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query; returns ``data.result``."""
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"query {promql!r}: {exc.read().decode(errors='replace')}") from exc
        if doc.get("status") != "success":
            raise PrometheusError(f"query {promql!r}: {doc}")
        return list(doc["data"]["result"])

    def active_targets(self) -> list[dict[str, Any]]:
        """``/api/v1/targets``'s active targets (labels, health, lastError)."""
        with urllib.request.urlopen(self.url + "/api/v1/targets?state=active", timeout=10) as resp:
            return list(json.loads(resp.read())["data"]["activeTargets"])


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
