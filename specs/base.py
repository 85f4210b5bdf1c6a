"""Shared building blocks of every Forge kind: the base model, metadata and small value types.

Every spec model is strict about shape: unknown fields are errors (``extra="forbid"``), YAML
keys are camelCase (``learningRate``), and every field carries a description, which becomes the
hover help of editors through the generated JSON Schema in ``schema/``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic.alias_generators import to_camel

API_VERSION = "forge.dev/v1alpha1"

#: DNS-1123 label: what Kubernetes accepts as a name of most objects (and what Forge requires of
#: every spec, so that a spec name can become an object name unchanged).
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_RE = re.compile(DNS1123_LABEL)

_DURATION_RE = re.compile(r"^(?P<value>\d+(?:\.\d+)?)(?P<unit>ms|s|m|h)$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=63, pattern=DNS1123_LABEL),
    Field(
        description="A DNS-1123 label: lower-case letters, digits and '-', starting and ending "
        "with a letter or digit, at most 63 characters.",
        examples=["digits-mlp"],
    ),
]

Duration = Annotated[
    str,
    StringConstraints(pattern=_DURATION_RE.pattern),
    Field(
        description="A duration such as `500ms`, `30s`, `5m` or `1h`.",
        examples=["30s", "5m"],
    ),
]

Quantity = Annotated[
    str,
    StringConstraints(pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"),
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


def duration_seconds(value: str) -> float:
    """Return a :data:`Duration` string (``"30s"``, ``"5m"``) as seconds."""
    match = _DURATION_RE.match(value)
    if match is None:
        raise ValueError(f"not a duration: {value!r} (expected e.g. 30s, 5m, 500ms)")
    return float(match["value"]) * _DURATION_UNITS[match["unit"]]


class SpecModel(BaseModel):
    """Base of every spec model: camelCase keys, unknown fields rejected, values validated on
    assignment too, and no coercion of strings into numbers or booleans (``"yes"`` is not true).
    """

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        # Python code may construct models by field name; YAML is validated with
        # `by_name=False` (see the loader), so a spec must use the camelCase keys.
        validate_by_name=True,
        validate_by_alias=True,
        strict=False,
        validate_default=True,
        frozen=True,
        use_attribute_docstrings=False,
    )

    def to_yaml_dict(self) -> dict[str, Any]:
        """The model as the plain data a user would write (camelCase, defaults left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class Metadata(SpecModel):
    """Kubernetes-style metadata of a spec."""

    name: Name = Field(description="Name of the spec, unique per kind in a repository.")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Labels copied onto every object rendered from this spec.",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Free-form annotations copied onto every object rendered from this spec.",
    )

    @field_validator("labels")
    @classmethod
    def _label_values(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            _check_qualified_name(key, "label key")
            if len(value) > 63 or not re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?", value):
                raise ValueError(
                    f"label value {value!r} of {key!r} must be at most 63 characters of "
                    "letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
                )
        return labels

    @field_validator("annotations")
    @classmethod
    def _annotation_keys(cls, annotations: dict[str, str]) -> dict[str, str]:
        for key in annotations:
            _check_qualified_name(key, "annotation key")
        return annotations


def _check_qualified_name(key: str, what: str) -> None:
    prefix, _, name = key.rpartition("/")
    if prefix and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", prefix):
        raise ValueError(f"{what} {key!r} has an invalid prefix (expected a DNS subdomain)")
    if not name or len(name) > 63 or not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", name):
        raise ValueError(
            f"{what} {key!r} must be at most 63 characters of letters, digits, '-', '_' or '.'"
        )


class Threshold(SpecModel):
    """A bound on one metric: at least ``min``, at most ``max``, or both."""

    metric: str = Field(description="Name of the metric the bound applies to, e.g. `accuracy`.")
    min: float | None = Field(default=None, description="The metric must be at least this.")
    max: float | None = Field(default=None, description="The metric must be at most this.")

    @model_validator(mode="after")
    def _bounds(self) -> "Threshold":
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
