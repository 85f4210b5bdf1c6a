"""Model → Argo `Workflow`: a DAG prepare-data → train (or a search fan-out + pick-best) →
evaluate → compress (one task per variant) → register, with an `onExit` handler; with
`labeling.auto`, an `autolabel` step beside them (:func:`autolabel_steps`).

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from renderers.deepspeed import deepspeed_config
from renderers.hardware import TENSORRT_IMAGE, apply_placement, hardware_steps
from renderers.labels import MODEL_VERSION, STEP, TRAINING_STAGE, digest, owner_metadata
from renderers.pods import SECURITY_CONTEXT, SHM_MOUNT, placement, scratch_volumes, secured, shm_volume, training_priority
from renderers.prerequisites import WORKSPACE_PVC, workflow_service_account
from renderers.queues import queue_labels
from renderers.scheduling import Schedule, schedule_resources
from renderers.shards import FAN_OUT_TASK, FanOut, credentials_env, fan_out_steps, fan_out_templates
from renderers.sources import SOURCE_READERS, source_volumes
from renderers.stepargs import decode_step_config, step_args
from renderers.versions import model_version, step_key
from specs import Environment, Model, SpecSet
from specs.compression import Distill
from specs.model import Choice, IntRange, Uniform
from specs.stepconfig import (
    DEFAULT_WORKSPACE,
    PERMANENT_EXIT_CODES,
    STUDY_RUN_ENV,
    STUDY_URL_ENV,
    WORKSPACE_ENV,
    AutoLabelConfig,
    AwaitConfig,
    CompressConfig,
    EvaluateConfig,
    ExplainConfig,
    JoinShardsConfig,
    PickBestConfig,
    PrepareConfig,
    PrepareGroupConfig,
    RegisterConfig,
    SearchStudy,
    StudyTrial,
    TrainConfig,
    shard_group_ids,
)

STEP_CACHE_CONFIGMAP = "forge-step-cache"


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
    fan_out: FanOut | None = None
    """A fan-out step (a sharded data set's groups): one memoized task per item."""


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


def groups_dir(dataset: str) -> str:
    """Workspace folder of a sharded data set's prepared groups, one sub-folder per group identity
    (shared by every version of the data set, so an unchanged group is prepared once)."""
    return f"data/{dataset}/groups"


def data_dir(specs: SpecSet, model: Model) -> str:
    """Workspace folder of a model's prepared data (keyed by the dataset digest)."""
    dataset = specs.dataset_of(model)
    return f"data/{dataset.name}/{dataset.spec.digest.removeprefix('sha256:')[:12]}"


def version_dir(model: str, version: str) -> str:
    """Workspace folder of one version's training outputs."""
    return f"models/{model}/{version}"


def workflow_name(model: str, version: str) -> str:
    """Name of the Workflow of one model version (the version makes it unique and immutable)."""
    return f"{model[:50]}-{version[:10]}"


def registry_dir(model: str, version: str, variant: str = "") -> str:
    """Workspace folder of a registered version (and of one of its variants)."""
    base = f"registry/{model}/{version}"
    return f"{base}/{variant}" if variant else base


def search_trials(model: Model) -> list[dict[str, float | int | str]]:
    """The hyperparameter sets of a search, generated deterministically from the spec: grid takes
    combinations in order; random draws from a generator seeded by the spec's own digest; tpe
    renders empty sets (its trials ask the study)."""
    search = model.spec.search
    if search is None:
        return []
    names = sorted(search.space)
    if search.algorithm == "tpe":
        # Each trial asks the study for its values when it starts (runtimes/study.py): TPE learns
        # from the trials done by then, so nothing is drawn here.
        return [{} for _ in range(search.trials)]
    if search.algorithm == "grid":
        grids = [dim.values for dim in (search.space[n] for n in names) if isinstance(dim, Choice)]
        assert len(grids) == len(names)  # the spec's validator allows only `choice` dimensions in a grid
        return [dict(zip(names, combo)) for combo in itertools.islice(itertools.product(*grids), search.trials)]
    rng = random.Random(digest(model.spec.result_dump()))
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


def search_study(model: Model, version: str, env: Environment | None = None) -> SearchStudy | None:
    """The Optuna study of a search that needs one (`tpe`, or early stopping): a SQLite file in the
    version's folder on the workspace volume, which every trial pod mounts, or the cluster's
    PostgreSQL database when the Environment names one; its sampler seeded from the spec's digest,
    like the random trials."""
    search = model.spec.search
    if search is None or not search.uses_study:
        return None
    seed = int(digest(model.spec.result_dump())[:8], 16)
    kube = env.spec.kubernetes if env is not None and env.spec.target == "kubernetes" else None
    return SearchStudy(storage=f"{version_dir(model.name, version)}/search/study.db", name=f"{model.name}-{version}",
                       search=search, seed=seed, database=kube.study_database if kube is not None else None)


def study_env(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The environment a step of a study kept in a database reads it by: the URL from the Secret,
    and the Workflow's uid naming the run (empty for a SQLite study, or a step without one)."""
    study = config.get("study") or (config.get("trial") or {}).get("study") or {}
    database = study.get("database")
    if not database:
        return []
    return [{"name": STUDY_URL_ENV, "valueFrom": {"secretKeyRef": {"name": database["secret"], "key": database["key"]}}},
            {"name": STUDY_RUN_ENV, "value": "{{workflow.uid}}"}]


def search_reasons(steps: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The plan's line for a search (from a Workflow's step configs): the algorithm, early
    stopping, the trials and how many run at a time, and where the study is kept."""
    trials = [s.get("config") or {} for n, s in steps.items() if n.startswith("train-trial-")]
    search = ((trials[0].get("spec") or {}).get("search") or {}) if trials else {}
    if not search:
        return []
    stopping = search.get("earlyStopping", "none")
    line = (f"search: {search.get('algorithm')}, {'no early stopping' if stopping == 'none' else f'early stopping {stopping}'}"
            f" — {len(trials)} trials, {search.get('parallelism')} at a time, best {search.get('metric')} "
            f"({search.get('goal')}) picked")
    study = (trials[0].get("trial") or {}).get("study") or {}
    if study.get("database"):
        line += f" from the study in the PostgreSQL database of Secret {study['database'].get('secret')}"
    elif study:
        line += f" from the study {study.get('storage')}"
    return [line]


def _config_json(config: Any) -> dict[str, Any]:
    return config.model_dump(mode="json", by_alias=True, exclude_defaults=False)


def training_stage(specs: SpecSet, model: Model) -> int:
    """How many distillation teachers (or labelling models) deep a Model is: 0 without any, else
    one more than its deepest (the loader refuses cycles)."""
    compression = specs.compression_of(model)
    teachers = [specs.get(Model, n) for n in specs.teachers_of(compression)] if compression else []
    labeller = specs.labeller_of(model)
    teachers += [specs.get(Model, labeller)] if labeller else []
    return max((1 + training_stage(specs, t) for t in teachers if t is not None and t.name != model.name), default=0)


def await_registration(model: str, version: str, what: str, variant: str | None = None) -> AwaitConfig:
    """The wait for one model version's registration (`registry.json`, written last by `register`),
    failing as soon as that version's workflow records a failed outcome — or, for a server of
    ``variant``, once the registration says a step rejected that variant (it will never come)."""
    return AwaitConfig(paths=[f"{registry_dir(model, version)}/registry.json"],
                       outcomes=[f"{version_dir(model, version)}/outcome.json"], what=what, variant=variant)


def plan_steps(specs: SpecSet, model: Model, env: Environment) -> tuple[str, list[Step], Schedule]:
    """The steps of a Model's workflow, with configs and cache keys (pure; shared by the renderer,
    the plan's cache-hit report and the local target)."""
    dataset = specs.dataset_of(model)
    compute = specs.compute_of(model, env)
    schedule = schedule_resources(model, dataset, compute)
    version = model_version(specs, model, env)
    train_image = image(env, "forge-train")
    compress_image = image(env, "forge-compress")
    data = data_dir(specs, model)
    vdir = version_dir(model.name, version)
    # What the train step runs: the spec without its placement (`priority` moves no result, so it
    # moves no step key and leaves the checkpoints of a run it preempts resumable).
    trained_spec = model.spec.model_copy(update=dict.fromkeys(model.spec.PLACEMENT_FIELDS))
    steps: list[Step] = []

    def add(name: str, kind: str, config: Any, img: str, depends: tuple[str, ...]) -> Step:
        cfg = _config_json(config)
        upstream = [s.key for s in steps if s.name in depends]
        key = step_key(kind, cfg, img, upstream)
        cfg["cacheKey"] = key
        step = Step(name, kind, cfg, img, key, depends)
        steps.append(step)
        return step

    shards = dataset.spec.source.shards
    if shards is None:
        add("prepare-data", "prepare", PrepareConfig(dataset=dataset.name, spec=dataset.spec, output=data), train_image, ())
    else:
        # The groups fan out (renderers/shards.py); the join keeps the name every later step reads
        # its data from, `prepare-data`.
        group_cfg = _config_json(PrepareGroupConfig(dataset=dataset.name, spec=dataset.spec, output=groups_dir(dataset.name)))
        items = tuple(shard_group_ids(dataset.spec))
        key = step_key("prepare-group", {**group_cfg, "items": list(items)}, train_image, [])
        group_cfg["cacheKey"] = key
        steps.append(Step(FAN_OUT_TASK, "prepare-group", group_cfg, train_image, key,
                          fan_out=FanOut(items, shards.parallelism)))
        add("prepare-data", "join-shards", JoinShardsConfig(dataset=dataset.name, spec=dataset.spec,
                                                            groups=groups_dir(dataset.name), output=data),
            train_image, (FAN_OUT_TASK,))
    ds = deepspeed_config(model, schedule.gpus) if model.spec.distributed.strategy == "deepspeed" else None
    trials = search_trials(model)
    if trials:
        names = []
        study = search_study(model, version, env)
        for i, overrides in enumerate(trials):
            cfg = TrainConfig(model=model.name, version=version, spec=trained_spec, overrides=overrides, data=data,
                              output=f"{vdir}/trials/{i}", deepspeed=ds,
                              trial=StudyTrial(study=study, index=i) if study else None)
            names.append(add(f"train-trial-{i}", "train", cfg, train_image, ("prepare-data",)).name)
        search = model.spec.search
        assert search is not None
        add("pick-best", "pick-best",
            PickBestConfig(model=model.name, trials=[f"{vdir}/trials/{i}" for i in range(len(trials))],
                           metric=search.metric, goal=search.goal, output=f"{vdir}/train", study=study),
            train_image, tuple(names))
        trained = "pick-best"
    else:
        add("train", "train", TrainConfig(model=model.name, version=version, spec=trained_spec, data=data,
                                          output=f"{vdir}/train", deepspeed=ds), train_image, ("prepare-data",))
        trained = "train"
    add("evaluate", "evaluate",
        EvaluateConfig(model=model.name, model_dir=f"{vdir}/train", data=data,
                       thresholds=list(model.spec.evaluation.thresholds), output=f"{vdir}/evaluate",
                       robustness=model.spec.evaluation.robustness),
        train_image, (trained, "prepare-data"))
    explain: tuple[str, ...] = ()
    if model.spec.explanations is not None:
        # Attributions of the evaluated model, beside compression (neither needs the other).
        explain = (add("explain", "explain",
                       ExplainConfig(model=model.name, model_dir=f"{vdir}/train", data=data,
                                     settings=model.spec.explanations, output=f"{vdir}/explain"),
                       train_image, ("evaluate", "prepare-data")).name,)
    variants = {"base": f"{vdir}/train"}
    compression = specs.compression_of(model)
    if compression is not None:
        for variant in compression.spec.variants:
            teachers = {}
            awaits: list[str] = []
            for name in sorted({ref for s in variant.stages if isinstance(s, Distill) and (ref := s.teacher_ref)}):
                teacher = specs.get(Model, name)
                assert teacher is not None
                if name == model.name:
                    teachers[name] = f"{vdir}/train"
                    continue
                teacher_version = model_version(specs, teacher, env)
                teachers[name] = registry_dir(name, teacher_version, "base")
                # The teacher trains in a Workflow of its own, which Argo does not order with
                # this one: wait for its registration (and fail with it).
                step_name = f"await-teacher-{name}"[:63]
                if not any(s.name == step_name for s in steps):
                    add(step_name, "await", await_registration(name, teacher_version, f"teacher {name} {teacher_version}"),
                        train_image, ())
                awaits.append(step_name)
            bound = variant.max_accuracy_drop if variant.max_accuracy_drop is not None else compression.spec.max_accuracy_drop
            add(f"compress-{variant.name}", "compress",
                CompressConfig(model=model.name, variant=variant, model_dir=f"{vdir}/train", data=data,
                               teachers=teachers, hardware_target=compression.spec.hardware_target,
                               max_accuracy_drop=bound, output=f"{vdir}/variants/{variant.name}"),
                compress_image, ("evaluate", "prepare-data", *awaits))
            variants[variant.name] = f"{vdir}/variants/{variant.name}"
    compress_steps = tuple(s.name for s in steps if s.kind == "compress")
    # ONNX export, the target's build (ORT INT8 / TensorRT) and the benchmark: renderers/hardware.py
    hw = hardware_steps(compression, model.name, version, vdir, data, variants, env, compress_image,
                        image(env, TENSORRT_IMAGE), compress_steps)
    for hw_step in hw.steps:
        add(*hw_step)
    labels = autolabel_steps(specs, model, env, vdir, train_image)
    for label_step in labels:
        add(*label_step)
    add("register", "register",
        RegisterConfig(model=model.name, version=version, variants={**variants, **hw.variants},
                       output=registry_dir(model.name, version), benchmark=hw.benchmark, artifacts=hw.artifacts),
        train_image, ("evaluate", *explain, *compress_steps, *hw.names, *(s[0] for s in labels if s[1] == "autolabel")))
    return version, steps, schedule


#: The step that pre-labels the Model's data set's unlabelled rows (`labeling.auto`).
AUTOLABEL_STEP = "autolabel"


def autolabel_steps(specs: SpecSet, model: Model, env: Environment, vdir: str,
                    img: str) -> list[tuple[str, str, Any, str, tuple[str, ...]]]:
    """The steps of `labeling.auto` (none when the Model's data set has none): `autolabel`
    pre-labels the unlabelled rows with the labelling model's registered `base` variant, writes
    `auto-labels.csv`, the review file and `report.json` (with the agreement with the held-back
    labels, gated by `minAgreement`) into ``{vdir}/labels``. Empty without `labeling.auto`.

    The labelling model is another Model: its version is the one its spec renders now (as a
    distillation teacher's), which trains in a Workflow of its own that Argo does not order with
    this one, so `await-labeller-<name>` waits for its registration (and fails with it); the step
    runs beside `prepare-data` and training. A Model labelling its own data set labels with the
    version this Workflow trained, after `evaluate`. `register` waits for it, so a version is
    registered with its labels written and the gate passed. Reviewed labels come back through
    `forgectl labels merge`, whose new digest is a new version of every Model on the data set."""
    dataset = specs.dataset_of(model)
    auto = dataset.spec.labeling.auto
    if auto is None:
        return []
    out = f"{vdir}/labels"
    if auto.model_ref == model.name:
        return [(AUTOLABEL_STEP, "autolabel", AutoLabelConfig(dataset=dataset.name, spec=dataset.spec,
                                                              model_dir=f"{vdir}/train", output=out),
                 img, ("evaluate",))]
    labeller = specs.get(Model, auto.model_ref)
    assert labeller is not None  # the loader checks the reference
    labeller_version = model_version(specs, labeller, env)
    wait = f"await-labeller-{labeller.name}"[:63]
    return [(wait, "await", await_registration(labeller.name, labeller_version, f"labelling model {labeller.name} "
                                               f"{labeller_version}"), img, ()),
            (AUTOLABEL_STEP, "autolabel", AutoLabelConfig(dataset=dataset.name, spec=dataset.spec,
                                                          model_dir=registry_dir(labeller.name, labeller_version, "base"),
                                                          output=out),
             img, (wait,))]


def _resources(schedule: Schedule, compute_cpu: str, compute_memory: str) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": compute_cpu, "memory": compute_memory}
    limits: dict[str, Any] = {"memory": compute_memory}
    if schedule.resource_name and schedule.gpus:
        requests[schedule.resource_name] = str(schedule.gpus_per_node)
        limits[schedule.resource_name] = str(schedule.gpus_per_node)
    return {"requests": requests, "limits": limits}


def _container(step: Step, command: list[str], resources: dict[str, Any]) -> dict[str, Any]:
    return secured({
        "image": step.image,
        "command": command,
        "args": step_args(step.kind, step.config),
        "env": [{"name": WORKSPACE_ENV, "value": DEFAULT_WORKSPACE}],
        "resources": resources,
        "volumeMounts": [{"name": "workspace", "mountPath": DEFAULT_WORKSPACE}],
    })


def retry_expression() -> str:
    """`retryStrategy.expression`: retry errors and failures, except the runtimes' permanent exits.

    Argo's controller puts `lastRetry.exitCode` into the expression's scope as a *string*
    (`buildRetryStrategyLocalScope`), so the codes are compared as strings: an integer comparison
    (`lastRetry.exitCode != 2`) is always true and would retry a digest mismatch. An `Error` (the
    pod never ran the step: eviction, image pull) has no meaningful exit code and is retried."""
    codes = ", ".join(f"'{c}'" for c in PERMANENT_EXIT_CODES)
    return f"lastRetry.status == 'Error' || (lastRetry.status == 'Failed' && !(lastRetry.exitCode in [{codes}]))"


def _retry(limit: int) -> dict[str, Any]:
    # No `backoff.maxDuration`: Argo measures it from the *first* attempt's start and also uses it
    # as the retried pod's deadline, so a training step failing after that long would never be
    # retried and a retry would be killed at it. `cap` bounds each wait instead.
    return {
        "limit": str(limit),
        "retryPolicy": "Always",
        "expression": retry_expression(),
        "backoff": {"duration": "10s", "factor": "2", "cap": "5m"},
    }


def memoized_name(step: str) -> str:
    """Name of the template that memoizes a step (no step's own name starts with `memoized-`)."""
    return f"memoized-{step}"


def memoized(step: Step, template: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The step's DAG task template: a one-task DAG around the step's own (retried) template that
    carries the step cache (`memoize`) and passes its outputs on.

    The key names the namespace: Argo (v4.0.5) keeps every namespace's cache entries in one
    ConfigMap in its own namespace (`NewCacheFactory(kubeclientset, namespace)`), while a step's
    outputs live on the workspace claim of the Workflow's namespace; without it, a team's step
    would "hit" another team's entry and its next step would find no file. Argo accepts a key
    matching ``^[a-zA-Z0-9][-a-zA-Z0-9]*$`` only (cache.go's cacheKeyRegex; any other ends the
    Workflow in Error when the task starts), so its parts are joined by dashes.

    Why not `memoize` and `retryStrategy` on the one pod template: Argo (v4.0.5) records a cache hit
    of a retried template as a `Retry` node with no attempt, which has no outbound node, so the
    tasks that depend on it hang off nothing: the DAG never completes, the Workflow stays Running
    with every task done and no exit handler. A memoized DAG that hits is its own outbound node
    (argoproj/argo-workflows#12780), and a DAG (unlike Steps) saves its outputs in the cache entry.
    """
    wrapper: dict[str, Any] = {
        "name": memoized_name(step.name),
        "memoize": {"key": f"{namespace}-{step.kind}-{step.key[:40]}", "maxAge": "8760h", "cache": {"configMap": {"name": STEP_CACHE_CONFIGMAP}}},
        "dag": {"tasks": [{"name": step.name, "template": step.name}]},
    }
    if "outputs" in template:
        wrapper["outputs"] = {"parameters": [
            {"name": p["name"], "valueFrom": {"parameter": f"{{{{tasks.{step.name}.outputs.parameters.{p['name']}}}}}"}}
            for p in template["outputs"]["parameters"]]}
    return wrapper


def task_templates(workflow: Mapping[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each DAG task of a rendered Workflow → (its `memoize`, the template that runs it): through a
    `memoized(...)` wrapper, or (Workflows rendered before it) one template carrying both."""
    templates = {t["name"]: t for t in workflow.get("spec", {}).get("templates", [])}
    entry = templates.get(workflow.get("spec", {}).get("entrypoint", ""), {})
    found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for task in (entry.get("dag") or {}).get("tasks", []):
        template = templates.get(task["template"], {})
        inner = (template.get("dag") or {}).get("tasks", [])
        run = templates.get(inner[0]["template"], {}) if len(inner) == 1 and "memoize" in template else template
        found[task["name"]] = (template.get("memoize") or {}, run)
    return found


def workflow_steps(workflow: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Step name → {"key": memoize key, "config": step config} of a rendered Workflow: what the
    renderer wrote, read back (the plan's reasons, the registry's lineage). A fan-out's items are
    steps of their own, named as Argo names their nodes (`group(0:<identity>)`)."""
    templates = {t["name"]: t for t in workflow.get("spec", {}).get("templates", [])}
    steps: dict[str, dict[str, Any]] = {}
    for name, (memoize, run) in task_templates(workflow).items():
        if memoize and "container" in run:
            steps[name] = {"key": memoize.get("key", ""), "config": decode_step_config(run["container"])}
        for node, key, pod in fan_out_steps(templates, run):  # a sharded data set's groups
            steps[node] = {"key": key, "config": decode_step_config(pod.get("container") or {})}
    return steps


def _pytorchjob(step: Step, schedule: Schedule, model: Model, pod_spec: dict[str, Any], namespace: str, name: str,
                labels: dict[str, str]) -> dict[str, Any]:
    """A Kubeflow Training Operator PyTorchJob for multi-node training: its rendezvous is the
    engine, so Forge writes none of its own.

    Each pod runs `torchrun`, which starts `nprocPerNode` workers and takes the node count, its
    rank and the rendezvous address from the `PET_*` variables the operator sets; running the
    step directly would start one process per pod in a world of nodes × GPUs, and hang.
    `elasticPolicy.nProcPerNode` is deprecated and refused by the operator's webhook together
    with `spec.nprocPerNode`, so only the latter is set.

    ``labels`` (a queued pool's, renderers/queues.py) hand the job to Kueue's Kubeflow
    integration: its webhook suspends the job on create and Kueue resumes it once every replica
    fits the quota at once."""
    container = dict(pod_spec["containers"][0])
    container["name"] = "pytorch"  # the operator finds its container by this name
    container["command"] = ["torchrun", "-m", "runtimes"]
    replica = {"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": {**pod_spec, "containers": [container]}}}
    spec: dict[str, Any] = {
        "nprocPerNode": str(schedule.gpus_per_node),
        "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": model.spec.retries},
        "pytorchReplicaSpecs": {"Master": replica, "Worker": {**replica, "replicas": schedule.nodes - 1}},
    }
    if model.spec.distributed.elastic:
        spec["elasticPolicy"] = {"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": schedule.nodes}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"generateName": f"{name}-", "namespace": namespace, **({"labels": labels} if labels else {})},
            "spec": spec}


def render_workflow(specs: SpecSet, model: Model, env: Environment, namespace: str, revision: str | None) -> RenderedWorkflow:
    """The Argo Workflow of one Model version."""
    version, steps, schedule = plan_steps(specs, model, env)
    compute = specs.compute_of(model, env)
    name = workflow_name(model.name, version)
    priority = training_priority(model, compute)
    train_placement = placement(compute, priority)
    # A queued pool's training waits for its quota (Kueue; renderers/queues.py): the labels of its queue.
    queue = queue_labels(compute, env, namespace, priority)
    sources = source_volumes(specs.dataset_of(model).spec, DEFAULT_WORKSPACE)
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
            "retryStrategy": _retry(model.spec.retries),
        }
        if "output" in step.config:
            template["outputs"] = {"parameters": [{"name": "metrics", "valueFrom": {
                "path": f"{DEFAULT_WORKSPACE}/{step.config['output']}/metrics.json", "default": "{}"}}]}
        container = _container(step, command, resources)
        if step.kind in ("prepare-group", "join-shards", "autolabel"):  # autolabel: the first shard's columns
            container["env"] = [*container["env"], *credentials_env(specs.dataset_of(model).spec)]
        container["env"] = [*container["env"], *study_env(step.config)]
        if step.kind in SOURCE_READERS:
            container["volumeMounts"] = [*container["volumeMounts"], *(v.mount for v in sources)]
        multi_process = heavy and schedule.gpus_per_node > 1
        if multi_process:
            container["volumeMounts"] = [*container["volumeMounts"], SHM_MOUNT]
        if heavy and schedule.multi_node:
            # The resource template's own pod only creates the job: it gets no GPU placement.
            pod = {**train_placement, "securityContext": SECURITY_CONTEXT, "containers": [container],
                   "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": WORKSPACE_PVC}},
                               shm_volume(compute.spec.node.memory), *scratch_volumes()]}
            job = _pytorchjob(step, schedule, model, pod, namespace, name, queue)
            template["resource"] = {
                "action": "create",
                "setOwnerReference": True,
                "manifest": json.dumps(job, sort_keys=True, indent=2),
                "successCondition": "status.replicaStatuses.Master.succeeded > 0",
                "failureCondition": "status.replicaStatuses.Master.failed > 0",
            }
            template.pop("outputs", None)
        else:
            if heavy:
                template.update(train_placement)
                template["metadata"] = {"labels": {**template["metadata"]["labels"], **queue}}
            if multi_process:
                template["volumes"] = [shm_volume(compute.spec.node.memory)]
            template["container"] = container
            apply_placement(template, step.kind, step.config)  # export/build-engine/benchmark only
        if step.fan_out is not None:
            container["args"] = [*container["args"], "--group", "{{inputs.parameters.group}}"]
            templates += fan_out_templates(step.fan_out, template, namespace, step.image, STEP_CACHE_CONFIGMAP)
            tasks.append({"name": step.name, "template": step.name})
            continue
        templates += [memoized(step, template, namespace), template]
        task: dict[str, Any] = {"name": step.name, "template": memoized_name(step.name)}
        if step.depends:
            task["depends"] = " && ".join(f"{d}.Succeeded" for d in step.depends)
        tasks.append(task)

    search = model.spec.search
    dag: dict[str, Any] = {"tasks": tasks}
    parallelism = search.parallelism if search else 2
    pipeline: dict[str, Any] = {"name": "pipeline", "dag": dag}
    fan_out = max((s.fan_out.parallelism for s in steps if s.fan_out is not None), default=0)
    if fan_out > parallelism:
        # The Workflow's `parallelism` counts pods: raised for the groups, while the pipeline's own
        # keeps its other tasks (trials, variants) to what they ran at before.
        pipeline["parallelism"] = parallelism
        parallelism = fan_out
    on_exit = {
        "name": "record-outcome",
        "container": secured({
            "image": image(env, "forge-train"),
            "command": ["python", "-m", "runtimes.outcome"],
            "args": ["--model", model.name, "--version", version, "--status", "{{workflow.status}}",
                     "--failures", "{{workflow.failures}}", "--output", f"{version_dir(model.name, version)}/outcome.json"],
            "env": [{"name": WORKSPACE_ENV, "value": DEFAULT_WORKSPACE}],
            "resources": light,
            "volumeMounts": [{"name": "workspace", "mountPath": DEFAULT_WORKSPACE}],
        }),
    }
    manifest: dict[str, Any] = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": owner_metadata(
            model, name=name, namespace=namespace, environment=env.name, revision=revision,
            labels={MODEL_VERSION: version},
            annotations={TRAINING_STAGE: str(training_stage(specs, model))},
        ),
        "spec": {
            "entrypoint": "pipeline",
            "onExit": "record-outcome",
            "parallelism": parallelism,
            "podGC": {"strategy": "OnWorkflowSuccess"},
            # Every pod of the Workflow (Argo gives a pod the Workflow's volumes its containers mount).
            "securityContext": SECURITY_CONTEXT,
            "ttlStrategy": {"secondsAfterSuccess": 604800},
            "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": WORKSPACE_PVC}}, *scratch_volumes(),
                        *(v.volume for v in sources)],
            "templates": [pipeline, *templates, on_exit],
        },
    }
    if env.spec.target == "kubernetes":
        manifest["spec"]["serviceAccountName"] = workflow_service_account(env)
    return RenderedWorkflow(model.name, version, manifest, steps, schedule)

