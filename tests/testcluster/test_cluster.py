"""The test cluster itself: a real kube-apiserver with the real CRDs, RBAC and Prometheus.

These are the done-when checks of issue 3; they also show how other tests use the fixtures.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from devkit.common import versions
from devkit.rbac import forgectl_rbac_documents
from reconciler.targets.local.processes import free_port, running

pytestmark = pytest.mark.cluster

ARGO = ("argoproj.io", "v1alpha1")
SELDON = ("machinelearning.seldon.io", "v1")


def apply(api_client, body: dict, namespace: str, manager: str = "forgectl", force: bool = False) -> dict:
    """Server-side apply through the dynamic client.

    (kubernetes 37's CustomObjectsApi.patch_namespaced_custom_object returns None when the
    server answers 201, i.e. when an apply creates the object, so it is not used here.)
    """
    res = dynamic.DynamicClient(api_client).resources.get(api_version=body["apiVersion"], kind=body["kind"])
    out = res.server_side_apply(body=body, name=body["metadata"]["name"], namespace=namespace,
                                field_manager=manager, force_conflicts=force or None)
    return out.to_dict()


def workflow(name: str, **spec_overrides) -> dict:
    spec = {
        "entrypoint": "main",
        "templates": [{
            "name": "main",
            "container": {"image": "python:3.11-slim", "command": ["python", "-c", "print('hi')"],
                          "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
        }],
    }
    spec.update(spec_overrides)
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "forge"}}, "spec": spec}


def seldon_deployment(name: str) -> dict:
    def predictor(pname: str, image: str, traffic: int) -> dict:
        return {
            "name": pname, "replicas": 1, "traffic": traffic,
            "graph": {"name": "model", "type": "MODEL", "endpoint": {"type": "REST"}},
            "componentSpecs": [{"spec": {"containers": [{"name": "model", "image": image}]}}],
        }

    return {
        "apiVersion": "machinelearning.seldon.io/v1", "kind": "SeldonDeployment",
        "metadata": {"name": name},
        "spec": {"protocol": "v2", "predictors": [predictor("stable", "registry.local/m:1", 90),
                                                   predictor("canary", "registry.local/m:2", 10)]},
    }


def test_version_is_the_pinned_release(kube_cluster, k8s_api):
    pinned = versions()["KUBERNETES_VERSION"]
    info = client.VersionApi(k8s_api).get_code()
    assert info.git_version == pinned
    assert (info.major, info.minor) == ("1", pinned.split(".")[1])


def test_the_real_crds_are_established(k8s_api):
    crds = {c.metadata.name: c for c in client.ApiextensionsV1Api(k8s_api).list_custom_resource_definition().items}
    expected = {
        "workflows.argoproj.io", "workflowtemplates.argoproj.io", "cronworkflows.argoproj.io",
        "clusterworkflowtemplates.argoproj.io", "seldondeployments.machinelearning.seldon.io",
        "servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com",
        "prometheusrules.monitoring.coreos.com",
        # the Gateway API's standard channel (what the gatewayAPI traffic router renders HTTPRoutes for)
        "gatewayclasses.gateway.networking.k8s.io", "gateways.gateway.networking.k8s.io",
        "httproutes.gateway.networking.k8s.io", "referencegrants.gateway.networking.k8s.io",
    }
    assert expected <= set(crds)
    for name in expected:
        conds = {c.type: c.status for c in crds[name].status.conditions}
        assert conds.get("Established") == "True", name
    # the *full* Argo CRD: a structural schema down to the container fields
    wf = crds["workflows.argoproj.io"].spec.versions[0].schema.open_apiv3_schema
    assert "templates" in wf.properties["spec"].properties


def test_workflow_create_and_read_back(k8s_api, namespace):
    api = client.CustomObjectsApi(k8s_api)
    created = api.create_namespaced_custom_object(*ARGO, namespace, "workflows", workflow("train-1"))
    assert created["metadata"]["uid"]
    got = api.get_namespaced_custom_object(*ARGO, namespace, "workflows", "train-1")
    assert got["spec"]["entrypoint"] == "main"
    assert got["spec"]["templates"][0]["container"]["command"] == ["python", "-c", "print('hi')"]
    # custom resources keep quantities as sent (int-or-string in the CRD schema)
    assert got["spec"]["templates"][0]["container"]["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    assert got["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_workflow_unknown_fields_are_pruned(k8s_api, namespace):
    api = client.CustomObjectsApi(k8s_api)
    body = workflow("pruned", notAnArgoField="x")
    created = api.create_namespaced_custom_object(*ARGO, namespace, "workflows", body)
    assert "notAnArgoField" not in created["spec"]


def test_seldondeployment_create_and_read_back(k8s_api, namespace):
    api = client.CustomObjectsApi(k8s_api)
    api.create_namespaced_custom_object(*SELDON, namespace, "seldondeployments", seldon_deployment("fraud"))
    got = api.get_namespaced_custom_object(*SELDON, namespace, "seldondeployments", "fraud")
    assert [(p["name"], p["traffic"]) for p in got["spec"]["predictors"]] == [("stable", 90), ("canary", 10)]
    assert got["spec"]["predictors"][1]["componentSpecs"][0]["spec"]["containers"][0]["image"] == "registry.local/m:2"


def test_workflow_breaking_the_schema_is_rejected_with_422(k8s_api, namespace):
    api = client.CustomObjectsApi(k8s_api)
    bad = workflow("bad", entrypoint=42)  # the CRD says string
    with pytest.raises(ApiException) as exc:
        api.create_namespaced_custom_object(*ARGO, namespace, "workflows", bad)
    assert exc.value.status == 422
    status = json.loads(exc.value.body)
    assert status["reason"] == "Invalid"
    fields = [c.get("field") for c in status["details"]["causes"]]
    assert "spec.entrypoint" in fields, status
    assert "must be of type string" in status["message"]


def test_server_side_apply_records_the_forgectl_field_manager(k8s_api, namespace):
    api = client.CustomObjectsApi(k8s_api)
    out = apply(k8s_api, workflow("applied"), namespace)
    managers = {(m["manager"], m["operation"]) for m in out["metadata"]["managedFields"]}
    assert ("forgectl", "Apply") in managers
    owned = next(m for m in out["metadata"]["managedFields"] if m["manager"] == "forgectl")["fieldsV1"]
    assert "f:entrypoint" in owned["f:spec"]

    # another manager changing a field forgectl owns conflicts (409) unless it forces
    other = workflow("applied", entrypoint="other")
    with pytest.raises(ApiException) as exc:
        apply(k8s_api, other, namespace, manager="someone-else")
    assert exc.value.status == 409
    assert 'conflict with "forgectl": .spec.entrypoint' in json.loads(exc.value.body)["message"]
    # re-applying forgectl's own intent is a no-op, and the object is as forgectl applied it
    again = apply(k8s_api, workflow("applied"), namespace)
    assert again["metadata"]["resourceVersion"] == out["metadata"]["resourceVersion"]
    got = api.get_namespaced_custom_object(*ARGO, namespace, "workflows", "applied")
    assert got["spec"]["entrypoint"] == "main"


def test_stale_resource_version_is_a_conflict(k8s_api, namespace):
    api = client.CustomObjectsApi(k8s_api)
    first = api.create_namespaced_custom_object(*SELDON, namespace, "seldondeployments", seldon_deployment("rv"))
    first["spec"]["predictors"][0]["traffic"] = 80
    first["spec"]["predictors"][1]["traffic"] = 20
    api.replace_namespaced_custom_object(*SELDON, namespace, "seldondeployments", "rv", first)
    with pytest.raises(ApiException) as exc:  # same, stale resourceVersion again
        api.replace_namespaced_custom_object(*SELDON, namespace, "seldondeployments", "rv", first)
    assert exc.value.status == 409


def test_least_privilege_credential(kube_cluster, restricted_kubeconfig, namespace):
    api = kube_cluster.api_client(restricted_kubeconfig)
    try:
        custom = client.CustomObjectsApi(api)
        core = client.CoreV1Api(api)
        # inside the role: works
        custom.create_namespaced_custom_object(*ARGO, namespace, "workflows", workflow("allowed"))
        apply(api, seldon_deployment("sd"), namespace)
        core.list_namespaced_config_map(namespace)
        assert namespace in {n.metadata.name for n in core.list_namespace().items}

        def forbidden(call, *args, **kwargs) -> dict:
            with pytest.raises(ApiException) as exc:
                call(*args, **kwargs)
            assert exc.value.status == 403, exc.value.body
            return json.loads(exc.value.body)

        # a verb outside the role: services are not Forge's to delete
        status = forbidden(core.delete_namespaced_service, "anything", namespace)
        assert 'User "forgectl" cannot delete resource "services"' in status["message"]
        # a resource outside the role
        forbidden(core.list_namespaced_secret, namespace)
        # the role is bound in this namespace only
        forbidden(custom.list_namespaced_custom_object, *ARGO, "default", "workflows")
        # namespaces: read-only
        forbidden(core.delete_namespace, namespace)
    finally:
        api.close()


def test_rbac_file_is_what_the_cluster_enforces(kube_cluster, restricted_kubeconfig, namespace):
    """Every rule in docs/rbac/forgectl-role.yaml is allowed, the neighbouring verbs are not."""
    api = kube_cluster.api_client(restricted_kubeconfig)
    try:
        authz = client.AuthorizationV1Api(api)

        def allowed(verb: str, group: str, resource: str) -> bool:
            review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    namespace=namespace, verb=verb, group=group, resource=resource)))
            return authz.create_self_subject_access_review(review).status.allowed

        for doc in forgectl_rbac_documents():
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for res in rule["resources"]:
                        for verb in rule["verbs"]:
                            assert allowed(verb, group, res), (verb, group, res)
        assert not allowed("deletecollection", "argoproj.io", "workflows")
        assert not allowed("create", "", "pods")
        assert not allowed("get", "", "secrets")
        assert not allowed("update", "", "services")
    finally:
        api.close()


def test_pytorchjob_crd_when_available(k8s_api, namespace, kube_cluster):
    if not any(c["name"] == "pytorchjobs.kubeflow.org" for c in kube_cluster.crds):
        pytest.skip("the Kubeflow Training Operator CRD was not available: " + "; ".join(kube_cluster.notes))
    api = client.CustomObjectsApi(k8s_api)
    job = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "ddp"},
        "spec": {"pytorchReplicaSpecs": {
            role: {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [
                {"name": "pytorch", "image": "registry.local/train:1",
                 "resources": {"limits": {"nvidia.com/gpu": 8}}}]}}}
            for role, n in (("Master", 1), ("Worker", 3))}},
    }
    api.create_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", job)
    got = api.get_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", "ddp")
    assert got["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3


def test_prometheus_scrapes_targets_and_survives_an_outage(prometheus):
    # Prometheus scrapes its own /metrics: a real target that is up
    prometheus.set_targets([f"127.0.0.1:{prometheus.port}"], labels={"test": "self"})
    prometheus.wait_for_targets(1)
    up = prometheus.query('up{job="forge", test="self"}')
    assert [r["value"][1] for r in up] == ["1"]

    prometheus.pause()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(prometheus.url + "/-/ready", timeout=2)
    prometheus.resume()
    prometheus.wait_for_targets(1)
    assert prometheus.query('up{job="forge", test="self"}')


def test_prometheus_target_down_is_reported(prometheus):
    dead = f"127.0.0.1:{free_port()}"
    prometheus.set_targets([dead])
    prometheus.wait_for_targets(1, health="down")
    assert [r["value"][1] for r in prometheus.query(f'up{{instance="{dead}"}}')] == ["0"]


@pytest.mark.slow
def test_dev_cluster_script_start_env_stop(tmp_path):
    """scripts/dev-cluster start prints the exports and its time; stop leaves no process behind."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, FORGE_DEV_CLUSTER_DIR=str(tmp_path / "dc"))
    script = str(root / "scripts" / "dev-cluster")
    start = subprocess.run([script, "start", "--no-crds"], env=env, capture_output=True, text=True, timeout=300)
    try:
        assert start.returncode == 0, start.stderr
        assert start.stdout.startswith(f"export KUBECONFIG={tmp_path / 'dc' / 'kubeconfig'}")
        assert "started in" in start.stderr
        state = json.loads((tmp_path / "dc" / "state.json").read_text())
        pids, starts = state["pids"], state["starts"]
        assert set(pids) == {"etcd", "kube-apiserver"}
        again = subprocess.run([script, "env"], env=env, capture_output=True, text=True, timeout=60)
        assert again.stdout == start.stdout
    finally:
        stop = subprocess.run([script, "stop"], env=env, capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0, stop.stderr
    for name, pid in pids.items():
        assert not running(pid, starts[name]), (name, pid)
    assert not (tmp_path / "dc").exists()
