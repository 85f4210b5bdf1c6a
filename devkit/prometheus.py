"""Debian's Prometheus for the tests and benchmarks: a real server on a free loopback port,
scraping targets listed in file_sd files. Started, waited for and stopped by the local target's
own process layer (:mod:`reconciler.targets.local.processes`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devkit.common import ClusterError, Log, stderr_log
from reconciler.targets.local import processes


def ensure_prometheus(log: Log = stderr_log) -> str:
    """Path of the ``prometheus`` binary ($FORGE_PROMETHEUS_BIN, on PATH, or Debian's); installs
    Debian's package with apt-get when missing."""
    binary = os.environ.get("FORGE_PROMETHEUS_BIN") or shutil.which("prometheus") or processes.PROMETHEUS
    return processes.ensure_package(binary, "prometheus", error=ClusterError, log=log)


@dataclass
class Prometheus:
    """A real Prometheus on a free loopback port, scraping targets listed in file_sd files."""

    state_dir: str
    port: int
    exe: str
    scrape_interval: str = "1s"
    pid: int = 0
    pid_start: int = -1  # start time of pid (see processes.spawn)
    die_with_parent: bool = True
    rule_files: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def sd_dir(self) -> Path:
        return Path(self.state_dir) / "targets"

    @classmethod
    def start(cls, targets: Iterable[str] = (), *, state_dir: str | os.PathLike[str] | None = None,
              scrape_interval: str = "1s", rule_files: Iterable[str] = (), die_with_parent: bool = True,
              log: Log = stderr_log) -> Prometheus:
        """Start Prometheus scraping ``targets`` (``host:port``) in job ``forge`` every ``scrape_interval``."""
        exe = ensure_prometheus(log)
        sd = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="forge-prometheus-"))
        sd.mkdir(parents=True, exist_ok=True)
        prom = cls(state_dir=str(sd), port=0, exe=exe, scrape_interval=scrape_interval,
                   die_with_parent=die_with_parent, rule_files=[str(r) for r in rule_files])
        prom.sd_dir.mkdir(exist_ok=True)
        prom._write_config()
        prom.set_targets(list(targets))
        prom._serve(port=None, attempts=3)  # a port taken between choosing and binding: another one
        return prom

    def _write_config(self) -> None:
        iv = self.scrape_interval
        cfg = {
            "global": {"scrape_interval": iv, "evaluation_interval": iv, "scrape_timeout": iv},
            "rule_files": self.rule_files,
            "scrape_configs": [{
                "job_name": "forge",
                "file_sd_configs": [{"files": [str(self.sd_dir / "*.json")], "refresh_interval": "1s"}],
            }],
        }
        (Path(self.state_dir) / "prometheus.yml").write_text(json.dumps(cfg, indent=2) + "\n")

    def set_targets(self, targets: Sequence[str], *, job: str = "forge", labels: dict[str, str] | None = None) -> None:
        """Replace the scrape targets of ``job`` (file_sd: picked up within about a second)."""
        group = {"targets": list(targets), "labels": {"job": job, **(labels or {})}}
        path = self.sd_dir / f"{job}.json"
        tmp = self.sd_dir / f".{job}.json.tmp"
        tmp.write_text(json.dumps([group] if targets else []))
        tmp.replace(path)

    def _serve(self, port: int | None, attempts: int, timeout: float = 30.0) -> None:
        sd = Path(self.state_dir)
        try:
            record = processes.start_server(
                "prometheus", "prometheus",
                lambda p: processes.prometheus_argv(self.exe, sd, p, retention="1d", admin_api=True),
                lambda p: f"http://127.0.0.1:{p}/-/ready", log=sd / "prometheus.log", port=port,
                attempts=attempts, timeout=timeout, die_with_parent=self.die_with_parent)
        except processes.ServerNotStarted as e:
            raise ClusterError(str(e)) from None
        self.port, self.pid, self.pid_start = record.info["port"], record.pid, record.start_ticks

    def resume(self, timeout: float = 30.0) -> None:
        """(Re)start the server on the same port and data dir (after :meth:`pause`)."""
        if not self.running():
            self._serve(port=self.port, attempts=1, timeout=timeout)

    def running(self) -> bool:
        return bool(self.pid) and processes.running(self.pid, self.pid_start)

    def pause(self) -> None:
        """Stop the server (for outage tests) but keep its port, config and data for :meth:`resume`."""
        if self.pid:
            self.thaw()  # a stopped process would hold its SIGTERM until continued
            processes.stop_pid(self.pid, self.pid_start)

    def freeze(self) -> None:
        """SIGSTOP the server (for hang drills): its port stays open and the kernel still accepts
        connections into the listen backlog, but nothing answers, scrapes or evaluates — a client
        sees timeouts, not refused connections. :meth:`thaw` continues it."""
        if self.pid and processes.running(self.pid, self.pid_start):
            os.killpg(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT the server after :meth:`freeze` (nothing when it runs)."""
        if self.pid and processes.running(self.pid, self.pid_start):
            os.killpg(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server (by PID) and delete its state directory."""
        self.pause()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def reset(self) -> None:
        """Running again (after a :meth:`pause`), no scrape targets, no stored series."""
        self.resume()
        for f in self.sd_dir.glob("*.json"):
            f.unlink()
        for path in ("/api/v1/admin/tsdb/delete_series?match%5B%5D=%7B__name__%3D~%22.%2B%22%7D",
                     "/api/v1/admin/tsdb/clean_tombstones"):
            req = urllib.request.Request(self.url + path, method="POST")
            urllib.request.urlopen(req, timeout=30).close()

    def reload(self) -> None:
        """POST /-/reload (after editing rule files)."""
        req = urllib.request.Request(self.url + "/-/reload", method="POST")
        urllib.request.urlopen(req, timeout=10).close()

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; returns ``data.result``."""
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as r:
            doc = json.loads(r.read())
        if doc.get("status") != "success":
            raise ClusterError(f"query {promql!r}: {doc}")
        return doc["data"]["result"]

    def active_targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.url + "/api/v1/targets?state=active", timeout=10) as r:
            return json.loads(r.read())["data"]["activeTargets"]

    def wait_for_targets(self, n: int, *, health: str = "up", timeout: float = 30.0) -> list[dict[str, Any]]:
        """Wait until ``n`` active targets report ``health``."""
        deadline = time.monotonic() + timeout
        while True:
            ts = [t for t in self.active_targets() if t.get("health") == health]
            if len(ts) >= n or time.monotonic() > deadline:
                if len(ts) < n:
                    raise ClusterError(f"{len(ts)} of {n} targets {health} after {timeout:.0f} s")
                return ts
            time.sleep(0.2)
