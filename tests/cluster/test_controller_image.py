"""The controller image's recipe (devkit.node.controller_image) against what runs it: the
Deployment `forgectl install` renders, and Forge's own dependencies. The image itself is built and
run on the node by tests/cluster/test_controller_node.py."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devkit.node import controller_image
from reconciler.controller.install import CACHE_PATH, InstallOptions, deployment

REPO = Path(__file__).resolve().parents[2]


def test_the_image_name_is_what_the_kubelet_asks_for_when_the_deployment_names_the_short_one() -> None:
    assert controller_image.normalized_ref(InstallOptions().image) == "docker.io/library/forge-controller:0.1.0"
    assert controller_image.normalized_ref("me/forge-controller:1") == "docker.io/me/forge-controller:1"
    assert controller_image.normalized_ref("registry.example:5000/forge-controller:1") == "registry.example:5000/forge-controller:1"
    assert controller_image.normalized_ref("localhost/forge-controller:1") == "localhost/forge-controller:1"


def test_the_image_runs_as_the_deployment_says_with_its_state_on_the_writable_volume() -> None:
    pod = deployment(InstallOptions())["spec"]["template"]["spec"]
    container = pod["containers"][0]
    config = controller_image.image_config(["sha256:" + "0" * 64])["config"]
    assert config["User"] == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # the working directory (where a relative cacheDir lands) and HOME are an emptyDir of the pod
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    env = dict(e.split("=", 1) for e in config["Env"])
    for path in (config["WorkingDir"], env["HOME"]):
        assert path == CACHE_PATH and "emptyDir" in volumes[mounts[path]], path
    assert config["Entrypoint"] == ["python3.11", "-m", "forgectl"] and config["Cmd"] == container["args"]
    assert f"{container['ports'][0]['containerPort']}/tcp" in config["ExposedPorts"]


def test_the_requirements_are_forges_own_dependencies_pinned_as_installed_here() -> None:
    pinned = dict(line.split("==") for line in controller_image.pinned_requirements())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for dep in project["dependencies"]:
        name = canonicalize_name(Requirement(dep).name)
        assert pinned[name] == metadata.version(name), name
    # transitive ones too (the API client's), never the dev or runtime extras'
    assert "urllib3" in pinned and "pydantic-core" in pinned
    extras = {canonicalize_name(Requirement(d).name) for deps in project["optional-dependencies"].values() for d in deps}
    assert not extras & set(pinned) - {"prometheus-client"}, extras & set(pinned)
    assert not {"torch", "pytest", "mypy", "ruff", "numpy"} & set(pinned)
