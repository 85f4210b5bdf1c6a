"""`Environment`: where specs become live — the embedded `local` target or a Kubernetes cluster."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from specs.base import LaterFieldsModel, Name, Quantity, SpecModel, check_relative_path
from specs.traffic import TrafficRouting

TargetType = Literal["local", "kubernetes"]
#: The Pod Security Standards' levels, most restrictive first.
PodSecurityLevel = Literal["restricted", "baseline", "privileged"]


class LocalSettings(SpecModel):
    """Settings of the embedded `local` target (one machine, no cluster)."""

    state_dir: str = Field(
        default=".forge",
        description="Folder, relative to the Environment's `root` and inside it, holding the SQLite state, "
        "artifacts, model registry and logs.",
    )
    max_parallel_steps: int = Field(
        default=1, ge=1, le=64, description="Workflow steps run at the same time on this machine."
    )
    gpus: int = Field(
        default=0, ge=0, le=64,
        description="Accelerators this machine offers to workflow steps and model servers (0: none). Declared, "
        "never probed: `forgectl plan` says a Model or Endpoint needs more than this before anything runs, and "
        "`apply` refuses it.",
    )
    scrape_interval: str = Field(
        default="1s",
        pattern=r"^\d{1,6}(ms|s|m)$",
        description="How often the local Prometheus scrapes the model servers and the router.",
    )

    @field_validator("state_dir")
    @classmethod
    def _contained(cls, value: str) -> str:
        return check_relative_path(value, "stateDir")


class WorkspaceSettings(SpecModel):
    """The PersistentVolumeClaim every workflow step and model server mounts at `/forge/workspace`
    (data, checkpoints, the model registry)."""

    storage_class_name: Name | None = Field(
        default=None, description="StorageClass of the claim; default the cluster's default class. It must "
        "support the access mode (RWX: NFS, CephFS, EFS, Filestore…).",
    )
    size: Quantity | None = Field(
        default=None, description="Requested size, e.g. `500Gi`; default 1.5 × the largest training checkpoint "
        "(16 bytes per parameter) and at least 20Gi. A size below one checkpoint is refused.",
    )
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] = Field(
        default="ReadWriteMany", description="`ReadWriteMany` when steps and servers may run on several nodes; "
        "`ReadWriteOnce` only for a one-node cluster.",
    )


class StudyDatabase(SpecModel):
    """A PostgreSQL database that keeps a cluster's hyperparameter-search studies, reached by every
    trial pod wherever it runs. Its SQLAlchemy URL (``postgresql+psycopg2://user:password@host/db``)
    is one key of a Secret in the Environment's namespace: no address or password is in a spec."""

    secret: Name = Field(description="The Secret that holds the database's URL.")
    key: str = Field(default="url", pattern=r"^[-._a-zA-Z0-9]{1,253}$", description="The Secret's key holding the URL.")


class KubernetesSettings(SpecModel):
    """Settings of the `kubernetes` target; unset values behave as `kubectl` does."""

    kubeconfig: str | None = Field(
        default=None,
        max_length=4096,
        description="Path of the kubeconfig; default `$KUBECONFIG` or `~/.kube/config`. Never read in "
        "pull-request mode (`plan --base`): there, credentials come from the runner only.",
    )
    context: str | None = Field(
        default=None, max_length=253, pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Kubeconfig context; default the current one.",
    )
    namespace: Name = Field(description="Namespace that holds every object rendered for this environment.")
    service_account: Name | None = Field(
        default=None, description="ServiceAccount the workflow pods run as; default `forge-workflow`, which "
        "Forge renders with the Role its steps need.",
    )
    workspace: WorkspaceSettings = Field(
        default_factory=WorkspaceSettings, description="The shared workspace volume."
    )
    study_database: StudyDatabase | None = Field(
        default=None,
        description="Where hyperparameter searches keep their Optuna studies on this cluster: a PostgreSQL "
        "database named by a Secret. Unset, a study is a SQLite file on the workspace volume, which serves trials "
        "on one node (SQLite's file locks do not hold across the nodes of a network file system).",
    )
    pod_security: PodSecurityLevel = Field(
        default="restricted",
        description="The Pod Security Standards level the namespace enforces (its "
        "`pod-security.kubernetes.io/enforce` label, which the cluster admin sets). Every pod Forge renders meets "
        "`restricted`, and no spec can ask for more; at `restricted` the containers the controllers add (Argo's "
        "executor, the Training Operator's init container) must be configured to meet it too "
        "(docs/cluster-prerequisites.md). The plan names it; `forgectl doctor` lists what it needs.",
    )


class PrometheusSettings(SpecModel):
    """How the rollout gates reach Prometheus."""

    url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="Base URL of the Prometheus HTTP API. The `local` target starts its own and "
        "leaves this unset.",
    )
    timeout: str = Field(default="5s", pattern=r"^\d{1,6}(ms|s|m)$", description="Timeout of one query.")


class EnvironmentDefaults(SpecModel):
    """References used by specs that leave them out."""

    compute_ref: Name | None = Field(default=None, description="Compute pool for Models without `computeRef`.")
    rollout_policy_ref: Name | None = Field(
        default=None, description="RolloutPolicy for Endpoints without `rolloutPolicyRef`."
    )


class EnvironmentSpec(LaterFieldsModel):
    """Where the specs are made live, and the settings that go with it."""

    target: TargetType = Field(
        default="local",
        description="`local` runs everything on this machine; `kubernetes` applies to a cluster.",
    )
    root: str = Field(
        default=".",
        description="The project root, relative to the folder forgectl runs in (the repository root): every "
        "path a spec names — dataset `file://` and `text://` sources, `local.stateDir` — is relative to it and "
        "must stay inside it (no `..`, no absolute path, no symlink leading out). The local target runs its "
        "steps with it as their source root; in a cluster the runtime images resolve sources against their "
        "own `FORGE_SOURCE_ROOT`, where the data is mounted.",
    )
    default: bool = Field(
        default=False, description="Chosen when `--env` is not given (at most one per repository)."
    )
    local: LocalSettings = Field(default_factory=LocalSettings, description="Settings of the `local` target.")
    kubernetes: KubernetesSettings | None = Field(
        default=None, description="Settings of the `kubernetes` target (required when `target: kubernetes`)."
    )
    prometheus: PrometheusSettings = Field(
        default_factory=PrometheusSettings, description="Prometheus that the rollout gates query."
    )
    image_registry: str = Field(
        default="ghcr.io/forge-dev",
        pattern=r"^[a-z0-9.\-:/_]+$",
        description="Registry and path prefix of the runtime images (`<registry>/forge-train:<tag>`).",
    )
    image_tag: str = Field(
        default="0.1.0", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$", description="Tag of the runtime images."
    )
    defaults: EnvironmentDefaults = Field(
        default_factory=EnvironmentDefaults, description="References used where a spec leaves them out."
    )
    traffic: TrafficRouting | None = Field(
        default=None, description="What splits traffic between an Endpoint's predictors (an Endpoint's own `traffic` "
        "replaces it); default `router: seldon`. `router: gatewayAPI` needs `target: kubernetes`.",
    )

    @field_validator("root")
    @classmethod
    def _relative_root(cls, value: str) -> str:
        return check_relative_path(value, "root")

    @model_validator(mode="after")
    def _target_settings(self) -> EnvironmentSpec:
        if self.target == "kubernetes" and self.kubernetes is None:
            raise ValueError("`target: kubernetes` needs a `kubernetes:` section with at least `namespace`")
        if self.target == "local" and self.traffic is not None and self.traffic.router == "gatewayAPI":
            raise ValueError("`traffic.router: gatewayAPI` needs `target: kubernetes`; the local target routes "
                             "requests itself")
        return self

    added_later = {"traffic": None}
