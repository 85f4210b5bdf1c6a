"""Git credentials from a Kubernetes Secret: a real smart-HTTP server (git's own `git http-backend`
behind Basic authentication, devkit/gitserver.py) refuses the fetch without them and serves it with
them; the controller process reads them from the Secret its source names (FetchFailed naming the
Secret while it is missing, applied once it exists), and the password is in no message or log.
Over https, the same server with a certificate of a private certificate authority is refused
until the Secret's `ca.crt` names that authority.
Over ssh, a real OpenSSH server (Debian's sshd, devkit/gitserver.py) refuses an unknown key and is
refused when its host key is not the one the Secret's known_hosts names; the controller fetches
with the Secret's key."""

from __future__ import annotations

import base64
import json
import os
import re
import stat
from pathlib import Path

import pytest

from devkit.certs import issue_cert, make_ca
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


@pytest.fixture
def served_tls(tmp_path: Path):
    """The quick-start's git server over https, its certificate issued by a private CA (``ca``)
    for 127.0.0.1; ``other`` is a CA that issued nothing of it."""
    pki = tmp_path / "pki"
    pki.mkdir()
    make_ca(pki, "ca", "forge-tests private CA")
    make_ca(pki, "other", "forge-tests other CA")
    issue_cert(pki, "ca", "server", "/CN=git.forge.test", server_sans="IP:127.0.0.1")
    server = start_git_server(tmp_path)
    https = serve_http(server.bare.parent, "forge", PASSWORD, tls=(pki / "server.crt", pki / "server.key"))
    try:
        yield server, f"{https.url}/specs.git", pki
    finally:
        https.stop()
        server.stop()


def _secret(**values: str) -> dict[str, dict[str, str]]:
    """A Secret as the API server returns it (``data`` base64), keys given as keyword arguments."""
    return {"data": {key.replace("_", "."): base64.b64encode(v.encode()).decode() for key, v in values.items()}}


def test_an_https_fetch_trusts_the_certificate_authority_of_the_secret(tmp_path: Path, served_tls) -> None:
    from reconciler.controller.credentials import credentials_of

    server, url, pki = served_tls
    assert url.startswith("https://127.0.0.1:")
    pushed = server.push("quick-start")
    ca, other = (pki / "ca.crt").read_text(), (pki / "other.crt").read_text()
    refused = "certificate verification failed|SSL certificate problem"
    with pytest.raises(GitError, match=refused):  # the system's authorities do not know the private one
        fetch_source(tmp_path / "none", url, "main", timeout=30, credentials=GitCredentials("forge", PASSWORD))
    with pytest.raises(GitError, match=refused):
        fetch_source(tmp_path / "other", url, "main", timeout=30,
                     credentials=GitCredentials("forge", PASSWORD, ca_cert=other))
    # the keys a Flux Secret has, read as the controller reads them
    read = credentials_of(_secret(username="forge", password=PASSWORD, ca_crt=ca), "ns/git-tls")
    assert read.ca_cert == ca and repr(read) == "GitCredentials(username, password, ca_cert)"
    assert fetch_source(tmp_path / "cache", url, "main", timeout=30, credentials=read) == pushed
    assert credentials_of({"data": {"caFile": _secret(ca_crt=ca)["data"]["ca.crt"]}}, "ns/git-tls").ca_cert == ca
    # a CA alone: the server still asks for its password, which is the 401's business, not TLS's
    with pytest.raises(GitError) as anonymous:
        fetch_source(tmp_path / "anonymous", url, "main", timeout=30, credentials=GitCredentials(ca_cert=ca))
    assert not re.search(refused, str(anonymous.value)), anonymous.value
    with pytest.raises(GitError, match="is for an https source, not http://"):
        fetch_source(tmp_path / "plain", url.replace("https://", "http://"), "main", timeout=30, credentials=read)


def test_an_https_server_asking_a_client_certificate_gets_the_secrets(tmp_path: Path) -> None:
    from reconciler.controller.credentials import credentials_of

    pki = tmp_path / "pki"
    pki.mkdir()
    make_ca(pki, "ca", "forge-tests private CA")
    issue_cert(pki, "ca", "server", "/CN=git.forge.test", server_sans="IP:127.0.0.1")
    issue_cert(pki, "ca", "client", "/CN=forge-controller")
    make_ca(pki, "other", "forge-tests other CA")
    issue_cert(pki, "other", "stranger", "/CN=someone-else")
    server = start_git_server(tmp_path)
    https = serve_http(server.bare.parent, "forge", PASSWORD, tls=(pki / "server.crt", pki / "server.key"),
                       client_ca=pki / "ca.crt")
    try:
        pushed = server.push("quick-start")
        url = f"{https.url}/specs.git"
        ca = (pki / "ca.crt").read_text()
        with pytest.raises(GitError, match="unable to access"):  # no client certificate: the handshake fails
            fetch_source(tmp_path / "none", url, "main", timeout=30, credentials=GitCredentials("forge", PASSWORD, ca_cert=ca))
        with pytest.raises(GitError, match="unable to access"):  # one another CA issued
            fetch_source(tmp_path / "stranger", url, "main", timeout=30, credentials=GitCredentials(
                "forge", PASSWORD, ca_cert=ca, client_cert=(pki / "stranger.crt").read_text(),
                client_key=(pki / "stranger.key").read_text()))
        read = credentials_of(_secret(username="forge", password=PASSWORD, ca_crt=ca, tls_crt=(pki / "client.crt").read_text(),
                                      tls_key=(pki / "client.key").read_text()), "ns/git-mtls")
        assert "PRIVATE KEY" not in repr(read)
        # the certificate alone passes the handshake: then the server's own Basic authentication asks
        with pytest.raises(GitError, match="could not read Username"):
            fetch_source(tmp_path / "no-password", url, "main", timeout=30, credentials=GitCredentials(
                ca_cert=ca, client_cert=read.client_cert, client_key=read.client_key))
        assert fetch_source(tmp_path / "cache", url, "main", timeout=30, credentials=read) == pushed
    finally:
        https.stop()
        server.stop()
    with pytest.raises(ForgeError, match="'tls.crt' .* and key 'tls.key' .* go together"):
        credentials_of(_secret(tls_crt=(pki / "client.crt").read_text()), "ns/git-mtls")
    with pytest.raises(ForgeError, match="key 'tls.key' holds no PEM private key"):
        credentials_of(_secret(tls_crt=(pki / "client.crt").read_text(), tls_key="hunter2"), "ns/git-mtls")


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


def test_the_controller_fetches_over_https_trusting_the_secrets_ca(kube_cluster, namespace, tmp_path: Path,
                                                                   served_tls) -> None:
    from tests.controller.test_controller import Controllers, applied, kubectl, ready, sync_status

    server, url, pki = served_tls
    kubeconfig = kube_cluster.kubeconfig
    first = server.push("quick-start")
    made = Controllers(tmp_path, kubeconfig, namespace, url, interval="2s", secret_ref="git-tls")
    try:
        made.start("a")
        created = kubectl(kubeconfig, "-n", namespace, "create", "secret", "generic", "git-tls",
                          "--from-literal=username=forge", f"--from-literal=password={PASSWORD}")
        assert created.returncode == 0, created.stderr
        status = wait_until(lambda: (s := sync_status(kubeconfig, namespace)) and ready(s).get("reason") == "FetchFailed"
                            and "certificate" in ready(s).get("message", "") and s,
                            timeout=60, what="the fetch refused while the Secret names no CA")
        assert "server certificate verification failed" in ready(status)["message"], ready(status)
        patched = kubectl(kubeconfig, "-n", namespace, "patch", "secret", "git-tls", "--type=merge", "-p",
                          json.dumps({"data": {"ca.crt": base64.b64encode((pki / "ca.crt").read_bytes()).decode()}}))
        assert patched.returncode == 0, patched.stderr
        wait_until(lambda: applied(kubeconfig, namespace, first), timeout=120, what="the revision fetched over https")
    finally:
        made.close()


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
    with pytest.raises(ForgeError, match="ns/git-auth: key 'ca.crt' holds no PEM certificate OpenSSL can load"):
        credentials_of(_secret(ca_crt="-----BEGIN PRIVATE KEY-----\nnot a certificate\n-----END PRIVATE KEY-----"),
                       "ns/git-auth")
    with pytest.raises(ForgeError, match="key 'caFile' holds no PEM certificate"):
        credentials_of(_secret(caFile="-----BEGIN CERTIFICATE-----\nbm90IERFUg==\n-----END CERTIFICATE-----"),
                       "ns/git-auth")
