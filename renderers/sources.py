"""How a Dataset's source reaches the pods of the steps that read it (pure).

A `pvc://claim/path` source is read from the claim itself: the Workflow lists the claim as a
read-only volume and the data steps (`prepare`, and a sharded data set's `prepare-group` and
`join-shards`) mount it at `$FORGE_WORKSPACE/pvc/<claim>`, where the runtimes look for it
(runtimes/data.py, runtimes/shard_source.py). The local target runs steps as processes of this
machine and reads `<workspace>/pvc/<claim>` as it is. Read-only, so a prepare step cannot change the
data it pins by digest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specs.dataset import DatasetSpec

#: The step kinds that read a Dataset's source (the others read what these prepared).
SOURCE_READERS = ("prepare", "prepare-group", "join-shards")
SOURCE_VOLUME = "dataset-source"


@dataclass(frozen=True)
class SourceVolume:
    """The claim of a `pvc://` source: the Workflow's volume and the data steps' mount."""

    claim: str
    workspace: str

    @property
    def volume(self) -> dict[str, Any]:
        return {"name": SOURCE_VOLUME, "persistentVolumeClaim": {"claimName": self.claim, "readOnly": True}}

    @property
    def mount(self) -> dict[str, Any]:
        return {"name": SOURCE_VOLUME, "mountPath": f"{self.workspace}/pvc/{self.claim}", "readOnly": True}


def source_volume(spec: DatasetSpec, workspace: str) -> SourceVolume | None:
    """The claim a `pvc://` source names (its first path segment), or None for any other source."""
    scheme, _, rest = spec.source.uri.partition("://")
    if scheme != "pvc":
        return None
    return SourceVolume(rest.split("/", 1)[0], workspace)
