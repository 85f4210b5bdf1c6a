"""A Compute pool's `queue` (specs/queue.py) → Kueue objects and labels (renderers/queues.py): the
rendered shapes, the rules refused at validate with file:line, a gang no queue can ever admit (a
blocker), and what the plan says of a queue (reconciler/plan/queues.py: the quota, the live
status, a lowered quota as a risk flag). The API server's verdict on the rendered objects, with
Kueue's own CRDs: tests/renderers/test_server_dry_run.py and test_queue_dry_run.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from reconciler.load.loader import LoadResult, load_files
from reconciler.load.sources import SourceFile
from reconciler.plan.plan import build_plan
from reconciler.plan.queues import admitted_workloads, queue_line, queue_notes
from reconciler.plan.review import annotate
from renderers import RenderContext, render
from renderers.cost import capacity_problems, estimate
from renderers.queues import (
    ADMISSION_GATE,
    PRIORITY_CLASS,
    QUEUE_NAME,
    admission_ceiling,
    flavor_name,
    render_queues,
    scale_quantity,
)
from specs import Compute, Environment

ROOT = Path(__file__).resolve().parents[2]
LLM = ROOT / "examples" / "llm-finetune"
KUEUE = ("ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass")


def _load(specs_text: str, envs_text: str | None = None) -> LoadResult:
    files = [SourceFile("specs.yaml", specs_text.encode()),
             SourceFile("environments.yaml", (envs_text or (LLM / "environments.yaml").read_text()).encode())]
    return load_files(files)


def _llm(old: str = "", new: str = "") -> str:
    text = (LLM / "specs.yaml").read_text()
    if old:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def _rendered(result: LoadResult, env: str = "cluster") -> list[dict[str, Any]]:
    assert result.ok, result.diagnostics
    environment = result.specs.get(Environment, env)
    assert environment is not None
    return render(result.specs, RenderContext(environment, revision="0123456789ab")).manifests


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, (kind, [o["metadata"]["name"] for o in found])
    return found[0]


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_llm_finetune_pool_renders_as_a_queue() -> None:
    objects = _rendered(_load(_llm()))
    flavor, cq, lq, wpc = (_one(objects, k) for k in KUEUE)
    assert flavor["spec"] == {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                              "nodeTaints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}
    assert flavor["metadata"]["annotations"] == {"forge.dev/prune": "disabled"}  # shared: no environment prunes it
    assert "forge.dev/environment" not in flavor["metadata"]["labels"]
    assert cq["metadata"]["name"] == "forge-llm-h100-pool" and cq["metadata"]["labels"]["forge.dev/environment"] == "cluster"
    spec = cq["spec"]
    assert spec["cohortName"] == "ml-org"
    assert spec["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "forge-llm"}}
    assert spec["preemption"] == {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority",
                                  "borrowWithinCohort": {"policy": "Never"}}
    [group] = spec["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]
    [quota] = group["flavors"]
    assert quota["name"] == flavor["metadata"]["name"]
    # cpu and memory follow the GPU quota: 64 GPUs are 8 nodes of 96 CPUs and 1800Gi
    assert quota["resources"] == [
        {"name": "cpu", "nominalQuota": "768"}, {"name": "memory", "nominalQuota": "14400Gi"},
        {"name": "nvidia.com/gpu", "nominalQuota": "64", "borrowingLimit": "32", "lendingLimit": "32"}]
    assert lq["metadata"]["namespace"] == "forge-llm" and lq["spec"] == {"clusterQueue": "forge-llm-h100-pool"}
    assert (wpc["metadata"]["name"], wpc["value"]) == ("forge-llm-high", 1000)
    # the train step's pod is submitted to the LocalQueue at the pool's priority; the light steps are not
    wf = _one(objects, "Workflow")
    labelled = {t["name"]: t["metadata"]["labels"] for t in wf["spec"]["templates"] if "metadata" in t}
    assert labelled["train"][QUEUE_NAME] == "h100-pool" and labelled["train"][PRIORITY_CLASS] == "forge-llm-high"
    assert all(QUEUE_NAME not in labels for name, labels in labelled.items() if name != "train")
    # Forge writes labels; the gate is Kueue's to add (its pod webhook), never Forge's
    assert ADMISSION_GATE not in str(wf)


def test_doctor_asks_for_kueues_crds() -> None:
    from renderers.prerequisites import cluster_requirements

    found = {r.name for r in cluster_requirements(_rendered(_load(_llm()))) if r.kind == "CustomResourceDefinition"}
    assert {"resourceflavors.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io", "localqueues.kueue.x-k8s.io",
            "workloadpriorityclasses.kueue.x-k8s.io"} <= found


def test_the_local_target_renders_no_queue() -> None:
    objects = _rendered(_load(_llm()), env="local")
    assert not [o for o in objects if o["kind"] in KUEUE]
    assert QUEUE_NAME not in str(_one(objects, "Workflow"))


def test_a_multi_node_pytorchjob_is_labelled_for_the_kubeflow_integration() -> None:
    import json

    text = _llm("    layers: 32\n    dModel: 4096\n    heads: 32", "    layers: 72\n    dModel: 6144\n    heads: 48")
    wf = _one(_rendered(_load(text)), "Workflow")
    [template] = [t for t in wf["spec"]["templates"] if "resource" in t]
    job = json.loads(template["resource"]["manifest"])
    assert job["kind"] == "PyTorchJob"
    assert job["metadata"]["labels"] == {PRIORITY_CLASS: "forge-llm-high", QUEUE_NAME: "h100-pool"}
    assert "labels" not in (template.get("metadata") or {}) or QUEUE_NAME not in template["metadata"]["labels"]


def test_pools_of_the_same_nodes_share_one_flavor_across_environments() -> None:
    result = _load(_llm())
    pool = result.specs.get(Compute, "h100-pool")
    assert pool is not None
    twin = pool.model_copy(update={"metadata": pool.metadata.model_copy(update={"name": "h100-team-b"})})
    env = result.specs.get(Environment, "cluster")
    assert env is not None
    assert flavor_name(twin) == flavor_name(pool)
    a = render_queues(type(result.specs)((pool, twin, env)), env, "team-a", None, {"forge-high"})
    b = render_queues(type(result.specs)((pool,)), env, "team-b", None, set())
    assert [o["kind"] for o in a].count("ResourceFlavor") == 1  # one object for both pools
    assert {o["metadata"]["name"] for o in a if o["kind"] == "ClusterQueue"} == {"team-a-h100-pool", "team-a-h100-team-b"}
    assert _one(a, "ResourceFlavor") == _one(b, "ResourceFlavor")  # the same object, whoever renders it
    other = pool.model_copy(update={"spec": pool.spec.model_copy(update={"node_selector": {"pool": "other"}})})
    assert flavor_name(other) != flavor_name(pool)


#: The llm-finetune pool's queue before its preemption block.
QUEUE = "    cohort: ml-org\n    quota:\n      gpus: 64\n    borrowingLimit:\n      gpus: 32\n    lendingLimit:\n      gpus: 32\n"


@pytest.mark.parametrize(("old", "new", "needle", "message"), [
    # the line of the field, or of the first line of the mapping a rule of several fields is about
    (QUEUE, "    quota:\n      gpus: 4\n", "gpus: 4", "queue quota of 4 GPUs is below the pool's minGpus (8)"),
    (QUEUE, "    quota:\n      cpu: \"8\"\n", 'cpu: "8"', "needs `quota.gpus`"),
    (QUEUE, QUEUE.replace("gpus: 32\n    lendingLimit:\n      gpus: 32", "gpus: 32\n    lendingLimit:\n      gpus: 65"),
     "cohort: ml-org", "`lendingLimit.gpus` (65) is above `quota.gpus` (64)"),
    (QUEUE, QUEUE.replace("    cohort: ml-org\n", ""), "    quota:", "`borrowingLimit` needs a `cohort`"),
    ("      reclaimWithinCohort: Any", "      reclaimWithinCohort: Never\n      borrowWithinCohort: {policy: LowerPriority}",
     "reclaimWithinCohort: Never", "needs `reclaimWithinCohort` other than Never"),
    ("  nodeSelector:\n", "  nodeSelector:\n" + "".join(f"    example.com/k{i}: v\n" for i in range(8)), "example.com/k0",
     "nodeLabels, which hold at most 8; this one has 9"),
    ("      withinClusterQueue: LowerPriority", "      withinClusterQueue: Always", "withinClusterQueue",
     "LowerOrNewerEqualPriority"),
])
def test_queue_rules_are_refused_with_file_and_line(old: str, new: str, needle: str, message: str) -> None:
    text = _llm(old, new)
    result = _load(text)
    assert not result.ok
    found = [(d.file, d.line, d.message) for d in result.diagnostics]
    assert any(f == "specs.yaml" and line == _line_of(text, needle) and message in m for f, line, m in found), found


def test_a_cpu_pool_queue_has_no_gpus() -> None:
    text = _llm("  accelerator:\n    type: nvidia-h100-80gb\n  gpusPerNode: 8\n  minGpus: 8\n  maxGpus: 64\n",
                "  accelerator:\n    type: cpu\n")
    result = _load(text)
    found = {(d.line, d.path) for d in result.diagnostics if "a `cpu` pool has no GPUs" in d.message}
    assert found == {(_line_of(text, "gpus: 64"), "spec.queue.quota.gpus"),
                     (_line_of(text, "borrowingLimit:") + 1, "spec.queue.borrowingLimit.gpus"),
                     (_line_of(text, "lendingLimit:") + 1, "spec.queue.lendingLimit.gpus")}, result.diagnostics


def test_validate_refuses_through_the_cli(tmp_path: Path) -> None:
    from tests.security.helpers import assert_diagnostic, forgectl

    text = _llm(QUEUE, "    quota:\n      gpus: 4\n")
    (tmp_path / "specs.yaml").write_text(text)
    (tmp_path / "environments.yaml").write_text((LLM / "environments.yaml").read_text())
    run = forgectl("validate", ".", cwd=tmp_path)
    assert_diagnostic(run, "specs.yaml", _line_of(text, "gpus: 4"), "below the pool's minGpus (8)")


def test_a_gang_larger_than_the_queue_can_ever_admit_is_a_blocker() -> None:
    # 72 layers of 6144: 16 GPUs on two nodes, as one PyTorchJob; the queue admits 8 and may not borrow
    text = _llm("    layers: 32\n    dModel: 4096\n    heads: 32", "    layers: 72\n    dModel: 6144\n    heads: 48")
    text = text.replace("    cohort: ml-org\n    quota:\n      gpus: 64\n    borrowingLimit:\n      gpus: 32\n"
                        "    lendingLimit:\n      gpus: 32\n", "    quota:\n      gpus: 8\n")
    result = _load(text)
    assert result.ok, result.diagnostics
    env = result.specs.get(Environment, "cluster")
    assert env is not None
    problems = capacity_problems(result.specs, env, estimate(result.specs, env))
    [problem] = [p for p in problems if "Kueue" in p.message]
    assert "16 × nvidia-h100-80gb in one gang" in problem.message and "admits at most 8" in problem.message
    assert problem.declared_by == ("Compute", "h100-pool", ("spec", "queue", "quota", "gpus"))
    # with a borrowing limit in a cohort the ceiling is quota + limit; without one it is unknown (other teams lend)
    pool = result.specs.get(Compute, "h100-pool")
    assert pool is not None and admission_ceiling(pool) == 8
    assert admission_ceiling(_load(_llm()).specs.get(Compute, "h100-pool")) == 96  # type: ignore[arg-type]
    unlimited = _load(_llm("    borrowingLimit:\n      gpus: 32\n", "")).specs.get(Compute, "h100-pool")
    assert unlimited is not None and admission_ceiling(unlimited) is None


def _status(gpus_in_use: str, borrowed: str, pending: int, admitted: int) -> dict[str, Any]:
    return {"flavorsUsage": [{"name": "f", "resources": [
        {"name": "cpu", "total": "96", "borrowed": "0"},
        {"name": "nvidia.com/gpu", "total": gpus_in_use, "borrowed": borrowed}]}],
        "pendingWorkloads": pending, "admittedWorkloads": admitted}


def test_the_plan_shows_each_queue_and_flags_a_lowered_quota() -> None:
    head_text = _llm("      gpus: 64\n    borrowingLimit", "      gpus: 32\n    borrowingLimit")
    head = _load(head_text)
    desired = _rendered(head)
    live = copy.deepcopy(_rendered(_load(_llm())))
    cq = next(o for o in live if o["kind"] == "ClusterQueue")
    cq["status"] = _status("48", "0", 2, 3)  # what Kueue's controller reports
    env = head.specs.get(Environment, "cluster")
    assert env is not None
    plan = annotate(build_plan(desired, live, environment="cluster", target="kubernetes"), head, env)
    [risk] = [r for r in plan.risks if r.flag == "queue-quota-lowered"]
    assert risk.message == ("ClusterQueue forge-llm-h100-pool: quota lowered, nvidia.com/gpu 64 → 32, cpu 768 → 384, "
                            "memory 14400Gi → 7200Gi; 48 nvidia.com/gpu in use now, above the new quota; 96 cpu in use now")
    assert (risk.kind, risk.name, risk.file, risk.line) == ("Compute", "h100-pool", "specs.yaml", _line_of(head_text, "gpus: 32"))
    [note] = [n for n in plan.notes if n.startswith("queue of pool")]
    assert note == ("queue of pool `h100-pool` (ClusterQueue forge-llm-h100-pool, cohort ml-org): quota "
                    "32 nvidia.com/gpu (borrow ≤ 32, lend ≤ 32), 384 cpu, 7200Gi memory; "
                    "live: 48 nvidia.com/gpu, 96 cpu in use, 2 workloads pending, 3 admitted")


def test_queue_lines_say_only_what_was_read() -> None:
    desired = next(o for o in _rendered(_load(_llm())) if o["kind"] == "ClusterQueue")
    bare = queue_line(desired, copy.deepcopy(desired))  # a render, or a live object Kueue has not reported on
    assert bare.endswith("14400Gi memory") and "in use" not in bare and "pending" not in bare
    assert queue_line(desired, None).endswith("; new: nothing in use yet")
    borrowing = {**desired, "status": _status("80", "16", 0, 4)}
    assert "live: 80 nvidia.com/gpu (16 borrowed), 96 cpu in use, 0 workloads pending, 4 admitted" in queue_line(desired, borrowing)
    raised = {**desired, "spec": copy.deepcopy(desired["spec"])}
    from reconciler.plan.plan import Action, Change
    from reconciler.resources import ObjectRef

    change = Change(ObjectRef.of(desired), Action.NOOP, borrowing, raised)
    assert queue_notes([change]) == [queue_line(raised, borrowing)]


def test_scale_quantity_keeps_the_unit() -> None:
    assert scale_quantity("1800Gi", 8) == "14400Gi"
    assert scale_quantity("96", 8) == "768"
    assert scale_quantity("500m", 3) == "1500m"
    assert scale_quantity("1.5", 2) == "3"
    assert scale_quantity("0.25", 2) == "0.5"


def test_an_environment_sees_only_the_shared_flavors_its_queues_name() -> None:
    from reconciler.resources import shared_in_use

    ours = [o for o in _rendered(_load(_llm())) if o["kind"] in ("ResourceFlavor", "ClusterQueue")]
    theirs = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
              "metadata": {"name": "amd-mi300x-0123456789", "labels": {"app.kubernetes.io/managed-by": "forgectl"}}}
    kept = shared_in_use([*ours, theirs])
    assert [o["metadata"]["name"] for o in kept] == [o["metadata"]["name"] for o in ours]
    # without its ClusterQueue (not created yet) an environment lists no flavor: its plan creates it
    assert shared_in_use([o for o in ours if o["kind"] == "ResourceFlavor"]) == []


def _admission_notes(text: str, status: dict[str, Any] | None, workloads: list[dict[str, Any]] | None = None) -> list[str]:
    """The plan's admission lines for ``text`` rendered anew (its Workflow a create) against a live
    ClusterQueue with ``status`` (None: the queue is new too) and Kueue's ``workloads`` when read."""
    head = _load(text)
    desired = _rendered(head)
    live = [copy.deepcopy(o) for o in desired if o["kind"] not in ("Workflow",)] if status is not None else []
    for o in live:
        if o["kind"] == "ClusterQueue":
            o["status"] = status
    env = head.specs.get(Environment, "cluster")
    assert env is not None
    plan = annotate(build_plan(desired, live, environment="cluster", target="kubernetes"), head, env,
                    workloads=admitted_workloads(workloads) if workloads is not None else None)
    return [n for n in plan.notes if n.startswith("Workflow ")]


def test_the_plan_says_whether_a_new_workflows_training_is_admitted_now_or_what_it_waits_for() -> None:
    [free] = _admission_notes(_llm(), _status("48", "0", 0, 3))
    assert free.endswith(": train asks 8 nvidia.com/gpu of ClusterQueue forge-llm-h100-pool: admitted now (16 of 64 free)"), free
    [behind] = _admission_notes(_llm(), _status("48", "0", 2, 3))
    assert behind.endswith(": fits the 16 free, behind 2 pending workloads (admitted now unless they take it first)"), behind
    [waits] = _admission_notes(_llm(), _status("60", "0", 2, 3))
    assert waits.endswith(": waits for 4 more nvidia.com/gpu (4 of 64 free, behind 2 pending workloads; "
                          "may borrow up to 32 in cohort ml-org)"), waits
    # a two-node gang asks all its replicas' GPUs at once
    gang_text = _llm("    layers: 32\n    dModel: 4096\n    heads: 32", "    layers: 72\n    dModel: 6144\n    heads: 48")
    [gang] = _admission_notes(gang_text, _status("56", "0", 0, 3))
    assert ": train asks 16 nvidia.com/gpu at once (a PyTorchJob: all replicas or none) of ClusterQueue " \
           "forge-llm-h100-pool: waits for 8 more nvidia.com/gpu (8 of 64 free; may borrow up to 32 in cohort ml-org)" in gang, gang
    # nothing read of Kueue: the quota alone
    [new] = _admission_notes(_llm(), None)
    assert new.endswith("of ClusterQueue forge-llm-h100-pool (quota 64): queued; Kueue's state not read"), new


def _workload(name: str, priority: int, gpus: int, reserved_at: str, *, queue: str = "forge-llm-h100-pool",
              admitted: bool = True) -> dict[str, Any]:
    """A Workload as Kueue v0.17 writes it for an Argo step's pod (v1beta2: `spec.priority`,
    `status.admission.podSetAssignments[].resourceUsage`, the `QuotaReserved` condition)."""
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": f"pod-{name}-0a1b2", "uid": name,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": "u"}]},
            "spec": {"queueName": "h100-pool", "priority": priority},
            "status": {"admission": {"clusterQueue": queue, "podSetAssignments": [
                {"name": "main", "count": 1, "resourceUsage": {"nvidia.com/gpu": str(gpus), "cpu": "12"}}]},
                "conditions": [{"type": "QuotaReserved", "status": "True" if admitted else "False",
                                "lastTransitionTime": reserved_at, "reason": "QuotaReserved", "message": ""}]}}


def test_the_plan_names_the_lower_priority_workloads_a_new_training_will_preempt() -> None:
    """At 60 of 64 GPUs in use, the 8-GPU training (priority 1000, `high`) does not fit; Kueue's
    within-queue preemption takes lower-priority workloads, the most recently admitted first, and
    gives back any it then does not need (its fill-back): the plan names exactly those."""
    low_old = _workload("low-old", 100, 4, "2026-12-05T10:00:00Z")
    low_new = _workload("low-new", 100, 4, "2026-12-05T11:00:00Z")
    medium = _workload("medium", 500, 8, "2026-12-05T11:30:00Z")
    high = _workload("high-peer", 1000, 44, "2026-12-05T09:00:00Z")
    other_queue = _workload("elsewhere", 100, 8, "2026-12-05T12:00:00Z", queue="forge-other-pool")
    pending = _workload("waiting", 100, 8, "2026-12-05T12:00:00Z", admitted=False)
    everyone = [low_old, low_new, medium, high, other_queue, pending]
    [line] = _admission_notes(_llm(), _status("60", "0", 0, 4), everyone)
    # 4 free, 4 more needed: the newest of the lowest priority is enough
    assert line.endswith(": will preempt pod-low-new-0a1b2 (Pod low-new, priority 100): lower priority than its 1000 "
                         "(4 of 64 free; withinClusterQueue LowerPriority); a preempted step is retried and waits again"), line
    # all 64 in use, 8 needed: both low ones (4 + 4), not the medium one (the lowest priority first)
    [both] = _admission_notes(_llm(), _status("64", "0", 0, 4), everyone)
    assert "will preempt pod-low-new-0a1b2 (Pod low-new, priority 100), pod-low-old-0a1b2 (Pod low-old, priority 100)" in both, both
    # fill-back: with one low (4) and the medium (8) admitted and 8 needed, the low is taken first (not
    # enough), then the medium; the low is given back, since the medium alone frees the 8
    [filled] = _admission_notes(_llm(), _status("64", "0", 0, 3), [low_old, medium, high])
    assert "will preempt pod-medium-0a1b2 (Pod medium, priority 500):" in filled and "low-old" not in filled, filled
    # nothing of lower priority frees enough: it waits, as without the Workloads
    [waits] = _admission_notes(_llm(), _status("64", "0", 0, 1), [high])
    assert "waits for 8 more nvidia.com/gpu (0 of 64 free" in waits, waits
    # a queue whose policy is Never preempts nothing
    never = _llm("      withinClusterQueue: LowerPriority", "      withinClusterQueue: Never")
    [kept] = _admission_notes(never, _status("60", "0", 0, 4), everyone)
    assert "will preempt" not in kept and "waits for 4 more" in kept, kept


def test_a_models_own_priority_places_its_training_and_changes_nothing_it_produces() -> None:
    """`priority: low` on a Model of a `high` pool: its train pod runs at PriorityClass `forge-low`
    and is labelled with the environment's `-low` WorkloadPriorityClass (rendered beside `-high`
    only when a model uses it), so a `high` training of the same queue preempts it. Placement only:
    the model's version, its train step's key and config are those of the same model without it."""
    from renderers.workflow import plan_steps
    from specs import Model

    plain = _load(_llm())
    low_text = _llm("  name: support-lm\nspec:\n", "  name: support-lm\nspec:\n  priority: low\n")
    low = _load(low_text)
    objects = _rendered(low)
    wf = _one(objects, "Workflow")
    train = next(t for t in wf["spec"]["templates"] if t["name"] == "train")
    assert train["metadata"]["labels"][PRIORITY_CLASS] == "forge-llm-low"
    assert train["priorityClassName"] == "forge-low", train.get("priorityClassName")
    assert sorted((o["metadata"]["name"], o["value"]) for o in objects if o["kind"] == "WorkloadPriorityClass") == [
        ("forge-llm-low", 100)]
    env = plain.specs.get(Environment, "cluster")
    assert env is not None
    steps = [plan_steps(r.specs, r.specs.get(Model, "support-lm"), env) for r in (plain, low)]  # type: ignore[arg-type]
    (v0, s0, _), (v1, s1, _) = steps
    assert v0 == v1 and [s.key for s in s0] == [s.key for s in s1] and [s.config for s in s0] == [s.config for s in s1]
