"""What the rendered objects make the cluster's controllers *do* (issue 11's defects), beyond what a
schema or the upstream validators check: placement lands on the pods that use the accelerators,
retries are not cut short, runs are ordered, a pool change is a new Workflow.

Each of these failed on the renderers before the fix; the upstream judges (tests/judges) check
the same objects with Argo's, the Training Operator's and Prometheus's own code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reconciler.load.loader import load_or_raise
from renderers import RenderContext, render
from renderers.bundle import sort_key
from renderers.stepargs import decode_step_config
from specs import Compute, Endpoint, Model, RolloutPolicy, SpecSet
from specs.rollout import CompareToStable

ROOT = Path(__file__).resolve().parents[2]


def _specs(example: str) -> SpecSet:
    return load_or_raise([str(ROOT / "examples" / example)]).specs


def _render(specs: SpecSet, env: str = "cluster") -> list[dict[str, Any]]:
    environment = specs.environment(env)
    assert environment is not None
    return render(specs, RenderContext(environment, revision="0123456789ab")).manifests


def _replace(specs: SpecSet, doc: Any, **spec_update: Any) -> SpecSet:
    changed = doc.model_copy(update={"spec": doc.spec.model_copy(update=spec_update)})
    return SpecSet(tuple(changed if d is doc else d for d in specs.documents))


def _workflow(manifests: list[dict[str, Any]], model: str) -> dict[str, Any]:
    return next(m for m in manifests if m["kind"] == "Workflow" and m["metadata"]["labels"]["forge.dev/name"] == model)


def _template(wf: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in wf["spec"]["templates"] if t["name"] == name)


def _multi_node(specs: SpecSet) -> SpecSet:
    """llm-finetune's model at ~33B (72 layers of 6144): 16 GPUs, two nodes of the 8-GPU pool,
    so a PyTorchJob."""
    model = specs.get(Model, "support-lm")
    assert model is not None
    arch = model.spec.architecture.model_copy(update={"layers": 72, "d_model": 6144, "heads": 48})
    return _replace(specs, model, architecture=arch)


def test_no_backoff_deadline_measured_from_the_first_attempt() -> None:
    # Argo measures backoff.maxDuration from the first attempt's start and makes it the retried
    # pod's deadline: a 10 min cap would never retry a long training step.
    for example in ("quickstart", "llm-finetune", "edge-vision"):
        for wf in (m for m in _render(_specs(example)) if m["kind"] == "Workflow"):
            for template in wf["spec"]["templates"]:
                backoff = (template.get("retryStrategy") or {}).get("backoff") or {}
                assert "maxDuration" not in backoff, (example, template["name"])


def test_multi_node_job_runs_torchrun_with_gpu_placement_on_its_own_pods() -> None:
    wf = _workflow(_render(_multi_node(_specs("llm-finetune"))), "support-lm")
    train = _template(wf, "train")
    assert "resource" in train
    # The resource template's pod only creates the job: no GPU priority, selector or tolerations.
    assert not {"priorityClassName", "nodeSelector", "tolerations"} & set(train)
    job = json.loads(train["resource"]["manifest"])
    assert job["kind"] == "PyTorchJob" and job["spec"]["nprocPerNode"] == "8"
    assert "nProcPerNode" not in job["spec"].get("elasticPolicy", {})
    for role, replicas in (("Master", 1), ("Worker", 1)):
        spec = job["spec"]["pytorchReplicaSpecs"][role]
        assert spec["replicas"] == replicas
        pod = spec["template"]["spec"]
        container = pod["containers"][0]
        assert container["name"] == "pytorch"
        assert container["command"] == ["torchrun", "-m", "runtimes"]  # nproc, nnodes, rank from PET_* env
        assert pod["priorityClassName"] == "forge-high"
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert pod["securityContext"]["fsGroup"] == 1000
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"])


def test_single_node_multi_gpu_step_gets_shared_memory() -> None:
    wf = _workflow(_render(_specs("llm-finetune")), "support-lm")
    train = _template(wf, "train")
    assert {"name": "dshm", "mountPath": "/dev/shm"} in train["container"]["volumeMounts"]
    assert train["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": train["container"]["resources"]["limits"]["memory"]}}]
    assert wf["spec"]["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                             "seccompProfile": {"type": "RuntimeDefault"}}


def test_endpoint_compute_ref_places_gpu_servers_on_the_pool() -> None:
    specs = _specs("llm-finetune")
    endpoint = next(iter(specs.of(Endpoint)))
    pool = next(iter(specs.of(Compute)))
    pool = pool.model_copy(update={"spec": pool.spec.model_copy(update={"priority": "low"})})
    specs = SpecSet(tuple(pool if isinstance(d, Compute) else d for d in specs.documents))
    resources = endpoint.spec.resources.model_copy(update={"limits": endpoint.spec.resources.limits.model_copy(update={"gpus": 1})})
    specs = _replace(specs, endpoint, compute_ref=pool.name, resources=resources)
    sd = next(m for m in _render(specs) if m["kind"] == "SeldonDeployment")
    pod = sd["spec"]["predictors"][0]["componentSpecs"][0]["spec"]
    assert pod["priorityClassName"] == "forge-low"  # the pool says low, not a hard-coded medium
    assert pod["nodeSelector"] == pool.spec.node_selector
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_gpu_servers_without_an_accelerator_pool_are_refused(tmp_path: Path) -> None:
    from reconciler.load.loader import load

    (tmp_path / "specs.yaml").write_text((ROOT / "examples" / "quickstart" / "endpoint.yaml").read_text()
                                         .replace("spec:\n", "spec:\n  resources:\n    limits:\n      gpus: 1\n", 1))
    for other in ("compute.yaml", "dataset.yaml", "model.yaml", "rollout.yaml", "compression.yaml", "environments.yaml"):
        (tmp_path / other).write_text((ROOT / "examples" / "quickstart" / other).read_text())
    result = load([str(tmp_path)])
    messages = [d.message for d in result.diagnostics]
    assert any("accelerator pool" in m and "computeRef" in m for m in messages), messages


def test_student_waits_for_its_teacher_and_applies_after_it() -> None:
    manifests = _render(_specs("edge-vision"))
    teacher, student = _workflow(manifests, "vision-teacher"), _workflow(manifests, "vision-student")
    tasks = {t["name"]: t for t in student["spec"]["templates"][0]["dag"]["tasks"]}
    assert "await-teacher-vision-teacher.Succeeded" in tasks["compress-pruned-distilled"]["depends"]
    wait = decode_step_config(_template(student, "await-teacher-vision-teacher")["container"])
    version = teacher["metadata"]["labels"]["forge.dev/model-version"]
    assert wait["paths"] == [f"registry/vision-teacher/{version}/registry.json"]
    assert wait["outcomes"] == [f"models/vision-teacher/{version}/outcome.json"]
    assert sort_key(teacher) < sort_key(student)  # the local target runs the teacher first


def test_first_version_server_waits_for_its_registration() -> None:
    manifests = _render(_specs("quickstart"))
    sd = next(m for m in manifests if m["kind"] == "SeldonDeployment")
    version = _workflow(manifests, "digits-mlp")["metadata"]["labels"]["forge.dev/model-version"]
    init = sd["spec"]["predictors"][0]["componentSpecs"][0]["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["await-model"]
    assert decode_step_config(init[0])["paths"] == [f"registry/digits-mlp/{version}/registry.json"]


def test_compare_to_stable_metrics_become_alerts() -> None:
    specs = _specs("quickstart")
    policy = next(iter(specs.of(RolloutPolicy)))
    metric = policy.spec.metrics[0].model_copy(
        update={"min": None, "max": None, "compare_to_stable": CompareToStable(max_decrease=0.01)})
    specs = _replace(specs, policy, metrics=[metric])
    rule = next(m for m in _render(specs) if m["kind"] == "PrometheusRule")
    rules = rule["spec"]["groups"][0]["rules"]
    assert len(rules) == 1 and rules[0]["alert"].endswith("BelowStable")
    assert "stable" in rules[0]["expr"] and "canary" in rules[0]["expr"]


def test_a_wider_pool_is_a_new_workflow() -> None:
    # Argo never re-runs a Workflow whose spec is updated in place: the job's width must be part
    # of the version (and so of the Workflow's name).
    specs = _specs("llm-finetune")
    pool = next(iter(specs.of(Compute)))
    before = _workflow(_render(specs), "support-lm")["metadata"]["name"]
    wider = _replace(specs, pool, min_gpus=16)  # same model, the pool now gives it two nodes
    assert _workflow(_render(wider), "support-lm")["metadata"]["name"] != before
    placed = _replace(specs, pool, node_selector={"pool": "other"})
    assert _workflow(_render(placed), "support-lm")["metadata"]["name"] == before  # placement alone: same run


def test_workspace_is_sized_from_the_largest_checkpoint_and_too_small_is_refused() -> None:
    import pytest

    from renderers.prerequisites import PrerequisiteError
    from specs import Environment

    specs = _specs("llm-finetune")
    pvc = next(m for m in _render(specs) if m["kind"] == "PersistentVolumeClaim")
    # ~6.6B parameters × 16 B ≈ 98 GiB per checkpoint; 1.5 × that, rounded up
    assert pvc["spec"]["resources"]["requests"]["storage"] == "148Gi"
    env = specs.environment("cluster")
    assert isinstance(env, Environment) and env.spec.kubernetes is not None
    small = env.spec.kubernetes.model_copy(update={"workspace": env.spec.kubernetes.workspace.model_copy(
        update={"size": "20Gi", "storage_class_name": "nfs"})})
    specs = _replace(specs, env, kubernetes=small)
    with pytest.raises(PrerequisiteError, match=r"workspace size 20Gi is smaller than one training checkpoint of model 'support-lm' \(~98 GiB"):
        _render(specs)


def test_workflow_pods_run_as_a_service_account_forge_renders_with_its_role() -> None:
    manifests = _render(_specs("quickstart"))
    kinds = {m["kind"]: m for m in manifests}
    assert kinds["Workflow"]["spec"]["serviceAccountName"] == "forge-workflow"
    rules = kinds["Role"]["rules"]
    assert {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"], "verbs": ["create", "patch"]} in rules
    assert kinds["RoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": "forge-workflow", "namespace": "forge-quickstart"}]
    # the local target has no pods: nothing of this is rendered there
    assert not {"ServiceAccount", "Role", "RoleBinding"} & {m["kind"] for m in _render(_specs("quickstart"), "local")}


def test_cluster_requirements_name_what_the_admin_provides() -> None:
    from renderers.prerequisites import cluster_requirements

    found = {(r.kind, r.name) for r in cluster_requirements(_render(_multi_node(_specs("llm-finetune"))))}
    assert {("CustomResourceDefinition", "workflows.argoproj.io"), ("CustomResourceDefinition", "pytorchjobs.kubeflow.org"),
            ("CustomResourceDefinition", "seldondeployments.machinelearning.seldon.io"),
            ("PriorityClass", "forge-high"), ("PriorityClass", "forge-medium"), ("StorageClass", "(default)"),
            ("ExtendedResource", "nvidia.com/gpu"), ("ControllerRights", "configmaps"),
            ("TrafficSplitter", "istio-or-ambassador")} <= found


def test_scrape_interval_leaves_four_samples_in_the_shortest_rate_window() -> None:
    # quickstart's gates use a 10s window: scraped every 5s it holds 1-2 samples (often no rate)
    pm = next(m for m in _render(_specs("quickstart")) if m["kind"] == "PodMonitor")
    assert pm["spec"]["podMetricsEndpoints"][0]["interval"] == "2s"
    pm = next(m for m in _render(_specs("llm-finetune")) if m["kind"] == "PodMonitor")
    assert pm["spec"]["podMetricsEndpoints"][0]["interval"] == "5s"  # 2m windows: the default


def test_readiness_probe_is_the_route_each_serving_runtime_has() -> None:
    # the seldon-core 1.17.1 wrapper answers 500 on /v2/health/ready: its pods would never be Ready
    specs = _specs("quickstart")
    endpoint = next(iter(specs.of(Endpoint)))
    for protocol, path in (("v2", "/v2/health/ready"), ("seldon", "/health/ping")):
        sd = next(m for m in _render(_replace(specs, endpoint, protocol=protocol)) if m["kind"] == "SeldonDeployment")
        container = sd["spec"]["predictors"][0]["componentSpecs"][0]["spec"]["containers"][0]
        assert container["readinessProbe"]["httpGet"]["path"] == path


def _pods(manifests: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]], dict[str, dict[str, Any]]]]:
    """(what, containers, volumes by name) of every pod Forge writes: Workflow steps (Argo gives a
    step the Workflow's volumes it mounts), PyTorchJob replicas, Seldon predictor components."""
    pods = []
    for m in manifests:
        if m["kind"] == "Workflow":
            shared = {v["name"]: v for v in m["spec"]["volumes"]}
            for t in m["spec"]["templates"]:
                if "container" in t:
                    pods.append((f"{m['metadata']['name']}/{t['name']}", [t["container"]],
                                 shared | {v["name"]: v for v in t.get("volumes", [])}))
                if "resource" in t:
                    job = json.loads(t["resource"]["manifest"])
                    for role, replica in job["spec"]["pytorchReplicaSpecs"].items():
                        spec = replica["template"]["spec"]
                        pods.append((f"{m['metadata']['name']}/{t['name']} {role}", spec["containers"],
                                     {v["name"]: v for v in spec["volumes"]}))
        if m["kind"] == "SeldonDeployment":
            for p in m["spec"]["predictors"]:
                spec = p["componentSpecs"][0]["spec"]
                pods.append((f"{m['metadata']['name']}/{p['name']}", spec["initContainers"] + spec["containers"],
                             {v["name"]: v for v in spec["volumes"]}))
    return pods


def test_every_container_runs_locked_down_on_a_read_only_root_with_writable_scratch() -> None:
    """Pod Security `restricted` (judged by the upstream evaluator in tests/judges) does not ask for
    a read-only root filesystem; Forge's containers have one, so what the runtimes write must land
    on a volume: the workspace, or an emptyDir at each place the runtime images write to (their
    FORGE_CACHE and TORCH_EXTENSIONS_DIR, the user's home, /tmp)."""
    from devkit.node import runtime_image
    from renderers.pods import SCRATCH_VOLUMES

    scratch = {path for _, path in SCRATCH_VOLUMES}
    image_env = dict(e.split("=", 1) for e in runtime_image.ENV)
    written = {image_env["FORGE_CACHE"], image_env["TORCH_EXTENSIONS_DIR"], "/tmp", "/home/forge"}
    assert "useradd --uid 1000 --create-home forge" in runtime_image.BASE_HOOK  # so HOME is /home/forge
    assert all(any(p == s or p.startswith(s + "/") for s in scratch) for p in written), (written, scratch)
    specs = _multi_node(_specs("llm-finetune"))
    cases = [_render(_specs(ex), env) for ex in ("quickstart", "llm-finetune", "edge-vision", "trust") for env in ("local", "cluster")]
    pods = [pod for manifests in [*cases, _render(specs)] for pod in _pods(manifests)]
    assert any(" Worker" in what for what, _, _ in pods)  # the PyTorchJob's pods are among them
    for what, containers, volumes in pods:
        for c in containers:
            assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                            "readOnlyRootFilesystem": True}, (what, c.get("name"))
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            for path in scratch:
                assert path in mounts and volumes[mounts[path]] == {"name": mounts[path], "emptyDir": {}}, (what, path)


def test_the_namespaces_pod_security_level_is_declared_named_and_its_needs_listed(tmp_path: Path) -> None:
    """`spec.kubernetes.podSecurity` (default `restricted`): the plan's note names it; at `restricted`
    the cluster requirements list the controllers' settings for the containers they add (a
    multi-node Model's PyTorchJob: the Training Operator's too), below it they do not. No spec can
    ask a pod for more than `restricted` (specs/ has no security context, host path or port), so
    there is nothing a lower level would admit."""
    from reconciler.load.loader import load
    from renderers.prerequisites import cluster_requirements, pod_security_note

    specs = _specs("quickstart")
    env = specs.environment("cluster")
    assert env is not None and env.spec.kubernetes is not None and env.spec.kubernetes.pod_security == "restricted"
    note = pod_security_note(env, "forge-quickstart")
    assert note is not None and note.startswith("Pod Security: namespace forge-quickstart enforces `restricted`"), note
    assert pod_security_note(specs.environment("local"), "forge-local") is None  # no pods: processes here

    def kinds(manifests: list[dict[str, Any]], level: str | None) -> set[tuple[str, str]]:
        return {(r.kind, r.name) for r in cluster_requirements(manifests, level) if r.kind == "PodSecurity"}

    single, multi = _render(specs), _render(_multi_node(_specs("llm-finetune")))
    assert kinds(single, "restricted") == {("PodSecurity", "argo-executor")}
    assert kinds(multi, "restricted") == {("PodSecurity", "argo-executor"), ("PodSecurity", "pytorch-init-container")}
    assert kinds(multi, "baseline") == kinds(multi, None) == set()

    for other in ("compute.yaml", "dataset.yaml", "model.yaml", "rollout.yaml", "compression.yaml", "endpoint.yaml"):
        (tmp_path / other).write_text((ROOT / "examples" / "quickstart" / other).read_text())
    envs = (ROOT / "examples" / "quickstart" / "environments.yaml").read_text()
    (tmp_path / "environments.yaml").write_text(envs.replace("namespace: forge-quickstart",
                                                             "namespace: forge-quickstart\n    podSecurity: baseline"))
    baseline = load([str(tmp_path)]).specs.environment("cluster")
    assert baseline is not None and baseline.spec.kubernetes is not None
    assert baseline.spec.kubernetes.pod_security == "baseline"
    assert (pod_security_note(baseline, "forge-quickstart") or "").endswith("so `baseline` admits them")
    bad = envs.replace("namespace: forge-quickstart", "namespace: forge-quickstart\n    podSecurity: root")
    (tmp_path / "environments.yaml").write_text(bad)
    [diagnostic] = [d for d in load([str(tmp_path)]).diagnostics if d.path == "spec.kubernetes.podSecurity"]
    line = bad.splitlines().index("    podSecurity: root") + 1
    assert diagnostic.file.endswith("environments.yaml") and diagnostic.line == line, diagnostic
    assert "restricted, baseline, privileged" in diagnostic.message, diagnostic
