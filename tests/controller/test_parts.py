"""The controller's parts that need no cluster: its configuration's errors (file:line), the Sync's
conditions, the webhook's signature check, and the fetch's refusals — on real files, a real git."""

from __future__ import annotations

import hashlib
import hmac
import subprocess
from pathlib import Path

import pytest

from reconciler.controller.config import load_config
from reconciler.controller.server import pushed_branch, signature_ok
from reconciler.controller.syncstatus import MAX_ROLLOUTS, RolloutLine, SyncReport, conditions, status_object
from reconciler.diagnostics import ForgeError, SpecError
from reconciler.load.gitrepo import GitError, fetch_source
from reconciler.observe.syncs import sync_lines, sync_view

GOOD = """\
apiVersion: forge.dev/v1alpha1
kind: ControllerConfig
sources:
  - name: quickstart
    url: git://127.0.0.1:9418/specs.git
    environment: cluster
    namespace: forge-quickstart
    interval: 10s
"""


def test_a_valid_configuration_has_the_documented_defaults(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(GOOD)
    config = load_config(path)
    [source] = config.sources
    assert (source.branch, source.path, source.interval_seconds, source.timeout_seconds, source.self_heal) == ("main", ".", 10.0, 60.0, False)
    assert source.push_writebacks is False  # a write-back is pushed only where a source says so
    assert (config.namespace, config.http.address, config.http.port) == ("forge-system", "127.0.0.1", 8080)
    assert (config.election.lease_duration, config.election.renew_deadline, config.election.retry_period) == ("15s", "10s", "2s")


@pytest.mark.parametrize(("change", "where", "says"), [
    (("interval: 10s", "interval: often"), ":8:", "sources.0.interval"),
    (("    environment: cluster\n", ""), ":4:", "environment"),
    (("name: quickstart", "name: Quick_Start"), ":4:", "sources.0.name"),
    (("kind: ControllerConfig", "kind: ControllerConfig\nsurprise: 1"), ":3:", "surprise"),
])
def test_a_bad_configuration_names_file_line_and_field(tmp_path: Path, change: tuple[str, str], where: str, says: str) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(GOOD.replace(*change))
    with pytest.raises(SpecError) as err:
        load_config(path)
    texts = [d.text() for d in err.value.diagnostics]
    assert any(f"{path}{where}" in t and says in t for t in texts), texts


def test_a_webhook_takes_its_secret_from_one_place(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(GOOD + "webhook: {secretRef: git-webhook}\n")
    assert load_config(path).secret_refs() == ("git-webhook",)  # the Role install renders may get it
    for webhook in ("{}", "{secretRef: git-webhook, secretFile: /etc/hook}"):
        path.write_text(GOOD + f"webhook: {webhook}\n")
        with pytest.raises(SpecError) as err:
            load_config(path)
        assert any(f"{path}:9:" in d.text() and "one of secretRef" in d.text() for d in err.value.diagnostics), \
            [d.text() for d in err.value.diagnostics]


def test_a_source_follows_one_of_branch_tag_or_semver_each_a_ref_name(tmp_path: Path) -> None:
    from reconciler.load.semverrange import highest_admitted

    path = tmp_path / "controller.yaml"
    for extra, says in (("    tag: v1.0.0\n    semver: '>=1'\n", "tag and semver are both set"),
                        ("    semver: 'one point x'\n", "is not a version range"),
                        ("    tag: 'v1..2'\n", "tag 'v1..2' is not a git ref name: it holds '..'"),
                        ("    branch: 'release/.next'\n", "its part '.next' begins with '.'")):
        path.write_text(GOOD + extra)
        with pytest.raises(SpecError) as err:
            load_config(path)
        assert any(f"{path}:4:" in d.text() and says in d.text() for d in err.value.diagnostics), [d.text() for d in err.value.diagnostics]
    path.write_text(GOOD + "    semver: '>=1.2,<2'\n")
    assert load_config(path).sources[0].ref == "semver >=1.2,<2"
    path.write_text(GOOD + "    semver: '^1.2'\n")
    assert load_config(path).sources[0].ref == "semver ^1.2"
    tags = ["v1.0.0", "v1.2.0", "1.3.1", "v1.10.0-rc.1", "v1.10.0rc1", "v2.0.0", "release-7", "v1.9.9"]
    # 1.10.0-rc.1 is a pre-release; 1.10.0rc1 and release-7 are no semantic versions (Flux skips them)
    assert highest_admitted(tags, ">=1.2,<2") == highest_admitted(tags, "^1.2") == ["v1.9.9"]
    assert highest_admitted(tags, ">=1.10.0-rc.1, <2") == ["v1.10.0-rc.1"]
    assert highest_admitted(tags, ">=3") == []


def test_two_sources_on_one_environment_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(GOOD + GOOD.split("sources:\n")[1].replace("name: quickstart", "name: other"))
    with pytest.raises(SpecError, match="1 problem") as err:
        load_config(path)
    assert "same environment and namespace" in err.value.diagnostics[0].message


def test_conditions_keep_their_transition_time_while_their_status_holds() -> None:
    first = conditions([], "Succeeded", "applied revision abc", 3, "2026-01-01T00:00:00Z")
    assert {c["type"]: (c["status"], c["reason"]) for c in first} == {
        "Ready": ("True", "Succeeded"), "Reconciling": ("False", "Succeeded"), "Stalled": ("False", "Succeeded")}
    later = conditions(first, "Succeeded", "applied revision def", 4, "2026-01-01T00:05:00Z")
    assert all(c["lastTransitionTime"] == "2026-01-01T00:00:00Z" and c["observedGeneration"] == 4 for c in later)
    failed = conditions(later, "ValidationFailed", "model.yaml:15:5: …", 4, "2026-01-01T00:06:00Z")
    by_type = {c["type"]: c for c in failed}
    assert by_type["Ready"]["status"] == "False" and by_type["Ready"]["lastTransitionTime"] == "2026-01-01T00:06:00Z"
    assert by_type["Stalled"]["status"] == "True" and by_type["Stalled"]["message"] == "model.yaml:15:5: …"
    assert by_type["Reconciling"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"  # False before, False now


def test_a_status_keeps_the_applied_revision_when_a_later_one_fails() -> None:
    stored = {"metadata": {"name": "q", "namespace": "ns", "generation": 2},
              "status": {"lastAppliedRevision": "aaa", "plan": {"created": 3, "configured": 0, "deleted": 0, "unchanged": 0}}}
    patch = status_object(stored, SyncReport("ValidationFailed", "bad", attempted="bbb", time="t",
                                             rollouts=(RolloutLine("digits", "Progressing", 1, 50, "step 2"),)))
    status = patch["status"]
    assert (status["lastAppliedRevision"], status["lastAttemptedRevision"], status["plan"]["created"]) == ("aaa", "bbb", 3)
    assert status["rollouts"] == [{"endpoint": "digits", "phase": "Progressing", "step": 1, "weight": 50, "reason": "step 2"}]


def test_a_status_of_thousands_of_rollouts_lists_those_in_progress_and_counts_every_phase() -> None:
    """10,000 endpoints' lines would make a status of megabytes (etcd keeps at most 1.5 MiB an object):
    it lists :data:`MAX_ROLLOUTS`, those in progress first, then those that failed, and counts all."""
    stored = {"metadata": {"name": "q", "namespace": "ns", "generation": 1}, "status": {}}
    lines = [RolloutLine(f"e{i:05}", "Idle", -1, 0, "at rest") for i in range(10_000)]
    lines[7000] = RolloutLine("e07000", "Progressing", 1, 50, "step 2")
    lines[42] = RolloutLine("e00042", "RolledBack", 0, 0, "error rate 0.3 > 0.05")
    lines[9] = RolloutLine("e00009", "Promoted", 2, 100, "every step passed")
    for i in range(20, 40):
        lines[i] = RolloutLine(f"e{i:05}", "WaitingForModel", -1, 0, "its Workflow runs")
    status = status_object(stored, SyncReport("Succeeded", "ok", time="t", rollouts=tuple(lines)))["status"]
    listed = [r["endpoint"] for r in status["rollouts"]]
    assert len(listed) == MAX_ROLLOUTS and listed == sorted(listed)
    assert {"e07000", "e00042", "e00009"} | {f"e{i:05}" for i in range(20, 40)} <= set(listed)
    assert status["rolloutPhases"] == {"Idle": 9_977, "Progressing": 1, "Promoted": 1, "RolledBack": 1, "WaitingForModel": 20}
    # a few endpoints: every line, whatever its phase; a report without rollouts keeps those written
    few = status_object(stored, SyncReport("Succeeded", "ok", time="t", rollouts=tuple(lines[:3])))["status"]
    assert [r["endpoint"] for r in few["rollouts"]] == ["e00000", "e00001", "e00002"] and few["rolloutPhases"] == {"Idle": 3}
    kept = status_object({**stored, "status": few}, SyncReport("Succeeded", "again", time="t2"))["status"]
    assert (kept["rollouts"], kept["rolloutPhases"]) == (few["rollouts"], few["rolloutPhases"])

    # `forgectl status` says how many there are before the lines it lists
    view = sync_view({"metadata": {"name": "q", "namespace": "ns"}, "spec": {"environment": "cluster"}, "status": status})
    text = sync_lines({"syncs": [view.to_json()], "note": None})
    assert "    rollouts: 9,977 Idle, 1 Progressing, 1 Promoted, 1 RolledBack, 20 WaitingForModel — 100 of 10,000 listed " \
           "(in progress first)" in text, text
    assert "    rollout e07000: Progressing, step 2, canary 50 %: step 2" in text
    assert not any(line.startswith("    rollouts:") for line in sync_lines({"syncs": [view.to_json()]}, endpoint="e07000"))


def test_the_webhook_signature_is_githubs() -> None:
    body = b'{"ref": "refs/heads/main"}'
    good = "sha256=" + hmac.new(b"secret", body, hashlib.sha256).hexdigest()
    assert signature_ok(b"secret", body, good)
    assert not signature_ok(b"other", body, good)
    assert not signature_ok(b"secret", body + b" ", good)
    assert not signature_ok(b"secret", body, good.replace("sha256=", "sha1="))
    assert not signature_ok(b"secret", body, None)
    assert pushed_branch(body) == "main" and pushed_branch(b'{"ref": "refs/tags/v1"}') is None and pushed_branch(b"[") is None


@pytest.mark.parametrize("url", ["git@example.com:specs.git", "ext::sh -c touch% /tmp/pwned", "/srv/specs.git",
                                 "fd::17", "-uhttps://x", "https://x/\x1b[31m"])
def test_a_fetch_refuses_urls_without_an_allowed_scheme(tmp_path: Path, url: str) -> None:
    with pytest.raises(GitError, match="not fetched"):
        fetch_source(tmp_path / "cache", url, "main", timeout=10)
    assert not (tmp_path / "cache").exists()


def test_a_fetch_refuses_a_branch_that_is_no_branch_name(tmp_path: Path) -> None:
    with pytest.raises(ForgeError):
        fetch_source(tmp_path / "cache", "file:///nowhere", "--upload-pack=touch", timeout=10)
    with pytest.raises(GitError, match="not a branch name"):
        fetch_source(tmp_path / "cache", "file:///nowhere", "main:refs/heads/x", timeout=10)


def test_a_fetch_takes_a_tag_and_lists_the_remotes_tags(tmp_path: Path) -> None:
    from devkit.gitserver import start_git_server
    from reconciler.load.gitrepo import remote_tags

    server = start_git_server(tmp_path)
    try:
        first = server.push("one")
        assert server.tag("v1.0.0", annotated=True) == first
        second = server.push("two")
        server.tag("v1.1.0")
        server.push("three, untagged")
        assert remote_tags(tmp_path / "cache", server.url, timeout=30) == ["v1.0.0", "v1.1.0"]
        # an annotated tag's commit, not the tag object; the branch's head is not fetched
        assert fetch_source(tmp_path / "cache", server.url, "main", timeout=30, tag="v1.0.0") == first
        assert fetch_source(tmp_path / "cache", server.url, "main", timeout=30, tag="v1.1.0") == second
        with pytest.raises(GitError, match="not a tag name"):
            fetch_source(tmp_path / "cache", server.url, "main", timeout=30, tag="v1..0")
        with pytest.raises(GitError, match="couldn't find remote ref"):
            fetch_source(tmp_path / "cache", server.url, "main", timeout=30, tag="v9.9.9")
    finally:
        server.stop()


def test_a_fetch_returns_the_branch_commit_into_a_cache_of_forges_own(tmp_path: Path) -> None:
    """A file:// fetch: the fetched commit is what the branch names, the cache has no work tree
    checked out, and a missing repository is a GitError naming the branch and URL."""
    origin = tmp_path / "origin"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
    subprocess.run(["git", "init", "-q", "--initial-branch=main", str(origin)], check=True, env=env)
    (origin / "a.yaml").write_text("x: 1\n")
    subprocess.run(["git", "add", "."], cwd=origin, check=True, env=env)
    subprocess.run(["git", "commit", "-qm", "one"], cwd=origin, check=True, env=env)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=origin, check=True, env=env, capture_output=True, text=True).stdout.strip()
    assert fetch_source(tmp_path / "cache", origin.as_uri(), "main", timeout=30) == head
    # the cache is Forge's own: no work tree checked out, nothing of the origin's configuration
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".git"]
    with pytest.raises(GitError, match="fetching main of file://"):
        fetch_source(tmp_path / "cache", (tmp_path / "missing").as_uri(), "main", timeout=30)


def test_of_one_versions_tags_the_newest_commits_is_taken_as_flux_takes_it(tmp_path: Path) -> None:
    """`v1.2.0` and `1.2.0+b` are one version to semver; Flux takes the tag whose commit is newer,
    whatever the names (here the older commit has the greater name)."""
    from devkit.gitserver import start_git_server
    from reconciler.load.gitrepo import newest_tag, remote_tags
    from reconciler.load.semverrange import highest_admitted

    server = start_git_server(tmp_path)
    try:
        older = server.push("quick-start")
        server.tag("v1.2.0")
        env = {"PATH": "/usr/bin:/bin", "HOME": str(server.work), "GIT_CONFIG_NOSYSTEM": "1",
               "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@forge.invalid", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@forge.invalid", "GIT_COMMITTER_DATE": "2030-01-01T00:00:00Z"}
        subprocess.run(["git", "commit", "--quiet", "--allow-empty", "-m", "later"], cwd=server.work, env=env, check=True)
        subprocess.run(["git", "push", "--quiet", "origin", "HEAD:main"], cwd=server.work, env=env, check=True)
        newer = server.tag("1.2.0+b")
        assert newer != older
        tags = remote_tags(tmp_path / "cache", server.url, timeout=30)
        tied = highest_admitted(tags, "^1")
        assert tied == ["1.2.0+b", "v1.2.0"]
        assert newest_tag(tmp_path / "cache", server.url, tied, timeout=30) == "1.2.0+b"
    finally:
        server.stop()
