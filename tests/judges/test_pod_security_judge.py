"""Every pod Forge causes, judged by the Pod Security admission's own evaluator.

``forge-judge pod-security`` runs ``k8s.io/pod-security-admission``'s
``policy.NewEvaluator(policy.DefaultChecks())`` — what the API server's PodSecurity admission runs
— at level ``restricted``, version ``latest``, over the pods the objects make: each Workflow
template's pod (assembled as Argo's workflow-controller assembles it), the replicas of a
multi-node PyTorchJob, each SeldonDeployment predictor's pod, and the Deployments Seldon Core's
own controller creates from it (``seldon-judge render``).

Cases: every example in every environment, plus the multi-node variants (PyTorchJob replicas).
Three views of the same pods:

* what Forge writes, alone;
* with the containers the controllers add, configured as docs/cluster-prerequisites.md tells the
  admin (Argo's executor ``init``/``wait`` containers from the workflow-controller ConfigMap; the
  Training Operator's ``init-pytorch`` container from its template file: both in
  ``renderers/prerequisites.py``) — and without that configuration they are refused;
* the Seldon operator's Deployments (no container is injected: ``seldon.io/no-engine``).

Mutants show the evaluator bites: an added capability, a host path, a missing field, and that
the level is honoured (what ``baseline`` admits, ``restricted`` refuses).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from reconciler.targets.local import upstream
from renderers.prerequisites import ARGO_EXECUTOR_SECURITY_CONTEXT, PYTORCH_INIT_CONTAINER_TEMPLATE
from tests.judges.test_upstream_judges import CASES, MULTI_NODE_CASES, SERVING_CASES, manifests

pytestmark = pytest.mark.judges

#: The workflow-controller ConfigMap's `executor`, as docs/cluster-prerequisites.md and the test node set it.
EXECUTOR = {"securityContext": ARGO_EXECUTOR_SECURITY_CONTEXT}
#: The objects whose pods Forge writes: Workflows (with the PyTorchJobs of their resource templates)
#: and SeldonDeployments.
KINDS = ("Workflow", "SeldonDeployment")



def _objects(case: str) -> list[dict[str, Any]]:
    return [m for kind in KINDS for m in manifests(case, kind)]


def _judge(objs: list[dict[str, Any]], **kwargs: Any) -> list[dict[str, Any]]:
    """Every pod's verdict, flattened (the objects' own errors among them)."""
    verdicts = upstream.pod_security_many(objs, **kwargs)
    for obj, v in zip(objs, verdicts, strict=True):
        assert v["pods"], f"{obj['kind']} {obj['metadata']['name']}: no pod found in it"
    return [p | {"object_errors": v["errors"]} for v in verdicts for p in v["pods"]]


def _refusals(pods: list[dict[str, Any]]) -> list[str]:
    return [f"{p['pod']}: {p['forbidden']}" for p in pods if not p["ok"]]


# ---------------------------------------------------------------------------------------------
# every pod passes `restricted`
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_every_pod_forge_renders_passes_restricted(case: str, judge: Path) -> None:
    pods = _judge(_objects(case))
    assert not _refusals(pods), "Pod Security `restricted` refuses:\n" + "\n".join(_refusals(pods))
    assert all(not p["object_errors"] for p in pods), pods
    # the pods judged are the ones Forge writes: steps (and the exit handler), servers
    names = " ".join(p["pod"] for p in pods)
    assert "template train" in names or "template train-trial-0" in names, names
    assert "template record-outcome" in names, names
    if case in SERVING_CASES:
        servers = [p for p in pods if p["pod"].startswith("SeldonDeployment ")]
        assert servers and all(p["containers"] == ["await-model", "model"] for p in servers), servers
    if case in MULTI_NODE_CASES:
        replicas = [p for p in pods if "→ PyTorchJob" in p["pod"]]
        assert {p["pod"].rsplit(" ", 1)[1] for p in replicas} == {"Master", "Worker"}, replicas


@pytest.mark.parametrize("case", CASES)
def test_with_the_controllers_configured_as_documented_every_container_passes(case: str, judge: Path) -> None:
    pods = _judge(_objects(case), argo_executor=EXECUTOR, pytorch_init_container_template=PYTORCH_INIT_CONTAINER_TEMPLATE)
    assert not _refusals(pods), "Pod Security `restricted` refuses:\n" + "\n".join(_refusals(pods))
    steps = [p for p in pods if p["pod"].startswith("Workflow ") and "→" not in p["pod"]]
    # Argo's executor is in every step pod: `init` first, `wait` beside the step's `main`
    assert steps and all(p["containers"][0] == "init" for p in steps), steps
    assert all(p["containers"][1:] in (["wait", "main"], ["main"]) for p in steps), steps
    if case in MULTI_NODE_CASES:
        workers = [p for p in pods if p["pod"].endswith("replica Worker")]
        assert workers and all(p["containers"] == ["init-pytorch", "pytorch"] for p in workers), workers


@pytest.mark.parametrize("case", [c for c in SERVING_CASES if c.endswith("/cluster")])
def test_what_the_seldon_operator_creates_passes_restricted(case: str, judge: Path, seldon_judge: Path) -> None:
    deployments = [o for objs in upstream.seldon_render_many(manifests(case, "SeldonDeployment"))
                   for o in objs if o["kind"] == "Deployment"]
    assert deployments
    pods = _judge(deployments)
    assert not _refusals(pods), "Pod Security `restricted` refuses:\n" + "\n".join(_refusals(pods))
    assert all(p["containers"] == ["await-model", "model"] for p in pods), pods  # nothing injected


# ---------------------------------------------------------------------------------------------
# the evaluator bites
# ---------------------------------------------------------------------------------------------


def _workflow() -> dict[str, Any]:
    return manifests("quickstart/cluster", "Workflow")[0]


def _step(wf: dict[str, Any], name: str = "train") -> dict[str, Any]:
    return next(t for t in wf["spec"]["templates"] if t["name"] == name)


def _errors(obj: dict[str, Any], **kwargs: Any) -> list[str]:
    return upstream.pod_security_many([obj], **kwargs)[0]["errors"]


def test_an_added_capability_is_refused(judge: Path) -> None:
    wf = _workflow()
    step = _step(wf)
    step["container"]["securityContext"] = copy.deepcopy(step["container"]["securityContext"])
    step["container"]["securityContext"]["capabilities"]["add"] = ["NET_ADMIN"]
    errors = _errors(wf)
    assert len(errors) == 1 and "template train: violates PodSecurity \"restricted:latest\"" in errors[0], errors
    assert 'unrestricted capabilities (container "main" must not include "NET_ADMIN"' in errors[0], errors
    assert not _errors(_workflow())  # the unchanged object passes


def test_a_host_path_is_refused(judge: Path) -> None:
    sd = manifests("quickstart/cluster", "SeldonDeployment")[0]
    pod = sd["spec"]["predictors"][0]["componentSpecs"][0]["spec"]
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/var/run"}})
    errors = _errors(sd)
    assert len(errors) == 1 and 'restricted volume types (volume "host" uses restricted volume type "hostPath")' in errors[0], errors
    baseline = _errors(sd, level="baseline")  # baseline forbids it too
    assert len(baseline) == 1 and 'hostPath volumes (volume "host")' in baseline[0], baseline


def test_the_level_is_honoured(judge: Path) -> None:
    wf = _workflow()
    step = _step(wf, "evaluate")
    step["container"]["securityContext"] = {k: v for k, v in step["container"]["securityContext"].items()
                                            if k != "allowPrivilegeEscalation"}
    errors = _errors(wf)
    assert len(errors) == 1 and "allowPrivilegeEscalation != false" in errors[0], errors
    assert not _errors(wf, level="baseline")  # baseline does not ask for it
    assert "violates PodSecurity \"restricted:v1.24\"" in _errors(wf, version="v1.24")[0]


def test_argo_executor_without_a_security_context_is_refused(judge: Path) -> None:
    errors = _errors(_workflow(), argo_executor={})
    steps = {t["name"] for t in _workflow()["spec"]["templates"] if "container" in t}
    refused = {e.split(": violates")[0].rsplit(" ", 1)[1] for e in errors}
    assert refused == steps, errors  # every step pod, for its executor's containers alone
    assert all('containers "init", "wait" must set securityContext.allowPrivilegeEscalation=false' in e for e in errors), errors


def test_the_training_operators_own_init_container_is_refused(judge: Path) -> None:
    """The operator's built-in `init-pytorch` template sets no security context: at `restricted`
    its workers would not start until the admin gives it one (docs/cluster-prerequisites.md)."""
    wf = manifests("llm-finetune-multi-node-static/cluster", "Workflow")[0]
    verdict = upstream.pod_security_many([wf], pytorch_init_container_template="")[0]
    refused = [p for p in verdict["pods"] if not p["ok"]]
    assert [p["pod"].rsplit(" ", 2)[1:] for p in refused] == [["replica", "Worker"]], verdict["pods"]
    assert refused[0]["containers"] == ["init-pytorch", "pytorch"]
    assert 'container "init-pytorch" must set securityContext.allowPrivilegeEscalation=false' in refused[0]["forbidden"]


def _labels_pods() -> list[dict[str, Any]]:
    """The one-off pods of `forgectl labels` on examples/sharded-labelled's cluster Environment."""
    from reconciler.load.environments import load_environment
    from renderers.labelpods import merge_pod, pull_pod
    from specs import Dataset
    from specs.stepconfig import MergeLabelsConfig

    result, env = load_environment([str(Path(__file__).resolve().parents[2] / "examples" / "sharded-labelled")], None,
                                   "cluster")
    dataset = result.specs.get(Dataset, "digits-labelled")
    assert dataset is not None
    config = MergeLabelsConfig(dataset=dataset.name, spec=dataset.spec, labels="/forge/inputs",
                               review="/forge/inputs/review.csv", output="labels-merges/digits-labelled/1")
    return [pull_pod(env, "forge-sharded-labelled", "forge-labels-pull-1", "models/digits-tpe/v/labels"),
            merge_pod(env, "forge-sharded-labelled", "forge-labels-merge-1", config, "digits-data", "inputs-1"),
            merge_pod(env, "forge-sharded-labelled", "forge-labels-withdraw-1", config, "digits-data", "inputs-1",
                      withdraw="labels-0123456789ab.parquet")]


def test_the_one_off_pods_of_forgectl_labels_pass_restricted(judge: Path) -> None:
    """`forgectl labels pull` and `merge` run pods of their own (renderers/labelpods.py): decoded
    strictly as Pods and judged like the rest; without the security context they are refused."""
    pods = _judge(_labels_pods())
    assert [p["pod"] for p in pods] == ["Pod forge-labels-pull-1", "Pod forge-labels-merge-1", "Pod forge-labels-withdraw-1"]
    assert not _refusals(pods) and all(not p["object_errors"] for p in pods), pods
    bare = _labels_pods()[1]
    bare["spec"].pop("securityContext")
    bare["spec"]["containers"][0].pop("securityContext")
    [refused] = _judge([bare])
    assert not refused["ok"] and "runAsNonRoot != true" in refused["forbidden"], refused


def test_the_documented_controller_settings_are_the_judged_ones() -> None:
    """docs/cluster-prerequisites.md shows the admin the settings these tests judge with."""
    import textwrap

    import yaml

    page = (Path(__file__).resolve().parents[2] / "docs" / "cluster-prerequisites.md").read_text()
    blocks = [textwrap.dedent(b.split("\n", 1)[1]) for b in page.split("```yaml")[1:] for b in [b.split("```")[0]]]
    configmaps = [yaml.safe_load(b) for b in blocks if "workflow-controller-configmap" in b]
    assert [yaml.safe_load(c["data"]["executor"]) for c in configmaps] == [EXECUTOR]
    assert [b for b in blocks if "init-pytorch" in b] == [PYTORCH_INIT_CONTAINER_TEMPLATE]
