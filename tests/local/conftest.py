"""Fixtures of the local-target tests. The runtime environment and the trained digits workspace
are the runtime tests' session fixtures, reused here."""

from __future__ import annotations

from tests.runtimes.conftest import digits, runtime_python  # noqa: F401  (re-exported fixtures)
