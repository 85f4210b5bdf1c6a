"""Forge's runtime image on the one-node cluster, and the quick-start's `cluster` Environment run
by the real Argo controller (issue 14).

Its own cluster (node=True, CRDs) + node + Argo, with the runtime image built here
(devkit.node.runtime_image: Debian + Python + the pinned requirements, the first build takes a
few minutes and ~7 GB) and imported into containerd under the names the `cluster` Environment
renders (a later start finds it in containerd's kept store and does not import it again). Needs
root; never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, dynamic

from devkit.cluster import Cluster
from devkit.node import Node, argo, runtime_image
from tests.polling import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart"


def _wait(what: str, fn: Callable[[], Any], timeout: float = 120.0, every: float = 1.0) -> Any:
    return wait_until(fn, timeout, what, interval=every)


class _Stack:
    def __init__(self, cluster: Cluster, node: Node, ctl: argo.ArgoController, archive: Path, refs: list[str],
                 build: dict[str, Any]) -> None:
        self.cluster, self.node, self.ctl, self.archive, self.refs, self.build = cluster, node, ctl, archive, refs, build


@pytest.fixture(scope="module")
def stack(pytestconfig: pytest.Config) -> Iterator[_Stack]:
    if os.geteuid() != 0:
        pytest.fail("the node needs root (containerd, runc, iptables, cgroups); this test does not skip")
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled():
        executor = argo.executor_image()
        archive, refs, build = runtime_image.build()
    cluster = Cluster.start(tempfile.mkdtemp(prefix="forge-rt-test-cluster-"), node=True, die_with_parent=True,
                            log=lambda m: None)
    node = None
    try:
        with capman.global_and_fixture_disabled():
            node = Node.start(cluster, tempfile.mkdtemp(prefix="forge-rt-test-node-"), die_with_parent=True,
                              extra_images=[executor] + [(str(archive), r) for r in refs], wait_for_other=900)
        ctl = argo.start(cluster, node, ["default"], die_with_parent=True, log=lambda m: None)
        yield _Stack(cluster, node, ctl, archive, refs, build)
    finally:
        if node is not None:
            node.stop(quiet=True)
        cluster.stop(quiet=True)


@pytest.fixture(scope="module")
def core(stack: _Stack) -> Iterator[client.CoreV1Api]:
    api = stack.node.api()
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()


def _rendered(env: str = "cluster") -> list[dict[str, Any]]:
    from reconciler.environments import load_environment
    from renderers import RenderContext, render

    result, environment = load_environment([str(QUICKSTART)], None, env)
    return render(result.specs, RenderContext(environment)).manifests


def test_runtime_images_are_in_containerd_under_the_rendered_names(stack: _Stack) -> None:
    wf = next(m for m in _rendered() if m["kind"] == "Workflow")
    rendered = {t["container"]["image"] for t in wf["spec"]["templates"] if "container" in t}
    assert rendered and rendered <= set(stack.refs), (rendered, stack.refs)
    listed = {ln.split()[0]: ln.split()[2] for ln in stack.node.ctr("images", "ls").stdout.splitlines()[1:]}
    for ref, digest in runtime_image.archive_refs(stack.archive).items():
        assert listed.get(ref) == digest, (ref, listed.get(ref), digest)
    # the archive is keyed and cached; building again finds it
    again, refs, info = runtime_image.build()
    assert again == stack.archive and refs == stack.refs and "pack_s" not in info


def test_a_runtime_pod_runs_the_pinned_stack(stack: _Stack, core: client.CoreV1Api) -> None:
    train = next(r for r in stack.refs if "/forge-train:" in r)
    script = ("import torch, sklearn, onnxruntime, runtimes, specs, os; "
              "print('versions', torch.__version__, sklearn.__version__, onnxruntime.__version__, os.getuid())")
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="runtime-probe"),
        spec=client.V1PodSpec(restart_policy="Never", containers=[client.V1Container(
            name="main", image=train, command=["sh", "-c", f'python -c "{script}" && torchrun --help >/dev/null '
                                                           '&& echo torchrun-ok'])]))
    core.create_namespaced_pod("default", pod)
    try:
        phase = _wait("the runtime pod to finish",
                      lambda: (p := core.read_namespaced_pod("runtime-probe", "default").status.phase)
                      in ("Succeeded", "Failed") and p, timeout=300)
        log = core.read_namespaced_pod_log("runtime-probe", "default")
        assert phase == "Succeeded", log
        pins = dict(ln.split("==") for ln in (REPO / "runtimes" / "requirements.txt").read_text().splitlines()
                    if "==" in ln and not ln.startswith("#"))
        assert f"versions {pins['torch']}" in log and pins["scikit-learn"] in log and log.split()[4] == "1000", log
        assert "torchrun-ok" in log
    finally:
        core.delete_namespaced_pod("runtime-probe", "default", grace_period_seconds=0)


def test_quickstart_apply_runs_the_workflow_as_pods(stack: _Stack, core: client.CoreV1Api,
                                                         tmp_path: Path) -> None:
    """`forgectl apply --env cluster` of the quick-start, unchanged; the real Argo controller runs
    its Workflow (prepare → train → evaluate → compress → export → benchmark → register, and the
    exit handler) as pods of the runtime image on the node's workspace volume, to Succeeded."""
    work = tmp_path / "quickstart"
    shutil.copytree(QUICKSTART, work)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", "quick-start"]):
        subprocess.run(git + cmd, cwd=work, check=True)
    env = dict(os.environ, KUBECONFIG=stack.node.kubeconfig)
    # the namespace's executor Role for Argo is Forge's own (rendered forge-workflow RBAC)
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "forgectl"), "apply", "--env", "cluster", "--auto-approve"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    ns = next(m for m in _rendered() if m["kind"] == "Namespace")["metadata"]["name"]
    wfs = dynamic.DynamicClient(core.api_client).resources.get(api_version="argoproj.io/v1alpha1", kind="Workflow")

    def finished() -> dict[str, Any] | None:
        items = wfs.get(namespace=ns).to_dict()["items"]
        assert len(items) == 1, [i["metadata"]["name"] for i in items]
        status = items[0].get("status") or {}
        return status if status.get("phase") in ("Succeeded", "Failed", "Error") else None

    status = _wait("the quick-start's Workflow to finish", finished, timeout=900, every=3)
    # each step: its Retry node (the step) and the attempts under it
    nodes = status["nodes"].values()
    steps = {n["displayName"]: n["phase"] for n in nodes if n["type"] in ("Retry", "Pod") and "(" not in n["displayName"]}
    attempts = {n["displayName"]: (n["phase"], n.get("message", "")) for n in nodes if n["type"] == "Pod"}
    print(json.dumps({"phase": status["phase"], "steps": steps, "attempts": attempts,
                      "started": status.get("startedAt"), "finished": status.get("finishedAt")}, indent=2))
    assert status["phase"] == "Succeeded", (status.get("message"), attempts)
    wf = next(m for m in _rendered() if m["kind"] == "Workflow")
    wanted = {task["name"] for t in wf["spec"]["templates"] if "dag" in t for task in t["dag"]["tasks"]}
    assert {"prepare-data", "train", "evaluate", "register"} <= wanted
    assert {k: v for k, v in steps.items() if k in wanted} == dict.fromkeys(wanted, "Succeeded"), steps
