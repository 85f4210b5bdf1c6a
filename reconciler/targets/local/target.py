"""The `local` target: the same rendered manifests, made live on this machine.

* `Workflow` → its DAG runs as local processes of the runtime environment (`executor`), with the
  step cache; the object becomes live once the workflow finished (so a killed apply re-runs it,
  and its finished steps are cache hits);
* `SeldonDeployment` → one model server per predictor behind an HAProxy router whose weights the
  rollout controller moves (`serving`, `router`);
* `PodMonitor` / `PrometheusRule` → scrape targets and rules of a local Prometheus (`monitoring`);
* `PersistentVolumeClaim` → the workspace folder; `Namespace` → nothing to do.

State (live manifests, runs, step cache, processes, rollout states) is one SQLite file under
`.forge/<environment>/`; every process is recorded by PID and start time and reaped by `down`.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import socket
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from reconciler.errors import ConflictError, LockHeldError, TargetError, TargetNotAvailable
from reconciler.registry.records import Record
from reconciler.resources import ObjectRef, Resource
from reconciler.rollout.controller import RolloutState
from reconciler.runtimeenv import FORGE_ROOT, runtime_python
from reconciler.targets.base import (
    ClusterAPI,
    ControllerAPI,
    LiveRead,
    PodAPI,
    Precondition,
    RolloutBackend,
    RunDetails,
    StepEvents,
)
from reconciler.targets.local import stephost
from reconciler.targets.local.details import log_files, model_summaries
from reconciler.targets.local.executor import Progress, WorkflowExecutor
from reconciler.targets.local.processes import alive, stop
from reconciler.targets.local.records import ingest_local
from reconciler.targets.local.rollout import LocalRolloutBackend
from reconciler.targets.local.state import StateDB
from renderers.labels import ENDPOINT, MODEL_VERSION, NAME, STICKY
from renderers.stepargs import decode_step_config
from specs import Environment, SpecSet
from specs.safety import OutsideRoot, resolve_inside
from specs.stepconfig import AwaitConfig


def _step_of(predictor: dict[str, Any]) -> str:
    return predictor["componentSpecs"][0]["spec"]["containers"][0]["args"][0]


class HeldByProcess:
    """The local lock's fence (:class:`~reconciler.targets.base.Fence`). The lock is an `flock` on
    `.forge/<env>/lock` held through this process's open file: the kernel keeps it for as long as
    the file is open — a paused process still holds it, and nobody can take it meanwhile — and frees
    it only when the file is closed or the process ends. So it cannot be lost while the process
    lives: always held, no deadline, nothing to check before a write."""

    held = True
    deadline = None

    def check(self, what: str) -> None:
        """Nothing to check (see the class docstring)."""


class LocalTarget:
    """One environment on this machine (see module docstring)."""

    name = "local"
    #: One write at a time: its state is one SQLite database and the processes it supervises.
    apply_parallelism = 1

    def __init__(self, env: Environment, namespace: str, *, repo_root: Path | None = None) -> None:
        self.environment = env.name
        self.namespace = namespace
        # Everything this target reads or writes stays inside the Environment's `root` (relative
        # to the folder forgectl runs in): a `stateDir` or source leading out, through `..` or a
        # symlink, is refused before anything is created.
        try:
            self.repo_root = resolve_inside((repo_root or Path.cwd()).resolve(), env.spec.root, what="root")
            self.state_dir = resolve_inside(self.repo_root, f"{env.spec.local.state_dir}/{env.name}", what="stateDir")
        except OutsideRoot as exc:
            raise TargetNotAvailable(f"environment {env.name!r}: {exc}") from None
        self.workspace = self.state_dir / "workspace"
        self.db = StateDB(self.state_dir / "state.db")
        self.max_parallel = env.spec.local.max_parallel_steps
        self.scrape_interval = env.spec.local.scrape_interval
        self.progress: Progress | None = None  # see follow_steps
        self._python: str | None = None
        self._serving: Any = None
        self._prometheus: Any = None

    # -- collaborators, created on first use (status and plan never start anything) -------------
    @property
    def python(self) -> str:
        if self._python is None:
            self._python = runtime_python()
        return self._python

    @property
    def serving(self) -> Any:
        if self._serving is None:
            from reconciler.targets.local.serving import LocalServing

            # The servers import the runtimes' code from Forge's own tree (the user's repository
            # holds only specs and data).
            self._serving = LocalServing(self.db, self.state_dir, self.python, self.workspace, FORGE_ROOT)
        return self._serving

    @property
    def prometheus(self) -> Any:
        if self._prometheus is None:
            from reconciler.targets.local.monitoring import LocalPrometheus

            self._prometheus = LocalPrometheus(self.db, self.state_dir, scrape_interval=self.scrape_interval)
        return self._prometheus

    def prometheus_url(self) -> str | None:
        """URL of the local Prometheus, once started."""
        return self.prometheus.ensure()

    # -- Target ---------------------------------------------------------------------------------
    def read_live(self) -> list[dict[str, Any]]:
        """Every manifest the local target holds for this environment."""
        return self.db.objects()

    def read_live_metadata(self, whole: Collection[str]) -> LiveRead:
        """The state DB holds whole manifests and reads them as cheaply as metadata: all whole."""
        return LiveRead(self.read_live())

    def read_whole(self, refs: Collection[ObjectRef]) -> list[dict[str, Any]]:
        """These objects from the state DB (one not there is left out)."""
        wanted = set(refs)
        return [o for o in self.read_live() if ObjectRef.of(o) in wanted]

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False,
              precondition: Precondition | None = None) -> dict[str, Any]:
        """Make one object live (see module docstring); unchanged objects are not touched. A
        ``precondition`` is checked against the state DB first, as the API server would: an
        object that exists though it should not, or whose resourceVersion moved, is refused
        (:class:`ConflictError`)."""
        obj = dict(obj)
        ref = ObjectRef.of(obj)
        if dry_run:
            current = self.db.get(ref) or {}
            return {**obj, "metadata": {**obj["metadata"], **{k: v for k, v in current.get("metadata", {}).items() if k in ("uid", "resourceVersion")}}}
        if precondition is not None:
            stored = self.db.get(ref)
            if precondition.absent and stored is not None:
                raise ConflictError(f"{ref}: exists, though the plan saw none: not written; plan again", status=409, ref=ref)
            have = (stored or {}).get("metadata", {}).get("resourceVersion")
            if precondition.resource_version and have != precondition.resource_version:
                raise ConflictError(f"{ref}: changed since the plan read it (resourceVersion {precondition.resource_version}, "
                                    f"now {have}): not written; plan again", status=409, ref=ref)
        if ref.kind == "PersistentVolumeClaim":
            self.workspace.mkdir(parents=True, exist_ok=True)
        elif ref.kind == "Workflow":
            obj = self._run_workflow(obj)
        else:
            try:
                self._serve_or_watch(ref, obj)
            except (RuntimeError, OSError) as exc:  # ServingError, RouterError, PrometheusError
                raise TargetError(f"{ref}: {exc}") from exc
        return self.db.put(obj)

    def _serve_or_watch(self, ref: ObjectRef, obj: dict[str, Any]) -> None:
        if ref.kind == "SeldonDeployment":
            endpoint = (obj["metadata"].get("labels") or {}).get(ENDPOINT, ref.name)
            predictors, held = self._servable(obj["spec"]["predictors"])
            if any(_step_of(p) == "serve-seldon" for p in predictors) and "serve-seldon" not in self.serving.pythons:
                self.serving.pythons["serve-seldon"] = runtime_python("seldon")
            sticky = (obj["metadata"].get("annotations") or {}).get(STICKY)
            self.serving.ensure_endpoint(endpoint, predictors, tuple(sticky.split(":", 1)) if sticky else None, held=held)
            self._refresh_scraping()
        elif ref.kind == "PodMonitor":
            self._refresh_scraping()
        elif ref.kind == "PrometheusRule":
            self.prometheus.ensure()
            self.prometheus.set_rules(ref.name, obj["spec"].get("groups", []))

    def delete(self, ref: ObjectRef, *, uid: str | None = None) -> None:
        """Stop what an object runs and forget it."""
        current = self.db.get(ref)
        if current is None:
            return
        if uid and current["metadata"].get("uid") != uid:
            return
        if ref.kind == "SeldonDeployment":
            endpoint = (current["metadata"].get("labels") or {}).get(ENDPOINT, ref.name)
            self.serving.remove_endpoint(endpoint)
            self._refresh_scraping()
        elif ref.kind == "PrometheusRule":
            self.prometheus.set_rules(ref.name, [])
        self.db.delete(ref)

    # -- pieces -------------------------------------------------------------------------------------
    def _run_workflow(self, obj: dict[str, Any]) -> dict[str, Any]:
        executor = WorkflowExecutor(self.db, self.state_dir, self.workspace, self.repo_root, self.python,
                                    self.max_parallel, self.progress, step_host=stephost.enabled(os.environ))
        self.workspace.mkdir(parents=True, exist_ok=True)
        outcome = executor.run(obj)
        if outcome.phase != "Succeeded":
            raise TargetError(f"Workflow {obj['metadata']['name']} failed: {outcome.message} "
                              f"(`forgectl logs {obj['metadata']['name']}` shows the step logs)")
        ingest_local(self.db, self.workspace, obj, self.environment, time.time())  # the model registry
        return {**obj, "status": {"phase": "Succeeded", "message": outcome.message}}

    def _servable(self, predictors: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Predictors whose `await-model` init container would finish now: the files it waits for
        exist (a canary waits for its workflow, as its pod would on a cluster); and, by predictor
        name, why each whose wait would fail is held — its version registered without the variant
        it serves (a step rejected it), where a pod stops in its init container saying so."""
        ready, held = [], {}
        for predictor in predictors:
            pod = predictor["componentSpecs"][0]["spec"]
            waits = [AwaitConfig.model_validate(decode_step_config(c)) for c in pod.get("initContainers", [])]
            if not all((self.workspace / path).exists() for w in waits for path in w.paths):
                continue
            why = next((reason for w in waits for path in w.registrations() if (reason := self._rejected(w, path)) is not None), None)
            if why is None:
                ready.append(predictor)
            else:
                held[predictor["name"]] = why
        return ready, held

    def _rejected(self, wait: AwaitConfig, registration: str) -> str | None:
        """Why the registration cannot serve the wait's variant, as `python -m runtimes await` says."""
        try:
            return wait.rejected(json.loads((self.workspace / registration).read_text()))
        except (OSError, ValueError) as exc:
            return f"{wait.what}: {registration} cannot be read: {exc}"

    def _refresh_scraping(self) -> None:
        if not any(o["kind"] == "PodMonitor" for o in self.db.objects()):
            return
        self.prometheus.ensure()
        self.prometheus.set_targets(self.serving.scrape_targets())

    # -- locking and teardown -----------------------------------------------------------------------
    @contextmanager
    def lock(self, holder: str | None = None) -> Iterator[HeldByProcess]:
        """An exclusive lock on `.forge/<env>/lock`; a second apply is refused naming the holder.
        Held by this process's open file, it cannot be lost while the process lives
        (:class:`HeldByProcess`)."""
        holder = holder or f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"
        path = self.state_dir / "lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                info = path.read_text() or "{}"
                data = json.loads(info) if info.strip().startswith("{") else {}
                raise LockHeldError(f"environment {self.environment!r} is locked by {data.get('holder', 'another forgectl')} "
                                    f"since {data.get('since', '?')} ({path})") from None
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"holder": holder, "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode())
            yield HeldByProcess()
        finally:
            os.close(fd)  # closing releases the flock; a killed holder releases it too

    def down(self) -> list[str]:
        """Stop every process started for this environment and forget what they served."""
        stopped = [f"{r.name} (pid {r.pid})" for r in self.db.processes() if alive(r)]
        if any(r.kind in ("serve", "router") for r in self.db.processes()):
            self.serving.stop_all()  # drains routers first, clears their state
        if self.db.process("prometheus") is not None:
            self.prometheus.stop()
        for record in self.db.processes():  # anything else (a step of a killed apply)
            if alive(record):
                stop(record)
            self.db.forget_process(record.name)
        for obj in self.db.objects():
            if obj["kind"] in ("SeldonDeployment", "PodMonitor", "PrometheusRule"):
                self.db.delete(ObjectRef.of(obj))
        return stopped

    def rollout_states(self, live: list[dict[str, Any]]) -> dict[str, RolloutState]:
        """Rollout states from the state DB."""
        return {endpoint: RolloutState.from_json(state) for endpoint, state in self.db.rollouts().items()}

    def rollout_backend(self, specs: SpecSet, env: Environment, revision: str | None) -> RolloutBackend:
        """The rollout controller's backend for this target."""
        return LocalRolloutBackend(self, self.db, self.state_dir / "events.jsonl", self._shadow_stats, self.serving.ready,
                                   specs, env, revision)

    def _shadow_stats(self, endpoint: str) -> dict[str, Any] | None:
        held = self.serving.held(endpoint).get("shadow")
        if held is not None:
            return {"held": held}
        router = self.serving.router(endpoint)
        return router.shadow_stats() if router.running() else None

    def model_records(self, live: list[dict[str, Any]], model: str | None = None, *,
                      backfill: bool = True) -> list[Record]:
        """The state DB's registry; with ``backfill``, a succeeded Workflow it has no record of
        (a run made before the registry existed) is recorded first."""
        if backfill:
            for wf in (o for o in live if o.get("kind") == "Workflow"):
                labels = wf["metadata"].get("labels") or {}
                if (wf.get("status") or {}).get("phase") == "Succeeded" and \
                        not self.db.has_model_version(labels.get(NAME, ""), labels.get(MODEL_VERSION, "")):
                    ingest_local(self.db, self.workspace, wf, self.environment)
        return self.db.model_versions(model)

    # -- what `status` and `logs` show --------------------------------------------------------------
    def run_details(self, live: list[dict[str, Any]]) -> RunDetails:
        """Steps of the live Workflows and runs still in progress (state DB), the registered model
        versions (workspace), and the router address of every live SeldonDeployment's endpoint."""
        workflows = [o["metadata"]["name"] for o in live if o["kind"] == "Workflow"]
        endpoints = [(o["metadata"].get("labels") or {}).get(ENDPOINT, o["metadata"]["name"])
                     for o in live if o["kind"] == "SeldonDeployment"]
        return RunDetails(steps={name: self.db.step_runs(name) for name in workflows},
                          running=self.db.workflow_runs(phase="Running"),
                          models=model_summaries(self.workspace),
                          endpoint_urls={endpoint: self.endpoint_url(endpoint) for endpoint in endpoints})

    def endpoint_url(self, endpoint: str) -> str | None:
        """The endpoint's router address on this machine (None while it is not served)."""
        return self.serving.endpoint_url(endpoint)

    def log_files(self, name: str) -> list[Path]:
        """Log files under `.forge/<env>/logs` (see :func:`details.log_files`)."""
        return log_files(self.state_dir, name)

    def follow_steps(self, events: StepEvents) -> bool:
        """The executor reports each step it runs here to ``events`` (from the next workflow on)."""
        self.progress = events
        return True

    def cluster_api(self) -> ClusterAPI | None:
        """None: there is no cluster here."""
        return None

    def controller_api(self) -> ControllerAPI | None:
        """None: the in-cluster controller's status objects need a cluster."""
        return None

    def watching(self, resources: Collection[Resource]) -> AbstractContextManager[None]:
        """Nothing to keep: the local target's reads are files of this machine."""
        return nullcontext()

    def pod_api(self) -> PodAPI | None:
        """None: no pods here; the workspace is a folder of this machine (:meth:`workspace_files`)."""
        return None

    def workspace_files(self, folder: str) -> dict[str, bytes] | None:
        """The files directly in ``folder`` of this environment's workspace (None when it is absent)."""
        path = self.workspace / folder
        if not path.is_dir():
            return None
        return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file() and not p.name.startswith(".")}
