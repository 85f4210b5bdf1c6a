"""A table of invalid documents: each must give its diagnostic on the right line, and exit 1.

Every case is validated next to a small valid base set, so references resolve and the only
problems are the ones the case is about.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from forgectl.cli import app

BASE = """\
apiVersion: forge.dev/v1alpha1
kind: Environment
metadata: {name: local}
spec: {target: local, default: true, defaults: {computeRef: cpu, rolloutPolicyRef: canary}}
---
apiVersion: forge.dev/v1alpha1
kind: Dataset
metadata: {name: digits}
spec:
  source: {uri: "sklearn://digits", format: sklearn}
  version: "1"
  digest: sha256:1111111111111111111111111111111111111111111111111111111111111111
---
apiVersion: forge.dev/v1alpha1
kind: Compute
metadata: {name: cpu}
spec: {accelerator: {type: cpu}}
---
apiVersion: forge.dev/v1alpha1
kind: Model
metadata: {name: base-model}
spec: {datasetRef: digits, architecture: {type: mlp}}
---
apiVersion: forge.dev/v1alpha1
kind: RolloutPolicy
metadata: {name: canary}
spec:
  strategy: canary
  canary: {steps: [{weight: 50}, {weight: 100}]}
"""

HEAD = "apiVersion: forge.dev/v1alpha1\n"


def doc(kind: str, body: str, name: str = "x") -> str:
    """A document of ``kind`` whose `spec:` is ``body`` (indented YAML); spec starts on line 5."""
    return f"{HEAD}kind: {kind}\nmetadata:\n  name: {name}\nspec:\n" + textwrap.indent(textwrap.dedent(body), "  ")


@dataclass(frozen=True)
class Case:
    id: str
    text: str | bytes
    line: int
    message: str
    hint: str = ""


MODEL_OK = "datasetRef: digits\narchitecture: {type: mlp}\n"

CASES = [
    # --- YAML and file-level problems -------------------------------------------------------
    Case("tab-indent", "a:\n\tb: 1\n", 2, "cannot start any token", "spaces, not tabs"),
    Case("unclosed-flow", "a: [1, 2\nb: 3\n", 2, "invalid YAML"),
    Case("bad-indent", "a: 1\n  b: 2\n", 2, "mapping values are not allowed"),
    Case("duplicate-key", f"{HEAD}kind: Compute\nkind: Compute\nmetadata: {{name: c}}\nspec: {{accelerator: {{type: cpu}}}}\n", 3, "duplicate key `kind` (first defined on line 2)"),
    Case("list-document", "- a\n- b\n", 1, "must be a mapping", ""),
    Case("scalar-document", "hello\n", 1, "not a str value"),
    Case("empty-file", "", 1, "file holds no document"),
    Case("only-comments", "# nothing here\n", 1, "file holds no document"),
    Case("non-utf8", b"apiVersion: forge.dev/v1alpha1\nkind: \xff\n", 2, "not valid UTF-8"),
    Case("nul-byte", "a: 1\nb: \x00\n", 2, "NUL character"),
    Case("alias-bomb", "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
         "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
         "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n", 4,
         "alias expansion per document is at most 10,000 values"),
    Case("deep-nesting", "a: " + "[" * 80 + "]" * 80 + "\n", 1, "nested deeper than"),
    Case("huge-file", "# " + "x" * (5 * 1024 * 1024) + "\n", 1, "spec files may be at most"),
    # --- envelope ---------------------------------------------------------------------------
    Case("unknown-kind", f"{HEAD}kind: Modle\nmetadata: {{name: m}}\nspec: {{}}\n", 2, "unknown kind 'Modle'", "did you mean `Model`?"),
    Case("unknown-api-version", "apiVersion: forge.dev/v2\nkind: Model\nmetadata: {name: m}\nspec: {}\n", 1, "unknown apiVersion 'forge.dev/v2'"),
    Case("missing-api-version", "kind: Model\nmetadata: {name: m}\nspec: {}\n", 1, "missing `apiVersion`"),
    Case("missing-kind", f"{HEAD}metadata: {{name: m}}\nspec: {{}}\n", 1, "missing `kind`"),
    Case("unknown-top-field", doc("Compute", "accelerator: {type: cpu}\n") + "status: {}\n", 7, "unknown field `status`"),
    Case("missing-spec", f"{HEAD}kind: Compute\nmetadata: {{name: c}}\n", 1, "missing required field `spec`"),
    Case("name-uppercase", doc("Compute", "accelerator: {type: cpu}\n", name="Bad_Name"), 4, "'Bad_Name' does not match", "DNS-1123"),
    Case("name-too-long", doc("Compute", "accelerator: {type: cpu}\n", name="a" * 64), 4, "at most 63 characters"),
    Case("bad-label-key", f"{HEAD}kind: Compute\nmetadata:\n  name: c\n  labels: {{'bad key!': x}}\nspec: {{accelerator: {{type: cpu}}}}\n", 5, "label key 'bad key!'"),
    # --- Model ------------------------------------------------------------------------------
    Case("snake-case-field", doc("Model", MODEL_OK + "hyperparameters:\n  learning_rate: 0.1\n"), 9, "unknown field `learning_rate`", "did you mean `learningRate`?"),
    Case("typo-field", doc("Model", MODEL_OK + "hyperparameters:\n  batchSze: 8\n"), 9, "unknown field `batchSze`", "did you mean `batchSize`?"),
    Case("wrong-type", doc("Model", MODEL_OK + "hyperparameters:\n  batchSize: many\n"), 9, "expected an integer, got 'many'"),
    Case("bool-not-int", doc("Model", MODEL_OK + "hyperparameters:\n  epochs: [1]\n"), 9, "expected an integer"),
    Case("precision-fp8", doc("Model", MODEL_OK + "precision: fp8\n"), 8, "'fp8' is not allowed; expected one of fp32, fp16, bf16"),
    Case("zero-stage-4", doc("Model", MODEL_OK + "distributed: {strategy: deepspeed, zeroStage: 4}\n"), 8, "less than or equal to 3"),
    Case("zero-without-deepspeed", doc("Model", MODEL_OK + "distributed:\n  zeroStage: 2\n"), 9, "zeroStage 2 needs `strategy: deepspeed`"),
    Case("param-offload-stage-2", doc("Model", MODEL_OK + "distributed: {strategy: deepspeed, zeroStage: 2, offload: optimizer+parameters}\n"), 8, "parameter offload needs zeroStage 3"),
    Case("unknown-architecture", doc("Model", "datasetRef: digits\narchitecture:\n  type: mpl\n"), 8, "unknown type 'mpl'", "did you mean `mlp`?"),
    Case("gpt-heads", doc("Model", "datasetRef: digits\narchitecture: {type: gpt, dModel: 100, heads: 3}\n"), 7, "heads (3) must divide dModel (100)"),
    Case("negative-learning-rate", doc("Model", MODEL_OK + "hyperparameters:\n  learningRate: -0.1\n"), 9, "greater than 0"),
    Case("search-unknown-param", doc("Model", MODEL_OK + "search:\n  space:\n    dropoutRate: {type: uniform, min: 0, max: 1}\n"), 9, "unknown hyperparameter 'dropoutRate'"),
    Case("search-parallelism", doc("Model", MODEL_OK + "search:\n  trials: 2\n  parallelism: 4\n  space: {learningRate: {type: choice, values: [0.1]}}\n"), 6, "search.parallelism (4) exceeds search.trials (2)"),
    Case("checkpointing-mode", doc("Model", MODEL_OK + "gradientCheckpointing: sqrt2\n"), 8, "expected true, false, `sqrt`, `auto` or a number of segments"),
    Case("checkpointing-no-segments", doc("Model", MODEL_OK + "gradientCheckpointing: 0\n"), 8, "number of segments from 1 to 1024; got 0"),
    Case("checkpointing-quoted", doc("Model", MODEL_OK + "gradientCheckpointing: \"true\"\n"), 8, "got 'true'"),
    Case("search-algorithm", doc("Model", MODEL_OK + "search:\n  algorithm: bayes\n  space: {learningRate: {type: choice, values: [0.1]}}\n"), 9, "'bayes' is not allowed"),
    Case("search-stopping", doc("Model", MODEL_OK + "search:\n  earlyStopping: hyperband\n  space: {learningRate: {type: choice, values: [0.1]}}\n"), 9, "'hyperband' is not allowed"),
    Case("search-stopping-one-epoch", doc("Model", MODEL_OK + "hyperparameters: {epochs: 1}\nsearch:\n  earlyStopping: asha\n  space: {learningRate: {type: choice, values: [0.1]}}\n"), 6, "it needs `hyperparameters.epochs` of 2 or more"),
    Case("search-study-distributed", doc("Model", MODEL_OK + "distributed: {strategy: ddp}\nsearch:\n  algorithm: tpe\n  space: {learningRate: {type: choice, values: [0.1]}}\n"), 6, "runs each trial as one training process against the study"),
    Case("search-stopping-privacy", doc("Model", MODEL_OK + "hyperparameters: {epochs: 3}\nprivacy: {epsilon: 8}\nsearch:\n  earlyStopping: median\n  space: {learningRate: {type: choice, values: [0.1]}}\n"), 6, "not with privacy"),
    Case("log-uniform-zero", doc("Model", MODEL_OK + "search:\n  space:\n    learningRate: {type: logUniform, min: 0, max: 1}\n"), 10, "logUniform range needs min > 0"),
    Case("threshold-no-bound", doc("Model", MODEL_OK + "evaluation:\n  thresholds:\n    - metric: accuracy\n"), 10, "needs `min`, `max` or both"),
    Case("threshold-unknown-metric", doc("Model", MODEL_OK + "evaluation:\n  thresholds:\n    - metric: acuracy\n      min: 0.9\n"), 10, "'acuracy' is not allowed", "did you mean `accuracy`?"),
    Case("threshold-inverted", doc("Model", MODEL_OK + "evaluation:\n  thresholds:\n    - {metric: loss, min: 2, max: 1}\n"), 10, "max (1) is below min (2)"),
    Case("dangling-dataset", doc("Model", "datasetRef: nope\narchitecture: {type: mlp}\n"), 6, "Dataset 'nope' is not defined (known: digits)"),
    Case("custom-without-size", doc("Model", "datasetRef: digits\narchitecture: {type: custom, entrypoint: 'pkg.mod:build'}\n"), 6, "needs `parameters`"),
    # --- Dataset ----------------------------------------------------------------------------
    Case("splits-sum", doc("Dataset", 'source: {uri: "sklearn://digits", format: sklearn}\nversion: "1"\ndigest: sha256:' + "a" * 64 + "\nsplits: {train: 0.8, validation: 0.3, test: 0.1}\n"), 9, "must be 1.0, got 1.2"),
    Case("bad-digest", doc("Dataset", 'source: {uri: "sklearn://digits", format: sklearn}\nversion: "1"\ndigest: md5:abc\n'), 8, "'md5:abc' does not match", "64 lower-case hex digits"),
    Case("unquoted-date", doc("Dataset", 'source: {uri: "sklearn://digits", format: sklearn}\nversion: 2024-06-01\ndigest: sha256:' + "a" * 64 + "\n"), 7, "valid string", "quote it"),
    Case("unknown-sklearn-set", doc("Dataset", 'source: {uri: "sklearn://mnist", format: sklearn}\nversion: "1"\ndigest: sha256:' + "a" * 64 + "\n"), 6, "unknown scikit-learn data set 'mnist'"),
    Case("csv-without-label", doc("Dataset", 'source: {uri: "file://d.csv", format: csv}\nversion: "1"\ndigest: sha256:' + "a" * 64 + "\n"), 6, "needs `labeling.column`"),
    Case("unknown-cleaning-op", doc("Dataset", 'source: {uri: "sklearn://digits", format: sklearn}\nversion: "1"\ndigest: sha256:' + "a" * 64 + "\ncleaning:\n  - op: dedupe\n"), 10, "unknown op 'dedupe'"),
    # --- Compute ----------------------------------------------------------------------------
    Case("cpu-with-gpus", doc("Compute", "accelerator: {type: cpu}\ngpusPerNode: 8\n"), 6, "a `cpu` pool has no GPUs"),
    Case("min-above-max", doc("Compute", "accelerator: {type: nvidia-h100-80gb}\ngpusPerNode: 8\nminGpus: 16\nmaxGpus: 8\n"), 6, "minGpus (16) is above maxGpus (8)"),
    Case("custom-accelerator", doc("Compute", "accelerator: {type: custom}\ngpusPerNode: 1\nmaxGpus: 1\n"), 6, "needs `resourceName` and `memoryGiB`"),
    Case("unknown-accelerator", doc("Compute", "accelerator: {type: nvidia-h300}\n"), 6, "'nvidia-h300' is not allowed"),
    # --- Compression ------------------------------------------------------------------------
    Case("distill-no-teacher", doc("Compression", "hardwareTarget: arm64\nvariants:\n  - name: v\n    stages:\n      - type: distill\n"), 10, "needs a teacher"),
    Case("quantize-not-last", doc("Compression", "hardwareTarget: arm64\nvariants:\n  - name: v\n    stages:\n      - {type: quantize}\n      - {type: prune, sparsity: 0.5}\n"), 8, "quantize must be the last stage"),
    Case("duplicate-variants", doc("Compression", "hardwareTarget: arm64\nvariants:\n  - {name: v, stages: [{type: quantize}]}\n  - {name: v, stages: [{type: quantize}]}\n"), 6, "repeated: v"),
    Case("sparsity-one", doc("Compression", "hardwareTarget: arm64\nvariants:\n  - {name: v, stages: [{type: prune, sparsity: 1.0}]}\n"), 8, "less than 1"),
    Case("dangling-teacher", doc("Compression", "hardwareTarget: arm64\nvariants:\n  - name: v\n    stages:\n      - {type: distill, teacherRef: ghost}\n"), 10, "Model 'ghost' is not defined"),
    # --- RolloutPolicy ----------------------------------------------------------------------
    Case("weights-not-increasing", doc("RolloutPolicy", "strategy: canary\ncanary:\n  steps: [{weight: 50}, {weight: 20}]\n"), 8, "must increase strictly: [50, 20]"),
    Case("weight-over-100", doc("RolloutPolicy", "strategy: canary\ncanary:\n  steps: [{weight: 150}]\n"), 8, "less than or equal to 100"),
    Case("metric-without-rule", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100}]}\nmetrics:\n  - name: sr\n    template: success-rate\n"), 9, "needs a rule"),
    Case("analysis-unknown-metric", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100, analysis: [latency]}]}\n"), 6, "names metric 'latency'"),
    Case("canary-without-steps", doc("RolloutPolicy", "strategy: canary\n"), 6, "needs a `canary:` section"),
    Case("bad-duration", doc("RolloutPolicy", "strategy: canary\ncanary:\n  steps:\n    - {weight: 100, pause: 30 seconds}\n"), 9, "'30 seconds' does not match", "30s, 5m"),
    Case("template-and-query", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100}]}\nmetrics:\n  - {name: m, template: error-rate, query: up, max: 1}\n"), 9, "exactly one of `template` or `query`"),
    # --- Endpoint and Environment -----------------------------------------------------------
    Case("autoscaling-inverted", doc("Endpoint", "modelRef: base-model\nautoscaling: {minReplicas: 5, maxReplicas: 2}\n"), 7, "maxReplicas (2) is below minReplicas (5)"),
    Case("dangling-model", doc("Endpoint", "modelRef: ghost\n"), 6, "Model 'ghost' is not defined (known: base-model)"),
    Case("variant-not-built", doc("Endpoint", "modelRef: base-model\nvariant: int8\n"), 7, "builds no variant 'int8'"),
    Case("kubernetes-without-section", doc("Environment", "target: kubernetes\n", name="prod"), 6, "needs a `kubernetes:` section"),
    Case("second-default-env", doc("Environment", "target: local\ndefault: true\ndefaults: {computeRef: cpu}\n", name="other"), 7, "only one Environment may be the default"),
    Case("duplicate-name", doc("Compute", "accelerator: {type: cpu}\n", name="cpu"), 4, "duplicate Compute 'cpu'"),
    Case("teacher-cycle", doc("Model", "datasetRef: digits\narchitecture: {type: mlp}\ncompressionRef: c1\n", name="m1")
         + "---\n" + doc("Compression", "hardwareTarget: arm64\nvariants: [{name: v, stages: [{type: distill, teacherRef: m2}]}]\n", name="c1")
         + "---\n" + doc("Model", "datasetRef: digits\narchitecture: {type: mlp}\ncompressionRef: c2\n", name="m2")
         + "---\n" + doc("Compression", "hardwareTarget: arm64\nvariants: [{name: v, stages: [{type: distill, teacherRef: m1}]}]\n", name="c2"),
         8, "reference cycle: m1 → m2 → m1"),
]


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_invalid_document(case: Case, tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(BASE)
    target = tmp_path / "case.yaml"
    target.write_bytes(case.text if isinstance(case.text, bytes) else case.text.encode())
    result = CliRunner().invoke(app, ["validate", str(tmp_path), "--output", "json"])
    assert result.exit_code == 1, result.output
    import json

    report = json.loads(result.stdout)
    assert report["valid"] is False
    mine = [d for d in report["diagnostics"] if d["file"].endswith("case.yaml")]
    assert not [d for d in report["diagnostics"] if d["file"].endswith("base.yaml")], report
    matching = [d for d in mine if case.message in d["message"]]
    assert matching, f"no diagnostic with {case.message!r}; got {[(d['line'], d['message']) for d in mine]}"
    assert matching[0]["line"] == case.line, matching[0]
    assert matching[0]["column"] >= 1
    if case.hint:
        assert case.hint in matching[0]["hint"], matching[0]


def test_text_output_names_file_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "case.yaml").write_text(doc("Model", MODEL_OK + "precision: fp8\n"))
    result = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 1
    assert f"{tmp_path / 'case.yaml'}:8:14: error: spec.precision: 'fp8' is not allowed" in result.output


def test_github_output_is_workflow_annotations(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "case.yaml").write_text(doc("Model", MODEL_OK + "precision: fp8\n"))
    result = CliRunner().invoke(app, ["validate", str(tmp_path), "--output", "github"])
    assert result.exit_code == 1
    line = result.stdout.strip().splitlines()[0]
    assert line.startswith(f"::error file={tmp_path / 'case.yaml'},line=8,col=14,title=spec.precision::")


def test_all_problems_are_collected(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "a.yaml").write_text(doc("Model", MODEL_OK + "precision: fp8\nretries: -1\n"))
    (tmp_path / "b.yaml").write_text("a:\n\tb: 1\n")
    result = CliRunner().invoke(app, ["validate", str(tmp_path), "--output", "json"])
    import json

    lines = sorted((d["file"].rsplit("/", 1)[-1], d["line"]) for d in json.loads(result.stdout)["diagnostics"])
    assert lines == [("a.yaml", 8), ("a.yaml", 9), ("b.yaml", 2)]
