"""bench/prepare: sharded, streaming preparation (runtimes/shards.py) with bounded memory.

    python bench/prepare.py [--budget-mib 256] [--shard-mib 128]   # re-execs itself in the runtime env

Generates Parquet shards (row groups of 16,384 rows: Parquet's unit of reading is a row group's
column chunk, so the memory of any Parquet reader grows with it) of random float32 features
(64 columns) and an int label, at two sizes —
10× and 20× the step's memory budget — and prepares each as one group in a child process
(`python -m runtimes.shards`), which streams every shard batch by batch (digest checked, clipped,
split into train/validation/test Parquet files). The child's peak resident memory (ru_maxrss) is
the figure: it must stay under the budget and be the same (within 20 %) at both sizes.

Last line, JSON: ``{"budgetBytes", "runs": [{"shards", "bytes", "rows", "seconds", "mbPerSecond",
"peakRssBytes"}, …], "peakRatio", "bounded"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.runtime_env import ensure_runtime_env  # noqa: E402

COLUMNS = 64


def write_shards(folder: Path, total_bytes: int, shard_bytes: int, seed: int, chunk: int = 16_384) -> list[Path]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    row_bytes = COLUMNS * 4 + 8
    rows_per_shard = shard_bytes // row_bytes
    paths = []
    written = 0
    index = 0
    while written < total_bytes:
        path = folder / f"shard-{index:05d}.parquet"
        writer = None
        for start in range(0, rows_per_shard, chunk):
            n = min(chunk, rows_per_shard - start)
            x = rng.normal(size=(n, COLUMNS)).astype(np.float32)
            table = pa.table({**{f"f{i}": x[:, i] for i in range(COLUMNS)}, "label": rng.integers(0, 10, n)})
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, compression="none")
            writer.write_table(table)
        writer.close()
        paths.append(path)
        written += path.stat().st_size
        index += 1
    return paths


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget-mib", type=int, default=256)
    parser.add_argument("--shard-mib", type=int, default=128)
    parser.add_argument("--batch-rows", type=int, default=16_384)
    parser.add_argument("--row-group-rows", type=int, default=16_384, help="Rows per Parquet row group of the generated shards.")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    ensure_runtime_env()
    budget = args.budget_mib << 20
    root = Path(tempfile.mkdtemp(prefix="forge-bench-prepare-"))
    runs = []
    try:
        for factor in (10, 20):
            data = root / f"x{factor}"
            data.mkdir()
            shards = write_shards(data, factor * budget, args.shard_mib << 20, seed=factor, chunk=args.row_group_rows)
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
            proc = subprocess.run([sys.executable, "-m", "runtimes.shards", *map(str, shards), "--output", str(root / f"out{factor}"),
                                   "--label", "label", "--clip", "-3", "3", "--batch-rows", str(args.batch_rows)],
                                  capture_output=True, text=True, env=env, check=True)
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            result["factor"] = factor
            runs.append(result)
            print(f"{factor:>3}× budget: {result['shards']} shards, {result['bytes'] / 1e9:.2f} GB, "
                  f"{sum(result['rows'].values()):,} rows in {result['seconds']:.1f} s = {result['mbPerSecond']} MB/s, "
                  f"peak RSS {result['peakRssBytes'] / 2**20:.0f} MiB (budget {args.budget_mib} MiB)", file=sys.stderr)
            shutil.rmtree(data)
            shutil.rmtree(root / f"out{factor}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    peaks = [r["peakRssBytes"] for r in runs]
    ratio = max(peaks) / min(peaks)
    print(json.dumps({"budgetBytes": budget, "runs": [{k: r[k] for k in ("factor", "shards", "bytes", "rows", "seconds", "mbPerSecond",
                                                                          "peakRssBytes")} for r in runs],
                      "peakRatio": round(ratio, 3), "bounded": ratio <= 1.2 and max(peaks) <= budget}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
