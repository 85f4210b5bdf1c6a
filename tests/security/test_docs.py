"""The CI workflow and the security page say what the code does: the pull-request workflow gives
the planning job read-only rights and installs forgectl from the base revision; the limits table
holds the limits the code enforces."""

from __future__ import annotations

from pathlib import Path

import yaml

from reconciler import budgets
from reconciler.load import loader, sources, yamlsource
from reconciler.present import views
from reconciler.targets.kubernetes import kubeconfig
from specs import base, compression, compute, dataset, model, rollout

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "docs" / "ci" / "forge-pr-plan.yml"
SECURITY = ROOT / "docs" / "security.md"


def _workflow() -> dict:
    data = yaml.safe_load(WORKFLOW.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def test_pull_request_workflow_holds_read_only_rights() -> None:
    wf = _workflow()
    assert set(wf["on"]) == {"pull_request"}, "never pull_request_target: it hands secrets to forks' code"
    assert wf["permissions"] == {}
    plan, comment = wf["jobs"]["plan"], wf["jobs"]["comment"]
    assert plan["permissions"] == {"contents": "read"}
    assert comment["permissions"] == {"pull-requests": "write"}
    text = WORKFLOW.read_text()
    secrets = {line.split("secrets.")[1].split("}")[0].strip() for line in text.splitlines() if "secrets." in line}
    assert secrets == {"FORGE_READONLY_KUBECONFIG"}, secrets
    # The commenting job runs nothing from the pull request.
    assert not any("checkout" in str(step.get("uses", "")) for step in comment["steps"])
    checkouts = [s for s in plan["steps"] if "checkout" in str(s.get("uses", ""))]
    assert all(s["with"]["persist-credentials"] is False for s in checkouts)
    assert [s["with"]["ref"] for s in checkouts] == ["${{ github.event.pull_request.base.sha }}",
                                                     "${{ github.event.pull_request.head.sha }}"]
    runs = "\n".join(line for s in plan["steps"] for line in str(s.get("run", "")).splitlines()
                     if not line.strip().startswith("#"))
    assert '-r "base/$FORGECTL_REQUIREMENTS"' in runs and "--require-hashes" in runs
    assert '"$RUNNER_TEMP/forge/bin/forgectl" plan "$SPECS" --base "$BASE_SHA" --output markdown' in runs
    assert "python -m forgectl" not in runs and "pip install -e" not in runs and "PYTHONPATH" not in text
    assert '"$RUNNER_TEMP/kubeconfig"' in runs  # the credential lives outside the checkout


def test_limits_table_matches_the_code() -> None:
    page = SECURITY.read_text()
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| ") and line.count("|") >= 4}

    def row(name: str) -> str:
        assert name in rows, f"no limits row {name!r}"
        return rows[name]

    assert f"{yamlsource.MAX_FILE_BYTES:,}" in row("one spec file")
    assert f"{sources.MAX_FILES:,}" in row("spec files per run")
    assert f"{sources.MAX_TOTAL_BYTES // 1024**2} MiB" in row("spec bytes per run")
    assert f"{loader.MAX_DOCUMENTS:,}" in row("documents per run")
    assert f"{yamlsource.MAX_NODES:,} / {yamlsource.MAX_DEPTH} levels" in row("YAML values per document / nesting")
    assert f"{kubeconfig.MAX_KUBECONFIG_BYTES // 1024**2} MiB" in row("kubeconfig")
    assert f"{base.MAX_ANNOTATIONS_BYTES:,} bytes" in row("user annotations, keys and values together")
    assert f"{base.MAX_DURATION_SECONDS // 86400} days" in row("a duration (`pause`, `interval`, `window`, …)")
    assert f"{base.MAX_SEED:,}" in row("seeds (`hyperparameters.seed`, `splits.seed`)")
    assert f"{rollout.MAX_QUERY_LENGTH} characters, bracket nesting {rollout.MAX_QUERY_NESTING}" in row("PromQL query")
    assert f"{rollout.MAX_METRICS}; {rollout.MAX_METRICS}" in row("metrics per policy; analyses per step")
    assert str(rollout.MAX_STEPS) in row("canary steps")
    assert str(compute.MAX_GPUS) in row("`maxGpus`, `minGpus`")
    assert f"{compute.MAX_TOLERATIONS}; {base.MAX_LABELS}" in row("tolerations; `nodeSelector` entries")
    assert str(model.MAX_LAYERS) in row("MLP hidden layers, CNN blocks")
    assert str(model.MAX_OPTIONS) in row("custom architecture `options`")
    assert f"{model.MAX_CHOICES}" in row("search trials; parallelism; `choice` values")
    assert f"{model.MAX_STEPS:,}" in row("`maxSteps`, `warmupSteps`")
    assert f"{model.MAX_PARAMETERS:,}" in row("`parameters`")
    assert f"{model.MAX_DATA_PARALLEL}" in row("`dataParallel`; tensor / pipeline parallel")
    assert (f"{dataset.MAX_CLEANING_STEPS}; {dataset.MAX_COLUMNS:,}; {dataset.MAX_CLASSES:,}"
            in row("cleaning steps; columns/features (each ≤ 256 characters); label classes"))
    assert f"{compression.MAX_VARIANTS}; {compression.MAX_STAGES}" in row("Compression variants; stages per variant")
    assert f"{views.MAX_MARKDOWN:,} characters; {views.MAX_FLAGS} / {views.MAX_FLAGS}" in row(
        "Markdown plan (a PR comment); blockers / risk flags listed in it")


def test_budgets_are_in_the_limits_table() -> None:
    """Each budget of a run (reconciler/budgets.py) has its row, with the number the code holds."""
    page = SECURITY.read_text()
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| ") and line.count("|") >= 4}

    def row(name: str) -> str:
        assert name in rows, f"no limits row {name!r}"
        return rows[name]

    assert f"{budgets.MAX_ALIAS_VALUES_PER_DOCUMENT:,} / {budgets.MAX_ALIAS_VALUES:,}" in row(
        "values expanded from aliases, per document / per run")
    assert f"{budgets.MAX_VALUES:,}" in row("YAML values per run")
    assert f"{budgets.MAX_DOCUMENTS_PER_FILE:,}" in row("documents per file (empty ones too)")
    assert f"{budgets.MAX_INT_DIGITS:,} digits; {budgets.MAX_BASE60_PARTS} parts" in row(
        "an integer in any base; a base-60 number (`1:30:00`)")
    assert f"{budgets.MAX_SEARCH_TRIALS:,}" in row("search trials, summed over every Model")
    assert f"{budgets.MAX_RENDERED_OBJECTS:,}" in row("rendered objects per run")
    assert f"{budgets.MAX_RENDERED_BYTES // 1024**2} MiB" in row("rendered output of `forgectl render`")
    assert (f"{budgets.MAX_TOKEN_PAIRS:,} / {budgets.MAX_TOKEN_PAIRS_TOTAL:,} pairs; {budgets.MAX_COMPARED:,} characters"
            in row("comparing a long value in the plan, per value / per plan"))
    assert "\n## Budgets\n" in page
