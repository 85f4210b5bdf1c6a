"""Risk flags (reconciler/plan/risks.py) through `reconciler.plan.review.annotate`: each flag raised by the
change that causes it — and only then — with the spec file:line of that change; the registry's
offline metrics; prunes of objects serving traffic; the Markdown of a plan capped in size."""

from __future__ import annotations

import json
from dataclasses import replace

from reconciler.load.loader import load_files
from reconciler.load.sources import SourceFile
from reconciler.plan.plan import Action, Change, Plan, build_plan
from reconciler.plan.review import annotate, exit_code, parse_fail_on
from reconciler.plan.risks import FLAGS, metric_risks
from reconciler.present.views import markdown
from reconciler.registry.records import Record
from reconciler.resources import ObjectRef
from renderers import RenderContext, render

HEAD = "apiVersion: forge.dev/v1alpha1\n"
#: Line numbers below are of this text (1-based).
BASE = f"""\
{HEAD}kind: Environment
metadata: {{name: local}}
spec: {{target: local, default: true, defaults: {{computeRef: cpu, rolloutPolicyRef: canary}}}}
---
{HEAD}kind: Dataset
metadata: {{name: digits}}
spec: {{source: {{uri: "sklearn://digits", format: sklearn}}, version: "1", digest: "sha256:{"1" * 64}"}}
---
{HEAD}kind: Compute
metadata: {{name: cpu}}
spec: {{accelerator: {{type: cpu}}}}
---
{HEAD}kind: Model
metadata: {{name: m}}
spec:
  datasetRef: digits
  compressionRef: small
  architecture: {{type: mlp}}
  evaluation:
    thresholds:
      - metric: accuracy
        min: 0.95
      - metric: loss
        max: 0.5
---
{HEAD}kind: Compression
metadata: {{name: small}}
spec:
  hardwareTarget: x86-avx2
  maxAccuracyDrop: 1.0
  variants:
    - name: int8
      maxAccuracyDrop: 0.5
      stages: [{{type: quantize}}]
  export: {{variants: [base], maxAbsDiff: 0.0001}}
---
{HEAD}kind: RolloutPolicy
metadata: {{name: canary}}
spec:
  strategy: canary
  canary:
    steps:
      - weight: 10
        analysis: [success, errors]
      - weight: 50
        analysis: [success, errors]
      - weight: 100
        analysis: [success]
  metrics:
    - name: success
      template: success-rate
      min: 0.99
      count: 3
      failureLimit: 1
      inconclusiveLimit: 5
    - name: errors
      template: error-rate
      compareToStable: {{maxIncrease: 0.01}}
  onPrometheusUnreachable: rollback
  gitWriteback: {{enabled: true}}
---
{HEAD}kind: RolloutPolicy
metadata: {{name: blue-green}}
spec:
  strategy: blueGreen
  blueGreen: {{analysis: [success], autoPromote: false}}
  metrics:
    - name: success
      template: success-rate
      min: 0.99
---
{HEAD}kind: Endpoint
metadata: {{name: web}}
spec: {{modelRef: m}}
"""


def loaded(text: str):
    result = load_files([SourceFile("specs/all.yaml", text.encode())])
    assert result.ok, [d.text() for d in result.diagnostics]
    return result


def review(head_text: str, base_text: str = BASE) -> dict:
    base, head = loaded(base_text), loaded(head_text)
    env, base_env = head.specs.environment(None), base.specs.environment(None)
    plan = build_plan(render(head.specs, RenderContext(env)).manifests, render(base.specs, RenderContext(base_env)).manifests,
                      environment="local", target="git", exact=True)
    return annotate(plan, head, env, base=base, base_env=base_env).to_json()


def flags(plan: dict) -> list[tuple[str, str, int]]:
    return [(r["flag"], r["path"], r["line"]) for r in plan["risks"]]


def test_an_unchanged_base_raises_nothing() -> None:
    plan = review(BASE)
    assert plan["risks"] == [] and plan["blockers"] == [] and plan["specChanges"] == []


def test_rollout_gates_loosened_and_tightened() -> None:
    head = (BASE.replace("      min: 0.99\n      count: 3\n      failureLimit: 1", "      min: 0.9\n      count: 2\n      failureLimit: 2")
            .replace("maxIncrease: 0.01", "maxIncrease: 0.05"))
    assert flags(review(head)) == [
        ("gate-loosened", "spec.metrics[success].min", 58),
        ("gate-loosened", "spec.metrics[success].count", 59),
        ("gate-loosened", "spec.metrics[success].failureLimit", 60),
        ("gate-loosened", "spec.metrics[errors].compareToStable.maxIncrease", 64),
    ]
    tightened = BASE.replace("      min: 0.99\n      count: 3", "      min: 0.995\n      count: 5")
    assert review(tightened)["risks"] == []


def test_gates_removed() -> None:
    head = (BASE.replace("        analysis: [success, errors]\n      - weight: 50", "        analysis: [success]\n      - weight: 50")
            .replace("      - metric: loss\n        max: 0.5\n", ""))
    plan = review(head)
    # The removed threshold is found where it was, at the base revision (line 27); the analysis
    # in the head (line 48: two lines above, as the threshold's two lines are gone).
    assert flags(plan) == [("gate-removed", "spec.evaluation.thresholds[loss]", 27),
                           ("gate-removed", "spec.canary.steps[0].analysis", 48)]
    assert plan["risks"][0]["message"].startswith("offline threshold on `loss` removed")
    without_metric = BASE.replace("        analysis: [success, errors]\n", "        analysis: [success]\n").replace(
        "    - name: errors\n      template: error-rate\n      compareToStable: {maxIncrease: 0.01}\n", "")
    assert ("gate-removed", "spec.metrics[errors]", 62) in flags(review(without_metric))


def test_offline_threshold_loosened() -> None:
    plan = review(BASE.replace("        min: 0.95", "        min: 0.9"))
    assert flags(plan) == [("gate-loosened", "spec.evaluation.thresholds[accuracy].min", 26)]
    assert plan["risks"][0]["message"] == "offline threshold on `accuracy`: `min` 0.95 → 0.9"


def test_rollback_and_writeback_disabled() -> None:
    head = (BASE.replace("onPrometheusUnreachable: rollback", "onPrometheusUnreachable: hold")
            .replace("gitWriteback: {enabled: true}", "gitWriteback: {enabled: false}")
            .replace("      inconclusiveLimit: 5\n", ""))
    assert flags(review(head)) == [
        ("rollback-disabled", "spec.metrics[success]", 56),
        ("rollback-disabled", "spec.onPrometheusUnreachable", 64),
        ("writeback-disabled", "spec.gitWriteback.enabled", 65),
    ]


def test_canary_step_skipped_and_traffic_jump() -> None:
    head = BASE.replace("      - weight: 50\n        analysis: [success, errors]\n", "")
    plan = review(head)
    assert flags(plan) == [("canary-step-skipped", "spec.canary.steps", 49),
                           ("traffic-jump", "spec.canary.steps[1].weight", 51)]
    assert "10 % → 50 % → 100 % became 10 % → 100 %" in plan["risks"][0]["message"]
    # Blue-green moves everything at once: an endpoint switched to it jumps.
    switched = BASE.replace("spec: {modelRef: m}", "spec: {modelRef: m, rolloutPolicyRef: blue-green}")
    # …and the laxer policy it moved to: every difference of the two policies, at the Endpoint's line.
    risks = review(switched)["risks"]
    assert [r["flag"] for r in risks] == ["gate-removed", "rollback-disabled", "rollback-disabled", "writeback-disabled",
                                          "traffic-jump"]
    assert {(r["spec"]["kind"], r["path"], r["line"]) for r in risks} == {("Endpoint", "spec.rolloutPolicyRef", 82)}
    assert risks[-1]["message"] == ("policy `canary` → `blue-green`: blue-green moves all traffic at once (0 → 100 %); "
                                    "it was 10 % → 50 % → 100 %")


def test_blue_green_auto_promote() -> None:
    plan = review(BASE.replace("autoPromote: false", "autoPromote: true"))
    assert flags(plan) == [("gate-loosened", "spec.blueGreen.autoPromote", 73)]


def test_compression_bounds_widened() -> None:
    head = BASE.replace("      maxAccuracyDrop: 0.5", "      maxAccuracyDrop: 2.0").replace("maxAbsDiff: 0.0001", "maxAbsDiff: 0.01")
    plan = review(head)
    assert flags(plan) == [("compression-bound-widened", "spec.variants[int8].maxAccuracyDrop", 37),
                           ("compression-bound-widened", "spec.export.maxAbsDiff", 40)]
    assert plan["risks"][0]["message"] == "variant `int8` may lose 2 points of accuracy (was 0.5)"


def test_fault_injection_is_flagged_whenever_on() -> None:
    head = BASE.replace("spec: {modelRef: m}", "spec: {modelRef: m, faultInjection: {errorRate: 0.25, addedLatencyMs: 100}}")
    [risk] = review(head)["risks"]
    assert (risk["flag"], risk["line"]) == ("fault-injection", 82)
    assert "injects 25 % errors and +100 ms into every canary (turned on by this change)" in risk["message"]
    [again] = review(head, base_text=head)["risks"]
    assert "(already on at the base revision)" in again["message"]



def test_a_model_holding_its_first_training_attempt_is_flagged() -> None:
    """The retry drill's hold (`Model.faultInjection.holdFirstAttemptSeconds`) is a drill setting too:
    flagged at the Model's line whenever it is on, like an Endpoint's fault injection."""
    head = BASE.replace("  datasetRef: digits\n", "  datasetRef: digits\n  faultInjection: {holdFirstAttemptSeconds: 600}\n")
    [risk] = review(head)["risks"]
    assert (risk["flag"], risk["spec"]["kind"], risk["line"]) == ("fault-injection", "Model", 21)
    assert "holds its first training attempt for 600 s (turned on by this change)" in risk["message"]
    [again] = review(head, base_text=head)["risks"]
    assert "(already on at the base revision)" in again["message"]


def test_a_model_killing_its_first_training_attempt_is_flagged() -> None:
    head = BASE.replace("  datasetRef: digits\n", "  datasetRef: digits\n  faultInjection: {killFirstAttempt: true}\n")
    [risk] = review(head)["risks"]
    assert (risk["flag"], risk["spec"]["kind"], risk["line"]) == ("fault-injection", "Model", 21)
    assert "kills its first training attempt (SIGKILL) (turned on by this change)" in risk["message"]
    [again] = review(head, base_text=head)["risks"]
    assert "(already on at the base revision)" in again["message"]

def test_prune_of_an_endpoint_serving_traffic() -> None:
    head = BASE[: BASE.index(f"---\n{HEAD}kind: Endpoint")]
    plan = review(head)
    [risk] = plan["risks"]
    assert risk["flag"] == "prune-live-traffic" and risk["spec"] == {"kind": "Endpoint", "name": "web"}
    assert (risk["file"], risk["line"]) == ("specs/all.yaml", 82)  # where it was, at the base
    assert "while serving traffic (stable 100 %)" in risk["message"]
    assert {"kind": "Endpoint", "name": "web", "op": "remove", "path": "", "old": None, "new": None,
            "file": "specs/all.yaml", "line": 79} in plan["specChanges"]


def _seldon(stable: str, canary: str | None = None) -> dict:
    predictors = [{"name": "stable", "traffic": 100 if canary is None else 90,
                   "labels": {"forge.dev/model-version": stable, "forge.dev/role": "stable", "forge.dev/variant": "int8"}}]
    if canary:
        predictors.append({"name": "canary", "traffic": 10,
                           "labels": {"forge.dev/model-version": canary, "forge.dev/role": "canary", "forge.dev/variant": "int8"}})
    return {"apiVersion": "machinelearning.seldon.io/v1", "kind": "SeldonDeployment",
            "metadata": {"name": "web", "namespace": "ns", "labels": {"forge.dev/kind": "Endpoint", "forge.dev/name": "web"}},
            "spec": {"predictors": predictors}}


def _records(*data: dict) -> list[Record]:
    """Registry records of only the parts a test names (as a stored record reads back)."""
    return [Record.from_json(d) for d in data]


def test_offline_metrics_fell_against_the_serving_version() -> None:
    records = _records(
        {"model": "m", "version": "aaa", "evaluation": {"accuracy": 0.97, "loss": 0.10, "passed": True},
         "variants": {"int8": {"figures": {"accuracy": 0.965}}}},
        {"model": "m", "version": "bbb", "evaluation": {"accuracy": 0.96, "loss": 0.09, "passed": True},
         "variants": {"int8": {"figures": {"accuracy": 0.95}}}},
    )
    change = Change(ObjectRef("SeldonDeployment", "ns", "web"), Action.UPDATE, _seldon("aaa"), _seldon("aaa", "bbb"))
    [risk] = metric_risks([change], records)
    assert risk.flag == "offline-metrics-fell" and (risk.kind, risk.name) == ("Endpoint", "web")
    assert risk.message == ("version bbb of model `m` scored worse offline than version aaa, which serves now: "
                            "accuracy 0.97 → 0.96; variant `int8` accuracy 0.965 → 0.95")
    better = [records[0], replace(records[1], evaluation={"accuracy": 0.98}, variants={})]
    assert metric_risks([change], better) == []
    assert metric_risks([change], records[:1]) == []  # the new version unknown: no claim


def test_fail_on_risk_and_exit_codes() -> None:
    assert parse_fail_on(["gate-loosened, traffic-jump", "gate-removed"]) == {"gate-loosened", "traffic-jump", "gate-removed"}
    assert parse_fail_on(["all"]) == set(FLAGS)
    plan = review(BASE.replace("        min: 0.95", "        min: 0.9"))
    assert exit_code(plan, detailed=False, fail_on=frozenset()) == 0
    assert exit_code(plan, detailed=True, fail_on=frozenset()) == 2
    assert exit_code(plan, detailed=True, fail_on=frozenset({"gate-loosened"})) == 3
    assert exit_code({**plan, "blockers": [{"flag": "unsatisfiable"}]}, detailed=True, fail_on=frozenset({"gate-loosened"})) == 1


def test_saved_plan_round_trips_with_its_review() -> None:
    plan = review(BASE.replace("        min: 0.95", "        min: 0.9"))
    again = Plan.from_json(json.loads(json.dumps(plan)))
    assert again.to_json() == plan


def test_markdown_is_capped_with_a_note_of_what_was_left_out() -> None:
    head = BASE.replace("        min: 0.95", "        min: 0.9").replace("spec: {modelRef: m}", "spec: {modelRef: m, replicas: 3}")
    plan = review(head)
    full = markdown(plan)
    assert "Left out" not in full
    small = markdown(plan, limit=len(full) - 200)
    assert len(small) <= len(full) - 200
    assert "**⚠️ Risk flags (1):**" in small and "**Plan:" in small  # what matters most always stays
    assert "> **Left out to fit a comment (" in small and "— `forgectl plan -o json` has everything." in small
    tiny = markdown(plan, limit=1500)
    assert len(tiny) <= 1500 and "Endpoint web (4 object(s))" in tiny.split("Left out")[1]


def test_live_diff_risks_in_pull_request_mode() -> None:
    """With a live diff, a deployment serving traffic that the pull request removes is flagged from
    the live state, at the Endpoint's line in the base revision."""
    from reconciler.plan.review import live_risks

    base, head = loaded(BASE), loaded(BASE[: BASE.index(f"---\n{HEAD}kind: Endpoint")])
    live_plan = build_plan([], [_seldon("aaa", "bbb")], environment="local", target="kubernetes")
    [risk] = live_risks(live_plan, head, base)
    assert (risk.flag, risk.kind, risk.name, risk.file, risk.line) == ("prune-live-traffic", "Endpoint", "web", "specs/all.yaml", 82)
    assert "(stable 90 %, canary 10 %)" in risk.message


def test_regression_gate_is_judged_in_the_plan_with_the_numbers() -> None:
    """The plan runs the controller's own regression gate (reconciler/rollout/regression.py) on the
    registry's records: a flag when the candidate will be refused, a note with the numbers always."""
    from reconciler.plan.risks import regression_risks

    text = BASE.replace("  onPrometheusUnreachable: rollback\n",
                        "  onPrometheusUnreachable: rollback\n  regressionGate: {metric: accuracy, maxDrop: 0.005}\n", 1)
    specs = loaded(text).specs
    env = specs.environment(None)
    records = _records(
        {"model": "m", "version": "aaa", "lineage": {"datasetDigest": "sha256:d"}, "evaluation": {"accuracy": 0.97}},
        {"model": "m", "version": "bbb", "lineage": {"datasetDigest": "sha256:d"}, "evaluation": {"accuracy": 0.95}},
    )
    sd_before, sd_after = _seldon("aaa"), _seldon("aaa", "bbb")
    for sd in (sd_before, sd_after):
        for p in sd["spec"]["predictors"]:
            p["labels"]["forge.dev/variant"] = "base"
    change = Change(ObjectRef("SeldonDeployment", "ns", "web"), Action.UPDATE, sd_before, sd_after)
    [risk], [note] = regression_risks([change], records, specs, env)
    assert risk.flag == "regression-gate-refused" and (risk.kind, risk.name) == ("Endpoint", "web")
    assert note == ("endpoint `web`: regression gate refused: accuracy on the held-out split: candidate bbb 0.9500, "
                    "live aaa 0.9700 (-0.0200; largest drop allowed 0.005)")
    better = [records[0], replace(records[1], evaluation={"accuracy": 0.968})]
    risks, [note] = regression_risks([change], better, specs, env)
    assert risks == [] and note.startswith("endpoint `web`: regression gate passed: accuracy on the held-out split: candidate bbb 0.9680")
    risks, [note] = regression_risks([change], records[:1], specs, env)
    assert risks == [] and "skipped: no registry record of the candidate" in note
    assert regression_risks([change], records, loaded(BASE).specs, env) == ([], [])  # no gate in the policy
