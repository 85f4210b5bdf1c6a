"""A sharded data set's validation and test splits, and the steps after training, are read streamed
(runtimes.shard_stream.SplitReader through runtimes.learn.Rows): the streamed metrics equal the
whole split's, no more than a batch of rows is held at once whatever the split's length, and
train, evaluate, compress, export, benchmark and explain run on the examples/sharded shards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.runtime_steps import Runner
from specs.dataset import DatasetSpec
from specs.stepconfig import shard_group_ids
from tests.runtimes.helpers import ROOT
from tests.runtimes.test_sharded_data import _prepare, _run, _spec, shard_writer

pytestmark = pytest.mark.runtime

#: Shards of `rows` rows: 32 normal float32 features and a label 0…4 (row groups of 300 rows).
WRITE = shard_writer('pa.table({**{f"f{j}": rng.normal(size=rows).astype(np.float32) for j in range(32)}, '
                     '"label": rng.integers(0, 5, size=rows)})', 300)

#: Each split measured whole (read_split, then runtimes.learn.measure) and streamed 97 rows at a
#: time (measure_rows), by a seeded random MLP as a classifier and as a regression.
EQUAL = r'''
import json, sys
from pathlib import Path
import torch
from runtimes._step import read_json
from runtimes.learn import Rows, measure, measure_rows, split_tensors
from runtimes.models import build_model
from runtimes.shard_stream import SplitReader, read_split
folder = Path(sys.argv[1]); meta = read_json(folder / "meta.json")
out = {}
for task in ("classification", "regression"):
    m = {**meta, "task": task, **({"numClasses": 1} if task == "regression" else {})}
    torch.manual_seed(0)
    model = build_model({"type": "mlp", "hiddenSizes": [16]}, m).eval()
    for split in ("train", "validation", "test"):
        whole = measure(model, *split_tensors(read_split(folder, m, split), m), task)
        reader = SplitReader(folder, m, split)
        streamed = measure_rows(model, Rows(reader=reader, batch_rows=97), task)
        out[f"{task}/{split}"] = {"whole": whole, "streamed": streamed, "rows": reader.rows,
                                  "batches": [len(x) for x, _ in reader.batches(97)]}
print(json.dumps(out))
'''

#: The train split measured streamed 256 rows at a time by a model that records the most rows it
#: is given at once, with tracemalloc's peak of that and of reading the split whole (the control:
#: the measurement does see a read that grows with the split), and a bounded calibration sample.
BOUNDED = r'''
import json, sys, tracemalloc
from pathlib import Path
import torch
from runtimes._step import read_json
from runtimes.learn import Rows, measure_rows
from runtimes.models import build_model
from runtimes.shard_stream import SplitReader, read_split

class Counting(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.most = inner, 0

    def forward(self, x):
        self.most = max(self.most, len(x))
        return self.inner(x)

def peak(fn):
    tracemalloc.start()
    fn()
    value = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return value

folder = Path(sys.argv[1]); meta = read_json(folder / "meta.json")
torch.manual_seed(0)
model = Counting(build_model({"type": "mlp", "hiddenSizes": [16]}, meta)).eval()
rows = Rows(reader=SplitReader(folder, meta, "train"), batch_rows=256)
measure_rows(model, rows, "classification")  # warm: lazy imports and caches are not the split's
streamed = peak(lambda: measure_rows(model, rows, "classification"))
whole = peak(lambda: read_split(folder, meta, "train"))
calibration = rows.sample(300, 0)
print(json.dumps({"rows": len(rows), "most": model.most, "batches": [len(x) for x, _ in rows.batches()],
                  "streamed": streamed, "whole": whole, "calibration": len(calibration)}))
'''


def _sharded(python: str, root: Path, shards: int, rows: int) -> Path:
    """``shards`` shards of ``rows`` rows written, prepared (groups of two) and joined in a workspace
    of their own under ``root``; returns that workspace (the prepared data at data/ds/v1)."""
    files = json.loads(_run(python, "-c", WRITE, str(root / "src" / "data"), str(shards), str(rows)).stdout)
    _prepare(python, root / "ws", _spec("file://data/*.parquet", files), env={"FORGE_SOURCE_ROOT": str(root / "src")})
    return root / "ws"


def _script(python: str, workspace: Path, code: str) -> Any:
    return json.loads(_run(python, "-c", code, str(workspace / "data/ds/v1"), env={"FORGE_WORKSPACE": str(workspace)}).stdout)


@pytest.fixture(scope="module")
def small(runtime_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _sharded(runtime_python, tmp_path_factory.mktemp("small"), 2, 5000)


def test_streamed_metrics_equal_the_whole_splits(runtime_python: str, small: Path) -> None:
    out = _script(runtime_python, small, EQUAL)
    for case, figures in out.items():
        whole, streamed = figures["whole"], figures["streamed"]
        assert whole and set(streamed) == set(whole), case
        assert streamed == pytest.approx(whole, rel=1e-5, abs=1e-7), case
        # read in many bounded batches, every row once
        assert sum(figures["batches"]) == figures["rows"] and max(figures["batches"]) <= 97, case
        assert len(figures["batches"]) >= figures["rows"] // 97, case
    assert set(out["classification/test"]["whole"]) >= {"loss", "accuracy", "precision", "recall", "f1"}
    assert set(out["regression/test"]["whole"]) == {"loss", "mse"}


def test_a_streamed_split_holds_one_batch_whatever_its_length(runtime_python: str, small: Path,
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    large = _sharded(runtime_python, tmp_path_factory.mktemp("large"), 8, 5000)
    a, b = _script(runtime_python, small, BOUNDED), _script(runtime_python, large, BOUNDED)
    assert b["rows"] >= 3.5 * a["rows"] and b["rows"] > 50 * 256
    for figures in (a, b):
        # the model never sees more than a batch, and the reader yields no more than one
        assert figures["most"] <= 256 and max(figures["batches"]) <= 256 and sum(figures["batches"]) == figures["rows"]
        assert figures["calibration"] == 300
    # reading the split whole grows with it (the control); measuring it streamed does not
    assert b["whole"] > 3 * a["whole"], (a, b)
    assert b["streamed"] < 1.25 * a["streamed"] + 64 * 1024, (a, b)
    assert b["streamed"] < b["whole"] / 4, b


#: The trained model measured on each split read whole (the figures the streamed steps must match).
WHOLE = r'''
import json, sys
from pathlib import Path
from runtimes._step import read_json
from runtimes.learn import measure, split_tensors
from runtimes.models import load_bundle
from runtimes.shard_stream import read_split
folder, bundle = Path(sys.argv[1]), Path(sys.argv[2])
meta = read_json(folder / "meta.json"); model, info = load_bundle(bundle)
print(json.dumps({s: measure(model, *split_tensors(read_split(folder, meta, s), meta), info["task"]) for s in ("validation", "test")}))
'''


def test_the_steps_after_training_run_streamed_on_a_sharded_data_set(runtime_python: str, tmp_path: Path) -> None:
    example = ROOT / "examples" / "sharded"
    runner = Runner(runtime_python, tmp_path)
    shutil.copytree(example / "data", tmp_path / "data")
    spec = yaml.safe_load((example / "dataset.yaml").read_text())["spec"]
    for group in shard_group_ids(DatasetSpec.model_validate(spec)):
        runner.run("prepare-group", {"step": "prepare-group", "dataset": "ds", "spec": spec, "output": "data/ds/groups"},
                   "--group", group)
    runner.run("join-shards", {"step": "join-shards", "dataset": "ds", "spec": spec, "groups": "data/ds/groups", "output": "data/ds/v1"})
    rows = runner.read("data/ds/v1/manifest.json")["rows"]
    model = {"datasetRef": "ds", "architecture": {"type": "mlp", "hiddenSizes": [64]},
             "hyperparameters": {"learningRate": 0.003, "batchSize": 64, "epochs": 8, "optimizer": "adamw", "seed": 7}}
    runner.run("train", {"step": "train", "model": "m", "version": "v1", "spec": model, "data": "data/ds/v1", "output": "models/base"},
               timeout=600)
    runner.run("evaluate", {"step": "evaluate", "model": "m", "modelDir": "models/base", "data": "data/ds/v1",
                            "thresholds": [{"metric": "accuracy", "min": 0.8}], "output": "eval",
                            "robustness": {"epsilon": 0.5, "samples": 40}})

    whole = json.loads(_run(runtime_python, "-c", WHOLE, str(tmp_path / "data/ds/v1"), str(tmp_path / "models/base"),
                            env={"FORGE_WORKSPACE": str(tmp_path)}).stdout)
    trained, evaluated = runner.read("models/base/metrics.json"), runner.read("eval/metrics.json")
    assert trained["validation"] == pytest.approx(whole["validation"], rel=1e-5)
    assert {k: evaluated["metrics"][k] for k in whole["test"]} == pytest.approx(whole["test"], rel=1e-5)
    assert evaluated["testRows"] == rows["test"] and evaluated["robustness"]["rows"] == 40

    stages = [{"type": "prune", "sparsity": 0.5, "fineTuneEpochs": 1}, {"type": "distill", "teacherRef": "m", "epochs": 1},
              {"type": "quantize", "mode": "ptq", "calibrationSamples": 100}]
    runner.run("compress", {"step": "compress", "model": "m", "variant": {"name": "small", "stages": stages}, "modelDir": "models/base",
                            "data": "data/ds/v1", "hardwareTarget": "x86-avx2", "maxAccuracyDrop": 100.0, "output": "variants/small",
                            "teachers": {"m": "models/base"}}, timeout=600)
    report = runner.read("variants/small/report.json")
    assert report["accepted"] and report["before"]["accuracy"] == pytest.approx(whole["test"]["accuracy"])

    runner.run("export", {"step": "export", "model": "m", "source": "base", "modelDir": "models/base", "data": "data/ds/v1",
                          "hardwareTarget": "x86-avx2", "maxAbsDiff": 1e-4, "maxAccuracyDrop": 100.0, "output": "exports/base",
                          "int8": {"calibrationSamples": 100}}, timeout=600)
    exported = runner.read("exports/base/report.json")
    assert exported["onnx"]["verification"]["rows"] == rows["test"] and exported["onnx"]["verification"]["passed"]
    assert exported["onnx"]["verification"]["accuracyReference"] == pytest.approx(whole["test"]["accuracy"])
    assert exported["onnxInt8"]["quantization"]["calibrationSamples"] == 100

    variants = {"base": "models/base", "base-onnx": "exports/base/onnx"}
    runner.run("benchmark", {"step": "benchmark", "model": "m", "version": "v1", "variants": variants, "data": "data/ds/v1",
                             "hardwareTarget": "x86-avx2", "settings": {"batchSizes": [1, 8], "seconds": 0.2, "threads": 1},
                             "output": "bench"}, timeout=600)
    bench = runner.read("bench/benchmark.json")["variants"]
    assert bench["base"]["accuracy"] == pytest.approx(whole["test"]["accuracy"])
    assert bench["base-onnx"]["accuracy"] == pytest.approx(whole["test"]["accuracy"], abs=0.01)

    runner.run("explain", {"step": "explain", "model": "m", "modelDir": "models/base", "data": "data/ds/v1",
                           "settings": {"samples": 20, "steps": 8}, "output": "explain"}, timeout=600)
    assert runner.read("explain/metrics.json")["rows"] == 20
