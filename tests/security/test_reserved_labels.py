"""Promise 2, for metadata: a spec's labels and annotations are copied onto every object rendered
from it, so keys that a controller of those objects reads — Argo's, Seldon's, Kueue's, the Training
Operator's, Prometheus's, Kubernetes' own, and Forge's — are refused at validate with file:line and
the name of the controller that owns them. A Model's `workflows.argoproj.io/controller-instanceid`
would otherwise hand its Workflow to another Argo controller, or to none."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.security.helpers import Project, assert_diagnostic, doc, snapshot

MODEL = "datasetRef: digits\narchitecture: {type: mlp}\n"
ENDPOINT = "modelRef: base-model\n"

#: (id, kind, body, `labels` or `annotations`, key, owner named in the message)
CASES = [
    ("argo-instance-id", "Model", MODEL, "labels", "workflows.argoproj.io/controller-instanceid", "Argo Workflows"),
    ("argo-archive", "Model", MODEL, "labels", "workflows.argoproj.io/workflow-archiving-status", "Argo Workflows"),
    ("argo-root", "Model", MODEL, "annotations", "argoproj.io/anything", "Argo Workflows"),
    ("argo-pod-name-format", "Model", MODEL, "annotations", "workflows.argoproj.io/pod-name-format", "Argo Workflows"),
    ("seldon", "Endpoint", ENDPOINT, "annotations", "seldon.io/engine-separate-pod", "Seldon Core"),
    ("seldon-group", "Endpoint", ENDPOINT, "labels", "machinelearning.seldon.io/x", "Seldon Core"),
    ("kueue-queue", "Model", MODEL, "labels", "kueue.x-k8s.io/queue-name", "Kueue"),
    ("kueue-priority", "Model", MODEL, "labels", "kueue.x-k8s.io/priority-class", "Kueue"),
    ("training-operator", "Model", MODEL, "labels", "training.kubeflow.org/job-name", "the Kubeflow Training Operator"),
    ("prometheus-scrape", "Endpoint", ENDPOINT, "annotations", "prometheus.io/scrape", "Prometheus"),
    ("prometheus-operator", "Endpoint", ENDPOINT, "labels", "operator.prometheus.io/name", "Prometheus"),
    ("kubernetes-root", "Endpoint", ENDPOINT, "labels", "kubernetes.io/metadata.name", "Kubernetes itself"),
    ("kubernetes-subdomain", "Model", MODEL, "annotations", "kubectl.kubernetes.io/last-applied-configuration",
     "Kubernetes itself"),
    ("kubernetes-node", "Model", MODEL, "labels", "node.kubernetes.io/instance-type", "Kubernetes itself"),
    ("k8s-root", "Endpoint", ENDPOINT, "labels", "k8s.io/x", "Kubernetes itself"),
    ("gateway-api", "Endpoint", ENDPOINT, "labels", "gateway.networking.k8s.io/route-name", "Kubernetes itself"),
    ("forge-own", "Endpoint", ENDPOINT, "annotations", "forge.dev/rollout", "Forge"),
    ("forge-subdomain", "Model", MODEL, "labels", "x.forge.dev/y", "Forge"),
    ("managed-by", "Model", MODEL, "labels", "app.kubernetes.io/managed-by", "Forge (ownership"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_controller_key_is_refused(tmp_path: Path, case: tuple[str, str, str, str, str, str]) -> None:
    _, kind, body, where, key, owner = case
    project = Project.create(tmp_path)
    project.write("case.yaml", doc(kind, body, metadata=f"{where}: {{{key}: 'x'}}\n"))
    before = snapshot(project.outside), snapshot(project.root)
    what = "label" if where == "labels" else "annotation"
    run = project.run("validate", "specs", timeout=30)
    assert_diagnostic(run, "case.yaml", 5, f"{what} key {key!r} is reserved: it belongs to {owner}")
    project.assert_untouched(*before)


def test_render_and_plan_refuse_too(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    project.git_init()
    project.write("case.yaml", doc("Model", MODEL, name="m2",
                                   metadata="labels: {workflows.argoproj.io/controller-instanceid: other}\n"))
    for args in (("render", "specs"), ("plan", "specs", "--base", "HEAD")):
        run = project.run(*args, timeout=60)
        assert_diagnostic(run, "case.yaml", 5, "belongs to Argo Workflows")
        assert "controller-instanceid" not in run.stdout


def test_recommended_application_labels_stay_the_users(tmp_path: Path) -> None:
    """`app.kubernetes.io/name`, `…/part-of` and a plain `team` pass, and reach the Workflow and the
    SeldonDeployment; look-alike prefixes that are not a controller's subdomain pass too."""
    labels = "labels: {app.kubernetes.io/name: digits, app.kubernetes.io/part-of: shop, team: a, notkubernetes.io/x: y}\n"
    project = Project.create(tmp_path)
    project.write("case.yaml", doc("Model", MODEL, name="m2", metadata=labels) + "---\n"
                  + doc("Endpoint", "modelRef: m2\n", name="web2", metadata=labels))
    run = project.run("render", "specs", timeout=60)
    assert run.returncode == 0, run.output
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(run.stdout) if o}
    workflow = next(o for (kind, name), o in objects.items() if kind == "Workflow" and name.startswith("m2-"))
    seldon = objects[("SeldonDeployment", "web2")]
    for obj in (workflow, seldon):
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "digits"
        assert obj["metadata"]["labels"]["notkubernetes.io/x"] == "y"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "forgectl"
        assert not [k for k in obj["metadata"]["labels"] if "argoproj.io" in k or "kueue" in k]


def test_node_selectors_still_name_kubernetes_labels(tmp_path: Path) -> None:
    """A Compute pool's `nodeSelector` selects nodes by Kubernetes' own labels: reading a key is
    not setting it, so it is not reserved there."""
    project = Project.create(tmp_path)
    project.write("case.yaml", doc("Compute", "accelerator: {type: cpu}\nnodeSelector: {kubernetes.io/arch: amd64, "
                                              "node.kubernetes.io/instance-type: m5.large}\n", name="pool"))
    assert project.run("validate", "specs", timeout=30).returncode == 0
