"""Golden pull-request plans: each example committed to a real git repository, changed the way
typical pull requests change it (a hyperparameter, a dataset digest, a gate threshold, traffic
steps, a compute pool, a compression bound, a model beyond its pool), and planned with the real
`forgectl plan --base HEAD` — no cluster. The Markdown (the PR comment) and the review part of the
JSON are pinned in tests/plan/golden/ (digests and versions normalized); the assertions next to
each case say what it must show. Refresh after an intended change with
`scripts/test tests/plan --update-golden`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import pytest

from reconciler.plan.plan import Plan
from tests.plan.repos import ROOT, PlanRepo, check_golden, normalize, review_json

SCHEMA = json.loads((ROOT / "docs" / "plan.schema.json").read_text())


@dataclass(frozen=True)
class Case:
    name: str
    example: str
    edits: tuple[tuple[str, str, str], ...]
    args: tuple[str, ...] = ()
    exit_code: int = 0
    markdown: tuple[str, ...] = ()  # must appear in the Markdown
    check: Callable[[dict], None] | None = field(default=None, compare=False)


def _risk_flags(plan: dict) -> list[str]:
    return [r["flag"] for r in plan["risks"]]


def _hyperparameter(plan: dict) -> None:
    assert _risk_flags(plan) == [] and plan["blockers"] == []
    paths = {(c["kind"], c["path"]): (c["old"], c["new"], c["file"], c["line"]) for c in plan["specChanges"]}
    assert paths[("Model", "hyperparameters.learningRate")] == (0.002, 0.003, "model.yaml", 15)
    assert paths[("Model", "hyperparameters.epochs")] == (30, 40, "model.yaml", 17)
    [train] = plan["cost"]["training"]
    assert train["model"] == "digits-mlp" and train["gpus"] == 0 and train["gpuHours"] == 0
    # 1,797 rows × 0.7 train = 1,257 samples × 40 epochs × 6 · 50,826 FLOPs.
    assert train["flops"] == 1257 * 40 * 6 * 50826


def _dataset_digest(plan: dict) -> None:
    [workflow] = [c for c in plan["changes"] if c["ref"]["kind"] == "Workflow" and c["action"] == "create"]
    assert any(r.startswith("dataset `digits` digest changed sha256:4eca0a80f799") for r in workflow["reasons"])
    assert not any(r.startswith("cache hit") for r in workflow["reasons"])  # prepare-data re-runs too
    assert {(c["path"], c["line"]) for c in plan["specChanges"]} == {("version", 13), ("digest", 14)}


def _gate_threshold(plan: dict) -> None:
    assert _risk_flags(plan) == ["gate-loosened"]
    [risk] = plan["risks"]
    assert risk["path"] == "spec.metrics[latency-p99].max" and (risk["file"], risk["line"]) == ("rollout.yaml", 30)
    assert "`max` 0.2 → 0.5" in risk["message"]
    # Tightening a gate (success-rate min 0.99 → 0.995) is a change, not a risk.
    assert {"kind": "RolloutPolicy", "name": "three-step-canary", "op": "change", "path": "metrics[success-rate].min",
            "old": 0.99, "new": 0.995, "file": "rollout.yaml", "line": 22} in plan["specChanges"]
    # The PrometheusRule's long PromQL: a token-level diff around the change.
    rule = next(c for c in plan["changes"] if c["ref"]["kind"] == "PrometheusRule")
    expr = next(d for d in rule["diff"] if d["path"].endswith(".expr") and "0.995" in d["new"])
    [hunk] = expr["valueDiff"]["hunks"]
    assert (hunk["old"], hunk["new"]) == ("0.99", "0.995") and hunk["before"].endswith("[10s]))) < ")


def _traffic_steps(plan: dict) -> None:
    assert _risk_flags(plan) == ["canary-step-skipped", "traffic-jump"]
    skipped, jump = plan["risks"]
    assert (skipped["file"], skipped["line"]) == ("rollout.yaml", 11)
    assert "10 % → 50 % → 100 % became 10 % → 100 %" in skipped["message"]
    assert (jump["path"], jump["line"]) == ("spec.canary.steps[1].weight", 14) and "+90 points" in jump["message"]
    [removed] = [c for c in plan["specChanges"] if c["op"] == "remove"]
    assert removed["path"] == "canary.steps[1]" and removed["old"]["weight"] == 50


def _compute_pool(plan: dict) -> None:
    [train] = plan["cost"]["training"]
    # 6.59B parameters, bf16 AdamW, ZeRO-3, checkpointing: 23.1 GiB per GPU on 8, fits from 2 of 80 GiB.
    assert (train["gpus"], train["nodes"], train["fitsOn"], train["accelerator"]) == (8, 1, 2, "nvidia-a100-80gb")
    assert train["base"]["accelerator"] == "nvidia-h100-80gb"
    # The same FLOPs on an A100 (312 TFLOP/s bf16) instead of an H100 (989.4): 3.17 × the GPU-hours.
    assert train["gpuHours"] / train["base"]["gpuHours"] == pytest.approx(989.4 / 312)
    [serve] = plan["cost"]["serving"]
    assert serve["gpus"] == 2 and serve["base"] == {"gpus": 2, "accelerator": "nvidia-h100-80gb"}


def _beyond_max_gpus(plan: dict) -> None:
    [blocker] = plan["blockers"]
    assert blocker["flag"] == "unsatisfiable" and (blocker["file"], blocker["line"]) == ("specs.yaml", 60)
    assert "even on 8 GPUs" in blocker["message"] and "maxGpus 8" in blocker["message"]
    assert blocker["declaredAt"] == "specs.yaml:29"
    assert plan["changes"] == []
    [train] = plan["cost"]["training"]
    assert train["gpus"] is None and train["memory"]["gpus"] == 8 and train["memory"]["totalBytes"] > train["memory"]["usableBytes"]


def _local_without_gpus(plan: dict) -> None:
    assert [b["spec"]["kind"] for b in plan["blockers"]] == ["Model", "Endpoint"]
    model, endpoint = plan["blockers"]
    assert "needs 8 × nvidia-h100-80gb" in model["message"] and "declares 0 GPUs" in model["message"]
    assert (model["file"], model["line"], model["declaredAt"]) == ("specs.yaml", 60, "environments.yaml:7")
    assert (endpoint["file"], endpoint["line"]) == ("specs.yaml", 129)


def _compression_bound(plan: dict) -> None:
    assert _risk_flags(plan) == ["compression-bound-widened"]
    [risk] = plan["risks"]
    assert (risk["path"], risk["file"], risk["line"]) == ("spec.maxAccuracyDrop", "specs.yaml", 103)
    assert "1.5 → 3 points" in risk["message"]


CASES = [
    Case("quickstart-hyperparameter", "quickstart",
         (("model.yaml", "learningRate: 0.002", "learningRate: 0.003"), ("model.yaml", "epochs: 30", "epochs: 40")),
         markdown=("- Model `digits-mlp`: `hyperparameters.learningRate` 0.002 → 0.003 (`model.yaml:15`)",
                   "cache hit (unchanged since the last run): prepare-data"),
         check=_hyperparameter),
    Case("quickstart-dataset-digest", "quickstart",
         (("dataset.yaml", 'version: "1.0"', 'version: "1.1"'),
          ("dataset.yaml", "digest: sha256:4eca0a80f7990df18560bf7c80f03e0893a8868820f1ee4405e0402527902353",
           "digest: sha256:" + "5" * 64)),
         check=_dataset_digest),
    Case("quickstart-gate-threshold", "quickstart",
         (("rollout.yaml", "min: 0.99", "min: 0.995"), ("rollout.yaml", "max: 0.2", "max: 0.5")),
         markdown=("**⚠️ Risk flags (1):**",
                   "- **gate-loosened** — RolloutPolicy three-step-canary: rollout metric `latency-p99`: `max` 0.2 → 0.5 "
                   "(`rollout.yaml:30`)",
                   "- spec.groups[0].rules[0].expr: …", "[10s]))) < 0.99\n+ spec.groups[0].rules[0].expr: …"),
         check=_gate_threshold),
    Case("quickstart-traffic-steps", "quickstart",
         (("rollout.yaml", "      - weight: 50\n        pause: 5s\n        analysis: [success-rate, latency-p99]\n", ""),),
         args=("--fail-on-risk", "canary-step-skipped,gate-removed"), exit_code=3,
         markdown=("- **canary-step-skipped** —", "- **traffic-jump** —"),
         check=_traffic_steps),
    Case("llm-finetune-compute-pool", "llm-finetune",
         (("specs.yaml", "type: nvidia-h100-80gb", "type: nvidia-a100-80gb"),
          ("specs.yaml", "nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB")),
         args=("--env", "cluster"),
         markdown=("  - weights 2 B × 6.59e9 ÷ 8 (ZeRO-3) = 1.5 GiB",
                   "  - fits from 2 GPUs; rounded to whole nodes of 8 within minGpus 8..maxGpus 64 → 8 × nvidia-a100-80gb",
                   "  - before this change: 8 × nvidia-h100-80gb on 1 node"),
         check=_compute_pool),
    Case("llm-finetune-beyond-max-gpus", "llm-finetune",
         (("specs.yaml", "maxGpus: 64", "maxGpus: 8"), ("specs.yaml", "layers: 32\n    dModel: 4096\n    heads: 32",
                                                        "layers: 80\n    dModel: 8192\n    heads: 64")),
         args=("--env", "cluster"), exit_code=1,
         markdown=("**⛔ The target cannot run this plan (1):**",),
         check=_beyond_max_gpus),
    Case("llm-finetune-local-without-gpus", "llm-finetune",
         (("specs.yaml", "learningRate: 0.00002", "learningRate: 0.00003"),), exit_code=1,
         markdown=("**⛔ The target cannot run this plan (2):**",),
         check=_local_without_gpus),
    Case("edge-vision-compression-bound", "edge-vision",
         (("specs.yaml", "maxAccuracyDrop: 1.5", "maxAccuracyDrop: 3.0"),),
         args=("--env", "cluster", "--fail-on-risk", "gate-loosened"), exit_code=0,
         markdown=("- **compression-bound-widened** — Compression jetson-int8: `maxAccuracyDrop` 1.5 → 3 points",),
         check=_compression_bound),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_pull_request_plan(case: Case, tmp_path: Path, update_golden: bool) -> None:
    repo = PlanRepo.of(tmp_path, case.example)
    for file, old, new in case.edits:
        repo.edit(file, old, new)
    markdown = repo.forgectl("plan", ".", "--base", "HEAD", "-o", "markdown", *case.args)
    assert markdown.returncode == case.exit_code, markdown.stderr
    as_json = repo.forgectl("plan", ".", "--base", "HEAD", "-o", "json", *case.args)
    assert as_json.returncode == case.exit_code, as_json.stderr
    plan = as_json.json()
    jsonschema.validate(plan, SCHEMA)
    # Read back, the typed plan (its spec changes, cost and base comparison) writes the same JSON.
    assert Plan.from_json(plan).to_json() == plan
    for text in case.markdown:
        assert text in markdown.stdout, (text, markdown.stdout)
    if case.check:
        case.check(plan)
    check_golden(f"{case.name}.md", normalize(markdown.stdout), update_golden)
    check_golden(f"{case.name}.json", review_json(plan), update_golden)


def test_text_output_shows_the_same_review(tmp_path: Path) -> None:
    """The terminal view: blockers and risks first, the arithmetic, word-level diffs marked."""
    repo = PlanRepo.of(tmp_path, "quickstart")
    repo.edit("rollout.yaml", "min: 0.99", "min: 0.95")
    repo.edit("model.yaml", "learningRate: 0.002", "learningRate: 0.003")
    run = repo.forgectl("plan", ".", "--base", "HEAD")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert out.index("⚠ Risk flags (1):") < out.index("Spec changes (2):") < out.index("GPU arithmetic and cost") < out.index("Plan:")
    assert "⚠ gate-loosened  RolloutPolicy three-step-canary: rollout metric `success-rate`: `min` 0.99 → 0.95 (rollout.yaml:22)" in out
    assert "~ `metrics[success-rate].min` 0.99 → 0.95 :22" in out
    assert re.search(r"~ spec\.groups\[0\]\.rules\[0\]\.expr: …\S*\[10s\]\)\)\) < \[-0\.99-\]\{\+0\.95\+\}", out), out


def test_fail_on_risk_names_are_checked(tmp_path: Path) -> None:
    repo = PlanRepo.of(tmp_path, "quickstart")
    run = repo.forgectl("plan", ".", "--base", "HEAD", "--fail-on-risk", "gate-loosend")
    assert run.returncode == 1
    assert "--fail-on-risk: unknown flag 'gate-loosend'; expected `all` or one of gate-loosened, gate-removed" in run.stderr
    # No risk raised: the flags asked for do not fail the run; `all` is every flag.
    assert repo.forgectl("plan", ".", "--base", "HEAD", "--fail-on-risk", "all").returncode == 0


def test_apply_refuses_a_plan_the_target_cannot_run(tmp_path: Path) -> None:
    """llm-finetune on the local target of a machine that declares no GPUs: the plan says so and
    `apply` stops before anything is created (no state folder, no process)."""
    repo = PlanRepo.of(tmp_path, "llm-finetune")
    run = repo.forgectl("apply", ".", "--auto-approve")
    assert run.returncode == 1
    assert "error: the target cannot run this plan: model `support-lm` needs 8 × nvidia-h100-80gb" in run.stderr
    assert not (repo.root / ".forge" / "local" / "workspace").exists()
