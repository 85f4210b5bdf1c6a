"""The real CustomResourceDefinitions of Argo Workflows, Seldon Core v1, the Prometheus Operator, the
Gateway API (standard channel), Kueue and (optionally) the Kubeflow Training Operator: fetched with ``go mod download`` (or taken from a
reference copy with the same sha256), patched as upstream's install does, converted to compact JSON
(cached by hash)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devkit.common import REPO_ROOT, ClusterError, Log, cache_dir, stderr_log, versions
from devkit.gobuild import go_mod_download


@dataclass(frozen=True)
class CrdSource:
    """One CRD file: where it comes from and what its bytes must hash to."""

    module_var: str  # key in versions.env naming the Go module
    version_var: str  # key in versions.env naming its version
    path: str  # path inside the module
    sha256: str  # of the YAML file in the pinned module version
    # the same file under FORGE_CRD_REFERENCE_DIR (see ../shared/crds/SOURCES.md), used only when
    # the proxy refuses the module and only if its sha256 is the pin: same bytes, same version
    reference: str | None = None
    optional: bool = False
    patch: str | None = None  # name of an install-time patch in CRD_PATCHES (what upstream's kustomize applies)


CRD_SOURCES: tuple[CrdSource, ...] = (
    # Argo v4.0.5: the version forge-judge's validator is built from (judges/go.mod). No reference
    # copy: ../shared/crds/argo-workflows holds v4.1.2, which the proxy does not serve.
    *(
        CrdSource("ARGO_WORKFLOWS_MODULE", "ARGO_WORKFLOWS_VERSION", f"manifests/base/crds/full/argoproj.io_{n}.yaml", h)
        for n, h in (
            ("workflows", "88e9b55114acf6c515f846554a249f24c01d9b09490c231f7fb9821a1ebf1458"),
            ("workflowtemplates", "b485418465242df241c94077d7a64698c637e713e1e6434c3798d5c4aec44f5b"),
            ("cronworkflows", "523395c632f6e1be187d1233c3b937ca9548d71981b6f7543d6023cacc49a6f5"),
            ("clusterworkflowtemplates", "d26f8fba607dd12d472703ace7cba265d47f96f8e000065a9904a3cb6613219d"),
        )
    ),
    CrdSource("SELDON_OPERATOR_MODULE", "SELDON_OPERATOR_VERSION",
              "config/crd/bases/machinelearning.seldon.io_seldondeployments.yaml",
              "0c01ccc714c6cf64a58c9060e56eca7e8d86d1a133779a9ead6182110bed25e3",
              "seldon-core-v1/machinelearning.seldon.io_seldondeployments.yaml", patch="seldon-graph-children"),
    *(
        CrdSource("PROMETHEUS_OPERATOR_MODULE", "PROMETHEUS_OPERATOR_VERSION",
                  f"example/prometheus-operator-crd/monitoring.coreos.com_{n}.yaml", h,
                  f"prometheus-operator/monitoring.coreos.com_{n}.yaml")
        for n, h in (
            ("servicemonitors", "a99047972c9dd7679ce2050b9968e8a08773492e671b3e17abd476d42aa78a32"),
            ("podmonitors", "45a93443daa687d3654f7e9631909ff7edcdf3ec09c5e60251b74aa2722aee5d"),
            ("prometheusrules", "78be98554b9c8506ab2b4f4feb91c5f3a56e536a0a510f3a8e876a459970d56d"),
        )
    ),
    # The Gateway API's standard channel (config/crd/standard/), GATEWAY_API_VERSION: the version Traefik's Kubernetes
    # Gateway provider on the node implements (scripts/cluster/versions.env), and the CEL validation Forge's
    # HTTPRoutes are judged by. No reference copy: the proxy serves the module.
    *(
        CrdSource("GATEWAY_API_MODULE", "GATEWAY_API_VERSION",
                  f"config/crd/standard/gateway.networking.k8s.io_{n}.yaml", h)
        for n, h in (
            ("gatewayclasses", "2f61e8c8c2289843a61d7b1bba31f8a5a46dbf20a1c54359209d638d3bd899c9"),
            ("gateways", "b0e29566bbe07fbe4ede55c2eff73865bd566f3063736ec9046224d7e20d6f88"),
            ("httproutes", "c2539410dec72b793ef840f484c19d13b48210074ec801b730e9fce2c5fc825c"),
            ("grpcroutes", "dc114a794b2bf2565489c3182d4b173590ea01348f986daf42c7bc0505521d26"),
            ("referencegrants", "3a59dcc699c2d01b19f13233943597f69de25420495ab3d4af7de7997bd807cc"),
            ("backendtlspolicies", "59d7cf1d99e1337e6d6a19c6306172d8f7ff2d9f920142a88ef9ba597d6d97bb"),
        )
    ),
    # Kueue v0.17.0: a Compute pool with a queue renders its ResourceFlavor, ClusterQueue, LocalQueue and
    # WorkloadPriorityClasses (renderers/queues.py), judged by these CRDs' OpenAPI schemas and CEL rules; the
    # Workload and Cohort CRDs are what its controller reads and writes. Upstream's install adds a conversion
    # webhook (v1beta1 <-> v1beta2) served by Kueue itself: left out here, where no Kueue runs, so the API
    # server serves v1beta2, the storage version Forge writes, as is. No reference copy: the proxy serves it.
    *(
        CrdSource("KUEUE_MODULE", "KUEUE_VERSION", f"config/components/crd/bases/kueue.x-k8s.io_{n}.yaml", h)
        for n, h in (
            ("resourceflavors", "19e339c47e9ca3fa2c9eeddd27715a512f765c4794ed859733408a9715720173"),
            ("clusterqueues", "666f5466bf85ace8c494a9a790ba87c4c18ddf3ab3eb9f18c878927d396869f3"),
            ("localqueues", "5c5768caeb499bb869bb8f90e4f5293170b183a4a74b618f1f182264d9ce4437"),
            ("workloadpriorityclasses", "b6c089d45938adf9afd21da05a6c613f29408989aa66afc09db189eb724db5a3"),
            ("workloads", "d4f5c22bff5074b8801412011d6d2fd68050e2868ce4dd0bba2ad523431af36d"),
            ("cohorts", "25fce81a539c3c22a031a501c3c9382f763221016f624c7e227eb47d3abb6f59"),
        )
    ),
    # v1.9.4, the version of the PyTorchJob webhook forge-judge runs (judges/go.mod).
    CrdSource("TRAINING_OPERATOR_MODULE", "TRAINING_OPERATOR_VERSION",
              "manifests/base/crds/kubeflow.org_pytorchjobs.yaml",
              "8b8a8a719cc94173169290251e817f7ac2bb425c20b6c2fa813397bcf4e932ed", None, optional=True),
)


def _seldon_graph_children(crd: dict[str, Any], levels: int = 10) -> dict[str, Any]:
    """Seldon Core v1's own install step for config/crd/bases/…seldondeployments.yaml.

    controller-gen cannot express the recursive inference graph, so the base file has
    ``graph.children.items: {}``, which the API server rejects ("must not be empty for specified
    array items").  Seldon's ``kustomize build config/crd`` applies
    ``config/crd/patches/graph_children.yaml``, made by ``hack/create_graph_openapi_schema.py``:
    the graph-node schema nested ``--levels`` (default 10) deep, the deepest without
    ``children``, in every served version.  This does the same, taking the node schema from the
    file itself.
    """
    import copy

    for version in crd["spec"]["versions"]:
        pred = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["predictors"]
        graph = pred["items"]["properties"]["graph"]
        node = copy.deepcopy(graph)
        node["properties"].pop("children", None)
        top = copy.deepcopy(node)
        cur = top
        for _ in range(levels):
            child = copy.deepcopy(node)
            cur["properties"]["children"] = {"type": "array", "items": child}
            cur = child
        pred["items"]["properties"]["graph"] = top
    return crd


CRD_PATCHES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "seldon-graph-children": _seldon_graph_children,
}


@dataclass
class FetchedCrd:
    name: str  # metadata.name of the CRD
    json_path: str  # compact JSON, cached
    origin: str  # "go mod download <module>@<version>" or "reference copy <path> (sha256 ok)"


def crd_reference_dir() -> Path:
    return Path(os.environ.get("FORGE_CRD_REFERENCE_DIR") or REPO_ROOT.parent / "shared" / "crds")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_crds(log: Log = stderr_log) -> tuple[list[FetchedCrd], list[str]]:
    """Fetch every CRD file (``go mod download``) and convert it to compact JSON (cached by hash).

    When the module proxy refuses a pinned version (this environment's proxy serves only some
    versions), the same file is taken from the reference copy in ``FORGE_CRD_REFERENCE_DIR``
    (default ``../shared/crds``) — only if its sha256 equals the pinned one.  Returns the CRDs
    and notes about what was skipped or substituted.
    """
    v = versions()
    notes: list[str] = []
    fetched: list[FetchedCrd] = []
    module_dirs: dict[tuple[str, str], Path | ClusterError] = {}
    for src in CRD_SOURCES:
        module, version = v[src.module_var], v[src.version_var]
        key = (module, version)
        if key not in module_dirs:
            try:
                module_dirs[key] = go_mod_download(module, version)
            except ClusterError as e:
                module_dirs[key] = e
        mdir = module_dirs[key]
        candidates: list[tuple[Path, str]] = []
        if isinstance(mdir, Path):
            candidates.append((mdir / src.path, f"go mod download {module}@{version}"))
        if src.reference:
            ref = crd_reference_dir() / src.reference
            candidates.append((ref, f"reference copy {ref}"))
        chosen: tuple[Path, str] | None = None
        for path, origin in candidates:
            if path.is_file():
                digest = _sha256(path)
                if digest == src.sha256:
                    chosen = (path, origin)
                    break
                notes.append(f"{path}: sha256 {digest} is not the pinned {src.sha256}; not used")
        if chosen is None:
            why = str(mdir) if isinstance(mdir, ClusterError) else f"{src.path} not in {module}@{version}"
            if src.optional:
                notes.append(f"skipped optional CRD {src.path}: {why}")
                continue
            raise ClusterError(f"cannot get CRD {src.path} from {module}@{version}: {why}; "
                               f"no checksum-matching reference copy under {crd_reference_dir()}")
        path, origin = chosen
        if not origin.startswith("go mod download"):
            notes.append(f"{module}@{version} is refused by the module proxy; "
                         f"{Path(src.path).name} taken from {origin} (sha256 matches the pin)")
        json_path = cache_dir() / "crds" / (f"{src.sha256}-{src.patch}.json" if src.patch else f"{src.sha256}.json")
        if src.patch:
            notes.append(f"{Path(src.path).name}: applied install-time patch {src.patch!r} "
                         "(upstream's own kustomize step; see devkit.crds.CRD_PATCHES)")
        if not json_path.is_file():
            import yaml  # only needed the first time

            with open(path, "rb") as f:
                loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
                doc = yaml.load(f, Loader=loader)
            if src.patch:
                doc = CRD_PATCHES[src.patch](doc)
            json_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = json_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, separators=(",", ":")))
            tmp.replace(json_path)
        name = json.loads(json_path.read_text())["metadata"]["name"]
        fetched.append(FetchedCrd(name=name, json_path=str(json_path), origin=origin))
    fetched += forge_crds()
    return fetched, notes


#: Forge's own CRDs (the in-cluster controller's Sync), committed under deploy/crds/.
FORGE_CRD_DIR = REPO_ROOT / "deploy" / "crds"


def forge_crds() -> list[FetchedCrd]:
    """Forge's own CRDs from deploy/crds/, converted to compact JSON (cached by their hash)."""
    import yaml

    found = []
    for path in sorted(FORGE_CRD_DIR.glob("*.yaml")):
        json_path = cache_dir() / "crds" / f"forge-{_sha256(path)}.json"
        if not json_path.is_file():
            json_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = json_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(yaml.safe_load(path.read_text()), separators=(",", ":")))
            tmp.replace(json_path)
        name = json.loads(json_path.read_text())["metadata"]["name"]
        found.append(FetchedCrd(name=name, json_path=str(json_path), origin=f"{path.relative_to(REPO_ROOT)} (this repository)"))
    return found
