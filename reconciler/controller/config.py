"""The in-cluster controller's configuration (`forgectl controller run --config FILE`): which git
sources it pulls, into which environment each is applied, and how it serves its probes, metrics and
push webhook. Read once at start; a bad file is one :class:`~reconciler.diagnostics.SpecError` with
file:line per problem, and the controller does not start.

Credentials never come from here nor from a spec: the webhook's secret is read from a Kubernetes
Secret in the controller's namespace (``webhook.secretRef``, key ``secret``) or from a file
(``webhook.secretFile``, a controller run on a host), the git credentials from the Secrets the
sources name, and the API server's from the kubeconfig or, in a pod, the ServiceAccount.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from reconciler.diagnostics import Diagnostic, ForgeError, SpecError
from reconciler.load.gitrepo import ref_name_problem
from reconciler.load.semverrange import SemverError, SemverRange
from reconciler.load.yamlsource import parse_documents
from specs import duration_seconds

#: Largest configuration file read.
MAX_CONFIG_BYTES = 1024 * 1024
_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_DURATION = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h)$"


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True)


class Source(_Model):
    """One git source: a branch of a repository, the folder of specs in it, and the environment its
    specs are applied to."""

    name: str = Field(pattern=_NAME, description="The Sync object's name (`kubectl wait sync/NAME`).")
    url: str = Field(min_length=1, max_length=4096, description="https://, http://, ssh://, git:// or file:// URL.")
    branch: str = Field(default="main", min_length=1, max_length=255)
    tag: str | None = Field(default=None, min_length=1, max_length=255, description="A tag to apply instead of the branch.")
    semver: str | None = Field(default=None, min_length=1, max_length=255, description=(
        "A version range over the repository's tags (semantic versions, `vX.Y.Z` or `X.Y.Z`), read as Flux reads a "
        "GitRepository's `ref.semver` (Masterminds/semver: `^1.2`, `~1.2.3`, `1.x`, `>=1.2.0 <2.0.0`, `1.2 - 1.4.5`, "
        "`||`): the highest tag in it is applied, instead of the branch."))
    path: str = Field(default=".", min_length=1, max_length=4096, description="Folder of the specs in the repository.")
    environment: str = Field(pattern=_NAME, description="The Environment (of the specs) applied to.")
    namespace: str = Field(pattern=_NAME, description="Where the environment's objects and its Lease live.")
    interval: str = Field(default="60s", pattern=_DURATION, description="How often git is polled (with up to 10 % jitter).")
    timeout: str = Field(default="60s", pattern=_DURATION, description="Bound of one fetch.")
    self_heal: bool = Field(default=False, description="Re-apply the applied revision every interval (drift is taken back).")
    rollout_interval: str = Field(default="2s", pattern=_DURATION, description="How often the rollouts are walked.")
    secret_ref: str | None = Field(default=None, pattern=_NAME, description=(
        "A Secret in the controller's namespace holding the fetch's credentials: `username` and `password`, or "
        "`bearerToken` (http/https); `identity` and `known_hosts` (ssh); `ca.crt`, and `tls.crt` with `tls.key` "
        "(https)."))
    push_writebacks: bool = Field(default=False, description=(
        "Push the branches of write-backs (a RolloutPolicy's or an experiment's `gitWriteback`) to the source's URL "
        "with the same credentials: made there or moved forward, never forced. Off, a write-back is skipped and "
        "said so (the rollout's state, `rollout status`)."))

    @model_validator(mode="after")
    def _one_ref(self) -> Source:
        if self.tag is not None and self.semver is not None:
            raise ValueError("a source follows one of branch, tag or semver: tag and semver are both set")
        for kind, name in (("branch", self.branch), ("tag", self.tag)):
            problem = ref_name_problem(name) if name is not None else None
            if problem is not None:
                raise ValueError(f"{kind} {name!r} is not a git ref name: {problem}")
        if self.semver is not None:
            try:
                SemverRange.parse(self.semver)
            except SemverError as e:
                raise ValueError(f"semver {self.semver!r} is not a version range as Flux reads one ({e}); expected e.g. "
                                 "`^1.2`, `~1.2.3`, `1.x` or `>=1.2.0 <2.0.0`") from None
        return self

    @property
    def ref(self) -> str:
        """What the source follows, as said in messages: `branch main`, `tag v1.2.0`, `semver >=1,<2`."""
        if self.semver is not None:
            return f"semver {self.semver}"
        return f"tag {self.tag}" if self.tag is not None else f"branch {self.branch}"

    @property
    def interval_seconds(self) -> float:
        return duration_seconds(self.interval)

    @property
    def timeout_seconds(self) -> float:
        return duration_seconds(self.timeout)

    @property
    def rollout_seconds(self) -> float:
        return duration_seconds(self.rollout_interval)


class Http(_Model):
    """Where /healthz, /readyz, /metrics and POST /hooks/git are served."""

    address: str = Field(default="127.0.0.1", max_length=255)
    port: int = Field(default=8080, ge=0, le=65535, description="0: any free port (written to the log).")


class Webhook(_Model):
    """The push webhook: a body signed with HMAC-SHA256 of this secret (GitHub's X-Hub-Signature-256).
    The secret is in a Secret of the controller's namespace (``secretRef``, its key ``secret``: what
    `forgectl install` grants the controller to read) or in a file (``secretFile``): one of the two."""

    secret_ref: str | None = Field(default=None, pattern=_NAME, description=(
        "A Secret in the controller's namespace whose key `secret` is the webhook's secret."))
    secret_file: str | None = Field(default=None, max_length=4096, description="File holding the secret.")

    @model_validator(mode="after")
    def _one_secret(self) -> Webhook:
        if (self.secret_ref is None) == (self.secret_file is None):
            raise ValueError("a webhook takes its secret from one of secretRef (a Secret in the controller's "
                             "namespace, key `secret`) or secretFile")
        return self


class Election(_Model):
    """How the environment's Lease is held (client-go's leader election: 15 s / 10 s / 2 s)."""

    lease_duration: str = Field(default="15s", pattern=_DURATION)
    renew_deadline: str = Field(default="10s", pattern=_DURATION)
    retry_period: str = Field(default="2s", pattern=_DURATION)

    @model_validator(mode="after")
    def _ordered(self) -> Election:
        if not duration_seconds(self.retry_period) < duration_seconds(self.renew_deadline) < duration_seconds(self.lease_duration):
            raise ValueError("retryPeriod < renewDeadline < leaseDuration is required (as client-go's leader election)")
        return self


class ControllerConfig(_Model):
    """The whole file."""

    api_version: Literal["forge.dev/v1alpha1"] = "forge.dev/v1alpha1"
    kind: Literal["ControllerConfig"] = "ControllerConfig"
    namespace: str = Field(default="forge-system", pattern=_NAME, description="Where the Sync objects live.")
    identity: str | None = Field(default=None, max_length=128, pattern=r"^[A-Za-z0-9._:@/-]+$",
                                 description="This replica's name in the Leases; default the pod's (host) name and pid.")
    kubeconfig: str | None = Field(default=None, max_length=4096, description="Default: $KUBECONFIG, ~/.kube/config.")
    cache_dir: str = Field(default=".forge/controller", max_length=4096, description="Where each source is fetched.")
    http: Http = Http()
    webhook: Webhook | None = None
    election: Election = Election()
    sources: list[Source] = Field(min_length=1, max_length=100)

    @model_validator(mode="after")
    def _unique(self) -> ControllerConfig:
        keys: tuple[tuple[str, list[str]], ...] = (
            ("name", [s.name for s in self.sources]),
            ("environment and namespace", [f"{s.environment} in {s.namespace}" for s in self.sources]))
        for what, values in keys:
            seen = {v for v in values if values.count(v) > 1}
            if seen:
                raise ValueError(f"two sources with the same {what} ({', '.join(map(str, sorted(seen)))}): each "
                                 "environment is one Lease, held by one source")
        return self

    def secret_refs(self) -> tuple[str, ...]:
        """The Secrets the sources' and the webhook's ``secretRef``s name (in the controller's
        namespace): the only ones its Role may read."""
        names = {s.secret_ref for s in self.sources if s.secret_ref}
        if self.webhook is not None and self.webhook.secret_ref:
            names.add(self.webhook.secret_ref)
        return tuple(sorted(names))


def load_config(path: str | Path) -> ControllerConfig:
    """The configuration in ``path``; :class:`SpecError` (file:line per problem) or
    :class:`ForgeError` when it cannot be read."""
    file = str(path)
    try:
        data = Path(path).read_bytes()[:MAX_CONFIG_BYTES + 1]
    except OSError as exc:
        raise ForgeError(f"{file}: cannot read the controller configuration ({exc.strerror})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ForgeError(f"{file}: larger than {MAX_CONFIG_BYTES:,} bytes")
    docs, problems = parse_documents(data.decode(errors="replace"), file)
    if problems:
        raise SpecError(problems)
    if len(docs) != 1 or not isinstance(docs[0].data, dict):
        raise SpecError([Diagnostic(file, 1, 1, "expected one YAML mapping (a ControllerConfig)")])
    doc = docs[0]
    try:
        return ControllerConfig.model_validate(doc.data)
    except ValidationError as exc:
        found = []
        for error in exc.errors():
            where = tuple(error["loc"])
            line, column = doc.position(where)
            found.append(Diagnostic(file, line, column, re.sub(r"\s+", " ", error["msg"]),
                                    ".".join(str(p) for p in where)))
        raise SpecError(found) from None
