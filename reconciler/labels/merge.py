"""`forgectl labels merge`: reviewed labels into a Dataset's source in the repository.

The `autolabel` step of a Model's Workflow (renderers/workflow.py) leaves `auto-labels.csv` and a
review file in the workspace; a reviewer fills the label column of the rows they accept. This
merges the auto-labels and the accepted rows into the Dataset's CSV source — its own lines kept
byte for byte, the rows appended (which rows merge, and which are refused with their file and
line, is specs/labels.py, shared with the `merge-labels` runtime) — and rewrites the `digest:` of
the Dataset's spec in place, on the line the loader says it is on, so the plan shows which Models
retrain. With ``commit``, the two files are committed (nothing else), through
:mod:`reconciler.load.gitrepo` (no hooks, no filters: nothing in the tree runs).

A sharded `file://` source (`source.shards`) keeps its shards as they are: the merged rows become
one new Parquet shard in its folder (the pinned shards' columns and types, named
`labels-<12 hex of its digest>.parquet` or after the glob), written by `python -m runtimes
merge-labels` in the runtime environment (forgectl's own has no Parquet library); its entry is
appended to `source.shards.files` after the last one's lines and `digest:` moves to the new root,
so the plan shows one new shard and only its group prepares. A `pvc://` or `s3://` source is
refused (the shard belongs where the data lives).

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
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    if spec.source.shards is not None:
        return _merge_shard(result, doc, raw, reviewed, auto_labels, env=env, commit=commit)
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


def _merge_shard(result: Any, doc: Any, raw: Any, reviewed: Path, auto_labels: Path | None, *,
                 env: str | None, commit: bool) -> LabelsMerge:
    """A sharded source: the merged rows become one new Parquet shard in the source's folder (written
    by `python -m runtimes merge-labels` in the runtime environment, which has Parquet; forgectl's own
    has none), appended to `source.shards.files` in the spec with its digest, and the `digest:` line
    re-pinned to the new root: the plan shows one new shard, and only its group prepares."""
    dataset, spec = doc.name, doc.spec
    shards = spec.source.shards
    uri_line = raw.position(("spec", "source", "uri"))[0]
    scheme = spec.source.uri.partition("://")[0]
    if scheme != "file":
        raise ForgeError(f"{raw.file}:{uri_line}: `forgectl labels merge` writes a shard into a `file://` source only; "
                         f"{spec.source.uri} is {scheme}://: write the shard where the data lives (`python -m runtimes "
                         "merge-labels` in the runtime environment writes it, with `merge.json` giving its name, digest "
                         "and the new root), then pin it in `source.shards.files` and `digest`")
    environment = result.specs.environment(env)
    folder_part, glob = spec.source.folder_and_glob
    try:
        root = resolve_inside(Path.cwd(), environment.spec.root if environment else ".", what="root")
        folder = resolve_inside(root, folder_part, what="source")
    except OutsideRoot as exc:
        raise ForgeError(f"{raw.file}:{uri_line}: {exc}") from None
    if not folder.is_dir():
        raise ForgeError(f"{raw.file}:{uri_line}: the source's folder {printable(str(folder))} does not exist")
    auto_path = _auto_labels_for(spec, raw, dataset, reviewed, auto_labels)
    last = len(shards.files) - 1
    item = ("spec", "source", "shards", "files", last)
    name_line, digest_item_line = raw.position((*item, "name"))[0], raw.position((*item, "digest"))[0]
    digest_line = raw.position(("spec", "digest"))[0]
    spec_path = Path(raw.file)
    lines = spec_path.read_bytes().decode("utf-8").splitlines(keepends=True)
    first, end = min(name_line, digest_item_line), max(name_line, digest_item_line)
    block = "".join(lines[first - 1 : end]) if 0 < first <= end <= len(lines) else ""
    if (not block.lstrip().startswith("- ") or block.count(shards.files[-1].name) != 1
            or block.count(shards.files[-1].digest) != 1 or end - first > 1
            or not 0 < digest_line <= len(lines) or lines[digest_line - 1].count(spec.digest) != 1):
        raise ForgeError(f"{raw.file}:{name_line}: the last shard of `source.shards.files` and the `digest` are not "
                         "written one item a line (`- name: …` then `digest: …`, or `- {name: …, digest: …}`) with "
                         "`digest: …` on a line of its own; nothing was written (write the shard's entry by hand)")
    with tempfile.TemporaryDirectory(prefix="forge-labels-") as tmp:
        workspace = Path(tmp)
        (workspace / "labels").mkdir()
        (workspace / "labels" / "auto-labels.csv").write_bytes(auto_path.read_bytes())
        review_copy = workspace / reviewed.name
        review_copy.write_bytes(reviewed.read_bytes())
        done = _run_merge_labels(dataset, spec, root, workspace, review_copy.name, f"{raw.file}:{uri_line}")
        new_name, file_digest, new_root = str(done["file"]), str(done["fileDigest"]), str(done["newDigest"])
        target = folder / new_name
        if target.exists():
            raise ForgeError(f"{printable(str(target))}: a file of that name is in the source's folder already "
                             "(these labels were merged before): nothing written")
        entry = block.replace(shards.files[-1].name, new_name).replace(shards.files[-1].digest, file_digest)
        if not entry.endswith(("\n", "\r")):
            entry += "\r\n" if lines[first - 1].endswith("\r\n") else "\n"
        new_lines = [*lines[:end], entry, *lines[end:]]
        at = digest_line - 1 + (1 if digest_line > end else 0)
        new_lines[at] = new_lines[at].replace(spec.digest, new_root)
        new_text = "".join(new_lines)
        _check_rewrite(new_text, raw, doc, new_name, file_digest, new_root)
        staged = workspace / "out" / new_name
        shutil.copyfile(staged, folder / f".{new_name}.tmp")
        os.replace(folder / f".{new_name}.tmp", target)
        try:
            _write(spec_path, new_text.encode("utf-8"))
        except BaseException:
            target.unlink(missing_ok=True)
            raise
    new_line = digest_line + (entry.count("\n") if digest_line > end else 0)
    outcome = LabelsMerge(dataset, str(target), raw.file, new_line, spec.digest, new_root, int(done["autoLabelled"]),
                          int(done["accepted"]), int(done["rejected"]), int(done["rows"]), shard=new_name,
                          shard_digest=file_digest, shards=len(shards.files) + 1)
    if not commit:
        return outcome
    message = (f"Labels for dataset {dataset}: {outcome.auto_labelled} auto-labelled and {outcome.accepted} reviewed "
               f"rows merged as the shard {new_name}\n\n{spec.source.uri}: {spec.digest} → {new_root}\n")
    return LabelsMerge(**{**outcome.__dict__, "commit": _commit([target, spec_path], message)})


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


def _run_merge_labels(dataset: str, spec: Any, root: Path, workspace: Path, review: str, where: str) -> dict[str, Any]:
    """`python -m runtimes merge-labels` in the runtime environment, in ``workspace``; its `merge.json`.
    A refusal keeps the step's own file:line (a reviewed row's); one about the source's shards (exit
    2: the folder does not hold what the spec pins) gets ``where``, the source's line in the spec."""
    from reconciler.runtimeenv import FORGE_ROOT, runtime_python

    config = {"step": "merge-labels", "dataset": dataset, "spec": spec.model_dump(mode="json", by_alias=True),
              "labels": "labels", "review": review, "output": "out"}
    env = {**os.environ, "FORGE_WORKSPACE": str(workspace), "FORGE_SOURCE_ROOT": str(root),
           "PYTHONPATH": str(FORGE_ROOT)}
    try:
        proc = subprocess.run([runtime_python(), "-m", "runtimes", "merge-labels", "--config-json", json.dumps(config)],
                              env=env, capture_output=True, text=True, timeout=3600, cwd=str(root))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ForgeError(f"cannot run the merge-labels step in the runtime environment: {exc}") from None
    if proc.returncode != 0:
        errors = [ln.removeprefix("error: ") for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
        message = printable(errors[-1] if errors else proc.stderr.strip()[-2000:] or f"merge-labels exited {proc.returncode}")
        raise ForgeError((f"{where}: " if proc.returncode == 2 else "") + message + " (nothing was written)")
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
