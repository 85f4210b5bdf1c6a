"""How a Dataset's data reaches the pods of the steps that read it (pure).

A `pvc://claim/path` source (or auto-labeling's `unlabelled` rows) is read from the claim itself:
the Workflow lists each claim as a read-only volume and the steps that read the data (`prepare`,
a sharded data set's `prepare-group` and `join-shards`, and `autolabel`) mount it at
`$FORGE_WORKSPACE/pvc/<claim>`, where the runtimes look for it (runtimes/data.py,
runtimes/shard_source.py). The local target runs steps as processes of this machine and reads
`<workspace>/pvc/<claim>` as it is. Read-only, so a step cannot change the data it pins by digest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specs.dataset import DatasetSpec

#: The step kinds that read a Dataset's data (the others read what these prepared).
SOURCE_READERS = ("prepare", "prepare-group", "join-shards", "autolabel")
SOURCE_VOLUME = "dataset-source"


@dataclass(frozen=True)
class SourceVolume:
    """One claim a Dataset's data is on: the Workflow's volume and the data steps' mount."""

    claim: str
    workspace: str
    index: int = 0

    @property
    def name(self) -> str:
        return SOURCE_VOLUME if self.index == 0 else f"{SOURCE_VOLUME}-{self.index}"

    @property
    def volume(self) -> dict[str, Any]:
        return {"name": self.name, "persistentVolumeClaim": {"claimName": self.claim, "readOnly": True}}

    @property
    def mount(self) -> dict[str, Any]:
        return {"name": self.name, "mountPath": f"{self.workspace}/pvc/{self.claim}", "readOnly": True}


def source_volumes(spec: DatasetSpec, workspace: str) -> list[SourceVolume]:
    """The claims the Dataset's `pvc://` URIs name (the source's, auto-labeling's `unlabelled`),
    each once, in that order."""
    uris = [spec.source.uri, *([spec.labeling.auto.unlabelled] if spec.labeling.auto is not None else [])]
    claims: list[str] = []
    for uri in uris:
        scheme, _, rest = uri.partition("://")
        if scheme == "pvc" and (claim := rest.split("/", 1)[0]) not in claims:
            claims.append(claim)
    return [SourceVolume(c, workspace, i) for i, c in enumerate(claims)]
