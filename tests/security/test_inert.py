"""Promise 1 — pull-request mode is inert: `validate`, `render` and `plan --base` never run a
command, plugin or import that a spec or a file of the tree names, and never connect where the pull
request says. Credentials come from the runner only.

Every case plants something that would leave evidence if it ran — a marker file written by a shell
command, a process carrying the test's token, a connection to a listening socket — and checks the
evidence is absent after the real CLI finished.
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from tests.security.helpers import BASE, Project, doc, snapshot

EXEC_TOKEN_JSON = '{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"t"}}'


def kubeconfig(server: str, user: str) -> str:
    return (
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        f"users: [{{name: u, user: {user}}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )


def exec_user(project: Project, command: str = "/bin/sh") -> str:
    """A kubeconfig user whose exec plugin writes the marker, starts a long-lived process carrying
    the token, and answers with a token."""
    script = f"echo $$ > {project.marker}; (sh -c 'sleep 300' {project.token} &) ; echo '{EXEC_TOKEN_JSON}'"
    return ("{exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: " + command
            + ", args: ['-c', " + json.dumps(script) + "]}}")


class Listener:
    """A TCP socket on localhost that records every connection made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


def pull_request(project: Project, head_base: str) -> None:
    """Commit the base specs, then change the working tree to ``head_base`` (the PR's head)."""
    project.git_init()
    project.write("base.yaml", head_base)


def with_cluster_env(base: str, kubernetes: str) -> str:
    return base.replace("kubernetes: {namespace: team-a}", f"kubernetes: {kubernetes}")


def test_spec_kubeconfig_with_exec_plugin_never_runs(tmp_path: Path, listener: Listener) -> None:
    project = Project.create(tmp_path)
    project.write("../ci/kubeconfig", kubeconfig(listener.url, exec_user(project)))
    pull_request(project, with_cluster_env(BASE, "{namespace: team-a, kubeconfig: ci/kubeconfig}"))
    before = snapshot(project.outside)
    run = project.run("plan", "specs", "--base", "HEAD", "--env", "cluster", "-o", "json")
    assert run.returncode == 0, run.output
    notes = json.loads(run.stdout)["notes"]
    assert any("changes its cluster settings; the live diff uses those at HEAD" in n for n in notes), notes
    # The runner has no kubeconfig in this test: the spec's is never even considered.
    assert any(n.startswith("no live diff: kubeconfig") and "runner-has-no-kubeconfig" in n for n in notes), notes
    project.assert_untouched(before)
    assert listener.connections == 0


def test_runner_kubeconfig_inside_the_checkout_is_refused(tmp_path: Path, listener: Listener) -> None:
    """$KUBECONFIG pointing into the checkout (a CI mistake) is refused in PR mode: the PR could edit
    that file. Not read, so neither its exec plugin nor its server is reached."""
    project = Project.create(tmp_path)
    config = project.write("../ci/kubeconfig", kubeconfig(listener.url, exec_user(project)))
    pull_request(project, BASE.replace("{type: mlp}}", "{type: mlp}, hyperparameters: {epochs: 3}}"))
    before = snapshot(project.outside)
    run = project.run("plan", "specs", "--base", "HEAD", "--env", "cluster", "-o", "json",
                      env={"KUBECONFIG": str(config)})
    assert run.returncode == 0, run.output
    notes = json.loads(run.stdout)["notes"]
    assert f"no live diff: kubeconfig {config} is inside the repository under review ({project.root})" in " ".join(notes)
    project.assert_untouched(before)
    assert listener.connections == 0


def test_runner_kubeconfig_with_a_relative_exec_command_is_refused(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    runner = tmp_path / "runner" / "kubeconfig"
    runner.parent.mkdir()
    runner.write_text(kubeconfig("https://127.0.0.1:9", exec_user(project, command="./hack/token.sh")))
    pull_request(project, BASE)
    before = snapshot(project.outside)
    run = project.run("plan", "specs", "--base", "HEAD", "--env", "cluster", "-o", "json", "--kubeconfig", str(runner))
    assert run.returncode == 0, run.output
    notes = " ".join(json.loads(run.stdout)["notes"])
    assert "the exec plugin runs './hack/token.sh', a relative path" in notes, notes
    project.assert_untouched(before)


def test_runner_kubeconfig_whose_plugin_lives_in_the_checkout_is_refused(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    plugin = project.write("../hack/token.sh", f"#!/bin/sh\ntouch {project.marker}\n")
    plugin.chmod(0o755)
    runner = tmp_path / "runner.kubeconfig"
    runner.write_text(kubeconfig("https://127.0.0.1:9", "{exec: {apiVersion: client.authentication.k8s.io/v1beta1, "
                                 f"command: {plugin}}}}}"))
    pull_request(project, BASE)
    before = snapshot(project.outside)
    run = project.run("plan", "specs", "--base", "HEAD", "--env", "cluster", "-o", "json", "--kubeconfig", str(runner))
    assert run.returncode == 0, run.output
    assert f"the exec plugin runs '{plugin}', inside the repository under review" in " ".join(json.loads(run.stdout)["notes"])
    project.assert_untouched(before)


def test_gcp_auth_provider_cmd_path_relative_is_refused(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    runner = tmp_path / "runner.kubeconfig"
    runner.write_text(kubeconfig("https://127.0.0.1:9", "{auth-provider: {name: gcp, config: {cmd-path: bin/gcloud, "
                                 "cmd-args: 'config config-helper'}}}"))
    pull_request(project, BASE)
    before = snapshot(project.outside)
    run = project.run("plan", "specs", "--base", "HEAD", "--env", "cluster", "-o", "json", "--kubeconfig", str(runner))
    assert run.returncode == 0, run.output
    assert "the auth-provider cmd-path runs 'bin/gcloud', a relative path" in " ".join(json.loads(run.stdout)["notes"])
    project.assert_untouched(before)


def test_a_new_cluster_environment_in_the_pull_request_is_not_contacted(tmp_path: Path, listener: Listener) -> None:
    """An Environment that only the PR defines cannot choose the namespace the runner's credential
    reads: no live diff, even with a working runner kubeconfig."""
    project = Project.create(tmp_path)
    runner = tmp_path / "runner.kubeconfig"
    runner.write_text(kubeconfig(listener.url, "{token: abc}"))
    head = BASE.replace("target: local, default: true", "target: local") + "---\n" + doc(
        "Environment", "target: kubernetes\ndefault: true\nkubernetes: {namespace: kube-system}\n"
        "defaults: {computeRef: cpu, rolloutPolicyRef: canary}\n", name="sneaky")
    pull_request(project, head)
    run = project.run("plan", "specs", "--base", "HEAD", "-o", "json", "--kubeconfig", str(runner))
    assert run.returncode == 0, run.output
    notes = json.loads(run.stdout)["notes"]
    assert "no live diff: environment `sneaky` is not a cluster environment at HEAD; a pull request cannot choose " \
           "where its plan reads from" in notes
    assert listener.connections == 0


def test_changed_namespace_uses_the_base_revisions(tmp_path: Path) -> None:
    """A PR moving `cluster` to kube-system: the live diff reads team-a (the reviewed setting) with
    the runner's credential, and only with GET (no dry-run apply, no write verb)."""
    import http.server

    requests: list[tuple[str, str]] = []

    class Api(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            requests.append((self.command, self.path))
            body = b'{"kind":"List","apiVersion":"v1","metadata":{},"items":[]}'
            self.send_response(200 if self.command == "GET" else 403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        project = Project.create(tmp_path)
        runner = tmp_path / "runner.kubeconfig"
        runner.write_text(kubeconfig(f"http://127.0.0.1:{server.server_address[1]}", "{token: abc}"))
        pull_request(project, with_cluster_env(BASE, "{namespace: kube-system}"))
        run = project.run("plan", "specs", "--base", "HEAD", "--env", "cluster", "-o", "json", "--kubeconfig", str(runner))
    finally:
        server.shutdown()
        thread.join(5)
    assert run.returncode == 0, run.output
    data = json.loads(run.stdout)
    assert "environment `cluster` changes its cluster settings; the live diff uses those at HEAD" in data["notes"]
    assert any(n.startswith("live: ") and "read-only" in n for n in data["notes"]), data["notes"]
    assert requests, "the runner's cluster was not read"
    assert {method for method, _ in requests} == {"GET"}, requests
    assert not [path for _, path in requests if "kube-system" in path], requests
    assert any("/namespaces/team-a/" in path for _, path in requests), requests


@pytest.mark.parametrize("command", ["validate", "render", "plan-base"])
def test_module_function_references_are_never_imported(tmp_path: Path, command: str) -> None:
    """`entrypoint` and `labeling.function` name Python code; a module of that name sits in the
    project root and in the specs folder. None is imported at validate, render or plan time."""
    project = Project.create(tmp_path)
    evil = f"import pathlib\npathlib.Path({str(project.marker)!r}).write_text('imported')\ndef build(**kw): pass\n"
    project.write("../evilmod.py", evil)
    project.write("evilmod.py", evil)
    project.write("../sitecustomize.py", evil)
    extra = (doc("Model", "datasetRef: digits\narchitecture: {type: custom, entrypoint: 'evilmod:build'}\nparameters: 1000\n",
                 name="custom")
             + "---\n" + doc("Dataset", 'source: {uri: "file://data/t.csv", format: csv}\nversion: "1"\n'
                             f"digest: sha256:{'2' * 64}\nlabeling: {{function: 'evilmod:label'}}\n", name="tab"))
    if command == "plan-base":
        project.git_init()
    project.write("custom.yaml", extra)
    before = snapshot(project.outside)
    args = {"validate": ["validate", "specs"], "render": ["render", "specs"],
            "plan-base": ["plan", "specs", "--base", "HEAD", "-o", "markdown"]}[command]
    run = project.run(*args)
    assert run.returncode == 0, run.output
    project.assert_untouched(before)


def test_python_m_forgectl_does_not_import_a_specs_package_from_the_checkout(tmp_path: Path) -> None:
    """Forge's own packages are named `specs`, `renderers`, `reconciler`: a `specs/__init__.py` in the
    checkout must not run in place of Forge's, even under `python -m forgectl` (cwd on sys.path)."""
    import sys

    project = Project.create(tmp_path)
    project.write("__init__.py", f"import pathlib\npathlib.Path({str(project.marker)!r}).write_text('x')\n")
    project.write("../renderers/__init__.py", f"import pathlib\npathlib.Path({str(project.marker)!r}).write_text('x')\n")
    before = snapshot(project.outside)
    run = project.run("validate", "specs", command=[sys.executable, "-m", "forgectl"])
    assert run.returncode == 0, run.output
    assert "valid" in run.output
    project.assert_untouched(before)


def test_prometheus_url_of_a_spec_is_never_contacted(tmp_path: Path, listener: Listener) -> None:
    project = Project.create(tmp_path)
    hostile = with_cluster_env(BASE, "{namespace: team-a}").replace(
        "kubernetes: {namespace: team-a}", f"kubernetes: {{namespace: team-a}}\n  prometheus: {{url: '{listener.url}'}}")
    pull_request(project, hostile)
    for args in (["validate", "specs"], ["render", "specs", "--env", "cluster"],
                 ["plan", "specs", "--base", "HEAD", "--env", "cluster", "-o", "markdown"]):
        run = project.run(*args)
        assert run.returncode == 0, run.output
    assert listener.connections == 0


def test_pull_request_mode_writes_nothing(tmp_path: Path) -> None:
    """`validate`, `render` and `plan --base` leave the checkout byte for byte as it was (no state
    folder, no cache) and write nothing outside it."""
    project = Project.create(tmp_path)
    pull_request(project, BASE.replace("{type: mlp}}", "{type: mlp}, hyperparameters: {epochs: 3}}"))
    before_project, before_outside = snapshot(project.root), snapshot(project.outside)
    for args in (["validate", "specs"], ["validate", "specs", "--rev", "HEAD"], ["render", "specs"],
                 ["plan", "specs", "--base", "HEAD", "-o", "markdown"], ["plan", "specs", "--base", "HEAD", "--env", "cluster"]):
        run = project.run(*args)
        assert run.returncode == 0, run.output
    project.assert_untouched(before_outside, before_project)
