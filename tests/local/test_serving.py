"""The local target's serving with real processes: model servers (the serve runtime), one HAProxy
router per endpoint, Debian's Prometheus. Traffic moves between stable and canary while a load
loop runs, and not one request fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.runtime_steps import Runner
from reconciler.load.loader import load_or_raise
from reconciler.targets.local import processes
from reconciler.targets.local.load import LoadError, generate
from reconciler.targets.local.monitoring import LocalPrometheus, PrometheusError
from reconciler.targets.local.router import Router
from reconciler.targets.local.serving import LocalServing, Predictor, ServingError
from reconciler.targets.local.state import StateDB
from renderers.seldon import ServingState, render_seldon
from specs import Endpoint
from tests.polling import wait_until
from tests.runtimes.helpers import ROOT

QUICKSTART = ROOT / "examples" / "quickstart"
MODEL = "digits-mlp"


def _predictors(state: ServingState) -> list[dict[str, Any]]:
    """The quick-start endpoint's SeldonDeployment predictors, as the renderer makes them."""
    specs = load_or_raise([str(QUICKSTART)]).specs
    endpoint = specs.get(Endpoint, "digits")
    assert endpoint is not None
    sd = render_seldon(specs, endpoint, specs.environment(), "default", None, state)
    return sd["spec"]["predictors"]


def _all_stopped(records: list[processes.ProcessRecord]) -> list[str]:
    return [f"{r.name} (pid {r.pid})" for r in records if processes.alive(r)]


def _wait_gone(record: processes.ProcessRecord, url: str) -> None:
    """Until a killed router is gone and the kernel has released its port (a moment after the
    process: the router takes another port while its own is still held)."""
    port = int(url.rsplit(":", 1)[1])
    wait_until(lambda: not processes.running(record.pid, record.start_ticks) and processes.port_free(port), timeout=30,
               what=f"the killed router (pid {record.pid}) gone and its port {port} free")


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """A state dir whose recorded processes are all stopped at the end, whatever happened."""
    path = tmp_path / ".forge"
    yield path
    if (path / "state.db").exists():
        db = StateDB(path / "state.db")
        for record in db.processes():
            processes.stop(record)


# -- without the runtime environment ----------------------------------------------------------

def test_predictor_reads_the_rendered_seldon_predictor() -> None:
    stable, canary = (Predictor("digits", p) for p in _predictors(ServingState("v1", "v2", 30)))
    assert (stable.role, stable.version, stable.traffic, stable.step) == ("stable", "v1", 70, "serve")
    assert (canary.role, canary.version, canary.traffic) == ("canary", "v2", 30)
    assert canary.config["host"] == "127.0.0.1" and canary.config["port"] == 0
    assert canary.config["modelDir"] == "registry/digits-mlp/v2/int8"
    assert stable.key("py") != canary.key("py")
    with pytest.raises(ServingError, match="not a rendered Forge predictor"):
        Predictor("digits", {"name": "stable", "componentSpecs": []})


def test_load_refuses_anything_but_loopback_and_unbounded_runs() -> None:
    with pytest.raises(LoadError, match="only to a local endpoint"):
        generate("http://example.com:80", MODEL, rate=1, seconds=1, concurrency=1, timeout=1)
    with pytest.raises(LoadError, match="rate"):
        generate("http://127.0.0.1:1", MODEL, rate=10_000, seconds=1, concurrency=1, timeout=1)
    with pytest.raises(LoadError, match="seconds"):
        generate("http://127.0.0.1:1", MODEL, rate=1, seconds=0, concurrency=1, timeout=1)
    result = generate(f"http://127.0.0.1:{processes.free_port()}", MODEL, rate=20, seconds=0.2, concurrency=2, timeout=1)
    assert result["requests"] == 4 and result["failed"] == 4
    assert set(result["by_status"]) == {"error:ConnectionRefusedError"}


BACKEND = r'''
import json, sys, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def _send(self, code, body):
        data = body.encode()
        self.send_response(code); self.send_header("content-length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self): self._send(200, "ok")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0))); time.sleep(0.01)
        self._send(200, json.dumps({"model_version": sys.argv[1]}))
    def log_message(self, *a): pass
    def handle(self):
        try: super().handle()
        except ConnectionError: pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
'''


@pytest.mark.slow
def test_router_moves_weights_swaps_servers_and_survives_a_kill(state_dir: Path, tmp_path: Path) -> None:
    """The router alone, in front of two tiny HTTP servers (no runtime environment needed)."""
    script = tmp_path / "backend.py"
    script.write_text(BACKEND)
    backends = []
    try:
        ports = {}
        for version in ("v1", "v2", "v3"):
            proc = subprocess.Popen([sys.executable, str(script), version], stdout=subprocess.PIPE, text=True)
            backends.append(proc)
            assert proc.stdout is not None
            ports[version] = ("127.0.0.1", int(proc.stdout.readline()))
        db = StateDB(state_dir / "state.db")
        router = Router(db, state_dir, "digits")
        url = router.ensure()
        assert router.ensure() == url  # idempotent
        router.set(ports["v1"], None, 0)
        stop = threading.Event()
        result: dict[str, Any] = {}
        loader = threading.Thread(target=lambda: result.update(generate(url, MODEL, rate=200, seconds=60, concurrency=4, stop=stop)))
        loader.start()

        def routed() -> int:
            """Requests the router has sent to any slot (HAProxy's session totals)."""
            return sum(stat.total for stat in router.servers().values())

        try:
            wait_until(lambda: routed() >= 20, timeout=30, what="the load loop's requests flowing through the router")
            router.set(ports["v1"], ports["v2"], 50)
            half = generate(url, MODEL, rate=200, seconds=1, concurrency=4)
            assert half["failed"] == 0 and set(half["by_version"]) == {"v1", "v2"}, half
            router.set(ports["v1"], ports["v3"], 50)  # a new canary: fresh slot, old one drained
            assert router.traffic()["canary"]["slot"] == "canary-b"
            backends[1].terminate()
            router.set(ports["v3"], None, 0)  # the canary becomes stable: stable slot swapped, canary drained
            full = generate(url, MODEL, rate=200, seconds=0.5, concurrency=4)
            assert full["failed"] == 0 and set(full["by_version"]) == {"v3"}, full
            backends[0].terminate()
            backends[0].wait(timeout=10)
            after = routed()  # the load goes on, to v3 alone, with the old servers gone
            wait_until(lambda: routed() >= after + 20, timeout=30, what="more requests routed after the old servers stopped")
        finally:
            stop.set()
            loader.join()
        assert result["failed"] == 0 and result["requests"] > 50, result

        record = db.process("router/digits")
        assert record is not None
        os.killpg(record.pid, signal.SIGKILL)
        _wait_gone(record, url)
        assert router.ensure() == url  # started again on the same port, slots restored
        again = generate(url, MODEL, rate=50, seconds=0.2, concurrency=1)
        assert again["failed"] == 0 and set(again["by_version"]) == {"v3"}, again
        router.stop()
        assert not processes.alive(record) and db.process("router/digits") is None
    finally:
        for proc in backends:
            proc.terminate()
            proc.wait()


def test_prometheus_rejects_a_bad_rule_and_keeps_running(state_dir: Path) -> None:
    db = StateDB(state_dir / "state.db")
    prom = LocalPrometheus(db, state_dir)
    url = prom.ensure()
    assert prom.ensure() == url
    prom.set_rules("digits", [{"name": "digits", "rules": [{"record": "forge:up:sum", "expr": "sum(up)"}]}])
    with pytest.raises(PrometheusError, match="rejected"):
        prom.set_rules("broken", [{"name": "broken", "rules": [{"record": "x", "expr": "sum(("}]}])
    assert not (state_dir / "prometheus" / "rules" / "broken.yml").exists()
    prom.reload()  # still a valid configuration
    record = db.process("prometheus")
    assert record is not None
    prom.stop()
    assert not processes.alive(record)


# -- the whole thing, with real model servers ---------------------------------------------------

@pytest.mark.runtime
@pytest.mark.slow
def test_stable_canary_weights_and_removal_without_a_failed_request(digits: Runner, runtime_python: str,
                                                                    state_dir: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    for version in ("v1", "v2"):  # two "registered versions" of the trained model
        target = workspace / "registry" / MODEL / version / "int8"
        target.parent.mkdir(parents=True)
        target.symlink_to(digits.workspace / "models" / "base", target_is_directory=True)
    db = StateDB(state_dir / "state.db")
    serving = LocalServing(db, state_dir, runtime_python, workspace, ROOT)
    prom = LocalPrometheus(db, state_dir, scrape_interval="1s")
    prom.ensure()
    seen: dict[str, processes.ProcessRecord] = {}

    def apply(state: ServingState) -> str:
        url = serving.ensure_endpoint("digits", _predictors(state))
        for record in db.processes():
            seen[f"{record.name}@{record.pid}"] = record
        prom.set_targets(serving.scrape_targets())
        return url

    url = apply(ServingState("v1"))
    stable_pid = serving.status("digits")["roles"]["stable"]["pid"]
    assert apply(ServingState("v1")) == url  # idempotent: same router, same server
    assert serving.status("digits")["roles"]["stable"]["pid"] == stable_pid
    first = generate(url, MODEL, rate=20, seconds=0.5, concurrency=2)
    assert first["failed"] == 0 and first["by_version"] == {"v1": first["requests"]}, first

    stop = threading.Event()
    result: dict[str, Any] = {}
    loader = threading.Thread(target=lambda: result.update(generate(url, MODEL, rate=40, seconds=600, concurrency=4, stop=stop)))
    loader.start()
    try:
        apply(ServingState("v1", "v2", 0))  # canary server started, no traffic yet
        status = serving.status("digits")["roles"]
        assert status["canary"]["version"] == "v2" and status["canary"]["weight"] == 0
        assert status["stable"]["pid"] == stable_pid
        apply(ServingState("v1", "v2", 50))
        half = generate(url, MODEL, rate=100, seconds=1, concurrency=4)
        assert half["failed"] == 0 and set(half["by_version"]) == {"v1", "v2"}, half
        apply(ServingState("v1", "v2", 100))
        full = generate(url, MODEL, rate=50, seconds=0.5, concurrency=2)
        assert full["failed"] == 0 and set(full["by_version"]) == {"v2"}, full

        # Prometheus scrapes both servers and the router (labels as the gates query them)
        def roles_seen() -> set[str]:
            rows = prom.query('sum by (forge_role, forge_version) '
                              '(forge_requests_total{forge_endpoint="digits",forge_namespace="default",code="200"})')
            return {f"{r['metric']['forge_role']}:{r['metric']['forge_version']}" for r in rows}
        wait_until(lambda: roles_seen() >= {"stable:v1", "canary:v2"}, timeout=30, what="forge_requests_total of both roles",
                   interval=0.25)
        wait_until(lambda: prom.query('sum(haproxy_backend_http_responses_total{component="router",forge_endpoint="digits",proxy="be"}) > 0'),
                   timeout=30, what="the router's exporter", interval=0.25)
        up = prom.query('up{namespace="default"}')
        assert len(up) == 3 and all(r["value"][1] == "1" for r in up), up
        # a model server's series carry the target labels the Prometheus Operator's PodMonitor job
        # gives them on a cluster (the servers' own are forge_*: nothing renamed to exported_*)
        rows = prom.query('forge_requests_total{forge_endpoint="digits"}')
        assert rows and all(set(r["metric"]) == {"__name__", "code", "forge_endpoint", "forge_namespace", "forge_role",
                                                 "forge_variant", "forge_version", "namespace", "pod", "container",
                                                 "endpoint", "job", "instance"} for r in rows), rows
        assert {(r["metric"]["job"], r["metric"]["endpoint"], r["metric"]["container"]) for r in rows} == {("default/digits", "http", "model")}

        # the rollout aborted: the canary is drained and stopped under load
        canary_record = next(r for r in db.processes() if r.info.get("role") == "canary")
        apply(ServingState("v1"))
        assert not processes.alive(canary_record)
        assert set(serving.status("digits")["roles"]) == {"stable"}

        # a promotion: the stable role changes version, replaced beside the old server
        apply(ServingState("v2"))
        after = generate(url, MODEL, rate=50, seconds=0.5, concurrency=2)
        assert after["failed"] == 0 and set(after["by_version"]) == {"v2"}, after
        # the replaced server (v1) was drained and stopped before apply returned, under load
        old_stable = [r for r in seen.values() if r.info.get("role") == "stable" and r.info.get("version") == "v1"]
        assert old_stable and not any(processes.alive(r) for r in old_stable), old_stable
    finally:
        stop.set()
        loader.join()
    assert result["failed"] == 0, result["by_status"]
    assert result["requests"] > 40 and set(result["by_version"]) == {"v1", "v2"}, result

    # a killed router comes back on the same URL with its traffic split
    router = db.process("router/digits")
    assert router is not None
    os.killpg(router.pid, signal.SIGKILL)
    _wait_gone(router, url)
    assert apply(ServingState("v2")) == url
    assert generate(url, MODEL, rate=20, seconds=0.3, concurrency=1)["failed"] == 0

    serving.stop_all()
    prom.stop()
    for record in db.processes():
        seen[f"{record.name}@{record.pid}"] = record
    assert len(seen) >= 6  # 3 servers, 2 routers (one killed), prometheus
    assert _all_stopped(list(seen.values())) == []
    assert db.processes() == []
