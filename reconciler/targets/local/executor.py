"""Run a rendered Argo Workflow on this machine: each DAG task's container command as a local
process of the runtime environment — the same command and config the cluster would run —
respecting dependencies, `parallelism`, `retryStrategy`, the step cache (`memoize` keys, on each
task's one-task DAG around the retried template: renderers.workflow.memoized) and the `onExit`
handler.

Fan-outs run as Argo runs them: a task with `withItems`, `withSequence` or `withParam` becomes one
task per item, named and substituted as Argo's controller does (reconciler.targets.local.fanout),
whose dependents wait for them all; a task whose template is a DAG of its own runs that DAG, at
most its template's `parallelism` children at a time. The Workflow's `parallelism` bounds the
step processes running at once (Argo: the Workflow's pods), with the target's own limit.

What `depends` and `retryStrategy` mean is decided by Argo's own code (`reconciler.targets.local.upstream`:
its expression evaluator over the scope its controller builds), never by reading the expression
here: a task starts when its dependencies are done and Argo says its `depends` holds; a failed
attempt is retried when Argo's controller would retry it.

A step whose key was computed and completed before is a cache hit and does not run. A step dies
with the `forgectl` running it (no orphans); the next apply starts it again, and training resumes
from its checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.targets.local import fanout, upstream
from reconciler.targets.local.processes import ProcessRecord, alive, die_with_parent, start_ticks, stop
from reconciler.targets.local.state import StateDB
from reconciler.targets.local.stephost import StepHost, StepProcess
from renderers.stepargs import decode_step_config
from specs.stepconfig import WORKSPACE_ENV

MAX_LOCAL_BACKOFF = 5.0
#: Local step status → the node phase Argo's `depends` sees.
ARGO_PHASE = {"succeeded": "Succeeded", "cached": "Succeeded", "failed": "Failed", "omitted": "Omitted"}

Progress = Callable[[dict[str, Any]], None]


@dataclass
class Task:
    """One DAG task and its template."""

    name: str
    depends: list[str]
    template: dict[str, Any]
    """The template that runs it (its container and `retryStrategy`)."""
    expression: str = ""
    """The task's `depends` as rendered (judged by Argo's evaluator)."""
    memoize: dict[str, Any] = field(default_factory=dict)
    """The step cache of its task template."""
    children: list[Task] | None = None
    """A DAG template's own tasks (the task runs that DAG), else None."""
    limit: int | None = None
    """That DAG template's `parallelism`: children running at once."""
    group: str = ""
    """The fan-out task it was expanded from (its dependents wait for the whole group)."""

    @property
    def key(self) -> str | None:
        return self.memoize.get("key")

    @property
    def output(self) -> str | None:
        return decode_step_config(self.template.get("container") or {}).get("output")


@dataclass
class _Run:
    """One run of a Workflow: every task's status (fan-out items and nested tasks included), the
    first failure, and the bound on step processes running at once."""

    workflow: str
    pods: threading.BoundedSemaphore
    status: dict[str, str] = field(default_factory=dict)
    failure: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Outcome:
    """How a workflow run ended."""

    phase: str
    message: str
    steps: dict[str, str] = field(default_factory=dict)


def _instance(templates: dict[str, dict[str, Any]], task: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(its `memoize`, the template that runs it) of a task, with the inputs it passes substituted:
    through a `memoized(...)` wrapper (a one-task DAG carrying the cache), or one template."""
    template = templates.get(task["template"], {})
    values = fanout.inputs(template, task.get("arguments") or {})
    memoize = fanout.substitute(template.get("memoize") or {}, values)
    inner = (template.get("dag") or {}).get("tasks", [])
    if len(inner) == 1 and "memoize" in template:
        inner_task = fanout.substitute(inner[0], values)
        run = templates.get(inner_task["template"], {})
        return memoize, fanout.substitute(run, fanout.inputs(run, inner_task.get("arguments") or {}))
    return memoize, fanout.substitute(template, values)


def _parse_dag(templates: dict[str, dict[str, Any]], dag: list[dict[str, Any]]) -> list[Task]:
    names = [t["name"] for t in dag]
    tasks = []
    for task in dag:
        expression = task.get("depends", "")
        # which tasks it waits for: every task named in the expression (Argo waits for each)
        depends = [n for n in names if re.search(rf"(?<![A-Za-z0-9_-]){re.escape(n)}(?![A-Za-z0-9_-])", expression)]
        expanded = fanout.expand(task)
        for one in expanded if expanded is not None else [task]:
            memoize, run = _instance(templates, one)
            children = None
            if "dag" in run and not memoize:  # a DAG template of its own
                children = _parse_dag(templates, run["dag"].get("tasks", []))
            limit = int(run["parallelism"]) if children is not None and run.get("parallelism") else None
            tasks.append(Task(one["name"], depends, run, expression, memoize, children, limit,
                              task["name"] if expanded is not None else ""))
    return tasks


def parse_tasks(workflow: dict[str, Any]) -> list[Task]:
    """The entrypoint DAG's tasks in order (fan-outs expanded), with their dependencies, step cache
    and templates; a task that runs a DAG template of its own carries that DAG's tasks."""
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    dag = templates[workflow["spec"]["entrypoint"]].get("dag", {}).get("tasks", [])
    return _parse_dag(templates, dag)


class WorkflowExecutor:
    """Executes Workflows for the local target (see module docstring)."""

    def __init__(self, db: StateDB, state_dir: Path, workspace: Path, repo_root: Path, runtime_python: str,
                 max_parallel: int = 1, progress: Progress | None = None, code_root: Path | None = None,
                 step_host: bool = True) -> None:
        self.db = db
        self.code_root = code_root or Path(__file__).resolve().parents[3]
        self.state_dir = state_dir
        self.workspace = workspace
        self.repo_root = repo_root
        self.python = runtime_python
        self.max_parallel = max_parallel
        self.progress = progress or (lambda event: None)
        #: Forks the steps from one interpreter that imported torch once (None: each step is a
        #: fresh process); started on the first step it takes, stopped when the run ends.
        self.host = StepHost(runtime_python, self._base_env(), repo_root, state_dir / "logs" / "step-host.log") if step_host else None

    # -- commands ---------------------------------------------------------------------------
    def _argv(self, container: dict[str, Any]) -> list[str]:
        command = list(container.get("command") or [])
        if command[:1] == ["python"]:
            command = [self.python, *command[1:]]
        elif command[:1] == ["torchrun"]:
            command = [self.python, "-m", "torch.distributed.run", *command[1:]]
        return command + list(container.get("args") or [])

    def _base_env(self) -> dict[str, str]:
        """What every step's environment starts from: forgectl's own, with the workspace and code."""
        env = dict(os.environ)
        env[WORKSPACE_ENV] = str(self.workspace)
        env["FORGE_SOURCE_ROOT"] = str(self.repo_root)
        env["PYTHONPATH"] = str(self.code_root)  # the runtimes' code; the user's data is under FORGE_SOURCE_ROOT
        env.setdefault("FORGE_CACHE", str(Path.home() / ".cache" / "forge"))
        return env

    def _env(self, container: dict[str, Any]) -> dict[str, str]:
        base = self._base_env()
        env = dict(base)
        for item in container.get("env") or []:
            if "valueFrom" in item:
                # A Secret's key in a cluster (S3 credentials): the local target runs steps with
                # forgectl's own environment, which holds them (or not) already.
                continue
            env[item["name"]] = str(item.get("value", ""))
        # what the target sets wins over a container's own value, as before
        for name in (WORKSPACE_ENV, "FORGE_SOURCE_ROOT", "PYTHONPATH"):
            env[name] = base[name]
        return env

    # -- state ------------------------------------------------------------------------------
    def _set_step(self, workflow: str, step: str, **values: Any) -> None:
        self.db.set_step(workflow, step, **values)

    def _cached(self, task: Task) -> bool:
        if not task.key:
            return False
        entry = self.db.cached_step(task.key)
        return entry is not None and (entry.output is None or (self.workspace / entry.output).exists())

    def _reap_leftovers(self, workflow: str) -> None:
        """Stop step processes a killed `forgectl` left running: the step restarts cleanly."""
        for record in self.db.processes():
            if record.kind == "step" and record.info.get("workflow") == workflow:
                if alive(record):
                    self.progress({"event": "reaped", "workflow": workflow, "task": record.info.get("step"), "pid": record.pid})
                    stop(record)
                self.db.forget_process(record.name)

    # -- running ----------------------------------------------------------------------------
    def _run_task(self, workflow: str, task: Task) -> tuple[int, str]:
        """Run one task (with its retries); (exit code, last error line)."""
        template = task.template
        if "container" not in template:
            return 1, f"step {task.name} needs a cluster ({next(iter(k for k in template if k in ('resource', 'script')), 'unsupported')} template)"
        container = template["container"]
        retry = template.get("retryStrategy") or {}
        limit = int(retry.get("limit", 0))
        backoff = retry.get("backoff") or {}
        delay = _seconds(backoff.get("duration", "1s"))
        factor = float(backoff.get("factor", 2))
        log_path = self.state_dir / "logs" / "workflows" / workflow / f"{task.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        code, last = 1, ""
        for attempt in range(limit + 1):
            self._set_step(workflow, task.name, status="running", attempts=attempt + 1, started=time.time(), log=str(log_path))
            started = time.monotonic()
            code, last = self._spawn_and_wait(workflow, task, container, log_path)
            if code == 0 or attempt == limit:
                break
            try:
                again = upstream.argo_eval_retry(retry.get("expression", "true"), code, "Failed",
                                                 duration_seconds=time.monotonic() - started, message=last,
                                                 retries=attempt, retry_policy=retry.get("retryPolicy"), limit=limit)
            except upstream.UpstreamError as exc:
                last = f"{last} (not retried: {exc})"
                break
            if not again:
                break
            wait = min(delay * factor**attempt, MAX_LOCAL_BACKOFF)
            self.progress({"event": "retry", "workflow": workflow, "task": task.name, "attempt": attempt + 2, "in": wait, "error": last})
            time.sleep(wait)
        return code, last

    def _spawn_and_wait(self, workflow: str, task: Task, container: dict[str, Any], log_path: Path) -> tuple[int, str]:
        argv = self._argv(container)
        with open(log_path, "ab") as log:
            log.write(f"$ {' '.join(argv[:4])} …\n".encode())
        env = self._env(container)
        proc: StepProcess | None = None
        if self.host is not None and self.host.accepts(argv, env):
            proc = self.host.spawn(argv, env, self.repo_root)
        if proc is None:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=str(self.repo_root), start_new_session=True, preexec_fn=die_with_parent)
        record = ProcessRecord(f"step/{workflow}/{task.name}", "step", proc.pid, start_ticks(proc.pid) or -1, argv[:4],
                               str(log_path), {"workflow": workflow, "step": task.name})
        self.db.record_process(record)
        last = ""
        assert proc.stdout is not None
        with open(log_path, "ab") as log:
            for raw in proc.stdout:
                log.write(raw)
                log.flush()
                line = raw.decode(errors="replace").strip()
                if line.startswith("{"):
                    try:
                        event = json.loads(line)
                    except json.JSONDecodeError:
                        event = None
                    if isinstance(event, dict) and "event" in event:
                        self.progress({**event, "workflow": workflow, "task": task.name})
                        continue
                if line:
                    last = line
        code = proc.wait()
        self.db.forget_process(record.name)
        # A process killed by a signal ends as a container's would: 128 + the signal (SIGKILL: 137),
        # the exit code Argo's retry expression sees on a cluster (Popen says -9).
        return (128 - code if code < 0 else code), last

    def run(self, workflow: dict[str, Any]) -> Outcome:
        """Run the workflow to its end; record every step; return how it ended."""
        name = workflow["metadata"]["name"]
        tasks = parse_tasks(workflow)
        self._reap_leftovers(name)
        self.db.start_workflow_run(name, time.time())
        entry = next(t for t in workflow["spec"]["templates"] if t["name"] == workflow["spec"]["entrypoint"])
        run = _Run(name, threading.BoundedSemaphore(max(1, min(int(workflow["spec"].get("parallelism") or 1), self.max_parallel))))
        self.progress({"event": "workflow", "workflow": name, "steps": [t.name for t in tasks]})
        try:
            self._run_dag(run, tasks, int(entry["parallelism"]) if entry.get("parallelism") else None)
            status = run.status
            phase = "Succeeded" if all(status.get(t.name) in ("succeeded", "cached", "omitted") for t in tasks) else "Failed"
            message = run.failure if phase == "Failed" else f"{sum(s == 'cached' for s in status.values())} cached, {sum(s == 'succeeded' for s in status.values())} ran"
            self._on_exit(workflow, phase, run.failure)
        finally:
            if self.host is not None:
                self.host.close()
        self.db.finish_workflow_run(name, phase, time.time(), message)
        return Outcome(phase, message, status)

    def _run_dag(self, run: _Run, tasks: list[Task], limit: int | None) -> None:
        """Run one DAG's tasks as their dependencies allow, at most ``limit`` at a time (its
        template's `parallelism`; step processes are bounded by the run's semaphore)."""
        name, status, lock = run.workflow, run.status, run.lock
        groups: dict[str, list[str]] = {}
        for t in tasks:
            if t.group:
                groups.setdefault(t.group, []).append(t.name)

        def work(task: Task) -> None:
            if task.children is not None:
                self._set_step(name, task.name, status="running", attempts=1, started=time.time())
                self._run_dag(run, task.children, task.limit)
                ok = all(status.get(c.name) in ("succeeded", "cached", "omitted") for c in task.children)
                finish(task, *((0, "") if ok else (1, run.failure)))
            else:
                with run.pods:  # held until the step's end is recorded: the next one starts after it
                    finish(task, *self._run_task(name, task))

        def finish(task: Task, code: int, last: str) -> None:
            with lock:
                if code == 0:
                    status[task.name] = "succeeded"
                    if task.key:
                        self.db.cache_step(task.key, task.name, name, task.output, time.time())
                else:
                    status[task.name] = "failed"
                    run.failure = run.failure or f"step {task.name} failed (exit {code}): {last}"
            self._set_step(name, task.name, status=status[task.name], finished=time.time(), exit_code=code, message=last)
            self.progress({"event": "step", "workflow": name, "task": task.name, "status": status[task.name], "exit": code, "message": last})

        verdicts: dict[str, bool] = {}

        def result(dep: str) -> upstream.TaskResult:
            """What Argo's `depends` sees of a dependency: its phase, or a fan-out's group with its children's."""
            if dep not in groups:
                return ARGO_PHASE[status[dep]]
            children = [ARGO_PHASE[status[c]] for c in groups[dep]]
            failed = next((c for c in children if c in ("Failed", "Error")), None)
            return {"phase": failed or "Succeeded", "children": children}

        def done(dep: str) -> bool:
            return all(c in status for c in groups.get(dep, [dep]))

        def ready(task: Task) -> bool:
            """Its dependencies are done and Argo's evaluation of its `depends` holds (asked once;
            a task whose `depends` is false is omitted, as Argo omits it)."""
            if task.name in status or not all(done(d) for d in task.depends):
                return False
            if task.name not in verdicts:
                try:
                    verdicts[task.name] = not task.expression or upstream.argo_eval_depends(
                        task.expression, {d: result(d) for d in task.depends})
                except upstream.UpstreamError as exc:
                    status[task.name], run.failure = "failed", run.failure or f"step {task.name}: {exc}"
                    return False
                if not verdicts[task.name]:
                    status[task.name] = "omitted"
                    self.progress({"event": "step", "workflow": name, "task": task.name, "status": "omitted"})
            return verdicts[task.name] and task.name not in status

        running: dict[str, threading.Thread] = {}
        while True:
            with lock:
                failed = "failed" in status.values()  # after a failure nothing new starts
                startable = [] if failed else [t for t in tasks if ready(t) and t.name not in running]
            for task in startable:
                if self._cached(task):
                    with lock:
                        status[task.name] = "cached"
                    self._set_step(name, task.name, status="cached", cached=1, finished=time.time(), exit_code=0)
                    self.progress({"event": "step", "workflow": name, "task": task.name, "status": "cached"})
                elif limit is None or len(running) < limit:
                    thread = threading.Thread(target=work, args=(task,), daemon=True)
                    running[task.name] = thread
                    self.progress({"event": "step", "workflow": name, "task": task.name, "status": "running"})
                    thread.start()
            running = {step: thread for step, thread in running.items() if thread.is_alive()}
            with lock:
                idle = not running and (failed or not any(ready(t) for t in tasks))
            if idle:
                break
            time.sleep(0.05)

    def _on_exit(self, workflow: dict[str, Any], phase: str, failure: str) -> None:
        handler = workflow["spec"].get("onExit")
        if not handler:
            return
        template = next(t for t in workflow["spec"]["templates"] if t["name"] == handler)
        container = dict(template["container"])
        failures = json.dumps([{"message": failure}] if failure else [])
        container["args"] = [a.replace("{{workflow.status}}", phase).replace("{{workflow.failures}}", failures) for a in container.get("args", [])]
        log = self.state_dir / "logs" / "workflows" / workflow["metadata"]["name"] / f"{handler}.log"
        self._spawn_and_wait(workflow["metadata"]["name"], Task(handler, [], template), container, log)


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", str(text))
    if not match:
        return 1.0
    return float(match[1]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match[2]]
