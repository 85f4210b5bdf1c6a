"""Every rendered object is accepted by the real kube-apiserver with the real CRDs (server-side
dry-run), and a deliberately broken render is rejected — proof the check bites."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from reconciler.errors import TargetError, TransientError
from reconciler.load.loader import load_or_raise
from reconciler.targets.kubernetes.target import KubernetesTarget
from renderers import RenderContext, ServingState, render
from specs import Environment

ROOT = Path(__file__).resolve().parents[2]


def rendered(example: str, namespace: str, serving: dict | None = None) -> list[dict]:
    specs = load_or_raise([str(ROOT / "examples" / example)]).specs
    env = specs.get(Environment, "cluster")
    assert env is not None and env.spec.kubernetes is not None
    k8s = env.spec.kubernetes.model_copy(update={"namespace": namespace})
    env = env.model_copy(update={"spec": env.spec.model_copy(update={"kubernetes": k8s})})
    return render(specs, RenderContext(env, revision="0123456789ab", serving=serving or {})).manifests


@pytest.mark.parametrize("example", ["quickstart", "llm-finetune", "edge-vision"])
def test_every_rendered_object_passes_server_dry_run(kube_cluster, namespace, example) -> None:
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    objects = rendered(example, namespace)
    assert {o["kind"] for o in objects} >= {"Workflow", "SeldonDeployment", "PodMonitor", "PrometheusRule"}
    for obj in objects:
        result = target.apply(obj, dry_run=True)
        assert result["metadata"]["name"] == obj["metadata"]["name"]


def test_canary_render_passes_server_dry_run(kube_cluster, namespace) -> None:
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    state = {"digits": ServingState("aaaaaaaaaaaa", "bbbbbbbbbbbb", 10)}
    sd = next(o for o in rendered("quickstart", namespace, state) if o["kind"] == "SeldonDeployment")
    result = target.apply(sd, dry_run=True)
    assert [p["traffic"] for p in result["spec"]["predictors"]] == [90, 10]


def test_broken_render_is_rejected(kube_cluster, namespace) -> None:
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    workflow = next(o for o in rendered("quickstart", namespace) if o["kind"] == "Workflow")
    broken = copy.deepcopy(workflow)
    broken["spec"]["templates"][2]["retryStrategy"]["backoff"] = "ten seconds"  # must be an object
    with pytest.raises(TargetError, match=r"spec\.templates\[2\]\.retryStrategy\.backoff") as err:
        target.apply(broken, dry_run=True)
    assert not isinstance(err.value, TransientError)  # a rejection is not retried
    sd = next(o for o in rendered("quickstart", namespace) if o["kind"] == "SeldonDeployment")
    broken_sd = copy.deepcopy(sd)
    broken_sd["spec"]["predictors"][0]["replicas"] = "many"
    with pytest.raises(TargetError, match=r"spec\.predictors\[0\]\.replicas"):
        target.apply(broken_sd, dry_run=True)


def test_schema_violation_is_a_422_naming_the_field(kube_cluster, namespace) -> None:
    from reconciler.errors import InvalidObjectError

    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    pvc = next(o for o in rendered("quickstart", namespace) if o["kind"] == "PersistentVolumeClaim")
    broken = copy.deepcopy(pvc)
    broken["spec"]["accessModes"] = ["ReadWriteSometimes"]
    with pytest.raises(InvalidObjectError, match=r"spec\.accessModes.*ReadWriteSometimes"):
        target.apply(broken, dry_run=True)
