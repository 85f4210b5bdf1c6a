"""`forgectl controller run` as real processes against the real kube-apiserver (+ etcd and the real
CRDs, Forge's Sync among them) and a real git server (`git daemon` on 127.0.0.1): the controller
pulls the pushed specs and applies them through the same plan and apply as the CLI, refuses an
invalid revision (Ready=False, ValidationFailed, file:line; nothing applied), takes a fix; two
replicas elect one leader on the environment's Lease, and a SIGKILLed leader is replaced within
the Lease's duration. Everything asserted is read from the API server (and the controller's
HTTP endpoints)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.gitserver import GitServer, start_git_server
from reconciler.targets.local.processes import free_port
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
FORGECTL = [sys.executable, "-m", "forgectl"]
SOURCE = "quickstart"


@pytest.fixture
def git_server(tmp_path: Path) -> Iterator[GitServer]:
    server = start_git_server(tmp_path)
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Replica:
    """One controller process."""

    name: str
    process: subprocess.Popen[str]
    port: int
    log: Path

    @property
    def identity(self) -> str:
        return f"forge-controller/{self.name}"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def leads(self) -> bool:
        status, text = self.get("/metrics")
        return status == 200 and f'forge_controller_leader{{source="{SOURCE}"}} 1.0' in text

    def follows(self) -> bool:
        """Its gauge says 0: a follower is counted by the "no leader" alert, not absent from it."""
        status, text = self.get("/metrics")
        return status == 200 and f'forge_controller_leader{{source="{SOURCE}"}} 0.0' in text

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Controllers:
    """Starts replicas of one configuration; kills what is left at the end."""

    def __init__(self, tmp: Path, kubeconfig: str, namespace: str, url: str, *, interval: str,
                 secret: bytes | None = None, self_heal: bool = False, secret_ref: str | None = None,
                 webhook_ref: str | None = None, semver: str | None = None) -> None:
        self.tmp, self.kubeconfig, self.namespace, self.url = tmp, kubeconfig, namespace, url
        self.interval, self.secret, self.self_heal, self.secret_ref = interval, secret, self_heal, secret_ref
        self.webhook_ref, self.semver = webhook_ref, semver
        self.replicas: list[Replica] = []

    def start(self, name: str) -> Replica:
        port = free_port()
        config: dict[str, Any] = {
            "apiVersion": "forge.dev/v1alpha1", "kind": "ControllerConfig", "namespace": self.namespace,
            "identity": f"forge-controller/{name}", "cacheDir": str(self.tmp / f"cache-{name}"),
            "http": {"address": "127.0.0.1", "port": port},
            "sources": [{"name": SOURCE, "url": self.url, "branch": "main", "path": ".", "environment": "cluster",
                         "namespace": self.namespace, "interval": self.interval, "timeout": "30s",
                         "selfHeal": self.self_heal, **({"secretRef": self.secret_ref} if self.secret_ref else {}),
                         **({"semver": self.semver} if self.semver else {})}],
        }
        if self.secret is not None:
            secret_file = self.tmp / "webhook-secret"
            secret_file.write_bytes(self.secret)
            config["webhook"] = {"secretFile": str(secret_file)}
        if self.webhook_ref is not None:
            config["webhook"] = {"secretRef": self.webhook_ref}
        path = self.tmp / f"controller-{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        log = self.tmp / f"controller-{name}.log"
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "NO_COLOR": "1"}
        process = subprocess.Popen([*FORGECTL, "controller", "run", "--config", str(path)], cwd=self.tmp, env=env,
                                   stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
        replica = Replica(name, process, port, log)
        self.replicas.append(replica)
        wait_until(lambda: replica.get("/readyz")[0] == 200, timeout=60, what=f"controller {name}'s /readyz",
                   ignore=(OSError,))
        return replica

    def close(self) -> None:
        for replica in self.replicas:
            if replica.process.poll() is None:
                replica.process.send_signal(signal.SIGTERM)
        for replica in self.replicas:
            try:
                replica.process.wait(20)
            except subprocess.TimeoutExpired:
                replica.process.kill()


@pytest.fixture
def controllers(tmp_path: Path, kube_cluster, namespace: str, git_server: GitServer, request) -> Iterator[Controllers]:
    interval, secret, self_heal = getattr(request, "param", ("2s", None, False))
    made = Controllers(tmp_path, kube_cluster.kubeconfig, namespace, git_server.url, interval=interval, secret=secret,
                       self_heal=self_heal)
    try:
        yield made
    finally:
        made.close()
        for replica in made.replicas:
            assert "internal error" not in replica.output(), replica.output()[-4000:]


def kubectl(kubeconfig: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, check=check,
                          timeout=180)


def sync_object(kubeconfig: str, namespace: str) -> dict[str, Any]:
    done = kubectl(kubeconfig, "-n", namespace, "get", f"sync/{SOURCE}", "-o", "json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def sync_status(kubeconfig: str, namespace: str) -> dict[str, Any]:
    return sync_object(kubeconfig, namespace).get("status", {})


def ready(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})


def applied(kubeconfig: str, namespace: str, revision: str) -> dict[str, Any] | None:
    status = sync_status(kubeconfig, namespace)
    return status if status.get("lastAppliedRevision") == revision and ready(status).get("status") == "True" else None


def live_versions(kubeconfig: str, namespace: str) -> dict[str, str]:
    done = kubectl(kubeconfig, "-n", namespace, "get", "workflows,seldondeployments,prometheusrules,podmonitors,configmaps",
                   "-l", "app.kubernetes.io/managed-by=forgectl", "-o", "json")
    return {f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"] for o in json.loads(done.stdout)["items"]}


def forgectl(kubeconfig: str, work: Path, *args: str) -> str:
    """A read-only forgectl command on the host (status, rollout status), its stdout."""
    done = subprocess.run([*FORGECTL, *args], capture_output=True, text=True, cwd=work, timeout=120,
                          env={**os.environ, "KUBECONFIG": kubeconfig, "NO_COLOR": "1", "COLUMNS": "200"})
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


def lease_holder(kubeconfig: str, namespace: str) -> str | None:
    done = kubectl(kubeconfig, "-n", namespace, "get", "lease", "forgectl-cluster", "-o", "json", check=False)
    return json.loads(done.stdout)["spec"].get("holderIdentity") if done.returncode == 0 else None


def test_the_controller_applies_pushed_revisions_and_refuses_an_invalid_one(kube_cluster, namespace, git_server,
                                                                          controllers) -> None:
    kubeconfig = kube_cluster.kubeconfig
    first = git_server.push("quick-start")
    replica = controllers.start("a")
    # kubectl wait on the Sync's Ready condition (the CRD under deploy/crds/, kstatus conventions)
    wait_until(lambda: sync_status(kubeconfig, namespace), timeout=60, what="the Sync object")
    waited = kubectl(kubeconfig, "-n", namespace, "wait", "--for=condition=Ready", f"sync/{SOURCE}", "--timeout=120s",
                     check=False)
    assert waited.returncode == 0, (waited.stdout, waited.stderr, replica.output()[-3000:])
    status = sync_status(kubeconfig, namespace)
    assert status["lastAppliedRevision"] == first and status["lastAttemptedRevision"] == first
    assert ready(status)["reason"] == "Succeeded" and status["plan"]["created"] > 0
    assert status["leader"] == replica.identity == lease_holder(kubeconfig, namespace)
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Ready": "True", "Reconciling": "False", "Stalled": "False"}
    before = live_versions(kubeconfig, namespace)
    assert "SeldonDeployment/digits" in before and any(k.startswith("Workflow/") for k in before)

    # a CLI apply while the controller leads the environment is refused, naming the controller
    refused = subprocess.run([*FORGECTL, "apply", str(git_server.work), "--env", "cluster", "-n", namespace, "--auto-approve"],
                             capture_output=True, text=True, env={**os.environ, "KUBECONFIG": kubeconfig, "NO_COLOR": "1"},
                             cwd=git_server.work, timeout=120)
    assert refused.returncode != 0 and f"locked by {replica.identity}" in refused.stderr, refused.stderr

    # an invalid revision: not applied, Ready=False with the reason and file:line, an Event on the Sync
    git_server.edit("model.yaml", "learningRate: 0.002", "learningRate: fast")
    bad = git_server.push("a typo")
    status = wait_until(lambda: (s := sync_status(kubeconfig, namespace)).get("lastAttemptedRevision") == bad
                        and ready(s).get("status") == "False" and s, timeout=60, what="the invalid revision refused")
    condition = ready(status)
    assert condition["reason"] == "ValidationFailed", condition
    assert "model.yaml:15:" in condition["message"] and "learningRate" in condition["message"], condition["message"]
    assert status["lastAppliedRevision"] == first  # the previous revision keeps running
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True"
    assert live_versions(kubeconfig, namespace) == before  # nothing was written
    # `forgectl status` reads what the controller wrote: the refusal, its file:line, both revisions
    # (run on the example's own specs: the pushed working tree holds the typo)
    shown = forgectl(kubeconfig, ROOT, "status", "examples/quickstart", "--env", "cluster", "-n", namespace)
    assert f"sync/{SOURCE} ({namespace})  Ready=False ValidationFailed" in shown, shown
    assert "model.yaml:15:" in shown and f"applied {first}  attempted {bad}" in shown, shown
    assert "Stalled=True" in shown and f"leader {replica.identity}" in shown, shown
    events = json.loads(kubectl(kubeconfig, "-n", namespace, "get", "events", "--field-selector",
                                f"involvedObject.kind=Sync,involvedObject.name={SOURCE}", "-o", "json").stdout)["items"]
    assert any(e["reason"] == "ValidationFailed" and "model.yaml:15:" in e["message"] for e in events), events

    # the fix: applied (a new version's Workflow), Ready again
    git_server.edit("model.yaml", "learningRate: fast", "learningRate: 0.003")
    fixed = git_server.push("the fix")
    status = wait_until(lambda: applied(kubeconfig, namespace, fixed), timeout=90, what="the fixed revision applied")
    assert ready(status)["reason"] == "Succeeded"
    after = live_versions(kubeconfig, namespace)
    assert set(after) > set(before), "the new version's Workflow is live"
    status_code, metrics = replica.get("/metrics")
    assert status_code == 200
    assert f'forge_controller_last_applied_revision_info{{revision="{fixed}",source="{SOURCE}"}} 1.0' in metrics
    assert f'forge_controller_syncs_total{{result="ValidationFailed",source="{SOURCE}"}} 1.0' in metrics
    assert "forge_controller_git_fetch_duration_seconds_count" in metrics
    assert replica.get("/healthz")[0] == 200


@pytest.mark.parametrize("controllers", [("1h", b"s3cret-for-tests", False)], indirect=True)
def test_a_signed_push_webhook_syncs_at_once_and_a_bad_signature_is_refused(kube_cluster, namespace, git_server,
                                                                          controllers) -> None:
    """A push reaches whichever replica the Service picks: the leader syncs at once; a follower
    passes it on through the Sync's `forge.dev/requested-at`, and the leader syncs at once too."""
    kubeconfig = kube_cluster.kubeconfig
    first = git_server.push("quick-start")
    a, b = controllers.start("a"), controllers.start("b")
    wait_until(lambda: applied(kubeconfig, namespace, first), timeout=120, what="the first revision applied")
    leader, follower = (a, b) if lease_holder(kubeconfig, namespace) == a.identity else (b, a)

    def push(replica: Replica, lr: str, secret: bytes | None = b"s3cret-for-tests") -> tuple[str, int]:
        git_server.edit("model.yaml", "learningRate: 0.002", f"learningRate: {lr}")
        revision = git_server.push(f"learning rate {lr}")
        git_server.edit("model.yaml", f"learningRate: {lr}", "learningRate: 0.002")
        body = json.dumps({"ref": "refs/heads/main", "after": revision}).encode()
        headers = {"Content-Type": "application/json"}
        if secret is not None:
            headers["X-Hub-Signature-256"] = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
        return revision, replica.post("/hooks/git", body, headers)

    for replica in (leader, follower):  # refused by either: a wrong signature, none at all
        assert push(replica, "0.004", b"another secret")[1] == 401
        assert push(replica, "0.004", None)[1] == 401
    time.sleep(3)  # the interval is an hour: nothing but a valid webhook moves it
    assert sync_status(kubeconfig, namespace)["lastAttemptedRevision"] == first
    for replica, lr in ((leader, "0.003"), (follower, "0.005")):
        pushed = time.monotonic()
        revision, answer = push(replica, lr)
        assert answer == 202
        wait_until(lambda revision=revision: applied(kubeconfig, namespace, revision), timeout=60,
                   what=f"the revision pushed to the {'leader' if replica is leader else 'follower'} applied")
        assert time.monotonic() - pushed < 30
    sync = json.loads(kubectl(kubeconfig, "-n", namespace, "get", f"sync/{SOURCE}", "-o", "json").stdout)
    assert "forge.dev/requested-at" in sync["metadata"]["annotations"], sync["metadata"]
    assert "a push, passed on to the leader" in follower.output()
    assert "a sync requested" in leader.output()


def test_the_webhooks_secret_comes_from_a_secret_made_after_the_start(kube_cluster, namespace, git_server,
                                                                        tmp_path) -> None:
    """`webhook.secretRef`, as `forgectl install` runs it: the controller starts before the Secret
    exists (install makes its namespace), answers 503 naming the Secret, and takes the secret once
    it is made — no restart."""
    kubeconfig = kube_cluster.kubeconfig
    first = git_server.push("quick-start")
    made = Controllers(tmp_path, kubeconfig, namespace, git_server.url, interval="1h", webhook_ref="git-webhook")
    try:
        replica = made.start("a")
        wait_until(lambda: applied(kubeconfig, namespace, first), timeout=120, what="the first revision applied")
        body = json.dumps({"ref": "refs/heads/main"}).encode()
        headers = {"X-Hub-Signature-256": "sha256=" + hmac.new(b"rotated-later", body, hashlib.sha256).hexdigest()}
        assert replica.post("/hooks/git", body, headers) == 503
        assert f"Secret {namespace}/git-webhook (the webhook's secretRef) does not exist" in replica.output()
        created = kubectl(kubeconfig, "-n", namespace, "create", "secret", "generic", "git-webhook",
                          "--from-literal=secret=rotated-later")
        assert created.returncode == 0, created.stderr
        git_server.edit("model.yaml", "learningRate: 0.002", "learningRate: 0.003")
        second = git_server.push("learning rate")
        wait_until(lambda: replica.post("/hooks/git", body, headers) == 202, timeout=30, what="the Secret's secret taken")
        wait_until(lambda: applied(kubeconfig, namespace, second), timeout=60, what="the pushed revision applied")
        assert "rotated-later" not in replica.output()
    finally:
        made.close()


def test_a_semver_source_applies_the_highest_tag_in_its_range(kube_cluster, namespace, git_server, tmp_path) -> None:
    """A source following `semver: '^1.0'` (a Flux range): the branch's head is not applied, the highest tag in
    the range is; a tag outside it (v2.0.0) is not; with no tag in range the Sync says so."""
    kubeconfig = kube_cluster.kubeconfig
    git_server.push("quick-start, untagged")
    made = Controllers(tmp_path, kubeconfig, namespace, git_server.url, interval="2s", semver="^1.0")
    try:
        made.start("a")
        status = wait_until(lambda: (s := sync_status(kubeconfig, namespace)) and ready(s).get("reason") == "FetchFailed" and s,
                            timeout=60, what="no tag in the range yet")
        assert "no tag is in the range ^1.0" in ready(status)["message"], ready(status)
        v1 = git_server.tag("v1.0.0", annotated=True)
        wait_until(lambda: applied(kubeconfig, namespace, v1), timeout=120, what="v1.0.0 applied")
        git_server.edit("model.yaml", "learningRate: 0.002", "learningRate: 0.003")
        git_server.push("learning rate")
        v11 = git_server.tag("v1.1.0")
        wait_until(lambda: applied(kubeconfig, namespace, v11), timeout=60, what="v1.1.0 applied")
        git_server.edit("model.yaml", "learningRate: 0.003", "learningRate: 0.004")
        git_server.push("a major version")
        git_server.tag("v2.0.0")
        time.sleep(5)  # two intervals: v2.0.0 is outside the range
        assert sync_status(kubeconfig, namespace)["lastAppliedRevision"] == v11
        sync = json.loads(kubectl(kubeconfig, "-n", namespace, "get", f"sync/{SOURCE}", "-o", "json").stdout)
        assert sync["spec"]["semver"] == "^1.0" and "tag" not in sync["spec"], sync["spec"]
    finally:
        made.close()


def test_two_replicas_elect_one_leader_and_a_killed_leader_is_replaced(kube_cluster, namespace, git_server,
                                                                     controllers) -> None:
    kubeconfig = kube_cluster.kubeconfig
    first = git_server.push("quick-start")
    a = controllers.start("a")
    b = controllers.start("b")
    wait_until(lambda: applied(kubeconfig, namespace, first), timeout=120, what="the first revision applied")
    holder = lease_holder(kubeconfig, namespace)
    leader, follower = (a, b) if holder == a.identity else (b, a)
    assert holder == leader.identity, holder
    wait_until(leader.leads, timeout=10, what="the leader's gauge")
    assert not follower.leads()
    assert sync_status(kubeconfig, namespace)["leader"] == leader.identity
    time.sleep(5)  # two replicas, one Lease: the follower keeps following (it retries every 2 s)
    assert lease_holder(kubeconfig, namespace) == leader.identity and not follower.leads()
    assert follower.follows()

    leader.process.send_signal(signal.SIGKILL)
    leader.process.wait(10)
    killed = time.monotonic()
    wait_until(lambda: lease_holder(kubeconfig, namespace) == follower.identity, timeout=30,
               what="the follower to take the Lease over", interval=0.2)
    took = time.monotonic() - killed
    assert took <= 20, took  # the Lease's 15 s duration, and a retry every 2 s
    wait_until(follower.leads, timeout=10, what="the new leader's gauge")
    # the new leader resumes (the revision is applied: nothing re-applied) and takes the next push
    git_server.edit("model.yaml", "learningRate: 0.002", "learningRate: 0.003")
    second = git_server.push("learning rate")
    status = wait_until(lambda: applied(kubeconfig, namespace, second), timeout=90, what="the new leader applying")
    assert status["leader"] == follower.identity
    assert f"leading environment cluster as {follower.identity}" in follower.output()


def test_the_controller_runs_under_exactly_the_rbac_install_renders(kube_cluster, namespace, git_server, tmp_path) -> None:
    """The ServiceAccount and bindings `forgectl install -n NS --manage NS` renders, the ClusterRoles of
    docs/rbac/forgectl-role.yaml, and a token of that ServiceAccount: the controller applies, takes
    the Lease and writes its Sync status with those rights alone; the ServiceAccount can do no more."""
    admin = kube_cluster.kubeconfig
    roles = kubectl(admin, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "docs" / "rbac" / "forgectl-role.yaml"))
    assert roles.returncode == 0, roles.stderr
    rendered = subprocess.run([*FORGECTL, "install", "--dry-run", "-o", "yaml", "--namespace", namespace, "--manage", namespace],
                              capture_output=True, text=True, check=True, timeout=60).stdout
    wanted = ("ServiceAccount", "Role", "RoleBinding", "ClusterRoleBinding")
    rbac = [o for o in yaml.safe_load_all(rendered) if o["kind"] in wanted]
    done = subprocess.run(["kubectl", "--kubeconfig", admin, "apply", "--server-side", "--force-conflicts", "-f", "-"],
                          input="".join("---\n" + yaml.safe_dump(o) for o in rbac), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    account = f"system:serviceaccount:{namespace}:forge-controller"

    def can(verb: str, resource: str) -> bool:
        return kubectl(admin, "auth", "can-i", verb, resource, "-n", namespace, f"--as={account}", check=False).stdout.strip() == "yes"

    wait_until(lambda: can("create", "workflows.argoproj.io") and can("patch", "syncs.forge.dev/status"), timeout=15,
               what="the rendered bindings to take effect")
    assert not can("get", "secrets") and not can("delete", "services") and not can("create", "deployments.apps")
    token = kubectl(admin, "create", "token", "forge-controller", "-n", namespace, "--duration=1h").stdout.strip()
    config = yaml.safe_load(Path(admin).read_text())
    config["users"] = [{"name": "forge-controller", "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = "forge-controller"
    restricted = tmp_path / "forge-controller.kubeconfig"
    restricted.write_text(yaml.safe_dump(config))

    first = git_server.push("quick-start")
    made = Controllers(tmp_path, str(restricted), namespace, git_server.url, interval="2s")
    try:
        replica = made.start("rbac")
        status = wait_until(lambda: applied(admin, namespace, first), timeout=120, what="the revision applied under the rendered RBAC")
        assert status["leader"] == replica.identity and status["plan"]["created"] > 0
        # a 403 status, not a log line's milliseconds (`10:54:44,403`)
        assert "Forbidden" not in replica.output() and not re.search(r"(?<![,\d])403\b", replica.output()), replica.output()[-3000:]
    finally:
        made.close()


def dashboard(kubeconfig: str, namespace: str) -> dict[str, str]:
    done = kubectl(kubeconfig, "-n", namespace, "get", "configmap", "digits-dashboard", "-o", "json")
    return json.loads(done.stdout)["data"]


def test_git_down_is_fetch_failed_and_ready_again_once_it_answers(kube_cluster, namespace, git_server, controllers) -> None:
    kubeconfig = kube_cluster.kubeconfig
    first = git_server.push("quick-start")
    controllers.start("a")
    wait_until(lambda: applied(kubeconfig, namespace, first), timeout=120, what="the first revision applied")
    before = live_versions(kubeconfig, namespace)
    git_server.stop()
    status = wait_until(lambda: (s := sync_status(kubeconfig, namespace)) and ready(s).get("reason") == "FetchFailed" and s,
                        timeout=60, what="the fetch failure reported")
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {"Ready": "False", "Reconciling": "True", "Stalled": "False"}, status["conditions"]
    assert status["lastAppliedRevision"] == first and "127.0.0.1" in ready(status)["message"]
    assert live_versions(kubeconfig, namespace) == before  # what runs keeps running
    git_server.restart()
    wait_until(lambda: applied(kubeconfig, namespace, first), timeout=60, what="Ready again once git answers")


@pytest.mark.parametrize("controllers", [("2s", None, True)], indirect=True)
def test_self_heal_takes_an_edit_made_outside_forge_back(kube_cluster, namespace, git_server, controllers) -> None:
    """An edit made by hand keeps the digest an apply recorded, so only the full compare finds it:
    with `selfHeal`, every interval is one (`apply --refresh`)."""
    kubeconfig = kube_cluster.kubeconfig
    first = git_server.push("quick-start")
    controllers.start("a")
    wait_until(lambda: applied(kubeconfig, namespace, first), timeout=120, what="the first revision applied")
    want = dashboard(kubeconfig, namespace)
    key = sorted(want)[0]
    # a ConfigMap is not read by the render, so a plan compares it by its recorded digest alone
    patched = kubectl(kubeconfig, "-n", namespace, "patch", "configmap", "digits-dashboard", "--type", "merge",
                      "-p", json.dumps({"data": {key: "edited by hand"}}))
    assert patched.returncode == 0, patched.stderr
    assert dashboard(kubeconfig, namespace)[key] == "edited by hand"
    wait_until(lambda: dashboard(kubeconfig, namespace) == want, timeout=60, what="the drift taken back by selfHeal")


def finish_workflows(kubeconfig: str, namespace: str, seen: set[str]) -> set[str]:
    """What Argo's controller would do when a version's Workflow ends (no Argo and no kubelet run on
    this API server: devkit.rollout_harness.finish_workflow does the same for the rollout tests)."""
    names = set(kubectl(kubeconfig, "-n", namespace, "get", "workflows", "-o", "name").stdout.split())
    for name in sorted(names - seen):
        kubectl(kubeconfig, "-n", namespace, "patch", name, "--type", "merge", "-p", json.dumps({"status": {"phase": "Succeeded"}}))
    return names


def rollout_of(kubeconfig: str, namespace: str) -> dict[str, Any]:
    return next((r for r in sync_status(kubeconfig, namespace).get("rollouts", []) if r["endpoint"] == "digits"), {})


def test_the_controller_alone_walks_the_rollout_of_a_pushed_version(kube_cluster, namespace, git_server, controllers) -> None:
    """No forgectl between the pushes: the controller's own rollout pass takes version 2 through the
    offline gate (its Workflow succeeded) and waits for the canary's pods, saying so in the Sync's
    status, in the SeldonDeployment's rollout state and on /metrics."""
    kubeconfig = kube_cluster.kubeconfig
    first = git_server.push("quick-start")
    replica = controllers.start("a")
    wait_until(lambda: applied(kubeconfig, namespace, first), timeout=120, what="the first revision applied")
    seen = finish_workflows(kubeconfig, namespace, set())
    wait_until(lambda: rollout_of(kubeconfig, namespace).get("phase") == "Idle", timeout=60, what="version 1 stable, at rest")
    git_server.edit("model.yaml", "learningRate: 0.002", "learningRate: 0.003")
    second = git_server.push("learning rate")
    wait_until(lambda: applied(kubeconfig, namespace, second), timeout=90, what="the second revision applied")
    finish_workflows(kubeconfig, namespace, seen)
    rollout = wait_until(lambda: "offline gate passed" in (r := rollout_of(kubeconfig, namespace)).get("reason", "") and r,
                         timeout=60, what="the controller's rollout pass past the offline gate")
    assert rollout["phase"] == "WaitingForModel" and "waiting for the canary to be ready" in rollout["reason"], rollout
    # a walk that changes no line writes no status: the Sync holds still over several walks (every 2 s)
    held = sync_object(kubeconfig, namespace)["metadata"]["resourceVersion"]
    time.sleep(7)
    assert sync_object(kubeconfig, namespace)["metadata"]["resourceVersion"] == held
    sdep = json.loads(kubectl(kubeconfig, "-n", namespace, "get", "seldondeployment", "digits", "-o", "json").stdout)
    state = json.loads(sdep["metadata"]["annotations"]["forge.dev/rollout"])
    assert state["phase"] == "WaitingForModel" and state["canary"] and state["canary"] != state["stable"]
    metrics = replica.get("/metrics")[1]
    assert 'forge_controller_rollout_phase{endpoint="digits",phase="WaitingForModel",source="quickstart"} 1.0' in metrics

    # `forgectl status` and `forgectl rollout status` read the Sync the controller wrote
    data = json.loads(forgectl(kubeconfig, git_server.work, "status", ".", "--env", "cluster", "-n", namespace, "-o", "json"))
    [sync] = data["controller"]["syncs"]
    assert sync["name"] == SOURCE and sync["lastAppliedRevision"] == second == sync["lastAttemptedRevision"], sync
    assert {c["type"]: c["status"] for c in sync["conditions"]} == {"Ready": "True", "Reconciling": "False", "Stalled": "False"}
    assert sync["leader"] == replica.identity and sync["plan"]["created"] > 0, sync
    [line] = [r for r in sync["rollouts"] if r["endpoint"] == "digits"]
    assert sync["rolloutPhases"]["WaitingForModel"] >= 1 and sum(sync["rolloutPhases"].values()) == len(sync["rollouts"])
    assert line["phase"] == "WaitingForModel" and "offline gate passed" in line["reason"], line
    steered = json.loads(forgectl(kubeconfig, git_server.work, "rollout", "status", "digits", "--env", "cluster", "-n",
                                  namespace, "-o", "json"))
    assert steered["rollout"]["phase"] == "WaitingForModel" and steered["rollout"]["canary"] == state["canary"]
    assert [(r["endpoint"], r["phase"]) for r in steered["controller"]["syncs"][0]["rollouts"]] == [("digits", "WaitingForModel")]
    text = forgectl(kubeconfig, git_server.work, "rollout", "status", "digits", "--env", "cluster", "-n", namespace)
    assert f"sync/{SOURCE} ({namespace})  Ready=True Succeeded" in text, text
    assert "rollout digits: WaitingForModel, no step yet, canary 0 %" in text, text
