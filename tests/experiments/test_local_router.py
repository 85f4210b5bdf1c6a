"""The local router in front of an experiment's arms (tiny HTTP servers, real HAProxy): shares by
weight, a user kept in one arm by a header or a cookie, arms replaced and removed."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.targets.local import processes
from reconciler.targets.local.router import Router
from reconciler.targets.local.state import StateDB
from tests.local.test_serving import BACKEND
from tests.polling import holds_for, wait_until


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / ".forge"
    yield path
    if (path / "state.db").exists():
        for record in StateDB(path / "state.db").processes():
            processes.stop(record)


def _ask(url: str, headers: dict[str, str] | None = None) -> str:
    req = urllib.request.Request(url + "/v2/models/m/infer", data=b"{}", headers=headers or {}, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())["model_version"]


@pytest.mark.slow
def test_arms_by_share_and_sticky_users(state_dir: Path, tmp_path: Path) -> None:
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
        router = Router(db, state_dir, "ab")
        router.set_roles({"control": (ports["v1"], 50), "treatment": (ports["v2"], 50)}, sticky=("header", "x-user-id"))
        url = router.url
        assert set(router.traffic()) == {"control", "treatment"}

        # without the header: weighted round robin over the arms
        seen = Counter(_ask(url) for _ in range(100))
        assert set(seen) == {"v1", "v2"} and 25 <= seen["v1"] <= 75, seen

        # with it: every user stays in one arm, and users are spread over both
        per_user = {u: {_ask(url, {"x-user-id": f"user-{u}"}) for _ in range(4)} for u in range(40)}
        assert all(len(v) == 1 for v in per_user.values()), per_user
        arms = Counter(next(iter(v)) for v in per_user.values())
        assert set(arms) == {"v1", "v2"}, arms
        # a client cannot pick its arm with the internal header
        assert Counter(_ask(url, {"X-Forge-Sticky": "x"}) for _ in range(40)).keys() == {"v1", "v2"}

        # shares move (no restart: same port); a user at 0 % share is moved away
        router.set_roles({"control": (ports["v1"], 100), "treatment": (ports["v2"], 0)}, sticky=("header", "x-user-id"))
        assert router.url == url
        assert {_ask(url, {"x-user-id": f"user-{u}"}) for u in range(20)} == {"v1"}

        # a replaced arm gets a fresh slot; a third arm a free family; the sticky setting changes in
        # place (the admin socket's `set map`), the router is not restarted
        pid = db.process("router/ab").pid
        router.set_roles({"control": (ports["v1"], 34), "treatment": (ports["v3"], 33), "third": (ports["v2"], 33)},
                         sticky=("cookie", "uid"))
        assert router.url == url and db.process("router/ab").pid == pid
        by_cookie = {u: {_ask(url, {"Cookie": f"uid=u{u}"}) for _ in range(3)} for u in range(30)}
        assert all(len(v) == 1 for v in by_cookie.values()), by_cookie
        assert set().union(*by_cookie.values()) == {"v1", "v2", "v3"}

        # the experiment ends: the rollout's stable slot takes all, the arms' slots are drained
        router.set(ports["v2"], None, 0)
        assert set(router.traffic()) == {"stable"}
        assert {_ask(url, {"Cookie": f"uid=u{u}"}) for u in range(10)} == {"v2"}
        router.stop()
    finally:
        for proc in backends:
            proc.terminate()
            proc.wait()


COUNTING = BACKEND.replace("    def do_POST(self):\n",
                           "    def do_POST(self):\n        open(sys.argv[2], 'a').write('x')\n").replace(
    'self._send(200, json.dumps({"model_version": sys.argv[1]}))',
    'p = [0.9, 0.1] if sys.argv[1] == "live" else [0.75, 0.25]\n'
    '        self._send(200, json.dumps({"model_version": sys.argv[1], "outputs": ['
    '{"name": "probabilities", "shape": [1, 2], "datatype": "FP32", "parameters": {"content_type": "np"}, "data": p}, '
    '{"name": "label", "shape": [1], "datatype": "INT64", "data": [0]}]}))')


@pytest.mark.slow
def test_the_router_mirrors_to_the_shadow_and_clients_never_see_it(state_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "backend.py"
    script.write_text(COUNTING)
    backends = []
    try:
        ports, hits = {}, {}
        for version in ("live", "shadow"):
            hits[version] = tmp_path / f"hits-{version}"
            proc = subprocess.Popen([sys.executable, str(script), version, str(hits[version])], stdout=subprocess.PIPE, text=True)
            backends.append(proc)
            assert proc.stdout is not None
            ports[version] = ("127.0.0.1", int(proc.stdout.readline()))
        db = StateDB(state_dir / "state.db")
        router = Router(db, state_dir, "sh")
        router.set(ports["live"], None, 0)
        router.set_shadow(ports["shadow"], 100)
        url = router.url

        def count(version: str) -> int:
            return len(hits[version].read_text()) if hits[version].exists() else 0

        def settled() -> dict[str, Any] | None:
            """The mirror's counts once no copy is in flight (each mirrored one answered or failed;
            a copy is counted as mirrored before its client gets the live answer)."""
            stats = router.shadow_stats()
            return stats if stats is not None and stats["answered"] + stats["failed"] == stats["mirrored"] else None

        answers = Counter(_ask(url) for _ in range(60))
        assert answers == {"live": 60}  # the shadow's answers never reach a client
        stats = wait_until(settled, timeout=10, what="every mirrored copy answered or failed")
        assert stats["mirrored"] == 60 and stats["answered"] == 60, stats
        assert count("live") == 60 and count("shadow") == 60  # every request, once
        assert stats["agreement"] == 1.0 and stats["maxProbabilityDistance"] == pytest.approx(0.15), stats
        assert stats["meanLatencySeconds"] is not None and stats["meanLatencySeconds"] > 0.005, stats  # the backend sleeps 10 ms

        router.set_shadow(ports["shadow"], 50)
        for _ in range(200):
            _ask(url)
        half = wait_until(settled, timeout=10, what="every mirrored copy answered or failed")
        assert 60 + 60 <= half["mirrored"] <= 60 + 140, half
        assert count("shadow") == half["answered"] == half["mirrored"], (count("shadow"), half)

        router.set_shadow(None)
        before = count("shadow")
        for _ in range(20):
            _ask(url)
        holds_for(lambda: count("shadow") == before, 0.5, "no copy reaching the removed shadow")
        router.stop()
    finally:
        for proc in backends:
            proc.terminate()
            proc.wait()
