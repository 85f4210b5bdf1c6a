"""The controller's PrometheusRule (`forgectl install`, reconciler/controller/install.py) judged by
Debian's promtool: `promtool check rules` takes it, and `promtool test rules` runs each alert over
series shaped like two replicas' `/metrics` as the PodMonitor scrapes them — it fires for the
leader's failing Sync, a rollout held at one step past the deadline and a source no replica
leads, and stays silent for a deposed replica's stale series and a rollout that moves."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from reconciler.controller.install import InstallOptions, prometheus_rule
from reconciler.targets.local import upstream

RULE = prometheus_rule(InstallOptions())
#: The target labels the Prometheus Operator gives a PodMonitor's series.
A = 'namespace="forge-system",pod="forge-controller-a",job="forge-system/forge-controller"'
B = 'namespace="forge-system",pod="forge-controller-b",job="forge-system/forge-controller"'


def promtool_test(tmp_path: Path, promtool: str, series: list[dict[str, str]], alerts: list[dict[str, Any]],
                  minutes: int = 40) -> subprocess.CompletedProcess[str]:
    rules = tmp_path / "forge-controller.rules.json"
    rules.write_text(json.dumps({"groups": RULE["spec"]["groups"]}))
    test = tmp_path / "test.json"
    test.write_text(json.dumps({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series, "alert_rule_test": alerts}]}))
    return subprocess.run([promtool, "test", "rules", test.name], cwd=tmp_path, capture_output=True, text=True, timeout=120)


def annotations(alert: str, labels: dict[str, str]) -> dict[str, str]:
    """The alert's annotations with its labels filled in, as Prometheus fills `{{ $labels.x }}`."""
    [rule] = [r for r in RULE["spec"]["groups"][0]["rules"] if r["alert"] == alert]
    out = {}
    for key, text in rule["annotations"].items():
        for name, value in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", value)
        out[key] = text
    return out


def fired(alert: str, at: str, *labels: dict[str, str]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert,
            "exp_alerts": [{"exp_labels": dict(x), "exp_annotations": annotations(alert, x)} for x in labels]}


def test_promtool_checks_the_controllers_rules(promtool: str) -> None:
    assert upstream.promtool_check_rules(RULE) == []
    assert [r["alert"] for r in RULE["spec"]["groups"][0]["rules"]] == [
        "ForgeSyncFailing", "ForgeRolloutStuck", "ForgeControllerNoLeader"]


def test_each_alert_fires_on_the_leaders_series_only(tmp_path: Path, promtool: str) -> None:
    up = [{"series": f"up{{{A}}}", "values": "1x50"}, {"series": f"up{{{B}}}", "values": "1x50"}]
    series = [
        *up,
        # a leads source `quickstart` throughout; b led it once and keeps its stale series
        {"series": f'forge_controller_leader{{{A},source="quickstart"}}', "values": "1x50"},
        {"series": f'forge_controller_leader{{{B},source="quickstart"}}', "values": "0x50"},
        # the leader's Sync: Ready, then failing from minute 5 on
        {"series": f'forge_controller_sync_ready{{{A},source="quickstart"}}', "values": "1x4 0x45"},
        {"series": f'forge_controller_sync_ready{{{B},source="quickstart"}}', "values": "0x50"},
        # endpoint digits enters step 2 at minute 5 and is held there; endpoint other moves on every 10 minutes
        {"series": f'forge_controller_rollout_phase{{{A},source="quickstart",endpoint="digits",phase="Holding"}}',
         "values": "1x50"},
        {"series": f'forge_controller_rollout_step{{{A},source="quickstart",endpoint="digits"}}', "values": "1x4 2x45"},
        {"series": f'forge_controller_rollout_phase{{{A},source="quickstart",endpoint="other",phase="Progressing"}}',
         "values": "1x50"},
        {"series": f'forge_controller_rollout_step{{{A},source="quickstart",endpoint="other"}}',
         "values": "1x9 2x9 3x9 1x9 2x10"},
        # source `batch`: both replicas follow (its Lease is held elsewhere, or by no one)
        {"series": f'forge_controller_leader{{{A},source="batch"}}', "values": "0x50"},
        {"series": f'forge_controller_leader{{{B},source="batch"}}', "values": "0x50"},
    ]
    leader = {"namespace": "forge-system", "pod": "forge-controller-a", "job": "forge-system/forge-controller",
              "source": "quickstart"}
    alerts = [
        fired("ForgeSyncFailing", "12m"),  # failing for 7 min: not yet
        fired("ForgeSyncFailing", "16m", {**leader, "severity": "warning"}),
        fired("ForgeRolloutStuck", "30m"),  # held 25 min: inside the 30 min deadline
        fired("ForgeRolloutStuck", "44m", {**leader, "endpoint": "digits", "phase": "Holding", "severity": "warning"}),
        fired("ForgeControllerNoLeader", "5m", {"source": "batch", "severity": "critical"}),
    ]
    done = promtool_test(tmp_path, promtool, series, alerts)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_replica_up_is_no_leader(tmp_path: Path, promtool: str) -> None:
    series = [{"series": f"up{{{A}}}", "values": "1x4 0x20"},
              {"series": f'forge_controller_leader{{{A},source="quickstart"}}', "values": "1x4 _x20"}]
    done = promtool_test(tmp_path, promtool, series, [
        fired("ForgeControllerNoLeader", "3m"),
        fired("ForgeControllerNoLeader", "12m", {"severity": "critical"})])
    assert done.returncode == 0, done.stdout + done.stderr
