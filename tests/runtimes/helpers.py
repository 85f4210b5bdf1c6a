"""Helpers of the runtime tests (the fixtures are in conftest.py): a step's JSON events, HTTP to a
model server, a script's JSON last line. Running steps and servers (Runner, Server) and the digits configs are the dev
harness's, shared with the benches: devkit/runtime_steps.py and devkit/digits.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_json(python: str, *args: str, env: dict[str, str] | None = None, timeout: float = 900) -> dict[str, Any]:
    """Run ``python args`` from the checkout (a bench, or ``-c`` code) in the runtime environment and
    return the JSON object its last line prints; a non-zero exit fails the test with its stderr."""
    proc = subprocess.run([python, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def events(stdout: str) -> list[dict[str, Any]]:
    """The JSON objects a step printed, one a line (other lines skipped)."""
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def post_json(url: str, body: Any, timeout: float = 30) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def get_text(url: str, timeout: float = 30) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def series_value(metrics: str, name: str, **labels: str) -> float:
    """The value of the first sample of ``name`` in a Prometheus text exposition whose labels
    include ``labels``, or 0 when there is none."""
    import re

    for match in re.finditer(rf"^{name}\{{([^}}]*)\}} ([0-9.e+-]+)$", metrics, re.M):
        if all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            return float(match.group(2))
    return 0.0
