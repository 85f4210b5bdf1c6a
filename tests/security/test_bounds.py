"""Promise 6 — bounded work: every count derived from specs has a documented limit
(docs/security.md) and a clean error past it, and `validate`/`plan` finish in seconds on hostile
inputs. Each case runs under a subprocess timeout: a limit that did not hold would hang or run out
of memory instead of answering."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.load import sources
from tests.security.helpers import BASE, DIGEST, Project, assert_diagnostic, doc, snapshot

MODEL = "datasetRef: digits\narchitecture: {type: mlp}\n"
DATASET = f'source: {{uri: "sklearn://digits", format: sklearn}}\nversion: "1"\ndigest: {DIGEST}\n'
GPU_POOL = "accelerator: {type: nvidia-h100-80gb}\ngpusPerNode: 8\n"

CASES = [
    ("max-gpus", doc("Compute", GPU_POOL + "maxGpus: 1000000000000\n"), 8, "less than or equal to 4096"),
    ("min-gpus", doc("Compute", GPU_POOL + "minGpus: 99999\nmaxGpus: 8\n"), 8, "less than or equal to 4096"),
    ("gpus-per-node", doc("Compute", "accelerator: {type: nvidia-h100-80gb}\ngpusPerNode: 100000\nmaxGpus: 8\n"), 7,
     "less than or equal to 64"),
    ("data-parallel", doc("Model", MODEL + "distributed: {strategy: ddp, dataParallel: 1000000}\n"), 8, "less than or equal to 4096"),
    ("trials", doc("Model", MODEL + "search:\n  trials: 1000000\n  space: {learningRate: {type: choice, values: [0.1]}}\n"), 9,
     "less than or equal to 1000"),
    ("choices", doc("Model", MODEL + "search:\n  space: {learningRate: {type: choice, values: [" + ", ".join(["0.1"] * 1001) + "]}}\n"),
     9, "at most 1000 items"),
    ("hidden-layers", doc("Model", "datasetRef: digits\narchitecture: {type: mlp, hiddenSizes: [" + ", ".join(["8"] * 65) + "]}\n"),
     7, "at most 64 items"),
    ("custom-options", doc("Model", "datasetRef: digits\narchitecture:\n  type: custom\n  entrypoint: 'm:f'\n  options: {"
                           + ", ".join(f"o{i}: {i}" for i in range(65)) + "}\nparameters: 10\n"), 10, "at most 64 items"),
    ("parameters", doc("Model", "datasetRef: digits\narchitecture: {type: custom, entrypoint: 'm:f'}\nparameters: 1e20\n"),
     8, "expected an integer"),
    ("parameters-int", doc("Model", "datasetRef: digits\narchitecture: {type: custom, entrypoint: 'm:f'}\n"
                           "parameters: 100000000000000000000\n"), 8, "less than or equal to 100000000000000"),
    ("max-steps", doc("Model", MODEL + "hyperparameters: {maxSteps: 10000000000000}\n"), 8, "less than or equal to 1000000000"),
    ("seed", doc("Model", MODEL + "hyperparameters: {seed: 4294967296}\n"), 8, "less than or equal to 4294967295"),
    ("split-seed", doc("Dataset", DATASET + "splits: {seed: 99999999999999999999}\n"), 9, "less than or equal to 4294967295"),
    ("replicas", doc("Endpoint", "modelRef: base-model\nreplicas: 1000000000\n"), 7, "less than or equal to 1000"),
    ("autoscaling", doc("Endpoint", "modelRef: base-model\nautoscaling: {minReplicas: 1, maxReplicas: 100000}\n"), 7,
     "less than or equal to 1000"),
    ("canary-steps", doc("RolloutPolicy", "strategy: canary\ncanary:\n  steps: ["
                         + ", ".join(f"{{weight: {min(i + 1, 100)}}}" for i in range(101)) + "]\n"), 8, "at most 100 items"),
    ("metrics", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100}]}\nmetrics:\n"
                    + "".join(f"  - {{name: m{i}, template: success-rate, min: 0.9}}\n" for i in range(33))), 9, "at most 32 items"),
    ("analysis-count", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100}]}\n"
                           "metrics: [{name: m, template: success-rate, min: 0.9, count: 1000000}]\n"), 8,
     "less than or equal to 1000"),
    ("variants", doc("Compression", "hardwareTarget: arm64\nvariants:\n"
                     + "".join(f"  - {{name: v{i}, stages: [{{type: quantize}}]}}\n" for i in range(33))), 8, "at most 32 items"),
    ("stages", doc("Compression", "hardwareTarget: arm64\nvariants:\n  - name: v\n    stages: ["
                   + ", ".join(["{type: prune, sparsity: 0.1}"] * 17) + "]\n"), 9, "at most 16 items"),
    ("cleaning-steps", doc("Dataset", DATASET + "cleaning: [" + ", ".join(["{op: deduplicate}"] * 65) + "]\n"), 9,
     "at most 64 items"),
    ("labels", doc("Model", MODEL, metadata="labels: {" + ", ".join(f"l{i}: v" for i in range(65)) + "}\n"), 5,
     "65 labels; at most 64 are allowed"),
    ("annotations-size", doc("Model", MODEL, metadata="annotations: {a: '" + "x" * 70_000 + "'}\n"), 5,
     "annotations take 70,001 bytes; at most 65,536 are allowed"),
    ("duration-huge", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100, pause: 99999999999999h}]}\n"), 7,
     "does not match the expected format"),
    ("duration-long", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100, pause: 100000h}]}\n"), 7,
     "is longer than the limit of 30 days"),
    ("scrape-interval", doc("Environment", "local: {scrapeInterval: 99999999999999s}\ndefaults: {computeRef: cpu}\n"), 6,
     "does not match"),
    ("query-length", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100}]}\n"
                         "metrics: [{name: m, max: 1, query: '" + "1+" * 2000 + "1'}]\n"), 8, "at most 1024 characters"),
    ("filter-length", doc("Dataset", DATASET + "cleaning: [{op: filter, query: '" + "a" * 5000 + "'}]\n"), 9,
     "at most 4096 characters"),
    ("quantity-length", doc("Compute", "accelerator: {type: cpu}\nnode: {memory: '" + "9" * 100 + "Gi'}\n"), 7,
     "at most 32 characters"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_limit(tmp_path: Path, case: tuple[str, str, int, str]) -> None:
    _, text, line, message = case
    project = Project.create(tmp_path)
    project.write("case.yaml", text)
    before = snapshot(project.outside), snapshot(project.root)
    assert_diagnostic(project.run("validate", "specs", timeout=30), "case.yaml", line, message)
    project.assert_untouched(*before)


def test_largest_pool_still_plans(tmp_path: Path) -> None:
    """At the limit: a pool of 4096 GPUs and a search of 1000 trials render and plan (bounded, not
    refused). The local Environment declares the 8 GPUs the model gets, so the plan is not blocked."""
    project = Project.create(tmp_path, BASE.replace("spec: {target: local, default: true,", "spec: {target: local, default: true, local: {gpus: 8},"))
    project.write("case.yaml", doc("Compute", "accelerator: {type: nvidia-h100-80gb}\ngpusPerNode: 8\nmaxGpus: 4096\n", name="big")
                  + "---\n" + doc("Model", "datasetRef: digits\ncomputeRef: big\narchitecture: {type: gpt, layers: 32, dModel: 4096, heads: 32}\n"
                                  "precision: bf16\ngradientCheckpointing: true\nhyperparameters: {batchSize: 1}\n"
                                  "distributed: {strategy: deepspeed, zeroStage: 3}\n"
                                  "search: {trials: 1000, parallelism: 8, space: {learningRate: {type: logUniform, min: 0.0001, max: 0.01}}}\n",
                                  name="llm"))
    run = project.run("plan", "specs", timeout=120)
    assert run.returncode == 0, run.output
    assert "Workflow forge-local/llm-" in run.stdout


def test_too_many_spec_files(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    many = project.root / "specs" / "many"
    many.mkdir()
    for i in range(sources.MAX_FILES + 1):
        (many / f"{i}.yaml").touch()
    run = project.run("validate", "specs", timeout=60)
    assert run.returncode == 1
    assert f"error: more than {sources.MAX_FILES:,} spec files under specs; at most that many are read in one run" in run.stderr


def test_alias_bomb_and_deep_nesting_answer_quickly(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))
    project.write("bomb.yaml", bomb)
    project.write("deep.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n")
    run = project.run("validate", "specs", timeout=30)
    assert_diagnostic(run, "bomb.yaml", 4, "alias expansion per document is at most 10,000 values")
    assert_diagnostic(run, "deep.yaml", 1, "nesting depth")  # libyaml's own bound answers first
