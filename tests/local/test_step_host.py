"""The step host (runtimes.stephost, reconciler.targets.local.stephost): a step it forks is a
process as a fresh `python -m` would be — its own session, the environment, folder and arguments
it was given, its output, its exit status (a signal's too), a fresh numpy random state — and it
dies with the `forgectl` that started it. A step whose start-up settings differ from the host's
is not taken. The real host runs in the runtime environment, torch imported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from reconciler.targets.local.processes import ProcessRecord, alive, start_ticks
from reconciler.targets.local.stephost import HostedStep, StepHost
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.runtime

PROBE = textwrap.dedent('''
    import json, os, sys
    import numpy
    what = sys.argv[1]
    if what == "raise":
        raise RuntimeError("the step broke")
    if what == "kill":
        os.kill(os.getpid(), 9)
    if what == "sleep":
        import time
        time.sleep(600)
    print(json.dumps({"pid": os.getpid(), "sid": os.getsid(0), "cwd": os.getcwd(), "argv": sys.argv,
                      "color": os.environ.get("COLOR"), "stdin": sys.stdin.read(),
                      "torch": "torch" in sys.modules, "random": float(numpy.random.random())}))
    print("to stderr", file=sys.stderr)
    sys.exit(int(sys.argv[2]))
''')


def _host(tmp_path: Path, python: str, **env: str) -> tuple[StepHost, dict[str, str]]:
    (tmp_path / "mods").mkdir(exist_ok=True)
    (tmp_path / "mods" / "probe.py").write_text(PROBE)
    base = {**os.environ, "PYTHONPATH": f"{ROOT}:{tmp_path / 'mods'}", **env}
    return StepHost(python, base, tmp_path, tmp_path / "host.log"), base


def _run(host: StepHost, python: str, env: dict[str, str], cwd: Path, *args: str) -> tuple[HostedStep, str, int]:
    step = host.spawn([python, "-m", "probe", *args], env, cwd)
    assert step is not None, host.failure
    assert step.stdout is not None
    out = step.stdout.read().decode()
    return step, out, step.wait()


def test_a_forked_step_is_a_process_of_its_own(tmp_path: Path, runtime_python: str) -> None:
    host, env = _host(tmp_path, runtime_python)
    work = tmp_path / "work"
    work.mkdir()
    try:
        first, out1, code1 = _run(host, runtime_python, {**env, "COLOR": "red"}, work, "report", "0")
        second, out2, code2 = _run(host, runtime_python, {**env, "COLOR": "blue"}, work, "report", "3")
    finally:
        host.close()
    assert (code1, code2) == (0, 3)
    one, two = (json.loads(out.splitlines()[0]) for out in (out1, out2))
    assert out1.splitlines()[1] == "to stderr"  # stderr goes where stdout goes, as the executor's pipe
    assert one["pid"] == first.pid and one["sid"] == first.pid  # a session of its own
    assert two["pid"] == second.pid != first.pid
    assert one["cwd"] == str(work) and one["argv"][1:] == ["report", "0"] and one["argv"][0].endswith("probe.py")
    assert (one["color"], two["color"]) == ("red", "blue")  # its own environment, not the host's
    assert one["stdin"] == ""  # nothing to read, as with stdin=DEVNULL
    assert one["torch"] is True  # imported once, by the host
    assert one["random"] != two["random"]  # numpy's global state seeded anew, as in a fresh process
    assert start_ticks(first.pid) is None and start_ticks(second.pid) is None  # ended, and reaped by the host


def test_a_failure_and_a_signal_end_the_step_as_they_would_end_a_fresh_one(tmp_path: Path, runtime_python: str) -> None:
    host, env = _host(tmp_path, runtime_python)
    try:
        _, raised, raised_code = _run(host, runtime_python, env, tmp_path, "raise")
        _, _, killed_code = _run(host, runtime_python, env, tmp_path, "kill")
    finally:
        host.close()
    assert raised_code == 1 and "Traceback" in raised and "RuntimeError: the step broke" in raised
    assert killed_code == -signal.SIGKILL


def test_stderr_apart_and_a_wait_with_a_deadline(tmp_path: Path, runtime_python: str) -> None:
    """As the tests' step runner asks (devkit.runtime_steps): stdout and stderr each in a pipe of
    its own, and a wait that gives up after its deadline while the step goes on."""
    host, env = _host(tmp_path, runtime_python)
    try:
        step = host.spawn([runtime_python, "-m", "probe", "report", "4"], env, tmp_path, separate_stderr=True)
        assert step is not None and step.stdout is not None and step.stderr is not None, host.failure
        out, err, code = step.stdout.read().decode(), step.stderr.read().decode(), step.wait()
        sleeper = host.spawn([runtime_python, "-m", "probe", "sleep"], env, tmp_path)
        assert sleeper is not None
        with pytest.raises(subprocess.TimeoutExpired):
            sleeper.wait(timeout=0.5)
        assert start_ticks(sleeper.pid) is not None  # still running: the deadline was the wait's
        os.killpg(sleeper.pid, signal.SIGKILL)
        killed = sleeper.wait(timeout=30)
    finally:
        host.close()
    assert code == 4 and json.loads(out)["torch"] is True and err == "to stderr\n"
    assert killed == -signal.SIGKILL


def test_the_host_outlives_the_step_thread_that_started_it(tmp_path: Path, runtime_python: str) -> None:
    """The executor runs each step in a thread of its own, and the first step's thread starts the
    host: the host must not die with that thread (PR_SET_PDEATHSIG follows the thread)."""
    host, env = _host(tmp_path, runtime_python)
    first: list[int] = []
    try:
        thread = threading.Thread(target=lambda: first.append(_run(host, runtime_python, env, tmp_path, "report", "0")[2]))
        thread.start()
        thread.join()
        time.sleep(1)  # a SIGKILL on the thread's end would have landed by now
        _, out, code = _run(host, runtime_python, env, tmp_path, "report", "0")
    finally:
        host.close()
    assert first == [0] and code == 0 and host.failure is not None  # closed now; it served both
    assert json.loads(out.splitlines()[0])["torch"] is True


def test_a_step_with_other_start_up_settings_is_not_taken(tmp_path: Path, runtime_python: str) -> None:
    host, env = _host(tmp_path, runtime_python)
    argv = [runtime_python, "-m", "probe", "report", "0"]
    assert host.accepts(argv, {**env, "COLOR": "green"})  # not read at start-up: taken
    assert not host.accepts(argv, {**env, "OMP_NUM_THREADS": "1"})  # libgomp read the host's at import
    assert not host.accepts(argv, {**env, "PYTHONPATH": str(ROOT)})
    assert not host.accepts([sys.executable, "-m", "probe"], env)  # another interpreter
    assert not host.accepts([runtime_python, str(tmp_path / "mods" / "probe.py")], env)  # not `-m`


DRIVER = textwrap.dedent('''
    import json, os, sys, time
    from pathlib import Path
    from reconciler.targets.local.stephost import StepHost
    python, mods, work = sys.argv[1:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.environ["FORGE_ROOT"], mods])}
    host = StepHost(python, env, Path(work), Path(work) / "host.log")
    step = host.spawn([python, "-m", "probe", "sleep"], env, Path(work))
    print(json.dumps({"host": host._proc.pid, "step": step.pid}), flush=True)
    time.sleep(600)
''')


def test_the_host_and_its_steps_die_with_the_process_that_started_them(tmp_path: Path, runtime_python: str) -> None:
    _host(tmp_path, runtime_python)  # writes the probe module
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, runtime_python, str(tmp_path / "mods"), str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "FORGE_ROOT": str(ROOT)})
    try:
        assert driver.stdout is not None
        pids = json.loads(driver.stdout.readline())
        ticks = {name: start_ticks(pid) for name, pid in pids.items()}
        assert all(ticks.values()), ticks
    finally:
        driver.kill()  # as a `forgectl` killed with SIGKILL
        driver.wait()
    records = [ProcessRecord(name, "test", pid, ticks[name] or -1, [], "", {}) for name, pid in pids.items()]
    wait_until(lambda: not any(alive(r) for r in records), 30, "the step host and its step to die with their parent")
