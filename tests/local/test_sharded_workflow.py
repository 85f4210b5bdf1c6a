"""A sharded data set end to end on the local target: `forgectl apply` of examples/sharded runs the
rendered fan-out (one process per group of shards) → the join → train on the streamed shards →
evaluate → register; then one shard changes and only its group is prepared again (the memoize
cache), which the plan says before anything runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from contextlib import closing
from pathlib import Path

import git
import pytest

from reconciler.targets.local.state import StateDB
from tests.local.test_local_target import Workspace

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sharded"
pytestmark = pytest.mark.runtime

CHANGE_ONE_SHARD = r'''
import re, sys
from pathlib import Path
import pyarrow.parquet as pq
from runtimes.shards import file_digest, tree
root = Path(sys.argv[1]); folder = root / "data" / "digits"
shard = folder / "part-00003.parquet"
table = pq.read_table(shard)
pq.write_table(table.slice(0, table.num_rows - 5), shard)
spec = root / "specs" / "dataset.yaml"; text = spec.read_text()
digests = [file_digest(p) for p in sorted(folder.glob("*.parquet"))]
pinned = re.findall(r"digest: (sha256:[0-9a-f]{64})", text)
spec.write_text(text.replace(pinned[3], digests[3]).replace(pinned[-1], tree(digests, 2)["root"]))
'''


def example_repo(example: Path, path: Path) -> git.Repo:
    """A git repository at ``path`` holding ``example``: its specs under `specs/` (its scripts left
    out), its data under `data/` (the Environment's root is the repository), committed."""
    shutil.copytree(example, path / "specs", ignore=shutil.ignore_patterns("data", "*.py"))
    shutil.copytree(example / "data", path / "data")
    repo = git.Repo.init(path)
    repo.config_writer().set_value("user", "name", "T").set_value("user", "email", "t@example.com").release()
    repo.git.add(A=True)
    repo.index.commit(f"the {example.name} example")
    return repo


def apply_example(example: Path, path: Path, runtime_python: str) -> tuple[git.Repo, Workspace, str, list[str]]:
    """``example`` in a repository at ``path``, applied on the local target: the repository, the
    workspace, what `apply` printed and the groups of shards the first Workflow names."""
    repo = example_repo(example, path)
    ws = Workspace(path, runtime_python)
    applied = ws.forgectl("apply", "specs", "--auto-approve").stdout
    return repo, ws, applied, re.findall(r"group\(\d:[0-9a-f]{32}\)", applied.split("will run")[0])


def test_sharded_dataset_fans_out_trains_streamed_and_reprepares_one_group(tmp_path: Path, runtime_python: str) -> None:
    path = tmp_path / "repo"
    repo, ws, applied, groups = apply_example(EXAMPLE, path, runtime_python)
    assert len(groups) == 3, applied  # six shards in groups of two, each named before it runs
    [wf] = ws.status()["workflows"]
    assert wf["phase"] == "Succeeded", wf
    steps = {s["step"]: s["status"] for s in wf["steps"]}
    assert steps == dict.fromkeys([*groups, "prepare-shards", "prepare-data", "train", "evaluate", "register"], "succeeded")

    workspace = path / ".forge" / "local" / "workspace"
    [data] = (workspace / "data" / "digits-shards").glob("[0-9a-f]" * 12)
    manifest = json.loads((data / "manifest.json").read_text())
    assert len(manifest["groups"]) == 3 and sum(manifest["rows"].values()) == 1797  # every digit once
    [version] = (workspace / "models" / "digits-sharded").iterdir()
    train = json.loads((version / "train" / "metrics.json").read_text())
    # 4 epochs of the streamed train split, 2 loader workers, batches of 64: each worker ends on a short batch
    half = manifest["rows"]["train"] // 2
    assert train["steps"] == 4 * (-(-half // 64) + -(-(manifest["rows"]["train"] - half) // 64))
    # the example checkpoints its four blocks in two segments (`gradientCheckpointing: sqrt`), in the Workflow
    assert train["gradientCheckpointing"] == "sqrt" and train["throughput"]["savedTensorBytes"] > 0, train
    evaluated = json.loads((version / "evaluate" / "metrics.json").read_text())
    assert evaluated["accuracy"] >= 0.85

    subprocess.run([runtime_python, "-c", CHANGE_ONE_SHARD, str(path)], check=True, timeout=120,
                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    repo.git.add(A=True)
    repo.index.commit("one shard changed")
    plan = ws.forgectl("plan", "specs", check=False).stdout
    # the plan counts what moved in the data set before what the cache makes of it
    assert "(1 of 6 shards changed (part-00003.parquet), 1 of 3 groups changed) → retrain model" in " ".join(plan.split()), plan
    hits = plan.split("cache hit (unchanged since the last run): ")[1].splitlines()[0]
    runs = plan.split("will run: ")[1].splitlines()[0]
    assert hits.split(", ") == [groups[0], groups[2]], plan
    assert re.match(r"group\(1:[0-9a-f]{32}\), prepare-data, train", runs) and groups[1] not in runs, plan
    ws.forgectl("apply", "specs", "--auto-approve")
    [wf2] = [w for w in ws.status()["workflows"] if w["name"] != wf["name"]]
    assert wf2["phase"] == "Succeeded", wf2
    steps2 = {s["step"]: s["status"] for s in wf2["steps"]}
    assert [steps2[g] for g in (groups[0], groups[2])] == ["cached", "cached"]
    assert [s for s, v in steps2.items() if s.startswith("group(") and v == "succeeded"] == [runs.split(", ")[0]]
    with closing(StateDB(path / ".forge" / "local" / "state.db")) as db:
        ran = {r.step for r in db.step_runs(wf2["name"]) if r.started is not None and r.step.startswith("group(")}
    assert ran == {runs.split(", ")[0]}
