"""The upstream judges, built or found once per session."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from devkit.common import ClusterError
from devkit.prometheus import ensure_prometheus
from reconciler.targets.local import upstream


@pytest.fixture(scope="session")
def judge() -> Path:
    """forge-judge, built from the Go module proxy on first use (minutes; its log is on stderr)."""
    t0 = time.monotonic()
    try:
        path = upstream.judge_binary()
    except upstream.UpstreamError as exc:
        pytest.fail(str(exc))
    print(f"[judges] forge-judge ready in {time.monotonic() - t0:.0f} s: {path}", file=sys.stderr, flush=True)
    return path


@pytest.fixture(scope="session")
def seldon_judge() -> Path:
    """seldon-judge, built on first use (about two minutes; its log is on stderr)."""
    try:
        return upstream.seldon_judge_binary()
    except upstream.UpstreamError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool from Debian's prometheus package (installed by the test set-up when missing)."""
    try:
        ensure_prometheus()
        return upstream.promtool_binary()
    except (ClusterError, upstream.UpstreamError) as exc:
        pytest.fail(str(exc))
