"""Seldon Core v1.17.1's executor (the service orchestrator), built from upstream's source by
``judges/seldon/build-executor.sh`` (:func:`devkit.node.seldon.ensure_executor`) and run on the host in
front of a small v2 (Open Inference Protocol) server this test starts. No node and no kube cluster.

The executor gets the arguments and environment the operator gives its container
(``operator/controllers/seldondeployment_engine.go``, ``createExecutorContainer``): ``--sdep``,
``--namespace``, ``--predictor`` (the predictor's name), ``--http_port``, ``--grpc_port``, ``--protocol
v2``, ``--transport rest``, ``--prometheus_path /prometheus`` (metrics on the HTTP port),
``--server_type rpc``, the request logger's queue settings, ``--full_health_checks=false``, and
``ENGINE_PREDICTOR``: the predictor spec as base64 JSON (``GetEngineVarJson``; replicas 0), whose graph is
one MODEL whose endpoint is the model container in the same pod (``service_host: localhost``, as the
operator's defaulting sets it). With protocol v2 the executor calls ``POST /v2/models/<name>/infer`` on the
model (``api/rest/client.go``, ``modifyMethod``), ``<name>`` being the model name of the request's path;
its ``/ready`` is a TCP connect to the model (``predictor/ready_checker.go``; ``/v2/health/ready`` on the
model only with full health checks, which the test server answers too).

The executor listens on every address (``net.Listen("tcp", ":<port>")`` in ``cmd/executor/main.go``; no
flag sets the host), so it runs in a network namespace of its own, which has nothing but a loopback
interface; the v2 server and the test's requests run on a thread that joined that namespace (``setns``),
on 127.0.0.1. Nothing is reachable from outside the machine, and no port of the host is taken.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest

from devkit.node import seldon
from reconciler.targets.local.processes import die_with_parent, free_port

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
SDEP, NAMESPACE, PREDICTOR, MODEL = "iris", "forge-test", "default", "classifier"


class V2Model(BaseHTTPRequestHandler):
    """One model, ``MODEL``, on the v2 protocol's REST paths: health, model readiness, metadata and
    ``infer`` (answers the sum of its one FP32 input). Every request is recorded on the server."""

    server: V2Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass

    def _answer(self, code: int, body: dict[str, Any] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.server.seen.append(("GET", self.path, None))
        if self.path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}/ready"):
            self._answer(200)
        elif self.path == f"/v2/models/{MODEL}":
            self._answer(200, {"name": MODEL, "platform": "forge-test", "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [-1]}], "outputs": [
                {"name": "sum", "datatype": "FP32", "shape": [1]}]})
        else:
            self._answer(404, {"error": f"no {self.path}"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self.server.seen.append(("POST", self.path, body))
        if self.path != f"/v2/models/{MODEL}/infer":
            self._answer(404, {"error": f"no {self.path}"})
            return
        total = float(sum(body["inputs"][0]["data"]))
        self._answer(200, {"model_name": MODEL, "id": body.get("id", ""), "outputs": [
            {"name": "sum", "datatype": "FP32", "shape": [1], "data": [total]}]})


class V2Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), V2Model)
        self.seen: list[tuple[str, str, Any]] = []


def _setns_net(pid: int) -> None:
    """Move the calling thread into process ``pid``'s network namespace (what ``nsenter --net`` does)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns(net of {pid}): {os.strerror(err)}")
    finally:
        os.close(fd)


def _http(url: str, data: dict[str, Any] | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(data).encode() if data is not None else None,
                                 headers={"Content-Type": "application/json"} if data is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def _stop(proc: subprocess.Popen[Any] | None) -> None:
    """SIGTERM the process by its PID (the executor shuts its servers down), SIGKILL after 15 s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@pytest.fixture(scope="module")
def executor_binary() -> Path:
    return seldon.ensure_executor()  # the first time: a Go build (see docs/test-cluster.md for how long)


class NetNs:
    """A network namespace held by process ``pid``; :meth:`run` calls a function on a thread inside it
    (sockets keep the namespace they were made in)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="netns", initializer=_setns_net, initargs=(pid,))

    def run(self, fn: Callable[[], T]) -> T:
        return self._pool.submit(fn).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@pytest.fixture
def netns() -> Iterator[NetNs]:
    """A fresh network namespace with its loopback up, held by a process of its own."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")):
        pytest.fail("needs root and unshare, nsenter and ip (util-linux, iproute2) for a network namespace; "
                    "this test does not skip")
    holder = subprocess.Popen(["unshare", "--net", "--", "sh", "-c", "ip link set lo up && echo up && exec cat >/dev/null"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    ns: NetNs | None = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up", "the namespace's loopback"
        ns = NetNs(holder.pid)
        ns.run(lambda: None)
        yield ns
    finally:
        if ns is not None:
            ns.close()
        _stop(holder)


def predictor_spec(model_port: int) -> dict[str, Any]:
    """The predictor as the operator hands it to the executor (defaulted: the graph's endpoint is the model
    container in the same pod), one MODEL on REST."""
    return {
        "name": PREDICTOR,
        "graph": {"name": MODEL, "type": "MODEL", "children": [],
                  "endpoint": {"service_host": "localhost", "service_port": model_port,
                               "httpPort": model_port, "grpcPort": 0, "type": "REST"}},
        "componentSpecs": [{"spec": {"containers": [{"name": MODEL, "image": "registry.local/classifier:1"}]}}],
        "replicas": 0,
        "engineResources": {},
        "svcOrchSpec": {},
        "labels": {"version": "v1"},
    }


def executor_argv(binary: Path, http_port: int, grpc_port: int) -> list[str]:
    """createExecutorContainer's Args, with the operator's defaults."""
    return [str(binary), "--sdep", SDEP, "--namespace", NAMESPACE, "--predictor", PREDICTOR,
            "--http_port", str(http_port), "--grpc_port", str(grpc_port), "--protocol", "v2",
            "--transport", "rest", "--prometheus_path", "/prometheus", "--server_type", "rpc",
            "--log_work_buffer_size", "10000", "--log_write_timeout_ms", "2000", "--full_health_checks=false"]


def test_executor_serves_v2_through_to_the_model(executor_binary: Path, netns: NetNs,
                                                 tmp_path: Path) -> None:
    server: V2Server = netns.run(V2Server)
    model_port = server.server_address[1]
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    http_port, grpc_port = netns.run(free_port), netns.run(free_port)
    while grpc_port == http_port:
        grpc_port = netns.run(free_port)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "ENGINE_PREDICTOR": base64.b64encode(json.dumps(predictor_spec(model_port)).encode()).decode(),
           "REQUEST_LOGGER_DEFAULT_ENDPOINT": "http://default-broker"}
    log_path = tmp_path / "executor.log"
    proc: subprocess.Popen[Any] | None = None
    base = f"http://127.0.0.1:{http_port}"
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(["nsenter", f"--net=/proc/{netns.pid}/ns/net", "--",
                                     *executor_argv(executor_binary, http_port, grpc_port)],
                                    cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, preexec_fn=die_with_parent)

        def logs() -> str:
            return log_path.read_text(errors="replace")[-4000:]

        deadline = time.monotonic() + 30
        while netns.run(lambda: _http(base + "/ready", timeout=2))[0] != 200:
            assert proc.poll() is None, f"the executor exited ({proc.returncode}):\n{logs()}"
            assert time.monotonic() < deadline, f"the executor's /ready never answered 200:\n{logs()}"
            time.sleep(0.2)
        assert netns.run(lambda: _http(base + "/live"))[0] == 200

        request = {"id": "forge-1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1.5, 2, 3]}]}
        code, body = netns.run(lambda: _http(f"{base}/v2/models/{MODEL}/infer", request))
        assert code == 200, f"{code} {body!r}\n{logs()}"
        answer = json.loads(body)
        assert answer["model_name"] == MODEL
        assert answer["outputs"] == [{"name": "sum", "datatype": "FP32", "shape": [1], "data": [6.5]}]
        # the request reached the model unchanged, on the v2 path the executor calls
        posts = [(path, sent) for method, path, sent in server.seen if method == "POST"]
        assert posts == [(f"/v2/models/{MODEL}/infer", request)]

        code, body = netns.run(lambda: _http(base + "/prometheus"))
        assert code == 200, f"{code} {body!r}"
        metrics = body.decode()
        served = [line for line in metrics.splitlines()
                  if line.startswith("seldon_api_executor_server_requests_seconds_count{")
                  and 'service="predictions"' in line and f'deployment_name="{SDEP}"' in line
                  and f'predictor_name="{PREDICTOR}"' in line and 'code="200"' in line]
        assert served and served[0].rsplit(" ", 1)[1] == "1", metrics[-3000:]
        called = [line for line in metrics.splitlines()
                  if line.startswith("seldon_api_executor_client_requests_seconds_count{")
                  and f'model_name="{MODEL}"' in line and 'code="200"' in line]
        assert called, metrics[-3000:]
    finally:
        _stop(proc)
        server.shutdown()
        server.server_close()
        serving.join(timeout=5)

