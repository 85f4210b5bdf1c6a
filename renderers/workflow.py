"""Model → Argo `Workflow`: a DAG prepare-data → train (or a search fan-out + pick-best) →
evaluate → compress (one task per variant) → register, with an `onExit` handler.

Why a `Workflow` per model version rather than a `WorkflowTemplate` plus submissions: the plan must
show exactly what will run, and a Workflow is that, fully rendered (configs, images, resources),
reviewable in a pull request and immutable once created. Its name carries the model version, so a
changed spec is a new Workflow (a `create` in the plan) and an unchanged one is a no-op; a
template would move that decision to submit time, outside the plan. The local target executes the
same Workflow object, so there is one rendering for both targets.

Artifacts flow through the workspace volume (a PersistentVolumeClaim mounted at
`/forge/workspace` in every step); their paths and the evaluation result flow as Argo parameters.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import dataclass, field
from typing import Any

from renderers.deepspeed import deepspeed_config
from renderers.labels import MODEL_VERSION, STEP, canonical_json, digest, owner_metadata
from renderers.scheduling import Schedule, schedule_resources
from renderers.versions import model_version, step_key
from specs import Compression, Environment, Model, SpecSet
from specs.model import Choice, IntRange, Uniform
from specs.stepconfig import (
    CompressConfig,
    DEFAULT_WORKSPACE,
    EvaluateConfig,
    PickBestConfig,
    PrepareConfig,
    RegisterConfig,
    TrainConfig,
    WORKSPACE_ENV,
)

WORKSPACE_PVC = "forge-workspace"
STEP_CACHE_CONFIGMAP = "forge-step-cache"
#: Exit codes of a runtime that retrying cannot fix: digest mismatch, thresholds, variant rejected.
PERMANENT_EXIT_CODES = (2, 3, 4)
TRAINING_PRIORITY = {"high": "forge-high", "medium": "forge-high", "low": "forge-low"}


@dataclass(frozen=True)
class Step:
    """One rendered step: its Argo task/template name, config, image and cache key."""

    name: str
    kind: str
    config: dict[str, Any]
    image: str
    key: str
    depends: tuple[str, ...] = ()
    reason: str = ""


@dataclass
class RenderedWorkflow:
    """A Model's Workflow manifest and the steps it is made of (for plans and the local target)."""

    model: str
    version: str
    manifest: dict[str, Any]
    steps: list[Step] = field(default_factory=list)
    schedule: Schedule | None = None


def image(env: Environment, runtime: str) -> str:
    """Image of a runtime (`forge-train`, `forge-compress`, `forge-serve`, `forge-serve-seldon`)."""
    return f"{env.spec.image_registry.rstrip('/')}/{runtime}:{env.spec.image_tag}"


def data_dir(specs: SpecSet, model: Model) -> str:
    """Workspace folder of a model's prepared data (keyed by the dataset digest)."""
    dataset = specs.dataset_of(model)
    return f"data/{dataset.name}/{dataset.spec.digest.removeprefix('sha256:')[:12]}"


def version_dir(model: str, version: str) -> str:
    """Workspace folder of one version's training outputs."""
    return f"models/{model}/{version}"


def registry_dir(model: str, version: str, variant: str = "") -> str:
    """Workspace folder of a registered version (and of one of its variants)."""
    base = f"registry/{model}/{version}"
    return f"{base}/{variant}" if variant else base


def search_trials(model: Model) -> list[dict[str, float | int | str]]:
    """The hyperparameter sets of a search, generated deterministically from the spec: grid takes
    combinations in order; random draws from a generator seeded by the spec's own digest."""
    search = model.spec.search
    if search is None:
        return []
    names = sorted(search.space)
    if search.algorithm == "grid":
        grids = [search.space[n].values for n in names]  # type: ignore[union-attr]
        return [dict(zip(names, combo)) for combo in itertools.islice(itertools.product(*grids), search.trials)]
    rng = random.Random(digest(model.spec.model_dump(mode="json", by_alias=True)))
    trials = []
    for _ in range(search.trials):
        trial: dict[str, float | int | str] = {}
        for name in names:
            dim = search.space[name]
            if isinstance(dim, Choice):
                trial[name] = rng.choice(dim.values)
            elif isinstance(dim, IntRange):
                trial[name] = rng.randint(dim.min, dim.max)
            elif isinstance(dim, Uniform) and dim.type == "logUniform":
                trial[name] = float(f"{math.exp(rng.uniform(math.log(dim.min), math.log(dim.max))):.6g}")
            else:
                trial[name] = float(f"{rng.uniform(dim.min, dim.max):.6g}")
        trials.append(trial)
    return trials


def _config_json(config: Any) -> dict[str, Any]:
    return config.model_dump(mode="json", by_alias=True, exclude_defaults=False)


def plan_steps(specs: SpecSet, model: Model, env: Environment) -> tuple[str, list[Step], Schedule]:
    """The steps of a Model's workflow, with configs and cache keys (pure; shared by the renderer,
    the plan's cache-hit report and the local target)."""
    dataset = specs.dataset_of(model)
    compute = specs.compute_of(model, env)
    schedule = schedule_resources(model, dataset, compute)
    version = model_version(specs, model, env.spec.image_tag)
    train_image = image(env, "forge-train")
    compress_image = image(env, "forge-compress")
    data = data_dir(specs, model)
    vdir = version_dir(model.name, version)
    steps: list[Step] = []

    def add(name: str, kind: str, config: Any, img: str, depends: tuple[str, ...]) -> Step:
        cfg = _config_json(config)
        upstream = [s.key for s in steps if s.name in depends]
        key = step_key(kind, cfg, img, upstream)
        cfg["cacheKey"] = key
        step = Step(name, kind, cfg, img, key, depends)
        steps.append(step)
        return step

    add("prepare-data", "prepare", PrepareConfig(dataset=dataset.name, spec=dataset.spec, output=data), train_image, ())
    ds = deepspeed_config(model, schedule.gpus) if model.spec.distributed.strategy == "deepspeed" else None
    trials = search_trials(model)
    if trials:
        names = []
        for i, overrides in enumerate(trials):
            cfg = TrainConfig(model=model.name, version=version, spec=model.spec, overrides=overrides, data=data,
                              output=f"{vdir}/trials/{i}", deepspeed=ds)
            names.append(add(f"train-trial-{i}", "train", cfg, train_image, ("prepare-data",)).name)
        search = model.spec.search
        assert search is not None
        add("pick-best", "pick-best",
            PickBestConfig(model=model.name, trials=[f"{vdir}/trials/{i}" for i in range(len(trials))],
                           metric=search.metric, goal=search.goal, output=f"{vdir}/train"),
            train_image, tuple(names))
        trained = "pick-best"
    else:
        add("train", "train", TrainConfig(model=model.name, version=version, spec=model.spec, data=data,
                                          output=f"{vdir}/train", deepspeed=ds), train_image, ("prepare-data",))
        trained = "train"
    add("evaluate", "evaluate",
        EvaluateConfig(model=model.name, model_dir=f"{vdir}/train", data=data,
                       thresholds=list(model.spec.evaluation.thresholds), output=f"{vdir}/evaluate"),
        train_image, (trained, "prepare-data"))
    variants = {"base": f"{vdir}/train"}
    compression = specs.compression_of(model)
    if compression is not None:
        for variant in compression.spec.variants:
            teachers = {}
            for name in sorted({s.teacher_ref for s in variant.stages if getattr(s, "teacher_ref", None)}):
                teacher = specs.get(Model, name)
                assert teacher is not None and name is not None
                teacher_version = version if name == model.name else model_version(specs, teacher, env.spec.image_tag)
                teachers[name] = f"{vdir}/train" if name == model.name else registry_dir(name, teacher_version, "base")
            bound = variant.max_accuracy_drop if variant.max_accuracy_drop is not None else compression.spec.max_accuracy_drop
            add(f"compress-{variant.name}", "compress",
                CompressConfig(model=model.name, variant=variant, model_dir=f"{vdir}/train", data=data,
                               teachers=teachers, hardware_target=compression.spec.hardware_target,
                               max_accuracy_drop=bound, output=f"{vdir}/variants/{variant.name}"),
                compress_image, ("evaluate", "prepare-data"))
            variants[variant.name] = f"{vdir}/variants/{variant.name}"
    compress_steps = tuple(s.name for s in steps if s.kind == "compress")
    add("register", "register",
        RegisterConfig(model=model.name, version=version, variants=variants, output=registry_dir(model.name, version)),
        train_image, ("evaluate", *compress_steps))
    return version, steps, schedule


def _resources(schedule: Schedule, compute_cpu: str, compute_memory: str) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": compute_cpu, "memory": compute_memory}
    limits: dict[str, Any] = {"memory": compute_memory}
    if schedule.resource_name and schedule.gpus:
        requests[schedule.resource_name] = str(schedule.gpus_per_node)
        limits[schedule.resource_name] = str(schedule.gpus_per_node)
    return {"requests": requests, "limits": limits}


def _container(step: Step, command: list[str], resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "image": step.image,
        "command": command,
        "args": [step.kind, "--config-json", canonical_json(step.config)],
        "env": [{"name": WORKSPACE_ENV, "value": DEFAULT_WORKSPACE}],
        "resources": resources,
        "volumeMounts": [{"name": "workspace", "mountPath": DEFAULT_WORKSPACE}],
    }


def _retry(limit: int) -> dict[str, Any]:
    codes = " && ".join(f"lastRetry.exitCode != {c}" for c in PERMANENT_EXIT_CODES)
    return {
        "limit": str(limit),
        "retryPolicy": "Always",
        "expression": f"lastRetry.status == 'Error' || ({codes})",
        "backoff": {"duration": "10s", "factor": "2", "maxDuration": "10m"},
    }


def _pytorchjob(step: Step, schedule: Schedule, model: Model, pod_spec: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    """A Kubeflow Training Operator PyTorchJob for multi-node training: its c10d rendezvous is the
    engine, so Forge writes none of its own."""
    container = dict(pod_spec["containers"][0])
    container["name"] = "pytorch"
    container["command"] = ["python", "-m", "runtimes"]
    replica = {"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": {**pod_spec, "containers": [container]}}}
    spec: dict[str, Any] = {
        "nprocPerNode": str(schedule.gpus_per_node),
        "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": model.spec.retries},
        "pytorchReplicaSpecs": {"Master": replica, "Worker": {**replica, "replicas": schedule.nodes - 1}},
    }
    if model.spec.distributed.elastic:
        spec["elasticPolicy"] = {"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": schedule.nodes, "nProcPerNode": schedule.gpus_per_node}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"generateName": f"{name}-", "namespace": namespace}, "spec": spec}


def render_workflow(specs: SpecSet, model: Model, env: Environment, namespace: str, revision: str | None) -> RenderedWorkflow:
    """The Argo Workflow of one Model version."""
    version, steps, schedule = plan_steps(specs, model, env)
    compute = specs.compute_of(model, env)
    name = f"{model.name[:50]}-{version[:10]}"
    train_priority = TRAINING_PRIORITY[compute.spec.priority]
    templates: list[dict[str, Any]] = []
    tasks: list[dict[str, Any]] = []
    light = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    for step in steps:
        heavy = step.kind == "train"
        resources = _resources(schedule, compute.spec.node.cpu, compute.spec.node.memory) if heavy else light
        command = ["python", "-m", "runtimes"]
        if heavy and schedule.gpus > 1 and not schedule.multi_node:
            command = ["torchrun", "--standalone", f"--nproc_per_node={schedule.gpus}", "-m", "runtimes"]
        template: dict[str, Any] = {
            "name": step.name,
            "metadata": {"labels": {STEP: step.kind}},
            "outputs": {"parameters": [{"name": "metrics", "valueFrom": {"path": f"{DEFAULT_WORKSPACE}/{step.config['output']}/metrics.json", "default": "{}"}}]},
            "memoize": {"key": f"{step.kind}-{step.key[:40]}", "maxAge": "8760h", "cache": {"configMap": {"name": STEP_CACHE_CONFIGMAP}}},
            "retryStrategy": _retry(model.spec.retries),
        }
        if heavy:
            template["priorityClassName"] = train_priority
            if compute.spec.node_selector:
                template["nodeSelector"] = dict(sorted(compute.spec.node_selector.items()))
            if compute.spec.tolerations:
                template["tolerations"] = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in compute.spec.tolerations]
        if heavy and schedule.multi_node:
            pod = {"priorityClassName": train_priority, "containers": [_container(step, command, resources)],
                   "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": WORKSPACE_PVC}}]}
            if compute.spec.node_selector:
                pod["nodeSelector"] = template["nodeSelector"]
            if compute.spec.tolerations:
                pod["tolerations"] = template["tolerations"]
            job = _pytorchjob(step, schedule, model, pod, namespace, name)
            template["resource"] = {
                "action": "create",
                "setOwnerReference": True,
                "manifest": json.dumps(job, sort_keys=True, indent=2),
                "successCondition": "status.replicaStatuses.Master.succeeded > 0",
                "failureCondition": "status.replicaStatuses.Master.failed > 0",
            }
            template.pop("outputs")
        else:
            template["container"] = _container(step, command, resources)
        templates.append(template)
        task: dict[str, Any] = {"name": step.name, "template": step.name}
        if step.depends:
            task["depends"] = " && ".join(f"{d}.Succeeded" for d in step.depends)
        tasks.append(task)

    search = model.spec.search
    dag: dict[str, Any] = {"tasks": tasks}
    on_exit = {
        "name": "record-outcome",
        "container": {
            "image": image(env, "forge-train"),
            "command": ["python", "-m", "runtimes.outcome"],
            "args": ["--model", model.name, "--version", version, "--status", "{{workflow.status}}",
                     "--failures", "{{workflow.failures}}", "--output", f"{version_dir(model.name, version)}/outcome.json"],
            "env": [{"name": WORKSPACE_ENV, "value": DEFAULT_WORKSPACE}],
            "resources": light,
            "volumeMounts": [{"name": "workspace", "mountPath": DEFAULT_WORKSPACE}],
        },
    }
    manifest = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": owner_metadata(
            model, name=name, namespace=namespace, environment=env.name, revision=revision,
            labels={MODEL_VERSION: version},
        ),
        "spec": {
            "entrypoint": "pipeline",
            "onExit": "record-outcome",
            "parallelism": search.parallelism if search else 2,
            "podGC": {"strategy": "OnWorkflowSuccess"},
            "ttlStrategy": {"secondsAfterSuccess": 604800},
            "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": WORKSPACE_PVC}}],
            "templates": [{"name": "pipeline", "dag": dag}, *templates, on_exit],
        },
    }
    if env.spec.kubernetes and env.spec.kubernetes.service_account:
        manifest["spec"]["serviceAccountName"] = env.spec.kubernetes.service_account
    return RenderedWorkflow(model.name, version, manifest, steps, schedule)


def compression_variants(compression: Compression | None) -> list[str]:
    """Variant names a Model builds, `base` first."""
    return ["base", *(v.name for v in compression.spec.variants)] if compression else ["base"]
