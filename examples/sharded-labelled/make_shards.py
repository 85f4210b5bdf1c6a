"""Write the example's data: scikit-learn's bundled 8×8 digits (nothing is downloaded) — the first
1,200 rows as six labelled Parquet shards of 200 rows (features `p0`…`p63`, the label `digit`)
under data/digits, the other 597 rows without their label in data/unlabelled.parquet (the true
label kept as `truth`, held back: the `autolabel` step only measures its agreement with it).
Then print the `shards` block and the root digest to pin in dataset.yaml.

    $(scripts/runtime-env) examples/sharded-labelled/make_shards.py     # from the repository root
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sklearn.datasets import load_digits

HERE = Path(__file__).resolve().parent
SHARDS = 6
LABELLED = 1200
GROUP_SIZE = 2


def main() -> int:
    sys.path.insert(0, str(HERE.parents[1]))
    from runtimes.shards import file_digest, tree

    digits = load_digits()
    x, y = digits.data.astype(np.float32), digits.target.astype(np.int64)
    columns = [f"p{j}" for j in range(x.shape[1])]
    folder = HERE / "data" / "digits"
    folder.mkdir(parents=True, exist_ok=True)
    digests = []
    for i, rows in enumerate(np.array_split(np.arange(LABELLED), SHARDS)):
        table = pa.table({**{c: x[rows, j] for j, c in enumerate(columns)}, "digit": y[rows]})
        path = folder / f"part-{i:05d}.parquet"
        pq.write_table(table, path, row_group_size=128, compression="zstd")
        digests.append(file_digest(path))
        print(f"      - name: {path.name}\n        digest: {digests[-1]}")
    rest = np.arange(LABELLED, len(x))
    pq.write_table(pa.table({**{c: x[rest, j] for j, c in enumerate(columns)}, "truth": y[rest]}),
                   HERE / "data" / "unlabelled.parquet", compression="zstd")
    print(f"  digest: {tree(digests, GROUP_SIZE)['root']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
