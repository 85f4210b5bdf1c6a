"""The local target end to end, through the real CLI: workflows as local processes with the step
cache, model servers behind HAProxy, a local Prometheus gating the canary, resume after a kill,
and `forgectl down` leaving no process behind.

Every test works in a copy of one template: a git repository where the quick-start was applied
once (its model trained and registered) and then brought down, so nothing of it runs. A test
starts what it needs in its copy (`Workspace.up`) and stops it at the end; the tests of one class
read one copy's walk (a fixture that walks it whole for whichever runs first). No test depends on
another having run before it, and any one runs alone (`-k`). What the tests read, they read
through `forgectl` (status, models, plan) and the state DB's own methods, never its tables.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git
import pytest

from reconciler.targets.local.processes import ProcessRecord, alive
from reconciler.targets.local.state import StateDB
from tests.polling import wait_until
from tests.specedits import REJECTED_VARIANT, add_rejected_variant

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.runtime

ALL_STEPS = ("prepare-data", "train", "evaluate", "compress-pruned", "compress-int8", "compress-gutted", "export-base",
             "benchmark", "register")
#: Registered: not `gutted`, the variant beyond its accuracy bound the tests add (`_new_repo`).
VARIANTS = {"base", "pruned", "int8", "base-onnx", "base-onnx-int8"}
DIGITS_DIGEST = "sha256:4eca0a80f7990df18560bf7c80f03e0893a8868820f1ee4405e0402527902353"


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

    def processes(self) -> list[ProcessRecord]:
        """The processes the local target has recorded (StateDB's own reader)."""
        with closing(StateDB(self.path / ".forge" / "local" / "state.db")) as db:
            return db.processes()

    def objects(self, kind: str) -> list[dict[str, Any]]:
        """The live objects of ``kind`` the local target holds (StateDB's own reader)."""
        with closing(StateDB(self.path / ".forge" / "local" / "state.db")) as db:
            return [o for o in db.objects() if o["kind"] == kind]

    def status(self) -> dict[str, Any]:
        return json.loads(self.forgectl("status", "specs", "-o", "json").stdout)

    def up(self) -> dict[str, Any]:
        """Serve what the specs say: the workflow is live already (a no-op), the endpoint's
        servers, router and Prometheus start. Returns the status."""
        self.forgectl("apply", "specs", "--auto-approve")
        return self.status()

    def prometheus(self, query: str) -> list[dict[str, Any]]:
        """Ask the local Prometheus (found by its process record) an instant query."""
        [record] = [p for p in self.processes() if p.kind == "prometheus"]
        url = f"http://127.0.0.1:{record.info['port']}/api/v1/query?query={urllib.parse.quote(query)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", (query, body)
        return body["data"]["result"]

    def roll_out(self, *, expect_rc: int) -> subprocess.CompletedProcess[str]:
        """Send load while `reconcile --watch` drives the rollout until it settles."""
        load = subprocess.Popen([sys.executable, "-m", "forgectl", "load", "digits", "specs", "--rate", "30", "--seconds", "120",
                                 "-o", "json"], cwd=self.path, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out = self.forgectl("reconcile", "specs", "--watch", "--interval", "1", "--until-settled", "--timeout", "150",
                                check=False, timeout=200)
        finally:
            load.send_signal(signal.SIGINT)
            load.wait(timeout=30)
        assert out.returncode == expect_rc, out.stdout + out.stderr
        return out


@dataclass(frozen=True)
class Template:
    """The quick-start applied once and brought down: copied, never used in place."""

    path: Path
    apply_output: str


def _new_repo(path: Path) -> None:
    shutil.copytree(ROOT / "examples" / "quickstart", path / "specs")
    # Shorter canary pauses for the tests; the shape is the example's.
    rollout = path / "specs" / "rollout.yaml"
    # (and a looser latency bound: a loaded 2-core CI machine can push a healthy p99 past 200 ms)
    rollout.write_text(rollout.read_text().replace("pause: 5s", "pause: 2s").replace("max: 0.2", "max: 2.0"))
    add_rejected_variant(path / "specs")
    repo = git.Repo.init(path)
    repo.config_writer().set_value("user", "name", "T").set_value("user", "email", "t@example.com").release()
    repo.index.add(["specs"])
    repo.index.commit("quickstart")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, runtime_python: str) -> Template:
    path = tmp_path_factory.mktemp("local-template") / "repo"
    _new_repo(path)
    template = Workspace(path, runtime_python)
    try:
        out = template.forgectl("apply", "specs", "--auto-approve")
    finally:
        template.forgectl("down", "specs", check=False)
    assert template.processes() == [], "the template keeps nothing running: each copy starts its own"
    # A connection that closes during a copy removes the WAL mid-way (shutil.Error on
    # state.db-wal): the test's own readers close theirs at once, and copies start once no other
    # process holds any of the template's files open.
    wait_until(lambda: not _holders(path), 30, f"no process to hold the template's files open ({_holders(path)})")
    return Template(path, out.stdout)


def _holders(folder: Path) -> list[str]:
    """`pid command` of each process with a file under ``folder`` open."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and proc.name != str(os.getpid()) and any(os.readlink(fd).startswith(f"{folder}/") for fd in (proc / "fd").iterdir()):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name} {command[:120]}")
        except OSError:  # gone, or not ours to read
            continue
    return found


def _sockets(folder: str, names: list[str]) -> list[str]:
    """A stopped process's leftover Unix sockets (HAProxy's admin socket): not state, not copyable."""
    return [n for n in names if stat.S_ISSOCK(os.lstat(os.path.join(folder, n)).st_mode)]


@pytest.fixture
def ws(trained: Template, tmp_path: Path, runtime_python: str) -> Iterator[Workspace]:
    """A private copy of the template (repository, specs, state DB, workspace)."""
    path = tmp_path / "repo"
    shutil.copytree(trained.path, path, symlinks=True, ignore=_sockets)
    workspace = Workspace(path, runtime_python)
    yield workspace
    started = workspace.processes()
    workspace.forgectl("down", "specs", check=False)
    assert not [p.name for p in started if alive(p)], "a process of this test outlived `forgectl down`"


def infer(url: str) -> int:
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}).encode()
    req = urllib.request.Request(f"{url}/v2/models/digits-mlp/infer", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status


def new_canary(ws: Workspace, rate: str) -> str:
    """Change the learning rate and apply: a new version trains and waits as a canary at 0 %."""
    ws.edit("model.yaml", "learningRate: 0.002", f"learningRate: {rate}")
    ws.forgectl("apply", "specs", "--auto-approve")
    [endpoint] = ws.status()["endpoints"]
    assert endpoint["canary"] and endpoint["weights"] == {"stable": 100, "canary": 0}, endpoint
    return str(endpoint["canary"])


@dataclass(frozen=True)
class Promotion:
    """One workspace's way from the template to a promoted second version, as a user takes it:
    serve, plan (nothing to do), change the learning rate, plan, apply (a canary at 0 %), roll
    out under load (promoted). What each step printed is kept for the tests that read it."""

    ws: Workspace
    served: dict[str, Any]
    served_code: int
    clean_plan: subprocess.CompletedProcess[str]
    change_plan: subprocess.CompletedProcess[str]
    canary: dict[str, Any]
    rollout: subprocess.CompletedProcess[str]


@pytest.fixture(scope="class")
def promotion(trained: Template, tmp_path_factory: pytest.TempPathFactory, runtime_python: str) -> Iterator[Promotion]:
    """The tests of :class:`TestALearningRateChange` read one promotion: each would otherwise
    train and roll out the same second version again (minutes of CPU each on a 2-core machine).
    Any one of them still runs alone: the fixture walks the whole way for it."""
    path = tmp_path_factory.mktemp("local-promotion") / "repo"
    shutil.copytree(trained.path, path, symlinks=True, ignore=_sockets)
    ws = Workspace(path, runtime_python)
    try:
        served = ws.up()
        served_code = infer(served["endpoints"][0]["url"])
        clean_plan = ws.forgectl("plan", "specs", "--detailed-exitcode", check=False)
        ws.edit("model.yaml", "learningRate: 0.002", "learningRate: 0.003")
        change_plan = ws.forgectl("plan", "specs", "--detailed-exitcode", check=False)
        ws.forgectl("apply", "specs", "--auto-approve")
        canary = ws.status()
        rollout = ws.roll_out(expect_rc=0)
        yield Promotion(ws, served, served_code, clean_plan, change_plan, canary, rollout)
    finally:
        started = ws.processes()
        ws.forgectl("down", "specs", check=False)
    assert not [p.name for p in started if alive(p)], "a process of the promotion outlived `forgectl down`"


class TestALearningRateChange:
    """The quick-start served, then a hyperparameter change from its plan to the promoted version
    and its lineage (one :func:`promotion` for the class)."""

    def test_apply_runs_the_workflow_and_serves_the_model(self, trained: Template, promotion: Promotion) -> None:
        assert "Apply complete: 7 created" in trained.apply_output, trained.apply_output
        assert "+ create  Workflow forge-local/digits-mlp-" in trained.apply_output
        assert " → ".join(ALL_STEPS) + " will run" in trained.apply_output
        status = promotion.served
        [wf] = status["workflows"]
        assert wf["phase"] == "Succeeded"
        assert {s["step"]: s["status"] for s in wf["steps"]} == dict.fromkeys(ALL_STEPS, "succeeded")
        [model] = status["models"]
        assert set(model["variants"]) == VARIANTS and model["version"] == wf["version"]
        [endpoint] = status["endpoints"]
        assert endpoint["stable"] == wf["version"] and endpoint["canary"] is None
        assert endpoint["weights"] == {"stable": 100, "canary": 0}
        assert promotion.served_code == 200
        assert promotion.clean_plan.returncode == 0, promotion.clean_plan.stdout

    def test_the_plan_reruns_only_the_affected_steps(self, promotion: Promotion) -> None:
        plan = promotion.change_plan
        assert plan.returncode == 2, plan.stdout
        assert "`hyperparameters.learningRate` 0.002 → 0.003" in plan.stdout
        assert "cache hit (unchanged since the last run): prepare-data" in plan.stdout
        assert "will run: " + ", ".join(ALL_STEPS[1:]) in plan.stdout
        stable = promotion.served["endpoints"][0]["stable"]
        endpoint = promotion.canary["endpoints"][0]
        assert endpoint["stable"] == stable and endpoint["canary"] not in (None, stable)
        assert endpoint["weights"] == {"stable": 100, "canary": 0}
        [steps] = [{s["step"]: s["status"] for s in w["steps"]} for w in promotion.canary["workflows"]
                   if w["version"] == endpoint["canary"]]
        assert steps == {"prepare-data": "cached", **dict.fromkeys(ALL_STEPS[1:], "succeeded")}, steps

    def test_healthy_canary_is_promoted_by_the_gates(self, promotion: Promotion) -> None:
        stable = promotion.served["endpoints"][0]["stable"]
        canary = promotion.canary["endpoints"][0]["canary"]
        assert "Promoted" in promotion.rollout.stdout, promotion.rollout.stdout
        endpoint = promotion.ws.status()["endpoints"][0]
        assert endpoint["rollout"]["phase"] == "Promoted", endpoint["rollout"]
        assert endpoint["stable"] == canary != stable and endpoint["canary"] is None
        assert endpoint["weights"] == {"stable": 100, "canary": 0}
        assert infer(endpoint["url"]) == 200

    def test_registry_lists_both_versions_with_lineage_and_the_leaderboard(self, promotion: Promotion) -> None:
        ws = promotion.ws
        first, second = promotion.served["endpoints"][0]["stable"], promotion.canary["endpoints"][0]["canary"]
        data = json.loads(ws.forgectl("models", "--specs", "specs", "-o", "json").stdout)
        old, new = data["versions"]
        assert (old["version"], new["version"]) == (first, second)
        repo = git.Repo(ws.path)
        commits = [c.hexsha[:12] for c in repo.iter_commits()]
        for record in (old, new):
            line = record["lineage"]
            assert line["datasetDigest"] == DIGITS_DIGEST
            assert line["gitCommit"] in commits and line["workflow"].startswith("digits-mlp-") and line["specDigest"]
            assert record["hardware"]["threads"] == 1 and record["evaluation"]["accuracy"] >= 0.95
        assert old["lineage"]["gitCommit"] != new["lineage"]["gitCommit"]
        assert {"endpoint": "digits", "role": "stable", "variant": "int8", "traffic": 100, "live": True} in new["servedBy"]
        [board] = data["leaderboards"]
        rows = {(r["version"], r["variant"]): r for r in board["rows"]}
        assert {v for _, v in rows} == VARIANTS and len(rows) == 10
        for row in rows.values():  # every variant measured by the benchmark step on this machine
            assert row["accuracy"] is not None and row["p50Ms"] > 0 and row["p99Ms"] >= row["p50Ms"] and row["sizeBytes"] > 0
        assert any(r["pareto"] for r in board["rows"])
        onnx_int8 = rows[(second, "base-onnx-int8")]
        assert onnx_int8["runtime"] == "onnxruntime" and onnx_int8["sizeBytes"] < 0.4 * rows[(second, "base")]["sizeBytes"]
        diff = ws.forgectl("models", "diff", "digits-mlp", "--specs", "specs").stdout
        assert "`hyperparameters.learningRate` 0.002 → 0.003" in diff and "pt)" in diff
        text = ws.forgectl("models", "--specs", "specs").stdout
        assert "Leaderboard: dataset digits" in text and "base-onnx-int8" in text
        # The variant beyond its bound: in neither version's registry, each saying why.
        for record in (old, new):
            assert "gutted" not in record["variants"] and "more than the allowed 0.5" in record["rejected"]["gutted"], record
        shown = ws.forgectl("models", "show", f"digits-mlp@{second}", "--specs", "specs").stdout
        assert "variant gutted: rejected — accuracy dropped" in shown, shown

        # The Grafana dashboard's queries select the series the servers export (asked of the real Prometheus).
        [configmap] = ws.objects("ConfigMap")
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        dashboard = json.loads(next(iter(configmap["data"].values())))
        answered: dict[str, list[int]] = {}
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                result = ws.prometheus(target["expr"].replace("$__rate_interval", "10m"))
                answered.setdefault(panel["title"], []).append(len(result))
        for title in ("Traffic per arm", "Success rate per arm", "Latency quantiles per arm", "Rows per model call (dynamic batching)"):
            assert answered.get(title) and all(n > 0 for n in answered[title]), (title, answered)


def test_canary_with_injected_errors_rolls_back_and_stable_serves_throughout(ws: Workspace) -> None:
    stable = ws.up()["endpoints"][0]["stable"]
    ws.edit("endpoint.yaml", "  protocol: v2\n", "  protocol: v2\n  faultInjection:\n    errorRate: 0.5\n")
    canary = new_canary(ws, "0.0025")
    ws.roll_out(expect_rc=3)  # settled, with a rollback
    endpoint = ws.status()["endpoints"][0]
    assert endpoint["rollout"]["phase"] == "RolledBack" and "success-rate" in endpoint["rollout"]["reason"]
    assert endpoint["rollout"]["canary"] == canary
    assert endpoint["stable"] == stable and endpoint["canary"] is None and endpoint["weights"] == {"stable": 100, "canary": 0}
    # Zero failed requests to stable, as its own metrics count them.
    query = 'sum by (forge_version, code) (forge_requests_total{forge_endpoint="digits",forge_role="stable"})'
    series = {(r["metric"].get("forge_version"), r["metric"].get("code")): float(r["value"][1]) for r in ws.prometheus(query)}
    assert series and any(code == "200" and n > 0 for (_, code), n in series.items()), series
    assert all(n == 0 for (_, code), n in series.items() if code != "200"), series
    assert infer(endpoint["url"]) == 200
    # The rolled-back version stays out: a plan does not bring its canary back (`rollout retry` would).
    plan = ws.forgectl("plan", "specs", "--detailed-exitcode", check=False)
    assert plan.returncode == 0, plan.stdout


def test_a_shadow_of_a_rejected_variant_is_held_and_the_endpoint_serves(ws: Workspace) -> None:
    # The shadow pins the variant the compress step rejected (no `select: fastest`, which would
    # pick among the registered ones): its server's wait fails, as its pod's init container would.
    ws.edit("endpoint.yaml", "  backend:\n    select: fastest\n    maxAccuracyDrop: 1.0\n",
            f"  shadow:\n    variant: {REJECTED_VARIANT}\n")
    ws.forgectl("apply", "specs", "--auto-approve")
    [endpoint] = ws.status()["endpoints"]
    assert infer(endpoint["url"]) == 200
    assert {p.info.get("role") for p in ws.processes() if p.kind == "serve"} == {"stable"}
    status = ws.forgectl("rollout", "status", "digits", "--specs", "specs").stdout
    held = f"shadow: not started — variant {REJECTED_VARIANT} of version {endpoint['stable']} was rejected: accuracy dropped"
    assert held in status, status
    # A registered variant: the shadow starts, is fed, and the hold is gone.
    ws.edit("endpoint.yaml", f"variant: {REJECTED_VARIANT}", "variant: base")
    ws.forgectl("apply", "specs", "--auto-approve")
    assert {p.info.get("role") for p in ws.processes() if p.kind == "serve"} == {"stable", "shadow"}
    assert infer(endpoint["url"]) == 200
    shadow = wait_until(lambda: json.loads(ws.forgectl("rollout", "status", "digits", "--specs", "specs", "-o", "json").stdout)
                        .get("shadow") or {}, 30, "the shadow's figures", interval=0.5)
    assert "held" not in shadow and shadow["mirrored"] >= 1, shadow


def test_killed_apply_resumes(ws: Workspace) -> None:
    ws.edit("model.yaml", "learningRate: 0.002", "learningRate: 0.004")
    ws.edit("model.yaml", "epochs: 30", "epochs: 150")  # a training long enough to be killed mid-way
    proc = subprocess.Popen([sys.executable, "-m", "forgectl", "apply", "specs", "--auto-approve"], cwd=ws.path, env=ws.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        train = wait_until(lambda: next((p for p in ws.processes() if p.kind == "step" and p.info.get("step") == "train"), None),
                           timeout=300, what="the train step to start", interval=0.5)
        log = Path(train.log)

        def trained_steps() -> int:
            steps = [json.loads(line)["step"] for line in log.read_text().splitlines()
                     if line.startswith("{") and '"progress"' in line]
            return max(steps, default=0)

        # past the first checkpoint (every 50 steps)
        wait_until(lambda: trained_steps() >= 120, timeout=300, what="training past step 120", ignore=(FileNotFoundError,))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    wait_until(lambda: not alive(train), timeout=10, what="the train step to die with its forgectl (a step must not outlive it)")
    out = ws.forgectl("apply", "specs", "--auto-approve")
    assert "Apply complete" in out.stdout
    workflow = train.info["workflow"]
    [steps] = [{s["step"]: s["status"] for s in w["steps"]} for w in ws.status()["workflows"] if w["name"] == workflow]
    assert steps["prepare-data"] == "cached" and steps["train"] == "succeeded" and steps["register"] == "succeeded", steps
    log_text = (ws.path / ".forge" / "local" / "logs" / "workflows" / workflow / "train.log").read_text()
    assert '"event": "resume"' in log_text or '"event":"resume"' in log_text


def test_down_leaves_no_process(ws: Workspace) -> None:
    ws.up()
    records = ws.processes()
    assert {p.kind for p in records} >= {"serve", "router", "prometheus"}
    assert all(alive(p) for p in records)
    ws.forgectl("down", "specs")
    # `down` returns once each process is gone (it waits for them), so no deadline is needed here
    assert not [p for p in records if alive(p)]
    assert ws.processes() == []
    assert ws.objects("SeldonDeployment") == [] and ws.objects("Workflow")  # what ran stays; what served is gone
