"""Git credentials from a Kubernetes Secret: a real smart-HTTP server (git's own `git http-backend`
behind Basic authentication, devkit/gitserver.py) refuses the fetch without them and serves it with
them; the controller process reads them from the Secret its source names (FetchFailed naming the
Secret while it is missing, applied once it exists), and the password is in no message or log.
Over ssh, a real OpenSSH server (Debian's sshd, devkit/gitserver.py) refuses an unknown key and is
refused when its host key is not the one the Secret's known_hosts names; the controller fetches
with the Secret's key."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from devkit.gitserver import serve_http, serve_ssh, ssh_keypair, start_git_server
from reconciler.diagnostics import ForgeError
from reconciler.load.gitrepo import GitCredentials, GitError, _authenticated, fetch_source
from tests.polling import wait_until

PASSWORD = "s3cret-token-for-tests"


@pytest.fixture
def served(tmp_path: Path):
    server = start_git_server(tmp_path)
    http = serve_http(server.bare.parent, "forge", PASSWORD)
    try:
        yield server, f"{http.url}/specs.git"
    finally:
        http.stop()
        server.stop()


def test_an_http_fetch_needs_the_secrets_credentials(tmp_path: Path, served) -> None:
    server, url = served
    pushed = server.push("quick-start")
    with pytest.raises(GitError) as refused:
        fetch_source(tmp_path / "cache", url, "main", timeout=30)
    assert "401" in str(refused.value) or "Authentication failed" in str(refused.value) or "could not read" in str(refused.value)
    with pytest.raises(GitError) as wrong:
        fetch_source(tmp_path / "cache", url, "main", timeout=30, credentials=GitCredentials("forge", "not-it"))
    assert "not-it" not in str(wrong.value)
    good = GitCredentials("forge", PASSWORD)
    assert fetch_source(tmp_path / "cache", url, "main", timeout=30, credentials=good) == pushed
    assert PASSWORD not in repr(good) and repr(good) == "GitCredentials(username, password)"
    with pytest.raises(GitError, match="git:// source takes no credentials"):
        fetch_source(tmp_path / "other", server.url, "main", timeout=30, credentials=good)
    with pytest.raises(GitError, match="need an identity"):
        fetch_source(tmp_path / "other", url.replace("http://", "ssh://"), "main", timeout=30, credentials=good)


def test_ssh_credentials_reach_git_as_files_of_the_fetch_alone(tmp_path: Path) -> None:
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----"
    config, env = _authenticated("ssh", GitCredentials(identity=key, known_hosts="git.example ssh-ed25519 AAAA"), tmp_path)
    assert config == []
    command = env["GIT_SSH_COMMAND"]
    assert "StrictHostKeyChecking=yes" in command and "BatchMode=yes" in command and "not-a-real-key" not in command
    for name in ("identity", "known_hosts"):
        assert str(tmp_path / name) in command and stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600
    assert (tmp_path / "identity").read_text() == key + "\n"


@pytest.fixture
def ssh_served(tmp_path: Path):
    """The quick-start's git server, and sshd serving its repository to the key it returns."""
    server = start_git_server(tmp_path)
    identity, public = ssh_keypair(tmp_path / "keys", "client")
    sshd = serve_ssh(server.bare.parent, public, tmp_path / "sshd")
    try:
        yield server, sshd, identity
    finally:
        sshd.stop()
        server.stop()


def test_an_ssh_fetch_needs_the_key_and_the_servers_host_key(tmp_path: Path, ssh_served) -> None:
    server, sshd, identity = ssh_served
    pushed = server.push("quick-start")
    url = sshd.url("specs.git")
    with pytest.raises(GitError, match="Host key verification failed"):  # the user's own ssh setup is not used
        fetch_source(tmp_path / "none", url, "main", timeout=30)
    other, _ = ssh_keypair(tmp_path / "keys", "other")
    with pytest.raises(GitError, match=r"Permission denied \(publickey\)") as refused:
        fetch_source(tmp_path / "other", url, "main", timeout=30,
                     credentials=GitCredentials(identity=other, known_hosts=sshd.known_hosts))
    assert "PRIVATE KEY" not in str(refused.value)
    _, impostor = ssh_keypair(tmp_path / "keys", "impostor")  # known_hosts naming another host key
    with pytest.raises(GitError, match="Host key verification failed"):
        fetch_source(tmp_path / "spoofed", url, "main", timeout=30, credentials=GitCredentials(
            identity=identity, known_hosts=f"[127.0.0.1]:{sshd.port} {' '.join(impostor.split()[:2])}"))
    good = GitCredentials(identity=identity, known_hosts=sshd.known_hosts)
    assert fetch_source(tmp_path / "cache", url, "main", timeout=30, credentials=good) == pushed
    assert "PRIVATE KEY" not in repr(good)


def test_the_controller_fetches_over_ssh_with_the_secrets_key(kube_cluster, namespace, tmp_path: Path, ssh_served) -> None:
    from tests.controller.test_controller import Controllers, applied, kubectl, sync_status

    server, sshd, identity = ssh_served
    kubeconfig = kube_cluster.kubeconfig
    (tmp_path / "identity").write_text(identity)
    (tmp_path / "known_hosts").write_text(sshd.known_hosts + "\n")
    created = kubectl(kubeconfig, "-n", namespace, "create", "secret", "generic", "git-ssh",
                      f"--from-file=identity={tmp_path / 'identity'}", f"--from-file=known_hosts={tmp_path / 'known_hosts'}")
    assert created.returncode == 0, created.stderr
    first = server.push("quick-start")
    made = Controllers(tmp_path, kubeconfig, namespace, sshd.url("specs.git"), interval="2s", secret_ref="git-ssh")
    try:
        replica = made.start("a")
        wait_until(lambda: applied(kubeconfig, namespace, first), timeout=120, what="the revision fetched over ssh")
        assert "PRIVATE KEY" not in replica.output() and "PRIVATE KEY" not in str(sync_status(kubeconfig, namespace))
    finally:
        made.close()
    assert "Accepted publickey for" in sshd.log.read_text()


def test_the_controller_reads_its_credentials_from_the_secret(kube_cluster, namespace, tmp_path: Path, served) -> None:
    from tests.controller.test_controller import Controllers, applied, kubectl, ready, sync_status

    server, url = served
    kubeconfig = kube_cluster.kubeconfig
    first = server.push("quick-start")
    made = Controllers(tmp_path, kubeconfig, namespace, url, interval="2s", secret_ref="git-auth")
    try:
        replica = made.start("a")
        status = wait_until(lambda: (s := sync_status(kubeconfig, namespace)) and ready(s).get("reason") == "FetchFailed" and s,
                            timeout=60, what="the fetch refused without the Secret")
        assert f"Secret {namespace}/git-auth (the source's secretRef) does not exist" in ready(status)["message"]
        created = kubectl(kubeconfig, "-n", namespace, "create", "secret", "generic", "git-auth",
                          "--from-literal=username=forge", f"--from-literal=password={PASSWORD}")
        assert created.returncode == 0, created.stderr
        wait_until(lambda: applied(kubeconfig, namespace, first), timeout=120, what="the revision fetched with the Secret")
        assert PASSWORD not in replica.output()
        assert PASSWORD not in str(sync_status(kubeconfig, namespace))
        assert base64.b64encode(PASSWORD.encode()).decode() not in replica.output()
    finally:
        made.close()


def test_a_secret_without_credentials_is_named() -> None:
    from reconciler.controller.credentials import credentials_of

    with pytest.raises(ForgeError, match="holds none of the keys"):
        credentials_of({"data": {"other": "eA=="}}, "ns/git-auth")
    with pytest.raises(ForgeError, match="'password' is not base64"):
        credentials_of({"data": {"password": "%%%"}}, "ns/git-auth")
