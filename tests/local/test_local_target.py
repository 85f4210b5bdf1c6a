"""The local target end to end, through the real CLI: workflows as local processes with the step
cache, model servers behind HAProxy, a local Prometheus gating the canary, resume after a kill,
and `forgectl down` leaving no process behind. The tests run in order on one workspace."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import git
import pytest

from reconciler.targets.local.processes import ProcessRecord, alive

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.runtime


class Workspace:
    """A git repository holding the quick-start, where `forgectl` runs."""

    def __init__(self, path: Path, python: str) -> None:
        self.path = path
        self.env = {**os.environ, "FORGE_RUNTIME_PYTHON": python, "NO_COLOR": "1", "COLUMNS": "160"}

    def forgectl(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "forgectl", *args], cwd=self.path, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"forgectl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    def edit(self, file: str, old: str, new: str) -> None:
        path = self.path / "specs" / file
        text = path.read_text()
        assert old in text, (old, file)
        path.write_text(text.replace(old, new))
        repo = git.Repo(self.path)
        repo.index.add([f"specs/{file}"])
        repo.index.commit(f"{file}: {old} → {new}")

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path / ".forge" / "local" / "state.db")

    def steps(self, workflow_prefix: str = "") -> dict[str, dict[str, str]]:
        rows = self.db().execute("SELECT workflow, step, status FROM steps").fetchall()
        out: dict[str, dict[str, str]] = {}
        for wf, step, status in rows:
            if wf.startswith(workflow_prefix):
                out.setdefault(wf, {})[step] = status
        return out

    def processes(self) -> list[ProcessRecord]:
        return [ProcessRecord(**json.loads(r)) for (r,) in self.db().execute("SELECT record FROM processes")]

    def status(self) -> dict:
        return json.loads(self.forgectl("status", "specs", "-o", "json").stdout)


@pytest.fixture(scope="module")
def ws(tmp_path_factory, runtime_python) -> Workspace:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("local") / "repo"
    shutil.copytree(ROOT / "examples" / "quickstart", path / "specs")
    # Shorter canary pauses for the tests; the shape is the example's.
    rollout = path / "specs" / "rollout.yaml"
    # (and a looser latency bound: a loaded 2-core CI machine can push a healthy p99 past 200 ms)
    rollout.write_text(rollout.read_text().replace("pause: 5s", "pause: 2s").replace("max: 0.2", "max: 2.0"))
    repo = git.Repo.init(path)
    repo.config_writer().set_value("user", "name", "T").set_value("user", "email", "t@example.com").release()
    repo.index.add(["specs"])
    repo.index.commit("quickstart")
    workspace = Workspace(path, runtime_python)
    yield workspace
    workspace.forgectl("down", "specs", check=False)


def infer(url: str) -> int:
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}).encode()
    req = urllib.request.Request(f"{url}/v2/models/digits-mlp/infer", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status


def test_apply_runs_the_workflow_and_serves_the_model(ws: Workspace) -> None:
    out = ws.forgectl("apply", "specs", "--auto-approve")
    assert "Apply complete" in out.stdout
    status = ws.status()
    [wf] = status["workflows"]
    assert wf["phase"] == "Succeeded"
    assert {s["step"]: s["status"] for s in wf["steps"]} == {
        "prepare-data": "succeeded", "train": "succeeded", "evaluate": "succeeded",
        "compress-pruned": "succeeded", "compress-int8": "succeeded", "export-base": "succeeded",
        "benchmark": "succeeded", "register": "succeeded"}
    [model] = status["models"]
    assert set(model["variants"]) == {"base", "pruned", "int8", "base-onnx", "base-onnx-int8"}
    [endpoint] = status["endpoints"]
    assert endpoint["weights"] == {"stable": 100, "canary": 0}
    assert infer(endpoint["url"]) == 200
    plan = ws.forgectl("plan", "specs", "--detailed-exitcode", check=False)
    assert plan.returncode == 0, plan.stdout


def test_hyperparameter_change_reruns_only_the_affected_steps(ws: Workspace) -> None:
    ws.edit("model.yaml", "learningRate: 0.002", "learningRate: 0.003")
    plan = ws.forgectl("plan", "specs", "--detailed-exitcode", check=False)
    assert plan.returncode == 2
    assert "`hyperparameters.learningRate` 0.002 → 0.003" in plan.stdout
    assert "cache hit (unchanged since the last run): prepare-data" in plan.stdout
    assert "will run: train, evaluate, compress-pruned, compress-int8, export-base, benchmark, register" in plan.stdout
    ws.forgectl("apply", "specs", "--auto-approve")
    status = ws.status()
    steps = {s["step"]: s["status"] for w in status["workflows"] for s in w["steps"] if w["version"] == status["endpoints"][0]["canary"]}
    assert steps["prepare-data"] == "cached"
    assert all(steps[s] == "succeeded" for s in ("train", "evaluate", "compress-pruned", "compress-int8", "export-base",
                                                   "benchmark", "register")), steps
    endpoint = status["endpoints"][0]
    assert endpoint["canary"] and endpoint["weights"] == {"stable": 100, "canary": 0}


def test_healthy_canary_is_promoted_by_the_gates(ws: Workspace) -> None:
    load = subprocess.Popen([sys.executable, "-m", "forgectl", "load", "digits", "specs", "--rate", "30", "--seconds", "120",
                             "-o", "json"], cwd=ws.path, env=ws.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = ws.forgectl("reconcile", "specs", "--watch", "--interval", "1", "--until-settled", "--timeout", "150", timeout=200)
    finally:
        load.send_signal(signal.SIGINT)
        load.wait(timeout=30)
    assert "Promoted" in out.stdout, out.stdout
    endpoint = ws.status()["endpoints"][0]
    assert endpoint["canary"] is None and endpoint["rollout"]["phase"] == "Promoted"


def test_registry_lists_both_versions_with_lineage_and_the_leaderboard(ws: Workspace) -> None:
    data = json.loads(ws.forgectl("models", "--specs", "specs", "-o", "json").stdout)
    old, new = data["versions"]
    repo = git.Repo(ws.path)
    commits = [c.hexsha[:12] for c in repo.iter_commits()]
    for record in (old, new):
        line = record["lineage"]
        assert line["datasetDigest"] == "sha256:4eca0a80f7990df18560bf7c80f03e0893a8868820f1ee4405e0402527902353"
        assert line["gitCommit"] in commits and line["workflow"].startswith("digits-mlp-") and line["specDigest"]
        assert record["hardware"]["threads"] == 1 and record["evaluation"]["accuracy"] >= 0.95
    assert {"endpoint": "digits", "role": "stable", "variant": "int8", "traffic": 100, "live": True} in new["servedBy"]
    [board] = data["leaderboards"]
    rows = {(r["version"], r["variant"]): r for r in board["rows"]}
    assert {v for _, v in rows} == {"base", "pruned", "int8", "base-onnx", "base-onnx-int8"} and len(rows) == 10
    for row in rows.values():  # every variant measured by the benchmark step on this machine
        assert row["accuracy"] is not None and row["p50Ms"] > 0 and row["p99Ms"] >= row["p50Ms"] and row["sizeBytes"] > 0
    assert any(r["pareto"] for r in board["rows"])
    onnx_int8 = rows[(new["version"], "base-onnx-int8")]
    assert onnx_int8["runtime"] == "onnxruntime" and onnx_int8["sizeBytes"] < 0.4 * rows[(new["version"], "base")]["sizeBytes"]
    diff = ws.forgectl("models", "diff", "digits-mlp", "--specs", "specs").stdout
    assert "`hyperparameters.learningRate` 0.002 → 0.003" in diff and "pt)" in diff
    text = ws.forgectl("models", "--specs", "specs").stdout
    assert "Leaderboard: dataset digits" in text and "base-onnx-int8" in text

    # The Grafana dashboard's queries select the series the servers export (asked of the real Prometheus).
    (raw,) = ws.db().execute("SELECT value FROM kv WHERE key = 'prometheus'").fetchone()
    url = f"http://127.0.0.1:{json.loads(raw)['port']}"
    (manifest,) = ws.db().execute("SELECT manifest FROM objects WHERE kind = 'ConfigMap'").fetchone()
    configmap = json.loads(manifest)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(next(iter(configmap["data"].values())))
    answered = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            query = target["expr"].replace("$__rate_interval", "10m")
            with urllib.request.urlopen(f"{url}/api/v1/query?query={urllib.parse.quote(query)}", timeout=10) as resp:
                body = json.loads(resp.read())
            assert body["status"] == "success", (panel["title"], body)
            answered.setdefault(panel["title"], []).append(len(body["data"]["result"]))
    for title in ("Traffic per arm", "Success rate per arm", "Latency quantiles per arm", "Rows per model call (dynamic batching)"):
        assert all(n > 0 for n in answered[title]), (title, answered)


def test_canary_with_injected_errors_rolls_back_and_stable_serves_throughout(ws: Workspace) -> None:
    ws.edit("endpoint.yaml", "  protocol: v2\n", "  protocol: v2\n  faultInjection:\n    errorRate: 0.5\n")
    ws.edit("model.yaml", "learningRate: 0.003", "learningRate: 0.0025")
    ws.forgectl("apply", "specs", "--auto-approve")
    load = subprocess.Popen([sys.executable, "-m", "forgectl", "load", "digits", "specs", "--rate", "30", "--seconds", "120",
                             "-o", "json"], cwd=ws.path, env=ws.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = ws.forgectl("reconcile", "specs", "--watch", "--interval", "1", "--until-settled", "--timeout", "150",
                          check=False, timeout=200)
    finally:
        load.send_signal(signal.SIGINT)
        load.wait(timeout=30)
    assert out.returncode == 3, out.stdout + out.stderr  # settled, with a rollback
    endpoint = ws.status()["endpoints"][0]
    assert endpoint["rollout"]["phase"] == "RolledBack" and "success-rate" in endpoint["rollout"]["reason"]
    assert endpoint["canary"] is None and endpoint["weights"] == {"stable": 100, "canary": 0}
    # Zero failed requests to stable, as its own metrics count them.
    assert any(p.kind == "prometheus" for p in ws.processes()), "the local Prometheus runs"
    (raw,) = ws.db().execute("SELECT value FROM kv WHERE key = 'prometheus'").fetchone()
    url = f"http://127.0.0.1:{json.loads(raw)['port']}"
    query = 'sum by (forge_version, code) (forge_requests_total{forge_endpoint="digits",forge_role="stable"})'
    with urllib.request.urlopen(f"{url}/api/v1/query?query={urllib.parse.quote(query)}", timeout=10) as resp:
        series = {(r["metric"].get("forge_version"), r["metric"].get("code")): float(r["value"][1]) for r in json.loads(resp.read())["data"]["result"]}
    assert series and any(code == "200" and n > 0 for (_, code), n in series.items()), series
    assert all(n == 0 for (_, code), n in series.items() if code != "200"), series
    assert infer(endpoint["url"]) == 200
    # The rolled-back version stays out: a plan does not bring its canary back (`rollout retry` would).
    plan = ws.forgectl("plan", "specs", "--detailed-exitcode", check=False)
    assert plan.returncode == 0, plan.stdout


def test_killed_apply_resumes(ws: Workspace) -> None:
    ws.edit("endpoint.yaml", "  faultInjection:\n    errorRate: 0.5\n", "")
    ws.edit("model.yaml", "learningRate: 0.0025", "learningRate: 0.004")
    ws.edit("model.yaml", "epochs: 30", "epochs: 150")  # a training long enough to be killed mid-way
    proc = subprocess.Popen([sys.executable, "-m", "forgectl", "apply", "specs", "--auto-approve"], cwd=ws.path, env=ws.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    train = None
    while time.monotonic() < deadline and train is None:
        train = next((p for p in ws.processes() if p.kind == "step" and p.info.get("step") == "train"), None)
        time.sleep(0.5)
    assert train is not None, "train never started"
    log = Path(train.log)

    def trained_steps() -> int:
        steps = [json.loads(line)["step"] for line in log.read_text().splitlines()
                 if line.startswith("{") and '"progress"' in line]
        return max(steps, default=0)

    while time.monotonic() < deadline and trained_steps() < 120:  # past the first checkpoint (every 50 steps)
        time.sleep(0.1)
    assert trained_steps() >= 120
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    time.sleep(1)
    assert not alive(train), "a step must not outlive its forgectl"
    out = ws.forgectl("apply", "specs", "--auto-approve")
    assert "Apply complete" in out.stdout
    workflow = train.info["workflow"]
    steps = ws.steps(workflow)[workflow]
    assert steps["prepare-data"] == "cached" and steps["train"] == "succeeded" and steps["register"] == "succeeded"
    log = (ws.path / ".forge" / "local" / "logs" / "workflows" / workflow / "train.log").read_text()
    assert '"event": "resume"' in log or '"event":"resume"' in log


def test_down_leaves_no_process(ws: Workspace) -> None:
    records = ws.processes()
    assert {p.kind for p in records} >= {"serve", "router", "prometheus"}
    ws.forgectl("down", "specs")
    time.sleep(0.5)
    assert not [p for p in records if alive(p)]
    assert ws.processes() == []
