"""The seven Forge kinds as whole documents (`apiVersion`, `kind`, `metadata`, `spec`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, get_args

from pydantic import Field

from specs.base import API_VERSION, Metadata, SpecModel
from specs.compression import CompressionSpec
from specs.compute import ComputeSpec
from specs.dataset import DatasetSpec
from specs.endpoint import EndpointSpec
from specs.environment import EnvironmentSpec
from specs.model import ModelSpec
from specs.rollout import RolloutPolicySpec


class Document(SpecModel):
    """Fields every Forge document has."""

    api_version: Literal["forge.dev/v1alpha1"] = Field(description=f"Always `{API_VERSION}`.")
    metadata: Metadata = Field(description="Name, labels and annotations.")
    if TYPE_CHECKING:  # each kind declares its own `kind: Literal[...]` field; a field here would come first
        kind: str

    @property
    def name(self) -> str:
        """The spec's `metadata.name`."""
        return self.metadata.name


class Environment(Document):
    """Where specs become live: the embedded `local` target or a Kubernetes cluster."""

    kind: Literal["Environment"] = Field(description="Kind of the document.")
    spec: EnvironmentSpec = Field(description="The environment.")


class Dataset(Document):
    """A pinned version of a data set, with cleaning and labeling steps."""

    kind: Literal["Dataset"] = Field(description="Kind of the document.")
    spec: DatasetSpec = Field(description="The data set.")


class Compute(Document):
    """A pool of nodes with accelerators."""

    kind: Literal["Compute"] = Field(description="Kind of the document.")
    spec: ComputeSpec = Field(description="The pool.")


class Model(Document):
    """A model and the workflow that trains, evaluates and compresses it."""

    kind: Literal["Model"] = Field(description="Kind of the document.")
    spec: ModelSpec = Field(description="The model.")


class Compression(Document):
    """Compressed variants of a model."""

    kind: Literal["Compression"] = Field(description="Kind of the document.")
    spec: CompressionSpec = Field(description="The compression variants.")


class RolloutPolicy(Document):
    """How new model versions reach traffic."""

    kind: Literal["RolloutPolicy"] = Field(description="Kind of the document.")
    spec: RolloutPolicySpec = Field(description="The policy.")


class Endpoint(Document):
    """A served model."""

    kind: Literal["Endpoint"] = Field(description="Kind of the document.")
    spec: EndpointSpec = Field(description="The endpoint.")


#: kind name → document class, in dependency order (what a kind refers to comes before it).
KINDS: dict[str, type[Document]] = {
    get_args(cls.model_fields["kind"].annotation)[0]: cls
    for cls in (Environment, Dataset, Compute, Compression, Model, RolloutPolicy, Endpoint)
}

AnyDocument = Annotated[
    Environment | Dataset | Compute | Compression | Model | RolloutPolicy | Endpoint,
    Field(discriminator="kind"),
]
