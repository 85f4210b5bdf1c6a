"""A sharded data set in the runtimes: the streaming `IterableDataset` gives every row to exactly
one (DDP rank, DataLoader worker), and S3 shards are prepared and joined from a real S3 API
(moto's server on 127.0.0.1, spoken to by Arrow's S3 filesystem), not a mock object."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from specs.shards import root_digest
from specs.stepconfig import shard_group_ids
from tests.runtimes.helpers import ROOT

pytestmark = pytest.mark.runtime

def shard_writer(table: str, row_group: int) -> str:
    """A script for the runtime environment (argv: folder, shards, rows per shard) that writes the
    shards `s000.parquet`, … as the Arrow table ``table`` (an expression of shard ``i``'s ``rng``,
    its row ids ``ids`` and ``rows``), row groups of ``row_group`` rows, and prints their
    entries (name, digest) as JSON."""
    return f'''
import json, sys
from pathlib import Path
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from runtimes.shards import file_digest
folder, n, rows = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
folder.mkdir(parents=True, exist_ok=True)
out = []
for i in range(n):
    ids = np.arange(i * rows, (i + 1) * rows)
    rng = np.random.default_rng(i)
    table = {table}
    path = folder / f"s{{i:03d}}.parquet"
    pq.write_table(table, path, row_group_size={row_group})
    out.append({{"name": path.name, "digest": file_digest(path)}})
print(json.dumps(out))
'''


#: Shards whose rows are numbered (`rowid`), a normal feature and a label 0…2 (row groups of 37 rows).
WRITE = shard_writer('pa.table({"rowid": ids.astype(np.float32), "f1": rng.normal(size=rows).astype(np.float32), "label": ids % 3})', 37)

STREAM = r'''
import json, sys
from pathlib import Path
from torch.utils.data import DataLoader
from runtimes._step import read_json
from runtimes.shard_stream import ShardStream, batches_per_rank
folder = Path(sys.argv[1]); meta = read_json(folder / "meta.json")
out = {}
for world, workers, even in ((1, 0, False), (3, 2, False), (4, 3, True), (2, 2, True)):
    seen, counts = [], []
    for rank in range(world):
        stream = ShardStream(folder, meta, batch_rows=16, rank=rank, world=world, even=even, seed=3)
        stream.set_epoch(1)
        batches = list(DataLoader(stream, batch_size=None, num_workers=workers))
        counts.append(len(batches))
        assert len(batches) == batches_per_rank(stream.total, world, workers, 16, even) or not even, (len(batches), world)
        seen += [int(v) for x, _ in batches for v in x[:, 0].tolist()]
    out[f"{world}x{workers}{'even' if even else ''}"] = {"seen": seen, "counts": counts, "total": stream.total}
print(json.dumps(out))
'''


def _run(python: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([python, *args], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"], **(env or {})})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def _spec(uri: str, files: list[dict[str, str]], **shards: Any) -> dict[str, Any]:
    return {"source": {"uri": uri, "format": "parquet", "shards": {"groupSize": 2, "files": files, **shards}},
            "version": "v1", "digest": root_digest([f["digest"] for f in files], 2), "labeling": {"column": "label"},
            "splits": {"train": 0.6, "validation": 0.2, "test": 0.2, "seed": 1}}


def _prepare(python: str, workspace: Path, spec: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The fan-out's steps as the rendered Workflow runs them: prepare-group per group, then join-shards."""
    from specs.dataset import DatasetSpec

    env = {"FORGE_WORKSPACE": str(workspace), **(env or {})}
    for group in shard_group_ids(DatasetSpec.model_validate(spec)):
        config = {"step": "prepare-group", "dataset": "ds", "spec": spec, "output": "data/ds/groups"}
        _run(python, "-m", "runtimes", "prepare-group", "--config-json", json.dumps(config), "--group", group, env=env)
    join = {"step": "join-shards", "dataset": "ds", "spec": spec, "groups": "data/ds/groups", "output": "data/ds/v1"}
    _run(python, "-m", "runtimes", "join-shards", "--config-json", json.dumps(join), env=env)
    return dict(json.loads((workspace / "data/ds/v1/manifest.json").read_text()))


def test_the_stream_gives_each_row_to_exactly_one_rank_and_worker(runtime_python: str, tmp_path: Path) -> None:
    files = json.loads(_run(runtime_python, "-c", WRITE, str(tmp_path / "src" / "data"), "5", "203").stdout)
    manifest = _prepare(runtime_python, tmp_path / "ws", _spec("file://data/*.parquet", files),
                        env={"FORGE_SOURCE_ROOT": str(tmp_path / "src")})
    assert len(manifest["groups"]) == 3 and sum(manifest["rows"].values()) == 5 * 203
    out = json.loads(_run(runtime_python, "-c", STREAM, str(tmp_path / "ws" / "data/ds/v1"),
                          env={"FORGE_WORKSPACE": str(tmp_path / "ws")}).stdout)
    total = manifest["rows"]["train"]
    for case in ("1x0", "3x2"):
        seen = out[case]["seen"]
        assert out[case]["total"] == total and sorted(seen) == sorted(set(seen)) and len(seen) == total, case
    for case, world in (("4x3even", 4), ("2x2even", 2)):
        seen = out[case]["seen"]
        assert len(seen) == len(set(seen)) == total // world * world, case  # each once; the last N mod world left out
        assert len(set(out[case]["counts"])) == 1, out[case]["counts"]  # every rank the same number of steps
    # the rows a rank sees are the whole train split's, no test or validation row among them
    test_rows = {int(v) for v in json.loads(_run(runtime_python, "-c", (
        "import json,sys; from pathlib import Path; from runtimes._step import read_json; from runtimes.shard_stream import read_split;"
        "f=Path(sys.argv[1]); print(json.dumps(read_split(f, read_json(f/'meta.json'), 'test')['x'][:,0].tolist()))"),
        str(tmp_path / "ws" / "data/ds/v1"), env={"FORGE_WORKSPACE": str(tmp_path / "ws")}).stdout)}
    assert len(test_rows) == manifest["rows"]["test"] and not test_rows & set(out["1x0"]["seen"])


def test_s3_shards_are_prepared_from_a_real_s3_api(runtime_python: str, tmp_path: Path) -> None:
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    files = json.loads(_run(runtime_python, "-c", WRITE, str(tmp_path / "src"), "3", "150").stdout)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        creds = {"AWS_ACCESS_KEY_ID": "forge-test", "AWS_SECRET_ACCESS_KEY": "forge-test-secret",
                 "AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_REGION": "us-east-1"}
        s3 = boto3.client("s3", endpoint_url=creds["AWS_ENDPOINT_URL"], aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
        s3.create_bucket(Bucket="forge-shards")
        for f in files:
            s3.upload_file(str(tmp_path / "src" / f["name"]), "forge-shards", f"events/{f['name']}")
        spec = _spec("s3://forge-shards/events/*.parquet", files, credentialsSecret="s3-reader")
        manifest = _prepare(runtime_python, tmp_path / "ws", spec, env=creds)
        assert manifest["digest"] == spec["digest"] and sum(manifest["rows"].values()) == 450
        assert [s["name"] for g in manifest["groups"] for s in g["shards"]] == [f["name"] for f in files]

        # Without credentials in its environment the step says so and reads nothing.
        from specs.dataset import DatasetSpec

        group = shard_group_ids(DatasetSpec.model_validate(spec))[0]
        config = {"step": "prepare-group", "dataset": "ds", "spec": spec, "output": "data/other/groups"}
        proc = subprocess.run([runtime_python, "-m", "runtimes", "prepare-group", "--config-json", json.dumps(config), "--group", group],
                              capture_output=True, text=True, timeout=300,
                              env={"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"], "FORGE_WORKSPACE": str(tmp_path / "ws")})
        assert proc.returncode == 1 and "AWS_ACCESS_KEY_ID" in proc.stderr

        # A shard added to the bucket but not pinned: the join refuses the data as a digest mismatch (exit 2).
        s3.upload_file(str(tmp_path / "src" / files[0]["name"]), "forge-shards", "events/extra.parquet")
        join = {"step": "join-shards", "dataset": "ds", "spec": spec, "groups": "data/ds/groups", "output": "data/ds/v2"}
        proc = subprocess.run([runtime_python, "-m", "runtimes", "join-shards", "--config-json", json.dumps(join)],
                              capture_output=True, text=True, timeout=300,
                              env={"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"], "FORGE_WORKSPACE": str(tmp_path / "ws"), **creds})
        assert proc.returncode == 2 and "extra.parquet" in proc.stderr, proc.stderr[-2000:]
    finally:
        server.stop()
