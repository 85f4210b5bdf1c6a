"""The local process layer (reconciler/targets/local/processes.py) that the local target and the
development harness (devkit) share: real processes, real ports, no mocks."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reconciler.targets.local import processes
from tests.polling import wait_until


def _http_server(port: int) -> list[str]:
    return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]


def test_spawn_records_the_process_and_stop_ends_exactly_it(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "sleep.log"
    argv = [sys.executable, "-c", "print('hello', flush=True); import time; time.sleep(60)"]
    record = processes.spawn("sleeper", "test", argv, log=log, info={"why": "test"})
    try:
        assert record.start_ticks > 0 and processes.alive(record)
        assert processes.running(record.pid, record.start_ticks)
        assert not processes.running(record.pid, record.start_ticks + 1)  # another start time: not ours
        wait_until(lambda: "hello" in processes.log_tail(log), timeout=10, what="the child's output in its log")
    finally:
        processes.stop(record)
    assert not processes.alive(record)
    assert record.to_json()["info"] == {"why": "test"}
    processes.stop(record)  # stopping what is gone is nothing


def test_a_die_with_parent_child_goes_with_its_parent(tmp_path: Path) -> None:
    """The parent spawns a child with die_with_parent and prints its PID; killing the parent kills it."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from reconciler.targets.local import processes
        r = processes.spawn("child", "test", [sys.executable, "-c", "import time; time.sleep(60)"],
                            log={str(tmp_path / "child.log")!r}, die_with_parent=True)
        print(r.pid, r.start_ticks, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid, ticks = (int(x) for x in parent.stdout.readline().split())
        assert processes.running(pid, ticks)
    finally:
        parent.kill()
        parent.wait()
    wait_until(lambda: not processes.running(pid, ticks), timeout=10, what="the child to die with its parent")


def test_log_tail_reads_after_an_offset_and_says_when_there_is_no_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"old line\n" + b"new \xff line\n")
    assert processes.log_tail(log, offset=len(b"old line\n")) == "new \ufffd line\n"
    assert processes.log_tail(log, limit=5) == "line\n"
    assert processes.log_tail(tmp_path / "missing.log") == "(no log)"


def test_ports_and_plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    port = processes.free_port()
    assert processes.port_free(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not processes.port_free(port)
    monkeypatch.setenv("FORGE_SECRET_FOR_TEST", "x")
    env = processes.plain_env()
    assert "FORGE_SECRET_FOR_TEST" not in env and set(env) <= {"PATH", "HOME", "LANG", "LC_ALL", "TZ"}


def test_free_port_never_hands_one_port_twice_nor_one_the_kernel_hands_out(tmp_path: Path) -> None:
    """Three processes at once each ask for 150 ports: no two answers alike (the lease file), none
    in the kernel's ephemeral range (where any bind to port 0 or outgoing connection could take it
    before the server binds it), none where NodePorts begin, and none that something holds."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        script = ("from reconciler.targets.local.processes import free_port\n"
                  "print(' '.join(str(free_port()) for _ in range(150)))")
        env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
                 for _ in range(3)]
        ports = [int(p) for proc in procs for p in proc.communicate(timeout=120)[0].split()]
        assert [proc.returncode for proc in procs] == [0, 0, 0]
        assert len(ports) == len(set(ports)) == 450
        eph_low, eph_high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        assert not [p for p in ports if eph_low <= p <= eph_high or p >= 30000 or p < 1024]
        assert held.getsockname()[1] not in ports
    assert all(processes.port_free(p) for p in ports[:20])


def test_start_server_waits_until_ready_and_moves_off_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        seen: list[processes.ProcessRecord] = []
        record = processes.start_server("web", "http-server", _http_server, lambda p: f"http://127.0.0.1:{p}/",
                                        log=tmp_path / "web.log", port=busy, timeout=30, on_spawn=seen.append)
    try:
        assert seen == [record] and record.info["port"] != busy and processes.alive(record)
        with socket.create_connection(("127.0.0.1", record.info["port"]), timeout=5):
            pass
    finally:
        processes.stop(record)


def test_start_server_reports_a_server_that_exits_with_its_log(tmp_path: Path) -> None:
    failed: list[processes.ProcessRecord] = []
    with pytest.raises(processes.ServerNotStarted) as err:
        processes.start_server("bad", "bad-server",
                               lambda p: [sys.executable, "-c", "print('no config here'); raise SystemExit(3)"],
                               lambda p: f"http://127.0.0.1:{p}/", log=tmp_path / "bad.log", timeout=30,
                               on_failed=failed.append)
    assert "no config here" in err.value.tail and "bad-server exited" in str(err.value)
    assert len(failed) == 1 and not processes.alive(failed[0])


def test_ensure_package_finds_the_binary_or_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert processes.ensure_package(sys.executable, "python3") == sys.executable

    class Missing(RuntimeError):
        pass

    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get, no binary of that name
    with pytest.raises(Missing, match="forge-no-such-tool is missing and apt-get is not available: "
                                      "install the forge-no-such-package package"):
        processes.ensure_package(str(tmp_path / "forge-no-such-tool"), "forge-no-such-package", error=Missing)
