"""Where a sharded source's files are: a pyarrow filesystem and the folder its glob lists.

Arrow's own filesystems read every scheme Forge accepts, so the streaming scanner reads S3 objects
the same way it reads local files (range requests, no whole-file download, no extra client):

* ``file://folder/*.parquet`` — under the source root (the repository), never outside it;
* ``pvc://claim/folder/*.parquet`` — the claim mounted under the workspace's ``pvc/`` folder;
* ``s3://bucket/folder/*.parquet`` — ``pyarrow.fs.S3FileSystem`` with the credentials of the
  environment only (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``: in a cluster from the
  Dataset's Secret, on the local target from forgectl's own environment), and an S3-compatible
  store's address from ``AWS_ENDPOINT_URL`` when set. Credentials never come from a spec.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtimes._step import in_workspace, source_root
from runtimes.errors import DigestMismatch, StepFailed
from specs.dataset import Source
from specs.safety import OutsideRoot, resolve_inside


@dataclass(frozen=True)
class ShardLocation:
    """A sharded source opened: its filesystem, the folder (a path of that filesystem) and the glob."""

    filesystem: Any
    folder: str
    glob: str
    root: Path | None = None
    """A local source's root: every shard opened must resolve inside it (a symlink may not lead out)."""

    def path(self, name: str) -> str:
        if self.root is not None:
            try:
                return str(resolve_inside(self.root, str(Path(self.folder, name).relative_to(self.root)), what=f"shard {name!r}"))
            except OutsideRoot as exc:
                raise StepFailed(str(exc)) from None
        return f"{self.folder}/{name}"

    def listing(self) -> list[str]:
        """The names in the folder that match the glob, sorted."""
        from pyarrow.fs import FileSelector, FileType

        try:
            infos = self.filesystem.get_file_info(FileSelector(self.folder, allow_not_found=False))
        except (OSError, FileNotFoundError) as exc:
            raise StepFailed(f"cannot list {self.folder}: {exc}") from None
        return sorted(i.base_name for i in infos if i.type == FileType.File and fnmatch.fnmatchcase(i.base_name, self.glob))


def _s3() -> Any:
    from pyarrow.fs import S3FileSystem

    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        raise StepFailed("an s3:// source needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the step's environment "
                         "(from the Dataset's `shards.credentialsSecret` in a cluster)")
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or None
    options: dict[str, Any] = {"access_key": key, "secret_key": secret,
                               "region": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"}
    if os.environ.get("AWS_SESSION_TOKEN"):  # temporary credentials (STS, SSO) come with one
        options["session_token"] = os.environ["AWS_SESSION_TOKEN"]
    if endpoint:
        scheme, _, address = endpoint.partition("://")
        options.update(endpoint_override=address or scheme, scheme=scheme if address else "https")
    return S3FileSystem(**options)


def open_source(source: Source) -> ShardLocation:
    """The filesystem and folder of a sharded source; a local folder must stay inside its root."""
    from pyarrow.fs import LocalFileSystem

    scheme = source.uri.partition("://")[0]
    folder, glob = source.folder_and_glob
    if scheme == "s3":
        return ShardLocation(_s3(), folder, glob)
    root = in_workspace("pvc") if scheme == "pvc" else source_root()
    try:
        local = resolve_inside(root, folder, what=f"source {source.uri!r}")
    except OutsideRoot as exc:
        raise StepFailed(str(exc)) from None
    return ShardLocation(LocalFileSystem(use_mmap=False), str(local), glob, root.resolve())


def check_listing(location: ShardLocation, pinned: list[str]) -> None:
    """Fail (as a digest mismatch: the data is not what the spec pins) when the source's folder
    holds shards the spec does not list, or lacks some it does."""
    found = set(location.listing())
    missing, extra = sorted(set(pinned) - found), sorted(found - set(pinned))
    if missing or extra:
        parts = ([f"missing {len(missing)} pinned shard(s): {', '.join(missing[:5])}"] if missing else []) + (
            [f"{len(extra)} shard(s) not pinned: {', '.join(extra[:5])}"] if extra else [])
        raise DigestMismatch(f"the source {location.folder}/{location.glob} differs from the Dataset's shards: "
                             + "; ".join(parts) + " (pin the new list and digest in the spec)")


def put_shard(location: ShardLocation, name: str, staged: Path) -> str:
    """Write the local file ``staged`` into the source's folder as the shard ``name`` (the same
    filesystem the steps read shards through: S3 with the environment's credentials, or the local
    folder); the shard's path. Refused when a file of that name is there already: a shard is never
    replaced, since the spec pins its digest."""
    from pyarrow.fs import FileType

    target = location.path(name)
    try:
        exists = location.filesystem.get_file_info(target).type != FileType.NotFound
    except OSError as exc:
        raise StepFailed(f"cannot look for {target}: {exc}") from None
    if exists:
        raise StepFailed(f"{target}: a file of that name is in the source's folder already (these labels were "
                         "merged before): nothing written")
    # Local: a temporary name renamed over, so no reader sees half a shard. S3: an object appears
    # whole when its upload completes (a multipart upload is committed by close()), so none is needed.
    partial = location.path(f".{name}.partial") if location.root is not None else target
    try:
        with staged.open("rb") as src, location.filesystem.open_output_stream(partial) as out:
            for chunk in iter(lambda: src.read(8 << 20), b""):
                out.write(chunk)
        if partial != target:
            location.filesystem.move(partial, target)
    except OSError as exc:
        if partial != target and location.filesystem.get_file_info(partial).type == FileType.File:
            location.filesystem.delete_file(partial)
        raise StepFailed(f"cannot write the shard {target}: {exc}") from None
    return target


def delete_shard(location: ShardLocation, name: str) -> None:
    """Remove the shard ``name`` from the source's folder (undoing :func:`put_shard` when the spec
    that would pin it could not be written); nothing when it is not there."""
    from pyarrow.fs import FileType

    target = location.path(name)
    try:
        if location.filesystem.get_file_info(target).type == FileType.File:
            location.filesystem.delete_file(target)
    except OSError as exc:
        raise StepFailed(f"cannot remove the shard {target}: {exc}") from None
