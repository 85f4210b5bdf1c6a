"""The local target's state: one SQLite database under `.forge/` — live manifests, workflow runs
and step cache, processes (PID + start time), rollout states. WAL mode, so `forgectl status`
reads while an apply writes."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.registry.records import Record
from reconciler.resources import ObjectRef
from reconciler.targets.base import StepRun, WorkflowRun
from reconciler.targets.local.processes import ProcessRecord

SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (ref TEXT PRIMARY KEY, kind TEXT, namespace TEXT, name TEXT,
                                    manifest TEXT NOT NULL, resource_version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS processes (name TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS step_cache (key TEXT PRIMARY KEY, step TEXT, workflow TEXT, output TEXT, finished REAL);
CREATE TABLE IF NOT EXISTS steps (workflow TEXT, step TEXT, status TEXT, attempts INTEGER, started REAL,
                                  finished REAL, exit_code INTEGER, cached INTEGER, log TEXT, message TEXT,
                                  PRIMARY KEY (workflow, step));
CREATE TABLE IF NOT EXISTS workflows (name TEXT PRIMARY KEY, phase TEXT, started REAL, finished REAL, message TEXT);
CREATE TABLE IF NOT EXISTS rollouts (endpoint TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS model_registry (model TEXT NOT NULL, version TEXT NOT NULL, registered REAL NOT NULL,
                                           record TEXT NOT NULL, PRIMARY KEY (model, version));
"""


#: Columns of a step record that the executor sets (`steps` table); a name outside this set is a
#: bug, refused before it reaches the SQL text.
STEP_FIELDS = frozenset({"status", "attempts", "started", "finished", "exit_code", "cached", "log", "message"})


@dataclass(frozen=True)
class CachedStep:
    """A step cache entry: the workspace path the step wrote (None: it declares no output)."""

    output: str | None


class StateDB:
    """The local target's database (see module docstring). Every SQL statement of the local
    target lives in this class, so the schema has one owner."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
        # One connection, shared by the executor's step threads: a transaction at a time (a second
        # BEGIN on the connection while one is open fails, and the step's record would stay behind).
        self._tx_lock = threading.RLock()
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        """Close the connection now rather than when the object is collected (the last connection
        to close checkpoints the WAL and removes its files: a copy of the folder taken meanwhile
        would lose them mid-way)."""
        self.db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (one at a time on this connection, whichever thread asks)."""
        with self._tx_lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    # -- objects ----------------------------------------------------------------------------
    def objects(self) -> list[dict[str, Any]]:
        """Every stored manifest, with its resourceVersion."""
        return [json.loads(m) for (m,) in self.db.execute("SELECT manifest FROM objects ORDER BY ref")]

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        """One stored manifest."""
        row = self.db.execute("SELECT manifest FROM objects WHERE ref = ?", (str(ref),)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a manifest; its resourceVersion moves only when its content changed (so an
        unchanged apply writes nothing, as on a real API server)."""
        ref = ObjectRef.of(obj)
        content = _content(obj)
        with self.tx() as db:
            row = db.execute("SELECT manifest FROM objects WHERE ref = ?", (str(ref),)).fetchone()
            uid = f"local-{time.time_ns():x}"
            if row:
                old = json.loads(row[0])
                if _content(old) == content:
                    return old
                uid = old["metadata"].get("uid", uid)
            rv = self._next_rv(db)
            stored = {**content, "metadata": {**content["metadata"], "uid": uid, "resourceVersion": str(rv)}}
            db.execute("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?, ?)",
                       (str(ref), ref.kind, ref.namespace, ref.name, json.dumps(stored), rv))
            return stored

    def _next_rv(self, db: sqlite3.Connection) -> int:
        row = db.execute("SELECT value FROM kv WHERE key = 'resourceVersion'").fetchone()
        rv = int(row[0]) + 1 if row else 1
        db.execute("INSERT OR REPLACE INTO kv VALUES ('resourceVersion', ?)", (str(rv),))
        return rv

    def delete(self, ref: ObjectRef) -> None:
        """Forget one manifest."""
        with self.tx() as db:
            db.execute("DELETE FROM objects WHERE ref = ?", (str(ref),))

    # -- processes ----------------------------------------------------------------------------
    def processes(self) -> list[ProcessRecord]:
        """Every recorded process."""
        return [ProcessRecord(**json.loads(r)) for (r,) in self.db.execute("SELECT record FROM processes ORDER BY name")]

    def process(self, name: str) -> ProcessRecord | None:
        """One recorded process."""
        row = self.db.execute("SELECT record FROM processes WHERE name = ?", (name,)).fetchone()
        return ProcessRecord(**json.loads(row[0])) if row else None

    def record_process(self, record: ProcessRecord) -> None:
        """Remember a started process."""
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO processes VALUES (?, ?)", (record.name, json.dumps(record.to_json())))

    def forget_process(self, name: str) -> None:
        """Forget a stopped process."""
        with self.tx() as db:
            db.execute("DELETE FROM processes WHERE name = ?", (name,))

    # -- key/value ------------------------------------------------------------------------------
    def kv_get(self, key: str) -> Any:
        """A small JSON value."""
        row = self.db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def kv_set(self, key: str, value: Any) -> None:
        """Store a small JSON value."""
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (key, json.dumps(value)))

    # -- rollouts -------------------------------------------------------------------------------
    def rollout(self, endpoint: str) -> dict[str, Any] | None:
        """The stored rollout state of an endpoint."""
        row = self.db.execute("SELECT state FROM rollouts WHERE endpoint = ?", (endpoint,)).fetchone()
        return json.loads(row[0]) if row else None

    def set_rollout(self, endpoint: str, state: dict[str, Any]) -> None:
        """Store an endpoint's rollout state."""
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO rollouts VALUES (?, ?)", (endpoint, json.dumps(state)))

    def rollouts(self) -> dict[str, dict[str, Any]]:
        """Every stored rollout state, by endpoint."""
        return {endpoint: json.loads(state) for endpoint, state in self.db.execute("SELECT endpoint, state FROM rollouts")}

    # -- workflow runs and steps (the executor writes, `status` and the rollout gate read) ------------
    def start_workflow_run(self, name: str, started: float) -> None:
        """Record a workflow run as `Running` (replacing an earlier run of the same name)."""
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO workflows VALUES (?, 'Running', ?, NULL, '')", (name, started))

    def finish_workflow_run(self, name: str, phase: str, finished: float, message: str) -> None:
        """Record how a workflow run ended."""
        with self.tx() as db:
            db.execute("UPDATE workflows SET phase = ?, finished = ?, message = ? WHERE name = ?", (phase, finished, message, name))

    def workflow_runs(self, *, phase: str | None = None, name_like: str | None = None) -> list[WorkflowRun]:
        """Workflow runs, optionally only those in ``phase`` or whose name matches the SQL LIKE
        pattern ``name_like``, in the database's order."""
        clauses, params = [], []
        if phase is not None:
            clauses.append("phase = ?")
            params.append(phase)
        if name_like is not None:
            clauses.append("name LIKE ?")
            params.append(name_like)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self.db.execute(f"SELECT name, phase, message FROM workflows{where}", params).fetchall()
        return [WorkflowRun(*row) for row in rows]

    def set_step(self, workflow: str, step: str, **values: Any) -> None:
        """Create the step's record (pending) if it has none, then set ``values`` (columns of
        :data:`STEP_FIELDS`) in one transaction."""
        unknown = set(values) - STEP_FIELDS
        if unknown:
            raise ValueError(f"not a step field: {', '.join(sorted(unknown))}")
        with self.tx() as db:
            row = db.execute("SELECT status FROM steps WHERE workflow = ? AND step = ?", (workflow, step)).fetchone()
            if row is None:
                db.execute("INSERT INTO steps (workflow, step, status, attempts, cached) VALUES (?, ?, 'pending', 0, 0)", (workflow, step))
            for key, value in values.items():
                db.execute(f"UPDATE steps SET {key} = ? WHERE workflow = ? AND step = ?", (value, workflow, step))

    def step_runs(self, workflow: str) -> list[StepRun]:
        """The recorded steps of a workflow, in the order they started."""
        rows = self.db.execute(
            "SELECT step, status, attempts, started, finished, exit_code, message FROM steps WHERE workflow = ? ORDER BY started",
            (workflow,)).fetchall()
        return [StepRun(*row) for row in rows]

    def cache_step(self, key: str, step: str, workflow: str, output: str | None, finished: float) -> None:
        """Remember that the step with memoize ``key`` succeeded, writing ``output``."""
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO step_cache VALUES (?, ?, ?, ?, ?)", (key, step, workflow, output, finished))

    def cached_step(self, key: str) -> CachedStep | None:
        """The step cache entry of memoize ``key``, if a run of it succeeded."""
        row = self.db.execute("SELECT output FROM step_cache WHERE key = ?", (key,)).fetchone()
        return CachedStep(row[0]) if row else None

    # -- model registry (reconciler/registry/records.py) ----------------------------------------------------
    def put_model_version(self, registered: float, record: Record) -> None:
        """Record (or replace) one registered model version with its lineage and measurements."""
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO model_registry VALUES (?, ?, ?, ?)",
                       (record.model, record.version, registered, json.dumps(record.to_json(), sort_keys=True)))

    def model_versions(self, model: str | None = None) -> list[Record]:
        """Registered versions (of one model, or all), oldest first."""
        query = "SELECT record FROM model_registry" + (" WHERE model = ?" if model else "") + " ORDER BY registered, model, version"
        return [Record.from_json(json.loads(r)) for (r,) in self.db.execute(query, (model,) if model else ())]

    def has_model_version(self, model: str, version: str) -> bool:
        """Whether a version is recorded."""
        return self.db.execute("SELECT 1 FROM model_registry WHERE model = ? AND version = ?", (model, version)).fetchone() is not None


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k not in ("resourceVersion", "uid")}
    return {**{k: v for k, v in obj.items() if k != "metadata"}, "metadata": meta}
