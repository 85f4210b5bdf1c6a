"""Forge's spec language: pydantic models of the seven kinds (imports nothing else of Forge)."""

from specs.base import API_VERSION, Metadata, SpecModel, Threshold, duration_seconds
from specs.documents import (
    KINDS,
    AnyDocument,
    Compression,
    Compute,
    Dataset,
    Document,
    Endpoint,
    Environment,
    Model,
    RolloutPolicy,
)
from specs.specset import ReferenceProblem, SpecSet, check_references

__all__ = [
    "API_VERSION",
    "KINDS",
    "AnyDocument",
    "Compression",
    "Compute",
    "Dataset",
    "Document",
    "Endpoint",
    "Environment",
    "Metadata",
    "Model",
    "ReferenceProblem",
    "RolloutPolicy",
    "SpecModel",
    "SpecSet",
    "Threshold",
    "check_references",
    "duration_seconds",
]
