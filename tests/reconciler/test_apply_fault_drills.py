"""The apply fault drills of bench/faults.py, one run each, so a regression fails CI (issue 35):
`forgectl apply` SIGKILLed inside its write phase, the API server restarted, etcd SIGKILLed and
etcd out of space (its NOSPACE alarm). The fifth, two applies at once, is a race of two processes'
timing, so its outcome is tested deterministically instead: an apply refused naming the holder of
the environment's Lease (tests/reconciler/test_kubernetes_target.py). Each is judged as the bench judges it:
the apply completes or fails naming the cause, a plain rerun converges (the plan then has no
change) and the Lease is given back. The same functions the bench runs, on a cluster of their own
(the etcd and API server faults must not reach the session's shared cluster).

The etcd faults land right after the apply took the Lease (the first writes meet them), not at a
drawn moment: a fault drawn by time against a short write phase can miss it.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator

import pytest

from bench import faults
from devkit.cluster import Cluster
from devkit.gobuild import ensure_binaries

pytestmark = [pytest.mark.cluster]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[faults.Bench]:
    ensure_binaries()
    cluster = Cluster.start(tempfile.mkdtemp(prefix="forge-test-faults-"), die_with_parent=True, log=lambda msg: None)
    try:
        yield faults.Bench(cluster, tmp_path_factory.mktemp("fault-specs"), 12)
    finally:
        cluster.stop(quiet=True)


def _passed(drill: faults.Drill) -> None:
    assert drill.runs == 1 and drill.failures == 0, drill.to_json()
    assert drill.converge_s, drill.to_json()


def test_an_apply_killed_in_its_write_phase_converges_on_a_rerun(bench: faults.Bench) -> None:
    drill = faults.Drill("kill-apply")
    faults.kill_apply(bench, 1, drill)  # also measures the write phase the later drills land in
    _passed(drill)
    assert drill.landed and drill.landed[0]["fraction_of_write_phase"] is not None


def test_an_api_server_restarted_mid_apply_is_bridged_by_the_applys_retries(bench: faults.Bench) -> None:
    """Stopped right after the apply took the Lease, down 2 s, then started: the apply's retry
    window (30 s for a one-shot command) outlasts the restart, so the apply completes."""
    drill = faults.Drill("apiserver-restart")
    faults.apiserver_restart(bench, 1, drill, down_s=2.0, at=0.0)
    _passed(drill)
    assert drill.landed[0]["outcome"] == "completed", drill.to_json()


def test_etcd_killed_mid_apply_is_bridged_or_named_and_a_rerun_converges(bench: faults.Bench) -> None:
    drill = faults.Drill("etcd-kill")
    faults.etcd_kill(bench, 1, drill, down_s=2.0, at=0.0)
    _passed(drill)
    assert drill.landed[0]["outcome"] in ("completed", "failed clearly")


def test_etcd_out_of_space_mid_apply_fails_naming_it_and_a_rerun_converges(bench: faults.Bench) -> None:
    assert bench.apply(bench.half).returncode == 0  # so the drill's apply creates (etcd out of space still deletes)
    drill = faults.Drill("etcd-nospace")
    faults.etcd_nospace(bench, 1, drill, at=0.0)
    assert drill.landed[0]["apply"] == "creates"
    _passed(drill)
    assert drill.landed[0]["outcome"] == "failed clearly", drill.to_json()
    assert drill.outcomes["alarms_disarmed"] == [["NOSPACE"]]
    assert bench.cluster.etcd_alarms() == []


def test_etcd_raises_the_same_alarm_by_itself_when_its_quota_is_reached(bench: faults.Bench) -> None:
    """The drill's alarm is the state etcd enters on its own: restarted with a backend quota
    below its database's size, the next write is refused and NOSPACE is raised."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    cluster = bench.cluster
    api = client.CoreV1Api(cluster.api_client())
    cluster.restart_etcd(quota_bytes=cluster.etcd_db_size() // 2)
    try:
        with pytest.raises(ApiException) as refused:
            for _ in range(50):  # the API server reconnects to etcd within a few tries
                try:
                    api.create_namespaced_config_map("default", {"metadata": {"generateName": "fill-"}, "data": {"x": "y"}})
                except ApiException as exc:
                    if "database space exceeded" in str(exc.body):
                        raise
                    time.sleep(0.2)
        assert "database space exceeded" in str(refused.value.body)
        assert cluster.etcd_alarms() == ["NOSPACE"]
    finally:
        cluster.restart_etcd()
        cluster.disarm_etcd_alarms()
    assert cluster.etcd_alarms() == []
