"""The local target's serving: each predictor of a rendered SeldonDeployment becomes a local model
server (``python -m runtimes serve …``, the same command and config the container would run), and
one HAProxy router per endpoint (:mod:`.router`) splits traffic between stable and canary by the
predictors' ``traffic``.

Process records (StateDB ``processes``), one per model server: ``serve/<endpoint>/<role>/<key>``,
kind ``serve``, info ``{endpoint, role, version, variant, step, key, namespace, container, port, health, url}``
(:meth:`Predictor.record_info`). ``key`` is a digest of what
the server runs (step, ServeConfig, interpreter), so a changed version or config is a *new*
process beside the old one, never a restart in place. The kv entry ``serving/<endpoint>`` holds
the current process name per role and the traffic split.

Changing a role: start the new server, wait until it answers ``/v2/health/ready``, point the
router's other slot of that role at it (it must pass HAProxy's own health check), drain the old
slot, and only then stop the old server. A role no longer present is drained (weight 0) before its
server stops. Nothing is stopped while it has a request in flight, so clients see no failure.

Everything is idempotent and crash-safe: a second ``ensure_endpoint`` with the same predictors
reuses the running processes; one interrupted half-way finds every process it started in the
StateDB and finishes the job (servers not wanted any more are stopped at the end).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reconciler.metrics.analysis import Readiness
from reconciler.targets.local import processes
from reconciler.targets.local.monitoring import pod_target
from reconciler.targets.local.processes import log_tail
from reconciler.targets.local.router import Router, RouterError, http_ok
from reconciler.targets.local.state import StateDB
from renderers.seldon import READINESS_PATHS
from renderers.stepargs import decode_step_config, step_args
from specs.rollout import SERIES_LABELS

ENDPOINT_LABEL = "forge.dev/endpoint"
VERSION_LABEL = "forge.dev/model-version"
VARIANT_LABEL = "forge.dev/variant"
ROLE_LABEL = "forge.dev/role"
#: Readiness path of each serving step (the router's health check uses the same).


class ServingError(RuntimeError):
    """A model server or router could not be brought to the wanted state (a message for the user)."""


class Predictor:
    """What the local target needs of one rendered SeldonDeployment predictor."""

    def __init__(self, endpoint: str, predictor: Mapping[str, Any]) -> None:
        labels = predictor.get("labels") or {}
        try:
            container = predictor["componentSpecs"][0]["spec"]["containers"][0]
            step = list(container["args"])[0]
            config = decode_step_config(container)
            if not config:
                raise ValueError("no JSON object after --config-json")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ServingError(f"endpoint {endpoint!r}: predictor {predictor.get('name')!r} is not a rendered "
                               f"Forge predictor (no container args `<step> --config-json …`): {exc}") from exc
        if step not in READINESS_PATHS:
            raise ServingError(f"endpoint {endpoint!r}: predictor {predictor.get('name')!r} runs {step!r}, "
                               f"not one of {', '.join(READINESS_PATHS)}")
        # ready when the rendered readinessProbe would pass, as the kubelet decides on a cluster
        probe = (container.get("readinessProbe") or {}).get("httpGet") or {}
        self.health_path: str = str(probe.get("path") or READINESS_PATHS[step])
        self.endpoint = endpoint
        self.role: str = labels.get(ROLE_LABEL) or config.get("role") or predictor.get("name") or "stable"
        self.version: str = labels.get(VERSION_LABEL) or config.get("version", "")
        self.variant: str = labels.get(VARIANT_LABEL) or config.get("variant", "")
        self.traffic = int(predictor.get("traffic", 0) or 0)
        self.step = step
        # what a cluster's Prometheus would know of the pod: its namespace, container, port name
        self.namespace: str = str(config.get("namespace") or "")
        self.container: str = str(container.get("name") or "")
        self.port_name: str = next((str(p.get("name") or "") for p in container.get("ports") or []), "")
        # locally: loopback only, and a free port the server picks (it prints the URL once ready)
        self.config = {**config, "host": "127.0.0.1", "port": 0}

    def record_info(self, key: str) -> dict[str, Any]:
        """The ``info`` of this predictor's process record (``url`` is added once it serves)."""
        return {"endpoint": self.endpoint, "role": self.role, "version": self.version, "variant": self.variant,
                "step": self.step, "key": key, "namespace": self.namespace, "container": self.container,
                "port": self.port_name, "health": self.health_path, "url": None}

    def key(self, python: str) -> str:
        blob = json.dumps({"step": self.step, "config": self.config, "python": python}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


class LocalServing:
    """Model servers and routers of the local target (see the module docstring)."""

    def __init__(self, db: StateDB, state_dir: str | os.PathLike[str], runtime_python: str,
                 workspace: str | os.PathLike[str], repo_root: str | os.PathLike[str], *,
                 pythons: Mapping[str, str] | None = None, ready_timeout: float = 300.0,
                 drain_timeout: float = 60.0) -> None:
        """``pythons`` maps a step to its interpreter when it differs from ``runtime_python``
        (``{"serve-seldon": <seldon env python>}``)."""
        self.db = db
        self.state_dir = Path(state_dir)
        self.runtime_python = runtime_python
        self.pythons = dict(pythons or {})
        self.workspace = Path(workspace)
        self.repo_root = Path(repo_root)
        self.ready_timeout, self.drain_timeout = ready_timeout, drain_timeout

    # -- routers --------------------------------------------------------------------------------
    def router(self, endpoint: str, step: str = "serve") -> Router:
        """The router of ``endpoint`` (not started by this call)."""
        return Router(self.db, self.state_dir, endpoint, health_path=READINESS_PATHS.get(step, READINESS_PATHS["serve"]))

    # -- the main operation ---------------------------------------------------------------------
    def ensure_endpoint(self, endpoint: str, predictors: list[dict[str, Any]], sticky: tuple[str, str] | None = None,
                        *, held: Mapping[str, str] | None = None) -> str:
        """Make the endpoint serve exactly ``predictors`` (as rendered in the SeldonDeployment's
        ``spec.predictors``) with their ``traffic``; returns the router's URL. Either a `stable` (and
        at most one `canary`) predictor, or the arms of an experiment (any other names), routed by
        their shares — by a hash of the ``sticky`` header or cookie when one is given. A `shadow`
        predictor (``shadow: true``) runs too and gets a copy of ``traffic`` percent of the requests
        (the router's Lua mirror); its answers are dropped. ``held``: predictors not started, by
        name, with why (recorded for :meth:`held`)."""
        shadows = [Predictor(endpoint, p) for p in predictors if p.get("shadow")]
        for p in shadows:
            p.role = "shadow"
        routed = [Predictor(endpoint, p) for p in predictors if not p.get("shadow")]
        wanted = routed + shadows[:1]
        roles = [p.role for p in routed]
        arms = [r for r in roles if r not in ("stable", "canary")]
        if len(set(roles)) != len(roles) or (arms and len(arms) != len(roles)) or (not arms and roles and "stable" not in roles):
            raise ServingError(f"endpoint {endpoint!r}: predictors must be one `stable` and at most one `canary`, "
                               f"or the arms of an experiment, got {roles}")
        router = self.router(endpoint, wanted[0].step if wanted else "serve")
        try:
            router.ensure(sticky=sticky)
        except RouterError as exc:
            raise ServingError(str(exc)) from exc

        # start what is missing (all at once: two servers load in parallel), then wait for each
        starting: list[tuple[Predictor, processes.ProcessRecord, int]] = []
        current: dict[str, processes.ProcessRecord] = {}
        for p in wanted:
            python = self.pythons.get(p.step, self.runtime_python)
            name = f"serve/{endpoint}/{p.role}/{p.key(python)}"
            record = self.db.process(name)
            if record is not None and processes.alive(record) and record.info.get("url") \
                    and http_ok(record.info["url"] + p.health_path, timeout=5):
                current[p.role] = record
                continue
            if record is not None:
                processes.stop(record)
            starting.append(self._start(p, name, python))
        try:
            for p, record, offset in starting:
                current[p.role] = self._wait_ready(p, record, offset)
        except ServingError:
            for _, record, _ in starting:
                if record.name not in {r.name for r in current.values()}:
                    processes.stop(record)
                    self.db.forget_process(record.name)
            raise

        # route: traffic moves only to servers that are ready; replaced slots are drained
        by_role = {p.role: p for p in wanted}
        stable, canary = current.get("stable"), current.get("canary")
        canary_weight = by_role["canary"].traffic if canary is not None else 0
        if stable is None and canary is not None:
            canary_weight = 100
        try:
            if shadows and "shadow" in current:
                router.set_shadow(_addr(current["shadow"]), shadows[0].traffic or 100)
            else:
                router.set_shadow(None)
            if arms:
                router.set_roles({role: (_addr(current[role]), max(0, min(100, by_role[role].traffic)))  # type: ignore[misc]  # _addr is None only for no record; current[role] is one
                                  for role in arms}, drain_timeout=self.drain_timeout)
            else:
                router.set(_addr(stable), _addr(canary), max(0, min(100, canary_weight)), drain_timeout=self.drain_timeout)
        except RouterError as exc:
            raise ServingError(str(exc)) from exc

        # stop what is no longer wanted (already drained by the router)
        keep = {r.name for r in current.values()}
        for record in self._servers(endpoint):
            if record.name not in keep:
                processes.stop(record)
                self.db.forget_process(record.name)
        self.db.kv_set(f"serving/{endpoint}", {
            "endpoint": endpoint,
            "roles": {role: {"process": r.name, "version": r.info.get("version"), "url": r.info.get("url"),
                             "traffic": (0 if role == "shadow" else by_role[role].traffic if arms
                                         else canary_weight if role == "canary" else 100 - canary_weight if canary else 100),
                             **({"mirrored": by_role[role].traffic or 100} if role == "shadow" else {})}
                      for role, r in current.items()},
            "url": router.url,
            "sticky": list(sticky) if sticky else None,
            "shadow": "mirrored by the router (Lua forge_mirror)" if shadows else None,
            "held": dict(held or {}),
        })
        return router.url

    def remove_endpoint(self, endpoint: str) -> None:
        """Drain and stop the endpoint's model servers, then its router."""
        router = self.router(endpoint)
        if router.running():
            try:
                router.set(None, None, 0, drain_timeout=self.drain_timeout)
            except RouterError:
                pass  # stopping anyway
        for record in self._servers(endpoint):
            processes.stop(record)
            self.db.forget_process(record.name)
        router.stop()
        self.db.kv_set(f"serving/{endpoint}", None)

    def stop_all(self) -> None:
        """Remove every endpoint this state knows of (``forgectl down``)."""
        for endpoint in self.endpoints():
            self.remove_endpoint(endpoint)

    # -- reading ----------------------------------------------------------------------------------
    def endpoints(self) -> list[str]:
        """Endpoints with a router or a model server recorded."""
        names = set()
        for record in self.db.processes():
            if record.kind in ("serve", "router") and record.info.get("endpoint"):
                names.add(record.info["endpoint"])
        return sorted(names)

    def endpoint_url(self, endpoint: str) -> str | None:
        """The router's URL of ``endpoint``, when it runs."""
        router = self.router(endpoint)
        return router.url if router.running() else None

    def held(self, endpoint: str) -> dict[str, str]:
        """The endpoint's predictors not started, by name, with why (see :meth:`ensure_endpoint`)."""
        return dict((self.db.kv_get(f"serving/{endpoint}") or {}).get("held") or {})

    def ready(self, endpoint: str, role: str, version: str) -> Readiness:
        """Whether ``role``'s server of ``endpoint`` runs ``version`` and answers its readiness
        path now (the rendered readinessProbe's, as the kubelet would probe it)."""
        saved = (self.db.kv_get(f"serving/{endpoint}") or {}).get("roles", {}).get(role) or {}
        record = self.db.process(saved["process"]) if saved.get("process") else None
        if record is None:
            return Readiness(False, f"no {role} server of endpoint {endpoint!r} is recorded")
        if record.info.get("version") != version:
            return Readiness(False, f"the {role} server runs version {record.info.get('version')}, not {version}")
        if not processes.alive(record):
            return Readiness(False, f"the {role} server (pid {record.pid}) is not running")
        url = record.info.get("url")
        health = record.info.get("health") or READINESS_PATHS.get(record.info.get("step", ""), READINESS_PATHS["serve"])
        if not url or not http_ok(url + health, timeout=2.0):
            return Readiness(False, f"the {role} server (pid {record.pid}) does not answer {url}{health}")
        return Readiness(True, f"the {role} server (pid {record.pid}) answers {url}{health}")

    def status(self, endpoint: str) -> dict[str, Any]:
        """Per role: version, URL, PID, whether it runs, its weight and the router's view of it."""
        router = self.router(endpoint)
        saved = self.db.kv_get(f"serving/{endpoint}") or {}
        traffic = {}
        if router.running():
            try:
                traffic = router.traffic()
            except (OSError, RouterError):
                traffic = {}
        roles = {}
        for record in self._servers(endpoint):
            role = record.info.get("role", "?")
            if saved.get("roles", {}).get(role, {}).get("process") not in (None, record.name):
                continue
            roles[role] = {"version": record.info.get("version"), "url": record.info.get("url"), "pid": record.pid,
                           "running": processes.alive(record), "log": record.log,
                           "weight": traffic.get(role, {}).get("weight", 0),
                           "router_status": traffic.get(role, {}).get("status", "-")}
        shadow = router.shadow_stats() if router.running() else None
        return {"endpoint": endpoint, "url": router.url if router.running() else None, "roles": roles,
                **({"shadow": shadow} if shadow is not None else {})}

    def logs(self, endpoint: str) -> list[Path]:
        """Log files of the endpoint's current model servers and of its router."""
        paths = [Path(r.log) for r in self._servers(endpoint)]
        router = self.db.process(f"router/{endpoint}")
        if router is not None:
            paths.append(Path(router.log))
        return paths

    def scrape_targets(self) -> list[tuple[str, dict[str, str]]]:
        """``(host:port, labels)`` of every running model server and router exporter, for the local
        Prometheus (:func:`.monitoring.pod_target`). A model server is scraped as the endpoint's
        PodMonitor makes a cluster's Prometheus scrape its pod: namespace, a pod name, the
        container and its port's name, job ``<namespace>/<endpoint>`` (renderers.monitoring names
        the PodMonitor after the endpoint, in its namespace). A router has no pod on a cluster: it
        gets job ``<namespace>/<endpoint>-router`` and ``component="router"``, ``forge_endpoint``."""
        out: list[tuple[str, dict[str, str]]] = []
        for record in self.db.processes():
            if not processes.alive(record):
                continue
            info = record.info
            if record.kind == "serve" and info.get("url"):
                namespace = info.get("namespace") or ""
                out.append(pod_target(urllib.parse.urlsplit(info["url"]).netloc, namespace=namespace,
                                      pod=f"{info['endpoint']}-{info['role']}-{info.get('key', '')}",
                                      container=info.get("container") or "", port_name=info.get("port") or "",
                                      job=f"{namespace}/{info['endpoint']}"))
            elif record.kind == "router" and info.get("metrics_port"):
                namespace = self._namespace_of(info["endpoint"])
                out.append(pod_target(f"127.0.0.1:{info['metrics_port']}", namespace=namespace, pod="", container="",
                                      port_name="", job=f"{namespace}/{info['endpoint']}-router",
                                      labels={"component": "router", SERIES_LABELS["endpoint"]: info["endpoint"]}))
        return out

    def _namespace_of(self, endpoint: str) -> str:
        return next((r.info.get("namespace") or "" for r in self._servers(endpoint)), "")

    # -- helpers ----------------------------------------------------------------------------------
    def _servers(self, endpoint: str) -> list[processes.ProcessRecord]:
        prefix = f"serve/{endpoint}/"
        return [r for r in self.db.processes() if r.kind == "serve" and r.name.startswith(prefix)]

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        env.update(PYTHONPATH=str(self.repo_root), FORGE_WORKSPACE=str(self.workspace), PYTHONUNBUFFERED="1")
        return env

    def _start(self, p: Predictor, name: str, python: str) -> tuple[Predictor, processes.ProcessRecord, int]:
        key = name.rsplit("/", 1)[1]
        log = self.state_dir / "logs" / f"serve-{p.endpoint}-{p.role}-{p.version}-{key}.log"
        offset = log.stat().st_size if log.exists() else 0
        argv = [python, "-m", "runtimes", *step_args(p.step, p.config)]
        record = processes.spawn(name, "serve", argv, env=self._env(), cwd=self.repo_root, log=log,
                                 info=p.record_info(key))
        self.db.record_process(record)
        return p, record, offset

    def _wait_ready(self, p: Predictor, record: processes.ProcessRecord, offset: int) -> processes.ProcessRecord:
        """Wait for the ``{"event": "serving", "url": …}`` line, then for the health path."""
        deadline = time.monotonic() + self.ready_timeout
        url = None
        while time.monotonic() < deadline:
            if url is None:
                url = _serving_url(Path(record.log), offset)
            if url is not None and http_ok(url + p.health_path):
                ready = processes.ProcessRecord(record.name, record.kind, record.pid, record.start_ticks, record.argv,
                                                record.log, {**record.info, "url": url})
                self.db.record_process(ready)
                return ready
            if not processes.alive(record):
                raise ServingError(f"endpoint {p.endpoint!r}: the {p.role} model server ({p.version}) exited before it "
                                   f"was ready; its log ({record.log}) ends with:\n{log_tail(record.log, offset)}")
            time.sleep(0.1)
        processes.stop(record)
        self.db.forget_process(record.name)
        raise ServingError(f"endpoint {p.endpoint!r}: the {p.role} model server ({p.version}) was not ready within "
                           f"{self.ready_timeout:g}s; its log ({record.log}) ends with:\n{log_tail(record.log, offset)}")


def _addr(record: processes.ProcessRecord | None) -> tuple[str, int] | None:
    if record is None:
        return None
    parts = urllib.parse.urlsplit(record.info["url"])
    return parts.hostname or "127.0.0.1", int(parts.port or 80)


def _serving_url(log: Path, offset: int) -> str | None:
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"serving"' in line:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "serving" and event.get("url"):
                return str(event["url"])
    return None
