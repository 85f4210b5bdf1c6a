"""Endpoint → Seldon Core v1 `SeldonDeployment`: a stable predictor and, during a rollout, a canary
predictor, with traffic weights — or, while an experiment runs, one predictor per arm with its
share — and optionally a shadow predictor (`shadow: true`: Seldon mirrors requests to it through
Istio, its answers are discarded); served by Forge's serve runtime over the Open Inference (v2)
protocol, labelled so Prometheus can select by endpoint, model version, variant and role."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from renderers.labels import ENDPOINT, MODEL_VERSION, ROLE, STICKY, TRAFFIC_ROUTER, VARIANT, owner_metadata
from renderers.pods import INFERENCE_PRIORITY, SECURITY_CONTEXT, placement, scratch_volumes, secured
from renderers.stepargs import step_args
from renderers.workflow import WORKSPACE_PVC, await_registration, image, registry_dir
from specs import Compute, Endpoint, Environment, SpecSet
from specs.endpoint import FaultInjection
from specs.stepconfig import DEFAULT_WORKSPACE, WORKSPACE_ENV, MirrorConfig, ServeConfig

SERVE_PORT = 9000
MAX_NAME = 63
#: The readiness route of each serving runtime: MLServer's v2 health endpoint; the seldon-core
#: 1.17.1 wrapper has no `/v2/...` routes (it answers 500 there) but serves `/health/ping`.
READINESS_PATHS = {"serve": "/v2/health/ready", "serve-seldon": "/health/ping"}


@dataclass(frozen=True)
class ServingState:
    """What is live for an endpoint, as the rollout controller last left it.

    ``stable`` is the version serving most traffic; ``canary`` (with ``canary_weight`` percent of
    traffic) is the version being rolled out, if any. The renderer takes this as an argument, so
    rendering stays pure and the controller alone decides weights."""

    stable: str
    canary: str | None = None
    canary_weight: int = 0
    #: While an experiment runs: one entry per arm (the controller resolves each arm's version).
    arms: tuple[ArmServing, ...] = ()
    #: The version the shadow predictor serves, when the Endpoint has a `shadow`.
    shadow: str | None = None
    #: The variant of the stable predictor when it is not the Endpoint's (an experiment's winner).
    stable_variant: str | None = None


@dataclass(frozen=True)
class ArmServing:
    """One arm of a running experiment: its name (predictor name and `forge.dev/role`), version,
    variant and share of traffic (percent)."""

    name: str
    version: str
    variant: str
    share: int


#: The init container of every model server's pod: it holds the server until its version is
#: registered, and stops, saying why, when the variant it serves was rejected.
AWAIT_CONTAINER = "await-model"


def predictor_service(deployment: str, predictor: str) -> str:
    """The Service the Seldon Core v1.17.1 operator creates for a `seldon.io/no-engine` predictor
    (`createPredictorService`, named by `GetPredictorKey`): `<SeldonDeployment>-<predictor>`, or
    `seldon-<md5 of that>` when it is longer than 63 characters; port `http` = :data:`SERVE_PORT`."""
    name = f"{deployment}-{predictor}"
    return name if len(name) <= MAX_NAME else "seldon-" + hashlib.md5(name.encode()).hexdigest()  # noqa: S324 (Seldon's name, not security)


def _arm_faults(endpoint: Endpoint, role: str) -> FaultInjection | None:
    experiment = endpoint.spec.experiment
    arm = next((a for a in experiment.arms if a.name == role), None) if experiment else None
    if arm is None or arm.fault_injection is None:
        return None
    return FaultInjection(error_rate=arm.fault_injection.error_rate, added_latency_ms=arm.fault_injection.added_latency_ms)


def _predictor(endpoint: Endpoint, compute: Compute | None, env: Environment, namespace: str, model: str,
               version: str, role: str, traffic: int, replicas: int, variant: str | None = None,
               mirror: MirrorConfig | None = None) -> dict[str, Any]:
    spec = endpoint.spec
    variant = variant or spec.variant
    # Injected faults are for drills: they apply to the canary of a rollout, or to the arm that names them.
    faults = spec.fault_injection if role == "canary" else _arm_faults(endpoint, role)
    config = ServeConfig(
        endpoint=endpoint.name, namespace=namespace, model=model, version=version, variant=variant,
        role=role, model_dir=registry_dir(model, version, variant), batching=spec.batching,
        fault_injection=faults, host="0.0.0.0", port=SERVE_PORT, backend=spec.backend, mirror=mirror,
    )
    runtime = "forge-serve-seldon" if spec.protocol == "seldon" else "forge-serve"
    step = "serve-seldon" if spec.protocol == "seldon" else "serve"
    resources: dict[str, Any] = {}
    for part in ("requests", "limits"):
        rl = getattr(spec.resources, part)
        values = {k: v for k, v in (("cpu", rl.cpu), ("memory", rl.memory)) if v is not None}
        if rl.gpus and compute is not None and compute.spec.accelerator.effective_resource_name:
            # The pool's own extended resource (amd.com/gpu, habana.ai/gaudi, …); the loader
            # refuses GPUs on an Endpoint without an accelerator pool.
            values[compute.spec.accelerator.effective_resource_name] = str(rl.gpus)
        if values:
            resources[part] = values
    labels = {ENDPOINT: endpoint.name, MODEL_VERSION: version, VARIANT: variant, ROLE: role}
    container = secured({
        "name": "model",
        "image": image(env, runtime),
        "command": ["python", "-m", "runtimes"],
        "args": step_args(step, config.model_dump(mode="json", by_alias=True)),
        "env": [{"name": WORKSPACE_ENV, "value": DEFAULT_WORKSPACE}],
        "ports": [{"name": "http", "containerPort": SERVE_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": READINESS_PATHS[step], "port": SERVE_PORT}, "periodSeconds": 2},
        "resources": resources,
        "volumeMounts": [{"name": "workspace", "mountPath": DEFAULT_WORKSPACE, "readOnly": True}],
    })
    # Seldon starts the server as soon as the object exists, and a first version is still
    # training then: the init container holds the pod until the version is registered.
    wait = await_registration(model, version, f"model {model} {version}", spec.required_variant(variant))
    init = secured({
        "name": AWAIT_CONTAINER,
        "image": image(env, "forge-serve"),
        "command": ["python", "-m", "runtimes"],
        "args": step_args("await", wait.model_dump(mode="json", by_alias=True)),
        "env": [{"name": WORKSPACE_ENV, "value": DEFAULT_WORKSPACE}],
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "volumeMounts": [{"name": "workspace", "mountPath": DEFAULT_WORKSPACE, "readOnly": True}],
    })
    component: dict[str, Any] = {
        "metadata": {"labels": labels},
        "spec": {
            **placement(compute, INFERENCE_PRIORITY[compute.spec.priority if compute else "medium"]),
            "securityContext": SECURITY_CONTEXT,
            "initContainers": [init],
            "containers": [container],
            "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": WORKSPACE_PVC, "readOnly": True}},
                        *scratch_volumes()],
        },
    }
    if spec.autoscaling and role == "stable" and not spec.experiment:
        component["hpaSpec"] = {
            "minReplicas": spec.autoscaling.min_replicas,
            "maxReplicas": spec.autoscaling.max_replicas,
            "metricsv2": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": spec.autoscaling.target_cpu_utilization}}}],
        }
    return {
        "name": role,
        "replicas": replicas,
        "traffic": traffic,
        "labels": labels,
        # One model per predictor, serving the v2 protocol and its own metrics: Seldon's executor
        # would add a hop and a second container with a port named `http`, which the PodMonitor
        # (port `http`) would scrape too.
        "annotations": {"seldon.io/no-engine": "true"},
        "componentSpecs": [component],
        "graph": {"name": "model", "type": "MODEL", "endpoint": {"type": "REST", "httpPort": SERVE_PORT}, "children": []},
    }


def experiment_serving(endpoint: Endpoint, version: str) -> ServingState:
    """The serving state of an Endpoint whose experiment runs: one arm per predictor, each arm's
    version pinned or ``version`` (what the specs build now), its variant or the Endpoint's."""
    experiment = endpoint.spec.experiment
    assert experiment is not None
    arms = tuple(ArmServing(a.name, a.version or version, a.variant or endpoint.spec.variant, a.share)
                 for a in experiment.arms)
    control = next(a for a in arms if a.name == experiment.control_arm.name)
    return ServingState(control.version, arms=arms)


def render_seldon(specs: SpecSet, endpoint: Endpoint, env: Environment, namespace: str, revision: str | None,
                  state: ServingState, router: str | None = None) -> dict[str, Any]:
    """The SeldonDeployment of an Endpoint in the given serving state. ``router``: what splits its
    traffic when that is not Seldon itself (`gatewayAPI`: an HTTPRoute, renderers/gateway.py), named
    in the `forge.dev/traffic-router` annotation; the predictors' `traffic` then only records the
    weights (Seldon's validation wants them summing to 100), the route applies them."""
    model = specs.model_of(endpoint)
    compute = specs.serving_compute_of(endpoint)
    replicas = endpoint.spec.replicas
    shadow = endpoint.spec.shadow
    # Under an HTTPRoute the live servers copy what they answered to the shadow's Service and
    # compare (runtimes/serving/mirror.py): the v2 server does; the Seldon v1 wrapper does not.
    mirror = (MirrorConfig(url=f"http://{predictor_service(endpoint.name, 'shadow')}.{namespace}.svc:{SERVE_PORT}",
                           percent=shadow.percent)
              if shadow is not None and router == "gatewayAPI" and endpoint.spec.protocol == "v2" else None)
    if state.arms:
        # An experiment: one predictor per arm, named after it, with its share. Seldon applies the
        # shares through Istio's or Ambassador's weighted routes: per request, never per user —
        # sticky assignment exists only where Forge routes itself (the local router).
        predictors = [_predictor(endpoint, compute, env, namespace, model.name, arm.version, arm.name, arm.share,
                                 replicas, arm.variant, mirror) for arm in state.arms]
    else:
        predictors = [_predictor(endpoint, compute, env, namespace, model.name, state.stable, "stable", 100 - state.canary_weight, replicas,
                                 state.stable_variant, mirror)]
        if state.canary is not None and state.canary != state.stable:
            predictors.append(_predictor(endpoint, compute, env, namespace, model.name, state.canary, "canary", state.canary_weight,
                                         max(1, min(replicas, 1)), mirror=mirror))
        else:
            predictors[0]["traffic"] = 100
    if shadow is not None:
        # Seldon's shadow: Istio mirrors `traffic` percent of the requests to it (VirtualService
        # `mirror` + `mirrorPercentage`) and drops its answers; under an HTTPRoute the live servers
        # copy them (above). One shadow at most. It serves the pinned version, else the one being
        # rolled out, else the stable one.
        version = shadow.version or state.shadow or state.canary or state.stable
        predictor = _predictor(endpoint, compute, env, namespace, model.name, version, "shadow", shadow.percent,
                               1, shadow.variant)
        predictor["shadow"] = True
        predictors.append(predictor)
    annotations = {}
    sticky = endpoint.spec.experiment.sticky if endpoint.spec.experiment else None
    if state.arms and sticky is not None:
        annotations[STICKY] = f"header:{sticky.header}" if sticky.header else f"cookie:{sticky.cookie}"
    if router is not None:
        annotations[TRAFFIC_ROUTER] = router
    return {
        "apiVersion": "machinelearning.seldon.io/v1",
        "kind": "SeldonDeployment",
        "metadata": owner_metadata(endpoint, name=endpoint.name, namespace=namespace, environment=env.name,
                                   revision=revision, labels={ENDPOINT: endpoint.name}, annotations=annotations),
        "spec": {
            "name": endpoint.name,
            "protocol": "v2" if endpoint.spec.protocol == "v2" else "seldon",
            "predictors": predictors,
        },
    }
