"""`forgectl labels merge`: reviewed labels into a Dataset's source.

The `autolabel` step of a Model's Workflow (renderers/workflow.py) leaves `auto-labels.csv` and a
review file in the workspace; a reviewer fills the label column of the rows they accept. This
merges the auto-labels and the accepted rows into the Dataset's CSV source — its own lines kept
byte for byte, the rows appended (which rows merge, and which are refused with their file and
line, is specs/labels.py, shared with the `merge-labels` runtime) — and rewrites the `digest:` of
the Dataset's spec in place, on the line the loader says it is on, so the plan shows which Models
retrain. With ``commit``, the two files are committed (nothing else), through
:mod:`reconciler.load.gitrepo` (no hooks, no filters: nothing in the tree runs).

A single Parquet source is rewritten the same way by `python -m runtimes merge-labels` in the
runtime environment (forgectl's own has no Parquet library): the same columns and types, the rows
appended; the new file replaces the source and the digest line moves with it.

A sharded `file://` or `s3://` source (`source.shards`) keeps its shards as they are: the merged
rows become one new Parquet shard (the pinned shards' columns and types, named
`labels-<12 hex of its digest>.parquet` or after the glob), written by the same runtime step into
the source's folder or bucket prefix (S3 through the client the data steps read shards with, with
the AWS_* credentials of the shell running forgectl); its entry is appended to
`source.shards.files` after the last one's lines and `digest:` moves to the new root, so the plan
shows one new shard and only its group prepares. A `pvc://` source (sharded or a single file) is
on a claim of the cluster, which this machine cannot write into: a one-off pod there does the
runtime's part (reconciler/labels/cluster.py), and the spec is re-pinned here as for the others.

Refused before anything is written: a Dataset without `labeling.auto`, a source that is not a
`file://` CSV or Parquet file inside the Environment's root, a `pvc://` one, or a sharded
`file://`/`s3://`/`pvc://` one (a `pvc://` source with an Environment that is not a cluster),
a source whose bytes no longer match the pinned digest (merge into the data the spec pins, nothing
else), labels the `autolabel` step made for another digest (its `report.json` beside them says
which: a second merge of the same review is refused), and any row that cannot merge.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from reconciler.diagnostics import ForgeError, printable
from reconciler.load.gitrepo import GitError, open_repository
from reconciler.load.loader import load_or_raise
from specs import Dataset, Environment
from specs.labels import LabelsError, Table, append_csv, csv_table, merge_rows
from specs.safety import OutsideRoot, resolve_inside

if TYPE_CHECKING:  # the session opens a target (the kubernetes client): only a `pvc://` merge loads it
    from reconciler.plan.session import TargetOptions
    from reconciler.targets.base import PodAPI, Target

#: Who a `--commit` is by when the repository's own configuration names nobody (forgectl reads
#: no global git configuration).
AUTHOR = {"GIT_AUTHOR_NAME": "forgectl", "GIT_AUTHOR_EMAIL": "forgectl@forge.dev",
          "GIT_COMMITTER_NAME": "forgectl", "GIT_COMMITTER_EMAIL": "forgectl@forge.dev"}


@dataclass(frozen=True)
class LabelsMerge:
    """What a merge did: the files, the counts, the digests and the commit (when asked)."""

    dataset: str
    source: str
    spec_file: str
    spec_line: int
    old_digest: str
    new_digest: str
    auto_labelled: int
    accepted: int
    rejected: int
    rows: int
    commit: str | None = None
    shard: str | None = None
    """A sharded source: the new shard's file name, its digest and the number of shards now pinned."""
    shard_digest: str | None = None
    shards: int | None = None

    def to_json(self) -> dict[str, object]:
        return {"dataset": self.dataset, "source": self.source, "specFile": self.spec_file, "specLine": self.spec_line,
                "oldDigest": self.old_digest, "newDigest": self.new_digest, "autoLabelled": self.auto_labelled,
                "accepted": self.accepted, "rejected": self.rejected, "rows": self.rows, "commit": self.commit,
                **({"shard": self.shard, "shardDigest": self.shard_digest, "shards": self.shards} if self.shard else {})}


def sha256_digest(data: bytes) -> str:
    """The digest a `file://` source is pinned by (what `sha256sum` prints, with its prefix)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _file_digest(path: Path) -> str:
    """:func:`sha256_digest` of a file, read in chunks (a Parquet source need not fit in memory)."""
    with path.open("rb") as fh:
        return "sha256:" + hashlib.file_digest(fh, "sha256").hexdigest()


def _read_csv(path: Path, what: str) -> tuple[str, Table]:
    if path.suffix == ".parquet":
        raise ForgeError(f"{printable(str(path))}: a Parquet {what}; `forgectl labels merge` reads CSV (merge Parquet "
                         "with `python -m runtimes merge-labels` in the runtime environment)")
    if not path.is_file():
        raise ForgeError(f"{printable(str(path))}: no such file ({what})")
    try:
        text = path.read_bytes().decode("utf-8")  # no newline translation: the digest is of the bytes
    except (OSError, UnicodeDecodeError) as exc:
        raise ForgeError(f"{printable(str(path))}: cannot read the {what}: {exc}") from None
    return text, csv_table(str(path), text)


def _labelled_digest(report: Path) -> str | None:
    """The Dataset digest the `autolabel` step's ``report.json`` says it labelled for, if it says."""
    try:
        value = json.loads(report.read_text(encoding="utf-8")).get("datasetDigest") if report.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _replace_all(writes: list[tuple[Path, bytes | Path]]) -> None:
    """Replace each path's content with the bytes (or the file) given: every new content is staged
    in a temporary file beside its target first, then all are renamed over their targets, so a
    failure while staging (a full disk) leaves every target as it was."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in writes:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            staged.append((tmp, path))
            with os.fdopen(fd, "wb") as fh:
                if isinstance(data, Path):
                    with data.open("rb") as src:
                        shutil.copyfileobj(src, fh, 8 << 20)
                else:
                    fh.write(data)
            os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        for tmp, path in staged:
            os.replace(tmp, path)
    finally:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)


def _repinned(raw: Any, old: str) -> tuple[Path, list[str], int]:
    """The spec file, its lines and the line its `digest:` is on (the loader's line), refused
    (nothing written) unless that line holds ``old`` exactly once: the caller replaces it there."""
    digest_line = raw.position(("spec", "digest"))[0]
    spec_path = Path(raw.file)
    lines = spec_path.read_bytes().decode("utf-8").splitlines(keepends=True)
    if not 0 < digest_line <= len(lines) or lines[digest_line - 1].count(old) != 1:
        raise ForgeError(f"{raw.file}:{digest_line}: `digest` is not written as {old} on a line of its own; nothing "
                         "was written (merge with `python -m runtimes merge-labels` and pin the new digest by hand)")
    return spec_path, lines, digest_line


def merge_reviewed(paths: list[str], dataset: str, reviewed: Path, auto_labels: Path | None = None, *,
                   env: str | None = None, commit: bool = False, options: TargetOptions | None = None,
                   progress: Callable[[str], None] | None = None) -> LabelsMerge:
    """Merge ``reviewed`` (and the auto-labels beside it, or ``auto_labels``) into ``dataset``'s
    source and pin its new digest in the spec; commit the files that changed with ``commit``. A
    `pvc://` sharded source is written through a pod of the Environment's cluster (``options``:
    the command line's kubeconfig, context and namespace; ``progress`` hears what it waits for)."""
    result = load_or_raise(paths)
    doc = result.specs.get(Dataset, dataset)
    if doc is None:
        known = ", ".join(d.name for d in result.specs.of(Dataset)) or "none defined"
        raise ForgeError(f"no Dataset {dataset!r} in {', '.join(paths)} (known: {known})")
    raw = result.raws[("Dataset", dataset)]
    spec = doc.spec
    where = f"{raw.file}:{raw.position(('spec', 'labeling'))[0]}"
    if spec.labeling.auto is None or not spec.labeling.column:
        raise ForgeError(f"{where}: Dataset {dataset!r} has no `labeling.auto` with a `labeling.column` to merge into")
    environment = result.specs.environment(env)
    uri_line = raw.position(("spec", "source", "uri"))[0]
    try:
        root = resolve_inside(Path.cwd(), environment.spec.root if environment else ".", what="root")
    except OutsideRoot as exc:
        raise ForgeError(f"{raw.file}:{uri_line}: {exc}") from None
    target: Target | None = None
    if spec.source.uri.startswith("pvc://") and environment is not None:
        from reconciler.plan.session import TargetOptions, open_target

        target = open_target(environment, options or TargetOptions())
    if spec.source.shards is not None:
        return _merge_shard(doc, raw, root, reviewed, auto_labels, commit=commit, environment=environment,
                            target=target, progress=progress)
    if spec.source.uri.startswith("pvc://"):
        return _merge_claim_file(doc, raw, reviewed, auto_labels, commit=commit, environment=environment,
                                 target=target, progress=progress)
    return _merge_file(doc, raw, root, reviewed, auto_labels, commit=commit)


class _MergeWriter(Protocol):
    """Where a merge's runtime step runs and writes: this machine (:class:`_LocalShardWriter`) or a
    cluster's pods (reconciler/labels/cluster.py `ClusterMergeWriter`)."""

    #: Whether :meth:`stage` has written where the data lives already (a pod does both at once).
    published_by_stage: bool

    def stage(self) -> dict[str, Any]:
        """Merge the rows; merge.json's content."""
        ...

    def publish(self, name: str) -> None:
        """Write what :meth:`stage` staged where the data lives."""
        ...

    def withdraw(self, name: str) -> None:
        """Undo :meth:`publish` (or a publishing :meth:`stage`)."""
        ...


def _withdraw_after(exc: BaseException, writer: _MergeWriter, name: str, spec_file: str, stays: str, fix: str) -> None:
    """Undo what ``writer`` put where the data lives, the spec that would pin it having failed with
    ``exc`` (the caller re-raises that); if undoing fails too, one error says what stays and what to do."""
    try:
        writer.withdraw(name)
    except ForgeError as undo:
        raise ForgeError(f"{spec_file}: cannot write the spec ({exc}), and {stays}: {undo}; {fix}") from exc


def _pods_for(target: Target | None, environment: Environment | None, where: str,
              uri: str) -> tuple[PodAPI, Environment]:
    """Where a `pvc://` source is written: the cluster's pods (and their Environment), or a refusal
    saying so."""
    pods = target.pod_api() if target is not None else None
    if pods is None or environment is None:
        name = environment.name if environment is not None else "local"
        raise ForgeError(f"{where}: {uri} is on a PersistentVolumeClaim, which `forgectl labels merge` writes through "
                         f"a pod of the cluster the Environment names; {name!r} is not a `kubernetes` Environment "
                         "(name one with --env)")
    return pods, environment


def _cluster_writer(pods: PodAPI, environment: Environment, doc: Any, reviewed: Path, auto_path: Path, where: str,
                    progress: Callable[[str], None] | None) -> _MergeWriter:
    """The pods that merge into the claim of ``doc``'s `pvc://` source, handed the reviewed file and
    the auto-labels (reconciler/labels/cluster.py)."""
    from reconciler.labels.cluster import ClusterMergeWriter

    review_key = reviewed.name if re.fullmatch(r"[-._a-zA-Z0-9]+", reviewed.name) else "reviewed" + reviewed.suffix
    config = ClusterMergeWriter.input_config(doc.name, doc.spec.model_dump(mode="json", by_alias=True), review_key)
    inputs = {"auto-labels.csv": auto_path.read_bytes(), review_key: reviewed.read_bytes()}
    claim = doc.spec.source.uri.removeprefix("pvc://").split("/", 1)[0]
    return ClusterMergeWriter(pods, environment, config, claim, inputs, where, progress or (lambda _: None))


def _merge_claim_file(doc: Any, raw: Any, reviewed: Path, auto_labels: Path | None, *, commit: bool,
                      environment: Environment | None, target: Target | None,
                      progress: Callable[[str], None] | None) -> LabelsMerge:
    """A single `pvc://` CSV or Parquet file: a pod of the cluster merges the rows and replaces the
    file in its claim (checking first that it holds what the spec pins: this machine cannot read
    it), keeping its bytes on the workspace claim; then the `digest:` line is re-pinned, and if that
    write fails another pod puts the file back."""
    spec = doc.spec
    where = f"{raw.file}:{raw.position(('spec', 'source', 'uri'))[0]}"
    if spec.source.format not in ("csv", "parquet"):
        raise ForgeError(f"{where}: `forgectl labels merge` writes a CSV or Parquet source; {spec.source.uri} is "
                         f"{spec.source.format}")
    pods, cluster = _pods_for(target, environment, where, spec.source.uri)
    auto_path = _auto_labels_for(spec, raw, doc.name, reviewed, auto_labels)
    spec_path, lines, digest_line = _repinned(raw, spec.digest)  # refused here, before the claim is written
    writer = _cluster_writer(pods, cluster, doc, reviewed, auto_path, where, progress)
    done = writer.stage()
    new, name = str(done["newDigest"]), str(done["file"])
    try:
        lines[digest_line - 1] = lines[digest_line - 1].replace(spec.digest, new)
        _replace_all([(spec_path, "".join(lines).encode("utf-8"))])
    except BaseException as exc:
        _withdraw_after(exc, writer, name, raw.file, f"{spec.source.uri} stays merged in its claim",
                        f"pin {new} by hand, or restore the file")
        raise
    outcome = LabelsMerge(doc.name, spec.source.uri, raw.file, digest_line, spec.digest, new, int(done["autoLabelled"]),
                          int(done["accepted"]), int(done["rejected"]), int(done["rows"]))
    if not commit:
        return outcome
    message = (f"Labels for dataset {doc.name}: {outcome.auto_labelled} auto-labelled and {outcome.accepted} reviewed "
               f"rows merged\n\n{spec.source.uri}: {spec.digest} → {new}\n")
    return LabelsMerge(**{**outcome.__dict__, "commit": _commit([spec_path], message)})  # the file is on the claim


def _merge_file(doc: Any, raw: Any, root: Path, reviewed: Path, auto_labels: Path | None, *,
                commit: bool) -> LabelsMerge:
    """A single `file://` source: a CSV gets the rows appended here (its own lines byte for byte);
    a Parquet file is rewritten by `python -m runtimes merge-labels` in the runtime environment
    (forgectl's own has no Parquet library) with the same columns and types. Either way the new
    file replaces the source, and the `digest:` line is re-pinned, together."""
    dataset, spec, label = doc.name, doc.spec, doc.spec.labeling.column
    uri_line = raw.position(("spec", "source", "uri"))[0]
    fmt = spec.source.format
    if fmt not in ("csv", "parquet") or not spec.source.uri.startswith("file://") or spec.source.local_path is None:
        raise ForgeError(f"{raw.file}:{raw.position(('spec', 'source'))[0]}: `forgectl labels merge` writes a `file://` "
                         f"or `pvc://` CSV or Parquet source (or a sharded `file://`, `s3://` or `pvc://` one); "
                         f"{spec.source.uri} ({fmt}) is not one")
    try:
        source = resolve_inside(root, spec.source.local_path, what="source")
    except OutsideRoot as exc:
        raise ForgeError(f"{raw.file}:{uri_line}: {exc}") from None
    if not source.is_file():
        raise ForgeError(f"{printable(str(source))}: no such file (source)")
    old = _file_digest(source)
    digest_line = raw.position(("spec", "digest"))[0]
    if old != spec.digest:
        raise ForgeError(f"{raw.file}:{digest_line}: the source {spec.source.uri} has digest {old}, the Dataset pins "
                         f"{spec.digest}: labels merge into the data the spec pins (restore it, or pin it first)")
    auto_path = _auto_labels_for(spec, raw, dataset, reviewed, auto_labels)
    with tempfile.TemporaryDirectory(prefix="forge-labels-") as tmp:
        new_content: bytes | Path
        if fmt == "csv":
            source_text, source_rows = _read_csv(source, "source")
            try:
                _, auto_table = _read_csv(auto_path, "auto-labels file")
                _, reviewed_table = _read_csv(reviewed, "reviewed file")
                merged = merge_rows(source_rows.columns, label, auto_table, reviewed_table, spec.labeling.classes)
            except LabelsError as exc:
                raise ForgeError(str(exc)) from None
            if not merged.rows:
                raise ForgeError(f"{printable(str(reviewed))}: nothing to merge (no auto-labels, and no reviewed row "
                                 f"has its `{label}` filled): the digest stays {old}")
            new_content = append_csv(source_text, merged.rows).encode("utf-8")
            new = sha256_digest(new_content)
            counts = (merged.auto_labelled, merged.accepted, merged.rejected, len(source_rows.rows) + len(merged.rows))
        else:
            workspace = _stage_inputs(Path(tmp), auto_path, reviewed)
            done = _run_merge_labels(dataset, spec, root, workspace, reviewed.name, f"{raw.file}:{uri_line}")
            new_content, new = workspace / "out" / str(done["file"]), str(done["newDigest"])
            counts = (int(done["autoLabelled"]), int(done["accepted"]), int(done["rejected"]), int(done["rows"]))
        spec_path, lines, digest_line = _repinned(raw, spec.digest)
        lines[digest_line - 1] = lines[digest_line - 1].replace(spec.digest, new)
        _replace_all([(source, new_content), (spec_path, "".join(lines).encode("utf-8"))])
    outcome = LabelsMerge(dataset, str(source), raw.file, digest_line, old, new, *counts)
    if not commit:
        return outcome
    message = (f"Labels for dataset {dataset}: {outcome.auto_labelled} auto-labelled and {outcome.accepted} reviewed "
               f"rows merged\n\n{spec.source.uri}: {old} → {new}\n")
    return LabelsMerge(**{**outcome.__dict__, "commit": _commit([source, spec_path], message)})


def _auto_labels_for(spec: Any, raw: Any, dataset: str, reviewed: Path, auto_labels: Path | None) -> Path:
    """The auto-labels file to merge (``auto_labels`` or the one beside ``reviewed``), refused when
    the `autolabel` step's report beside it says it labelled another digest."""
    digest_line = raw.position(("spec", "digest"))[0]
    auto_path = auto_labels if auto_labels is not None else reviewed.parent / "auto-labels.csv"
    if auto_labels is None and not auto_path.is_file():
        raise ForgeError(f"{printable(str(auto_path))}: no auto-labels beside the reviewed file (the `autolabel` step "
                         "writes `auto-labels.csv` beside `review.csv`; name it with --auto-labels)")
    if not auto_path.is_file():
        raise ForgeError(f"{printable(str(auto_path))}: no such file (auto-labels file)")
    if not reviewed.is_file():
        raise ForgeError(f"{printable(str(reviewed))}: no such file (reviewed file)")
    made_for = _labelled_digest(auto_path.parent / "report.json")
    if made_for is not None and made_for != spec.digest:
        raise ForgeError(f"{raw.file}:{digest_line}: the labels in {printable(str(auto_path.parent))} were made for "
                         f"{dataset}'s digest {made_for}, the Dataset pins {spec.digest} (merged already, or made "
                         "for another version of the data): nothing merged")
    return auto_path


def _stage_inputs(workspace: Path, auto_path: Path, reviewed: Path) -> Path:
    """A workspace for the runtime's `merge-labels`: the auto-labels as ``labels/auto-labels.csv``
    and the reviewed file under its own name (copies: the step never reads outside its workspace)."""
    (workspace / "labels").mkdir()
    shutil.copyfile(auto_path, workspace / "labels" / "auto-labels.csv")
    shutil.copyfile(reviewed, workspace / reviewed.name)
    return workspace


class _LocalShardWriter:
    """Writes a merge's new shard with `python -m runtimes merge-labels` on this machine: staged in
    a temporary workspace, then published into a `file://` folder or an `s3://` prefix."""

    published_by_stage = False

    def __init__(self, dataset: str, spec: Any, root: Path, workspace: Path, review: str, where: str) -> None:
        self.dataset, self.spec, self.root, self.staging, self.review, self.where = (
            dataset, spec, root, workspace, review, where)

    def stage(self) -> dict[str, Any]:
        return _run_merge_labels(self.dataset, self.spec, self.root, self.staging, self.review, self.where)

    def publish(self, name: str) -> None:
        _runtime(_merge_config(self.dataset, self.spec, self.review), self.root, self.staging, self.where,
                 "--publish", name)

    def withdraw(self, name: str) -> None:
        _runtime(_merge_config(self.dataset, self.spec, self.review), self.root, self.staging, self.where,
                 "--withdraw", name)


#: What the spec's rewrite is checked with before any shard exists (the name and digests the merge
#: will give are not known yet; the check is of the rewrite's shape).
_PLACEHOLDER_SHARD = ("labels-000000000000.parquet", "sha256:" + "0" * 64, "sha256:" + "1" * 64)


def _merge_shard(doc: Any, raw: Any, root: Path, reviewed: Path, auto_labels: Path | None, *,
                 commit: bool, environment: Environment | None = None, target: Target | None = None,
                 progress: Callable[[str], None] | None = None) -> LabelsMerge:
    """A sharded source: the merged rows become one new Parquet shard (written by `python -m
    runtimes merge-labels` in the runtime environment, which has Parquet and the S3 client the data
    steps use; forgectl's own has neither), appended to `source.shards.files` in the spec with its
    digest, and the `digest:` line re-pinned to the new root: the plan shows one new shard, and only
    its group prepares. The shard goes into a `file://` folder or an `s3://` prefix from this
    machine, or, through a pod on the Environment's cluster (reconciler/labels/cluster.py), into a
    `pvc://` claim."""
    dataset, spec = doc.name, doc.spec
    shards = spec.source.shards
    uri_line = raw.position(("spec", "source", "uri"))[0]
    where = f"{raw.file}:{uri_line}"
    scheme = spec.source.uri.partition("://")[0]
    folder_part, _ = spec.source.folder_and_glob
    if scheme == "pvc":
        on_cluster = _pods_for(target, environment, where, spec.source.uri)
        shard_folder = f"pvc://{folder_part}"
    elif scheme == "s3":
        missing = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not os.environ.get(k)]
        if missing:
            raise ForgeError(f"{where}: {spec.source.uri} is written with the S3 credentials of this "
                             f"shell, and {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set "
                             "(export them, and AWS_ENDPOINT_URL for an S3-compatible store, as for the AWS CLI): "
                             "nothing was written")
        shard_folder = f"s3://{folder_part}"
    else:
        try:
            folder = resolve_inside(root, folder_part, what="source")
        except OutsideRoot as exc:
            raise ForgeError(f"{where}: {exc}") from None
        if not folder.is_dir():
            raise ForgeError(f"{where}: the source's folder {printable(str(folder))} does not exist")
        shard_folder = str(folder)
    auto_path = _auto_labels_for(spec, raw, dataset, reviewed, auto_labels)
    last = len(shards.files) - 1
    item = ("spec", "source", "shards", "files", last)
    name_line, digest_item_line = raw.position((*item, "name"))[0], raw.position((*item, "digest"))[0]
    spec_path, lines, digest_line = _repinned(raw, spec.digest)
    first, end = min(name_line, digest_item_line), max(name_line, digest_item_line)
    block = "".join(lines[first - 1 : end]) if 0 < first <= end <= len(lines) else ""
    if (not block.lstrip().startswith("- ") or block.count(shards.files[-1].name) != 1
            or block.count(shards.files[-1].digest) != 1 or end - first > 1):
        raise ForgeError(f"{raw.file}:{name_line}: the last shard of `source.shards.files` is not written one item a "
                         "line (`- name: …` then `digest: …`, or `- {name: …, digest: …}`); nothing was written "
                         "(write the shard's entry by hand)")

    def rewritten(new_name: str, file_digest: str, new_root: str) -> tuple[str, str]:
        entry = block.replace(shards.files[-1].name, new_name).replace(shards.files[-1].digest, file_digest)
        if not entry.endswith(("\n", "\r")):
            entry += "\r\n" if lines[first - 1].endswith("\r\n") else "\n"
        new_lines = [*lines[:end], entry, *lines[end:]]
        at = digest_line - 1 + (1 if digest_line > end else 0)
        new_lines[at] = new_lines[at].replace(spec.digest, new_root)
        text = "".join(new_lines)
        _check_rewrite(text, raw, doc, new_name, file_digest, new_root)
        return text, entry

    rewritten(*_PLACEHOLDER_SHARD)  # refused here, before any shard is written, if the rewrite cannot be made
    with tempfile.TemporaryDirectory(prefix="forge-labels-") as tmp:
        writer: _MergeWriter
        if scheme == "pvc":
            writer = _cluster_writer(*on_cluster, doc, reviewed, auto_path, where, progress)
        else:
            writer = _LocalShardWriter(dataset, spec, root, _stage_inputs(Path(tmp), auto_path, reviewed),
                                       reviewed.name, where)
        done = writer.stage()
        new_name, file_digest, new_root = str(done["file"]), str(done["fileDigest"]), str(done["newDigest"])
        published = writer.published_by_stage
        # The shard goes where the data lives first, the spec that pins it second: a spec never pins
        # a shard that is not there, and a shard the spec could not pin is taken away again.
        try:
            new_text, entry = rewritten(new_name, file_digest, new_root)
            if not published:
                writer.publish(new_name)
                published = True
            _replace_all([(spec_path, new_text.encode("utf-8"))])
        except BaseException as exc:
            if published:
                _withdraw_after(exc, writer, new_name, raw.file, f"the shard {new_name} it would pin stays in "
                                f"{shard_folder}", "remove it by hand")
            raise
    target_path = f"{shard_folder}/{new_name}"
    new_line = digest_line + (entry.count("\n") if digest_line > end else 0)
    outcome = LabelsMerge(dataset, target_path, raw.file, new_line, spec.digest, new_root, int(done["autoLabelled"]),
                          int(done["accepted"]), int(done["rejected"]), int(done["rows"]), shard=new_name,
                          shard_digest=file_digest, shards=len(shards.files) + 1)
    if not commit:
        return outcome
    message = (f"Labels for dataset {dataset}: {outcome.auto_labelled} auto-labelled and {outcome.accepted} reviewed "
               f"rows merged as the shard {new_name}\n\n{spec.source.uri}: {spec.digest} → {new_root}\n")
    # An S3 object or a claim's file is not in git: the spec alone.
    committed = [Path(target_path), spec_path] if scheme == "file" else [spec_path]
    return LabelsMerge(**{**outcome.__dict__, "commit": _commit(committed, message)})


def _check_rewrite(text: str, raw: Any, doc: Any, name: str, file_digest: str, root: str) -> None:
    """Refuse (nothing written) unless the rewritten file parses to the same documents with only the
    new shard appended and the digest moved."""
    import yaml

    try:
        docs = list(yaml.safe_load_all(text))
        before = list(yaml.safe_load_all(Path(raw.file).read_text(encoding="utf-8")))
    except yaml.YAMLError as exc:
        raise ForgeError(f"{raw.file}: the rewritten spec does not parse ({exc}); nothing was written") from None
    expected = before
    found = False
    for d in expected:
        if isinstance(d, dict) and d.get("kind") == "Dataset" and (d.get("metadata") or {}).get("name") == doc.name:
            d["spec"]["source"]["shards"]["files"].append({"name": name, "digest": file_digest})
            d["spec"]["digest"] = root
            found = True
    if not found or docs != expected:
        raise ForgeError(f"{raw.file}: rewriting the shard list in place would change more than the new shard and the "
                         f"digest; nothing was written (append {{name: {name}, digest: {file_digest}}} and pin {root} "
                         "by hand)")


def _merge_config(dataset: str, spec: Any, review: str) -> dict[str, Any]:
    """The `merge-labels` step's config for a workspace laid out by :func:`_stage_inputs`."""
    return {"step": "merge-labels", "dataset": dataset, "spec": spec.model_dump(mode="json", by_alias=True),
            "labels": "labels", "review": review, "output": "out"}


def _runtime(config: dict[str, Any], root: Path, workspace: Path, where: str, *args: str) -> None:
    """`python -m runtimes merge-labels` (with ``args``) in the runtime environment, in ``workspace``.
    Its environment is this one's (an `s3://` source is read and written with the shell's AWS_*
    variables, as the AWS CLI would use them). A refusal keeps the step's own file:line (a reviewed
    row's); one about the source (exit 2: it does not hold what the spec pins) gets ``where``, the
    source's line in the spec."""
    from reconciler.runtimeenv import FORGE_ROOT, runtime_python

    env = {**os.environ, "FORGE_WORKSPACE": str(workspace), "FORGE_SOURCE_ROOT": str(root),
           "PYTHONPATH": str(FORGE_ROOT)}
    try:
        proc = subprocess.run([runtime_python(), "-m", "runtimes", "merge-labels", "--config-json", json.dumps(config),
                               *args], env=env, capture_output=True, text=True, timeout=3600, cwd=str(root))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ForgeError(f"cannot run the merge-labels step in the runtime environment: {exc}") from None
    if proc.returncode != 0:
        errors = [ln.removeprefix("error: ") for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
        message = printable(errors[-1] if errors else proc.stderr.strip()[-2000:] or f"merge-labels exited {proc.returncode}")
        raise ForgeError((f"{where}: " if proc.returncode == 2 else "") + message + " (nothing was written)")


def _run_merge_labels(dataset: str, spec: Any, root: Path, workspace: Path, review: str, where: str) -> dict[str, Any]:
    """`python -m runtimes merge-labels` in ``workspace`` (see :func:`_runtime`); its `merge.json`."""
    _runtime(_merge_config(dataset, spec, review), root, workspace, where)
    try:
        done: dict[str, Any] = json.loads((workspace / "out" / "merge.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ForgeError(f"the merge-labels step wrote no merge.json: {exc}") from None
    return done


def _commit(files: list[Path], message: str) -> str:
    """Commit exactly ``files`` (their work-tree content) on the current branch; the new commit's id."""
    repo = open_repository(needed_by="forgectl labels merge --commit")
    names = [os.path.relpath(os.path.abspath(f), repo.top) for f in files]
    try:
        repo.run("config", "--get", "user.email", what="reading the repository's user.email")
        author: dict[str, str] = {}
    except GitError:
        author = AUTHOR
    repo.run("add", "--", *names, what="staging the merged labels")
    repo.run("commit", "--no-verify", "--only", "-F", "-", "--", *names, what="committing the merged labels",
             input=message.encode("utf-8"), env=author)
    head = repo.head()
    assert head is not None
    return head
