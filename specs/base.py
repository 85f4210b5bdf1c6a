"""Shared building blocks of every Forge kind: the base model, metadata and small value types.

Every spec model is strict about shape: unknown fields are errors (``extra="forbid"``), YAML
keys are camelCase (``learningRate``), and every field carries a description, which becomes the
hover help of editors through the generated JSON Schema in ``schema/``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

API_VERSION = "forge.dev/v1alpha1"

#: DNS-1123 label: what Kubernetes accepts as a name of most objects (and what Forge requires of
#: every spec, so that a spec name can become an object name unchanged).
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_RE = re.compile(DNS1123_LABEL)

_DURATION_RE = re.compile(r"^(?P<value>\d{1,9}(?:\.\d{1,6})?)(?P<unit>ms|s|m|h)$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

#: Limits on what a spec may ask for, so that `validate` and `plan` stay fast on any input (see
#: docs/security.md for the whole table). Each is checked where the field is declared.
MAX_DURATION_SECONDS = 30 * 86_400
MAX_LABELS = 64
MAX_ANNOTATIONS_BYTES = 64 * 1024
MAX_SEED = 2**32 - 1
#: Label/annotation keys and key prefixes (each with its subdomains: `*.kubernetes.io/`) that belong
#: to a controller of something Forge renders, with who reads them. User labels and annotations are
#: copied onto every object rendered from a spec (a Model's onto its Workflow, an Endpoint's onto its
#: SeldonDeployment, …), so a key such as `workflows.argoproj.io/controller-instanceid` would hand
#: the Workflow to another Argo controller, or to none: a user's metadata may not set them. Forge's
#: own are read back as rollout state and trusted by pruning.
RESERVED_KEYS = {"app.kubernetes.io/managed-by": "Forge (ownership: pruning trusts it)"}
RESERVED_PREFIXES = {
    "forge.dev": "Forge (rollout state, ownership, pruning)",
    "argoproj.io": "Argo Workflows (workflows.argoproj.io/…: e.g. the controller instance id)",
    "seldon.io": "Seldon Core",
    "x-k8s.io": "Kueue and the other Kubernetes SIG controllers (kueue.x-k8s.io/…: e.g. the queue name)",
    "kubeflow.org": "the Kubeflow Training Operator (PyTorchJobs)",
    "prometheus.io": "Prometheus and the Prometheus Operator",
    "kubernetes.io": "Kubernetes itself",
    "k8s.io": "Kubernetes itself",
}
#: Under a reserved prefix, what stays the user's: Kubernetes' recommended application labels
#: (`app.kubernetes.io/name`, `…/instance`, `…/version`, `…/component`, `…/part-of`) are meant to be
#: set by whoever deploys the application (`…/managed-by` is Forge's, above).
USER_PREFIXES = ("app.kubernetes.io",)

Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=63, pattern=DNS1123_LABEL),
    Field(
        description="A DNS-1123 label: lower-case letters, digits and '-', starting and ending "
        "with a letter or digit, at most 63 characters.",
        examples=["digits-mlp"],
    ),
]


def _bounded_duration(value: str) -> str:
    if duration_seconds(value) > MAX_DURATION_SECONDS:
        raise ValueError(f"duration {value!r} is longer than the limit of {MAX_DURATION_SECONDS // 86_400} days")
    return value


Duration = Annotated[
    str,
    StringConstraints(pattern=_DURATION_RE.pattern),
    AfterValidator(_bounded_duration),
    Field(
        description="A duration such as `500ms`, `30s`, `5m` or `1h` (at most 30 days).",
        examples=["30s", "5m"],
    ),
]

Quantity = Annotated[
    str,
    StringConstraints(max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"),
    Field(description="A Kubernetes resource quantity such as `500m`, `2`, `512Mi` or `4Gi`."),
]

ImportRef = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"),
    Field(description="A Python callable as `package.module:function`.", examples=["mypkg.nets:build"]),
]

Digest = Annotated[
    str,
    StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$"),
    Field(description="A content digest: `sha256:` followed by 64 lower-case hex digits."),
]


_QUANTITY_SUFFIX = {"": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
                    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}
_QUANTITY_RE = re.compile(r"^(?P<number>[0-9]+(\.[0-9]+)?)(?P<suffix>m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def quantity_value(value: str) -> float:
    """A :data:`Quantity` (``"512Mi"``, ``"500m"``) as a plain number (bytes, cores)."""
    match = _QUANTITY_RE.match(value)
    if match is None:
        raise ValueError(f"not a quantity: {value!r} (expected e.g. 500m, 2, 512Mi, 4Gi)")
    return float(match["number"]) * _QUANTITY_SUFFIX[match["suffix"] or ""]


def duration_seconds(value: str) -> float:
    """Return a :data:`Duration` string (``"30s"``, ``"5m"``) as seconds."""
    match = _DURATION_RE.match(value)
    if match is None:
        raise ValueError(f"not a duration: {value!r} (expected e.g. 30s, 5m, 500ms)")
    return float(match["value"]) * _DURATION_UNITS[match["unit"]]


class SpecModel(BaseModel):
    """Base of every spec model: camelCase keys, unknown fields rejected, values validated on
    assignment too, and no coercion of strings into numbers or booleans (``"yes"`` is not true,
    ``"30"`` is not an integer, as Kubernetes would refuse both), and no NaN or infinity where a
    number is expected (a NaN threshold would let every value pass).
    """

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        # Python code may construct models by field name; YAML is validated with
        # `by_name=False` (see the loader), so a spec must use the camelCase keys.
        validate_by_name=True,
        validate_by_alias=True,
        strict=True,
        allow_inf_nan=False,
        validate_default=True,
        frozen=True,
        use_attribute_docstrings=False,
        # each model's validator is built when first used, not at import: a command that loads a
        # few kinds (or none: `--help`, `status`) does not pay for all of them (0.2 s a run)
        defer_build=True,
    )

    def to_yaml_dict(self) -> dict[str, Any]:
        """The model as the plain data a user would write (camelCase, defaults left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class LaterFieldsModel(SpecModel):
    """A spec model with fields added after v1alpha1 shipped. Each field named in `added_later`
    stays out of a dump (by its name and by its camelCase key) while it holds the value given
    there, so specs that do not use it keep their rendered objects, step keys, digests and model
    versions."""

    #: field name → the value at which it is left out of a dump (usually its default)
    added_later: ClassVar[Mapping[str, Any]] = {}
    _dump_omits: ClassVar[tuple[tuple[str, Any], ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        unknown = sorted(set(cls.added_later) - set(cls.model_fields))
        if unknown:
            raise TypeError(f"{cls.__name__}.added_later names no field: {', '.join(unknown)}")
        # both keys: a dump is by alias (specs, digests) or by name (step configs in Python)
        cls._dump_omits = tuple((key, unset) for name, unset in cls.added_later.items()
                                for key in dict.fromkeys((name, to_camel(name))))

    @model_serializer(mode="wrap")
    def _omit_added_later(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if isinstance(data, dict):
            for key, unset in self._dump_omits:
                if key in data and data[key] == unset:
                    del data[key]
        return data


class Metadata(SpecModel):
    """Kubernetes-style metadata of a spec."""

    name: Name = Field(description="Name of the spec, unique per kind in a repository.")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description=f"Labels copied onto every object rendered from this spec (at most {MAX_LABELS}). Keys under "
        "the prefixes of the controllers that read them are reserved: `forge.dev/`, `argoproj.io/`, `seldon.io/`, "
        "`x-k8s.io/`, `kubeflow.org/`, `prometheus.io/`, `kubernetes.io/`, `k8s.io/` and their subdomains (but "
        "`app.kubernetes.io/` is yours, except `app.kubernetes.io/managed-by`).",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Free-form annotations copied onto every object rendered from this spec (at most "
        f"{MAX_ANNOTATIONS_BYTES // 1024} KiB in all; the same keys as for labels are reserved).",
    )

    @field_validator("labels")
    @classmethod
    def _label_values(cls, labels: dict[str, str]) -> dict[str, str]:
        if len(labels) > MAX_LABELS:
            raise ValueError(f"{len(labels)} labels; at most {MAX_LABELS} are allowed")
        for key, value in labels.items():
            check_qualified_name(key, "label key")
            check_label_value(value, f"label value of {key!r}")
        return labels

    @field_validator("annotations")
    @classmethod
    def _annotation_keys(cls, annotations: dict[str, str]) -> dict[str, str]:
        for key in annotations:
            check_qualified_name(key, "annotation key")
        size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
        if size > MAX_ANNOTATIONS_BYTES:
            raise ValueError(f"annotations take {size:,} bytes; at most {MAX_ANNOTATIONS_BYTES:,} are allowed")
        return annotations


_LABEL_VALUE_RE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_NAME_PART_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_label_value(value: str, what: str = "label value") -> str:
    """Raise ValueError unless ``value`` is a valid Kubernetes label value."""
    if len(value) > 63 or not _LABEL_VALUE_RE.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} must be at most 63 characters of "
            "letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    return value


def check_qualified_name(key: str, what: str, *, reserved: bool = True) -> str:
    """Raise ValueError unless ``key`` is a Kubernetes qualified name (`prefix/name`), and, with
    ``reserved``, not one of Forge's own keys."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(prefix)):
        raise ValueError(f"{what} {key!r} has an invalid prefix (expected a DNS subdomain)")
    if not name or len(name) > 63 or not _NAME_PART_RE.fullmatch(name):
        raise ValueError(
            f"{what} {key!r} must be at most 63 characters of letters, digits, '-', '_' or '.'"
        )
    owner = reserved_by(key) if reserved else None
    if owner is not None:
        raise ValueError(f"{what} {key!r} is reserved: it belongs to {owner}, which reads it from the objects Forge renders")
    return key


def reserved_by(key: str) -> str | None:
    """Who owns the label or annotation key ``key`` (:data:`RESERVED_KEYS`,
    :data:`RESERVED_PREFIXES` and their subdomains), or None when it is free for users."""
    if key in RESERVED_KEYS:
        return RESERVED_KEYS[key]
    prefix, slash, _ = key.rpartition("/")
    if not slash or prefix in USER_PREFIXES:
        return None
    for reserved, owner in RESERVED_PREFIXES.items():
        if prefix == reserved or prefix.endswith("." + reserved):
            return owner
    return None


MAX_PATH_LENGTH = 1024


def check_relative_path(value: str, what: str) -> str:
    """Raise ValueError unless ``value`` is a relative path that cannot leave the folder it is
    relative to: no absolute path, no `~`, no `..` part, no backslash, no control character.
    (Symlinks are the business of whoever opens the path: see `reconciler.containment`.)"""
    if not value or len(value) > MAX_PATH_LENGTH:
        raise ValueError(f"{what} must be 1 to {MAX_PATH_LENGTH} characters long")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError(f"{what} {value!r} holds a control character")
    if "\\" in value:
        raise ValueError(f"{what} {value!r} holds a backslash; use `/`")
    if value.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", value):
        raise ValueError(f"{what} {value!r} must be relative to the Environment's `root` (no absolute path, no `~`)")
    if ".." in value.split("/"):
        raise ValueError(f"{what} {value!r} must stay inside the Environment's `root` (no `..`)")
    return value


def check_selector(selector: dict[str, str], what: str) -> dict[str, str]:
    """Raise ValueError unless every key of ``selector`` is a qualified name and every value a
    label value (what a Kubernetes node selector or label selector accepts)."""
    if len(selector) > MAX_LABELS:
        raise ValueError(f"{what}: {len(selector)} entries; at most {MAX_LABELS} are allowed")
    for key, value in selector.items():
        check_qualified_name(key, f"{what} key", reserved=False)
        check_label_value(value, f"{what} value of {key!r}")
    return selector


class Threshold(SpecModel):
    """A bound on one metric: at least ``min``, at most ``max``, or both."""

    metric: str = Field(description="Name of the metric the bound applies to, e.g. `accuracy`.")
    min: float | None = Field(default=None, description="The metric must be at least this.")
    max: float | None = Field(default=None, description="The metric must be at most this.")

    @model_validator(mode="after")
    def _bounds(self) -> Threshold:
        if self.min is None and self.max is None:
            raise ValueError("a threshold needs `min`, `max` or both")
        if self.min is not None and self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max:g}) is below min ({self.min:g})")
        return self

    def check(self, value: float) -> bool:
        """True when ``value`` lies within the bound (NaN never does)."""
        if value != value:  # NaN
            return False
        if self.min is not None and value < self.min:
            return False
        if self.max is not None and value > self.max:
            return False
        return True

    def describe(self) -> str:
        """``accuracy ≥ 0.95`` style text for plans and reports."""
        parts = []
        if self.min is not None:
            parts.append(f"≥ {self.min:g}")
        if self.max is not None:
            parts.append(f"≤ {self.max:g}")
        return f"{self.metric} " + " and ".join(parts)


Precision = Literal["fp32", "fp16", "bf16"]
#: A pool's (or a Model's training's) priority: the PriorityClass and Kueue priority it runs at.
Priority = Literal["high", "medium", "low"]


