"""`forgectl labels merge` on a sharded data set (issue 31; examples/sharded-labelled): the merged
rows become a new Parquet shard in the source's folder, its entry is appended to
`source.shards.files` after the last one's lines and the `digest:` line moves to the new root —
the rest of the spec file byte for byte; an `s3://` source gets its shard in the bucket (moto's S3
server, through the runtimes' own S3 client); refused with file:line, nothing written, for a
`pvc://` source, a shard list the command cannot extend in place, and rows that cannot merge.
The whole loop on the local target: tests/local/test_sharded_labelled_workflow.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import git
import pytest

from reconciler.load.loader import load_or_raise
from specs import Dataset
from specs.shards import labels_shard_name, root_digest
from tests.local.test_sharded_workflow import example_repo

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sharded-labelled"
HEADER = ",".join(f"p{i}" for i in range(64))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    example_repo(EXAMPLE, tmp_path / "repo")
    return tmp_path / "repo"


def _pinned(repo: Path) -> str:
    doc = load_or_raise([str(repo / "specs")]).specs.get(Dataset, "digits-labelled")
    assert doc is not None
    return doc.spec.digest


def _review(repo: Path, auto_rows: list[str], review_rows: list[str], digest: str | None = None) -> Path:
    """The `autolabel` step's files as a reviewer left them (its report names the digest labelled for)."""
    folder = repo / ".forge" / "workspace" / "labels"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "auto-labels.csv").write_text("\n".join([f"{HEADER},digit", *auto_rows]) + "\n")
    (folder / "review.csv").write_text("\n".join([f"row,{HEADER},_top1,_p1,digit", *review_rows]) + "\n")
    (folder / "report.json").write_text(json.dumps({"dataset": "digits-labelled", "datasetDigest": digest or _pinned(repo)}))
    return folder / "review.csv"


def _row(value: float, label: str) -> str:
    return ",".join([str(value)] * 64 + [label])


def _forgectl(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forgectl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})


def _files(repo: Path) -> dict[str, bytes]:
    return {str(p.relative_to(repo)): p.read_bytes() for p in [*(repo / "data").rglob("*"), *(repo / "specs").glob("*")]
            if p.is_file()}


def test_the_labels_shard_is_named_after_its_digest_and_matches_the_glob() -> None:
    digest = "sha256:" + "ab12" * 16
    assert labels_shard_name("*.parquet", digest) == "labels-ab12ab12ab12.parquet"
    assert labels_shard_name("part-*.parquet", digest) == "part-labels-ab12ab12ab12.parquet"
    assert labels_shard_name("part-0000[0-5].parquet", digest) is None


def _to_s3(repo: Path, bucket: str) -> None:
    """The example's Dataset read from ``bucket``'s `digits/` prefix (its Secret for the cluster's steps)."""
    spec = repo / "specs" / "dataset.yaml"
    spec.write_text(spec.read_text().replace("file://data/digits/*.parquet", f"s3://{bucket}/digits/*.parquet").replace(
        "      groupSize: 2\n", "      groupSize: 2\n      credentialsSecret: s3-reader\n"))


def test_a_pvc_source_on_the_local_target_is_refused_saying_why_and_what_to_do(repo: Path) -> None:
    """A claim is written through a pod of a cluster (tests/cluster/test_runtime_node.py stage 10
    merges into one): the local Environment has none."""
    spec = repo / "specs" / "dataset.yaml"
    spec.write_text(spec.read_text().replace("file://data/digits/*.parquet", "pvc://scans/digits/*.parquet"))
    review = _review(repo, [_row(1.0, "3")], [])
    before = _files(repo)
    done = _forgectl(repo, "labels", "merge", "digits-labelled", "--reviewed", str(review), "--specs", "specs")
    assert done.returncode == 1 and "specs/dataset.yaml:17:" in done.stderr, done.stderr
    assert "writes through a pod of the cluster the Environment names" in done.stderr, done.stderr
    assert "'local' is not a `kubernetes` Environment (name one with --env)" in done.stderr, done.stderr
    assert _files(repo) == before


def test_an_s3_source_without_credentials_in_the_shell_is_refused(repo: Path) -> None:
    _to_s3(repo, "bucket")
    review = _review(repo, [_row(1.0, "3")], [])
    before = _files(repo)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = subprocess.run([sys.executable, "-m", "forgectl", "labels", "merge", "digits-labelled", "--reviewed",
                           str(review), "--specs", "specs"], cwd=repo, capture_output=True, text=True, timeout=300,
                          env={**env, "NO_COLOR": "1", "COLUMNS": "200"})
    assert done.returncode == 1 and "specs/dataset.yaml:17:" in done.stderr, done.stderr
    assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set" in done.stderr and "nothing was written" in done.stderr
    assert _files(repo) == before


def test_a_shard_list_written_in_flow_style_is_refused(repo: Path) -> None:
    spec = repo / "specs" / "dataset.yaml"
    doc = load_or_raise([str(repo / "specs")]).specs.get(Dataset, "digits-labelled")
    assert doc is not None and doc.spec.source.shards is not None
    flow = ", ".join(f"{{name: {f.name}, digest: '{f.digest}'}}" for f in doc.spec.source.shards.files)
    lines = spec.read_text().splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.strip() == "files:")
    spec.write_text("".join([*lines[:start], f"      files: [{flow}]\n", *lines[start + 13:]]))
    assert load_or_raise([str(repo / "specs")]).specs.get(Dataset, "digits-labelled") is not None
    review = _review(repo, [_row(1.0, "3")], [])
    before = _files(repo)
    done = _forgectl(repo, "labels", "merge", "digits-labelled", "--reviewed", str(review), "--specs", "specs")
    assert done.returncode == 1 and "specs/dataset.yaml:" in done.stderr and "one item a line" in done.stderr, done.stderr
    assert _files(repo) == before


@pytest.mark.runtime
def test_merge_writes_one_shard_and_extends_the_spec_in_place(repo: Path, runtime_python: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_RUNTIME_PYTHON", runtime_python)  # the merge's Parquet is written by the runtime environment
    # a bad reviewed row first: refused with its file and line, nothing written
    review = _review(repo, [_row(1.0, "3")], ["4," + _row(2.0, "0.1,0.5,3"), "5," + _row(2.0, "0.1,0.5,12")])
    before = _files(repo)
    done = _forgectl(repo, "labels", "merge", "digits-labelled", "--reviewed", str(review), "--specs", "specs")
    assert done.returncode == 1 and "review.csv:3:" in done.stderr and "not one of the Dataset's classes" in done.stderr, done.stderr
    assert _files(repo) == before and "Traceback" not in done.stderr
    # a shard in the folder that the spec does not pin: refused at the source's line
    stray = repo / "data" / "digits" / "extra.parquet"
    stray.write_bytes((repo / "data" / "digits" / "part-00000.parquet").read_bytes())
    review = _review(repo, [_row(1.0, "3")], [])
    done = _forgectl(repo, "labels", "merge", "digits-labelled", "--reviewed", str(review), "--specs", "specs")
    assert done.returncode == 1 and "specs/dataset.yaml:17:" in done.stderr and "1 shard(s) not pinned: extra.parquet" in done.stderr, done.stderr
    stray.unlink()
    assert _files(repo) == before
    # two auto-labels and one accepted row (another left out)
    review = _review(repo, [_row(1.0, "3"), _row(0.0, "7")], ["4," + _row(2.0, "0.1,0.5,1"), "5," + _row(2.0, "0.1,0.5,")])
    old_text, old = (repo / "specs/dataset.yaml").read_text(), _pinned(repo)
    done = _forgectl(repo, "labels", "merge", "digits-labelled", "--reviewed", str(review), "--specs", "specs", "-o", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["autoLabelled"], result["accepted"], result["rejected"], result["rows"]) == (2, 1, 1, 3)
    name, digest = result["shard"], result["shardDigest"]
    assert (repo / "data" / "digits" / name).is_file() and result["oldDigest"] == old
    text = (repo / "specs/dataset.yaml").read_text()
    last = "          digest: sha256:c05760d525d601f3affef68d6db2a114efed771ae68617a6bceb96f12c34ec27\n"
    assert text == old_text.replace(last, f"{last}        - name: {name}\n          digest: {digest}\n").replace(
        old, result["newDigest"])  # two lines inserted, one changed: the rest byte for byte
    doc = load_or_raise([str(repo / "specs")]).specs.get(Dataset, "digits-labelled")
    assert doc is not None and doc.spec.source.shards is not None
    assert root_digest(doc.spec.source.shards.digests, 2) == result["newDigest"] == doc.spec.digest
    assert text.splitlines()[result["specLine"] - 1] == f"  digest: {result['newDigest']}"


@pytest.mark.runtime
def test_the_runtime_publishes_and_withdraws_only_the_shard_it_staged(repo: Path, runtime_python: str,
                                                                        tmp_path: Path) -> None:
    """`merge-labels --publish/--withdraw` (what `forgectl labels merge` runs after checking the
    spec's rewrite, and to undo it): the staged shard only — a pinned shard is never removed, and a
    name already in the folder is never overwritten."""
    review = _review(repo, [_row(1.0, "3")], [])
    workspace = tmp_path / "ws"
    (workspace / "labels").mkdir(parents=True)
    shutil.copy(review.parent / "auto-labels.csv", workspace / "labels")
    shutil.copy(review, workspace / "review.csv")
    doc = load_or_raise([str(repo / "specs")]).specs.get(Dataset, "digits-labelled")
    assert doc is not None
    config = json.dumps({"step": "merge-labels", "dataset": "digits-labelled", "labels": "labels", "output": "out",
                         "review": "review.csv", "spec": doc.spec.model_dump(mode="json", by_alias=True)})

    def step(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([runtime_python, "-m", "runtimes", "merge-labels", "--config-json", config, *args],
                              capture_output=True, text=True, timeout=300, env={
                                  "PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"], "FORGE_WORKSPACE": str(workspace),
                                  "FORGE_SOURCE_ROOT": str(repo)})

    assert step().returncode == 0
    name, folder = json.loads((workspace / "out" / "merge.json").read_text())["file"], repo / "data" / "digits"
    refused = step("--withdraw", "part-00000.parquet")
    assert refused.returncode == 1 and "not the new shard" in refused.stderr and (folder / "part-00000.parquet").is_file()
    assert step("--publish", name).returncode == 0 and (folder / name).is_file()
    again = step("--publish", name)
    assert again.returncode == 1 and "in the source's folder already" in again.stderr, again.stderr
    assert step("--withdraw", name).returncode == 0 and not (folder / name).exists()
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]  # no partial file left


@pytest.fixture
def s3_server() -> Iterator[dict[str, str]]:
    """moto's S3 server on 127.0.0.1 (a real S3 API, in this process's threads), and the AWS_*
    variables a shell would export for it."""
    pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield {"AWS_ACCESS_KEY_ID": "forge-test", "AWS_SECRET_ACCESS_KEY": "forge-test-secret",
               "AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_REGION": "us-east-1"}
    finally:
        server.stop()


@pytest.mark.runtime
def test_merge_into_an_s3_source_writes_the_shard_to_the_bucket_and_pins_it(
        repo: Path, runtime_python: str, s3_server: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    for key, value in {**s3_server, "FORGE_RUNTIME_PYTHON": runtime_python}.items():
        monkeypatch.setenv(key, value)  # the shell's credentials, as the AWS CLI would read them
    s3 = boto3.client("s3", endpoint_url=s3_server["AWS_ENDPOINT_URL"], region_name="us-east-1",
                      aws_access_key_id=s3_server["AWS_ACCESS_KEY_ID"], aws_secret_access_key=s3_server["AWS_SECRET_ACCESS_KEY"])
    s3.create_bucket(Bucket="forge-labels")
    for shard in sorted((repo / "data" / "digits").glob("*.parquet")):
        s3.upload_file(str(shard), "forge-labels", f"digits/{shard.name}")
    shutil.rmtree(repo / "data" / "digits")  # the data lives in the bucket only

    def objects() -> dict[str, bytes]:
        listed = s3.list_objects_v2(Bucket="forge-labels").get("Contents", [])
        return {o["Key"]: s3.get_object(Bucket="forge-labels", Key=o["Key"])["Body"].read() for o in listed}

    _to_s3(repo, "forge-labels")
    git.Repo(repo).git.commit("-am", "the data in S3")
    # a row that cannot merge: refused with its file and line, the bucket and the spec untouched
    review = _review(repo, [_row(1.0, "3")], ["4," + _row(2.0, "0.1,0.5,12")])
    before, stored = _files(repo), objects()
    done = _forgectl(repo, "labels", "merge", "digits-labelled", "--reviewed", str(review), "--specs", "specs")
    assert done.returncode == 1 and "review.csv:2:" in done.stderr and "not one of the Dataset's classes" in done.stderr, done.stderr
    assert _files(repo) == before and objects() == stored

    review = _review(repo, [_row(1.0, "3"), _row(0.0, "7")], ["4," + _row(2.0, "0.1,0.5,1"), "5," + _row(2.0, "0.1,0.5,")])
    old_text, old = (repo / "specs/dataset.yaml").read_text(), _pinned(repo)
    done = _forgectl(repo, "labels", "merge", "digits-labelled", "--reviewed", str(review), "--specs", "specs",
                     "--commit", "-o", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["autoLabelled"], result["accepted"], result["rejected"], result["rows"]) == (2, 1, 1, 3)
    name, digest = result["shard"], result["shardDigest"]
    assert result["source"] == f"s3://forge-labels/digits/{name}" and result["oldDigest"] == old
    after = objects()
    assert sorted(after) == sorted([*stored, f"digits/{name}"]) and all(after[k] == v for k, v in stored.items())
    assert "sha256:" + hashlib.sha256(after[f"digits/{name}"]).hexdigest() == digest
    last = "          digest: sha256:c05760d525d601f3affef68d6db2a114efed771ae68617a6bceb96f12c34ec27\n"
    assert (repo / "specs/dataset.yaml").read_text() == old_text.replace(
        last, f"{last}        - name: {name}\n          digest: {digest}\n").replace(old, result["newDigest"])
    doc = load_or_raise([str(repo / "specs")]).specs.get(Dataset, "digits-labelled")
    assert doc is not None and doc.spec.source.shards is not None
    assert root_digest(doc.spec.source.shards.digests, 2) == result["newDigest"] == doc.spec.digest
    head = git.Repo(repo).head.commit  # the spec only: the shard is an object in the bucket, not a file in git
    assert head.hexsha == result["commit"] and sorted(head.stats.files) == ["specs/dataset.yaml"]
    # the same review again: made for the old digest, refused, nothing written
    again = _forgectl(repo, "labels", "merge", "digits-labelled", "--reviewed", str(review), "--specs", "specs")
    assert again.returncode == 1 and "were made for" in again.stderr, again.stderr
    assert objects() == after


def test_the_autolabel_step_of_an_s3_sharded_source_gets_the_secret(repo: Path) -> None:
    """The step reads the first shard's columns from the Parquet footer and streams the shards'
    feature columns (to skip rows merged already), so on S3 it needs the credentials the data steps
    get (from the Secret; nothing else does)."""
    from renderers import RenderContext, render

    spec = repo / "specs" / "dataset.yaml"
    spec.write_text(spec.read_text().replace("file://data/digits/*.parquet", "s3://bucket/digits/*.parquet").replace(
        "      groupSize: 2\n", "      groupSize: 2\n      credentialsSecret: s3-reader\n"))
    specs = load_or_raise([str(repo / "specs")]).specs
    environment = specs.environment("cluster")
    assert environment is not None
    [wf] = [m for m in render(specs, RenderContext(environment, revision="0123456789ab")).manifests
            if m["kind"] == "Workflow" and m["metadata"]["name"].startswith("digits-tpe")]
    secrets = {t["name"]: {e["valueFrom"]["secretKeyRef"]["name"] for e in t["container"].get("env", []) if "valueFrom" in e
                           and "secretKeyRef" in e["valueFrom"]} for t in wf["spec"]["templates"] if "container" in t}
    assert sorted(name for name, refs in secrets.items() if refs) == ["autolabel", "prepare-data", "prepare-group"]
    assert secrets["autolabel"] == {"s3-reader"}  # prepare-data is the join of the shards
