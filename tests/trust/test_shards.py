"""Sharded, streaming preparation (runtimes/shards.py; issue 18's last item, in part): the
Merkle-style digest, the streamed group preparation, and memory that does not grow with the
data. Runs in the runtime environment (pyarrow); bench/prepare.py has the full-size figures."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.runtimes.helpers import ROOT

pytestmark = pytest.mark.runtime

SCRIPT = r'''
import json, sys, subprocess, os
from pathlib import Path
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from runtimes import shards
from runtimes.errors import DigestMismatch

root = Path(sys.argv[1])

def write(path, rows, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=4, size=(rows, 8)).astype(np.float32)
    table = pa.table({**{f"f{i}": x[:, i] for i in range(8)}, "label": rng.integers(0, 3, rows)})
    pq.write_table(table, path, row_group_size=4096)
    return path

out = {}
paths = [write(root / f"s{i}.parquet", 5000, i) for i in range(6)]
digests = [shards.file_digest(p) for p in paths]
before = shards.tree(digests, 2)
write(paths[3], 5000, 99)                       # one shard changes
after = shards.tree([shards.file_digest(p) for p in paths], 2)
out["groupsChanged"] = [a != b for a, b in zip(before["groups"], after["groups"])]
out["rootChanged"] = before["root"] != after["root"]
digests = [shards.file_digest(p) for p in paths]

r1 = shards.prepare_group(paths[:2], digests[:2], root / "g0", "label", seed=5, clip=(-3.0, 3.0), batch_rows=1000)
r2 = shards.prepare_group(paths[:2], digests[:2], root / "g0b", "label", seed=5, clip=(-3.0, 3.0), batch_rows=3000)
out["rows"], out["rowsOther"] = r1["rows"], r2["rows"]
out["groupDigest"] = r1["groupDigest"] == after["groups"][0]
train = pq.read_table(root / "g0" / "train")
out["files"] = sorted(p.name for p in (root / "g0" / "train").iterdir())
out["maxAbs"] = max(float(np.abs(train.column(f"f{i}").to_numpy()).max()) for i in range(8))
out["labels"] = sorted(set(train.column("label").to_pylist()))
try:
    shards.prepare_group(paths[2:4], [digests[2], "sha256:" + "0" * 64], root / "g1", "label")
    out["mismatch"] = None
except DigestMismatch as exc:
    out["mismatch"] = str(exc)

# peak RSS of the streaming child for 1x and 4x the data (same shard size)
peaks = {}
for n in (2, 8):
    files = [write(root / f"m{n}-{i}.parquet", 200_000, 1000 + i) for i in range(n)]
    proc = subprocess.run([sys.executable, "-m", "runtimes.shards", *map(str, files), "--output", str(root / f"m{n}"),
                           "--label", "label"], capture_output=True, text=True, check=True, env=os.environ)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    peaks[n] = {"rss": result["peakRssBytes"], "bytes": result["bytes"], "rows": sum(result["rows"].values())}
out["peaks"] = peaks
print(json.dumps(out))
'''


def test_merkle_digest_streaming_groups_and_bounded_memory(runtime_python: str, tmp_path: Path) -> None:
    proc = subprocess.run([runtime_python, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # A changed shard changes its group's digest and the root, and no other group's.
    assert out["groupsChanged"] == [False, True, False] and out["rootChanged"]
    # Every row lands in exactly one split, the same one whatever the batch size.
    assert sum(out["rows"].values()) == 10_000 and out["rows"] == out["rowsOther"]
    assert 7_600 < out["rows"]["train"] < 8_400  # 80 % of 10,000
    assert out["groupDigest"] and out["maxAbs"] <= 3.0 and out["labels"] == [0, 1, 2]
    assert out["files"] == ["s0.parquet", "s1.parquet"]  # one file per shard and split
    assert out["mismatch"] and "differs from the pinned" in out["mismatch"]
    small, large = out["peaks"]["2"], out["peaks"]["8"]
    assert large["rows"] == 4 * small["rows"] and large["bytes"] > 3.9 * small["bytes"]
    assert large["rss"] <= 1.2 * small["rss"], out["peaks"]  # four times the data, the same peak
