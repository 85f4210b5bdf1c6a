"""`forgectl labels merge`: reviewed labels into a Dataset's source in the repository.

The `autolabel` step of a Model's Workflow (renderers/workflow.py) leaves `auto-labels.csv` and a
review file in the workspace; a reviewer fills the label column of the rows they accept. This
merges the auto-labels and the accepted rows into the Dataset's CSV source — its own lines kept
byte for byte, the rows appended (which rows merge, and which are refused with their file and
line, is specs/labels.py, shared with the `merge-labels` runtime) — and rewrites the `digest:` of
the Dataset's spec in place, on the line the loader says it is on, so the plan shows which Models
retrain. With ``commit``, the two files are committed (nothing else), through
:mod:`reconciler.load.gitrepo` (no hooks, no filters: nothing in the tree runs).

Refused before anything is written: a Dataset without `labeling.auto`, a source that is not a
`file://` CSV inside the Environment's root, a source whose bytes no longer match the pinned
digest (merge into the data the spec pins, nothing else), labels the `autolabel` step made for
another digest (its `report.json` beside them says which: a second merge of the same review is
refused), and any row that cannot merge.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from reconciler.diagnostics import ForgeError, printable
from reconciler.load.gitrepo import GitError, open_repository
from reconciler.load.loader import load_or_raise
from specs import Dataset
from specs.labels import LabelsError, Table, append_csv, csv_table, merge_rows
from specs.safety import OutsideRoot, resolve_inside

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

    def to_json(self) -> dict[str, object]:
        return {"dataset": self.dataset, "source": self.source, "specFile": self.spec_file, "specLine": self.spec_line,
                "oldDigest": self.old_digest, "newDigest": self.new_digest, "autoLabelled": self.auto_labelled,
                "accepted": self.accepted, "rejected": self.rejected, "rows": self.rows, "commit": self.commit}


def sha256_digest(data: bytes) -> str:
    """The digest a `file://` source is pinned by (what `sha256sum` prints, with its prefix)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


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


def _write(path: Path, data: bytes) -> None:
    """Replace ``path``'s content at once (a temporary file beside it, renamed over it)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def merge_reviewed(paths: list[str], dataset: str, reviewed: Path, auto_labels: Path | None = None, *,
                   env: str | None = None, commit: bool = False) -> LabelsMerge:
    """Merge ``reviewed`` (and the auto-labels beside it, or ``auto_labels``) into ``dataset``'s
    source and pin its new digest in the spec; commit both files with ``commit``."""
    result = load_or_raise(paths)
    doc = result.specs.get(Dataset, dataset)
    if doc is None:
        known = ", ".join(d.name for d in result.specs.of(Dataset)) or "none defined"
        raise ForgeError(f"no Dataset {dataset!r} in {', '.join(paths)} (known: {known})")
    raw = result.raws[("Dataset", dataset)]
    spec = doc.spec
    where = f"{raw.file}:{raw.position(('spec', 'labeling'))[0]}"
    label = spec.labeling.column
    if spec.labeling.auto is None or not label:
        raise ForgeError(f"{where}: Dataset {dataset!r} has no `labeling.auto` with a `labeling.column` to merge into")
    if spec.source.format != "csv" or not spec.source.uri.startswith("file://") or spec.source.local_path is None:
        raise ForgeError(f"{raw.file}:{raw.position(('spec', 'source'))[0]}: `forgectl labels merge` writes a `file://` "
                         f"CSV source; {spec.source.uri} ({spec.source.format}) is not one")
    environment = result.specs.environment(env)
    try:
        root = resolve_inside(Path.cwd(), environment.spec.root if environment else ".", what="root")
        source = resolve_inside(root, spec.source.local_path, what="source")
    except OutsideRoot as exc:
        raise ForgeError(f"{raw.file}:{raw.position(('spec', 'source', 'uri'))[0]}: {exc}") from None
    source_text, source_rows = _read_csv(source, "source")
    old = sha256_digest(source_text.encode("utf-8"))
    digest_line = raw.position(("spec", "digest"))[0]
    if old != spec.digest:
        raise ForgeError(f"{raw.file}:{digest_line}: the source {spec.source.uri} has digest {old}, the Dataset pins "
                         f"{spec.digest}: labels merge into the data the spec pins (restore it, or pin it first)")
    auto_path = auto_labels if auto_labels is not None else reviewed.parent / "auto-labels.csv"
    if auto_labels is None and not auto_path.is_file():
        raise ForgeError(f"{printable(str(auto_path))}: no auto-labels beside the reviewed file (the `autolabel` step "
                         "writes `auto-labels.csv` beside `review.csv`; name it with --auto-labels)")
    made_for = _labelled_digest(auto_path.parent / "report.json")
    if made_for is not None and made_for != spec.digest:
        raise ForgeError(f"{raw.file}:{digest_line}: the labels in {printable(str(auto_path.parent))} were made for "
                         f"{dataset}'s digest {made_for}, the Dataset pins {spec.digest} (merged already, or made "
                         "for another version of the data): nothing merged")
    try:
        _, auto_table = _read_csv(auto_path, "auto-labels file")
        _, reviewed_table = _read_csv(reviewed, "reviewed file")
        merged = merge_rows(source_rows.columns, label, auto_table, reviewed_table, spec.labeling.classes)
    except LabelsError as exc:
        raise ForgeError(str(exc)) from None
    if not merged.rows:
        raise ForgeError(f"{printable(str(reviewed))}: nothing to merge (no auto-labels, and no reviewed row has its "
                         f"`{label}` filled): the digest stays {old}")
    new_bytes = append_csv(source_text, merged.rows).encode("utf-8")
    new = sha256_digest(new_bytes)
    spec_path = Path(raw.file)
    spec_bytes = spec_path.read_bytes()
    lines = spec_bytes.decode("utf-8").splitlines(keepends=True)
    if not 0 < digest_line <= len(lines) or lines[digest_line - 1].count(spec.digest) != 1:
        raise ForgeError(f"{raw.file}:{digest_line}: `digest` is not written as {spec.digest} on this line; "
                         f"pin {new} by hand (nothing was written)")
    lines[digest_line - 1] = lines[digest_line - 1].replace(spec.digest, new)
    _write(source, new_bytes)
    _write(spec_path, "".join(lines).encode("utf-8"))
    outcome = LabelsMerge(dataset, str(source), raw.file, digest_line, old, new, merged.auto_labelled, merged.accepted,
                          merged.rejected, len(source_rows.rows) + len(merged.rows))
    if not commit:
        return outcome
    message = (f"Labels for dataset {dataset}: {merged.auto_labelled} auto-labelled and {merged.accepted} reviewed "
               f"rows merged\n\n{spec.source.uri}: {old} → {new}\n")
    return LabelsMerge(**{**outcome.__dict__, "commit": _commit([source, spec_path], message)})


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
