"""Failures of a step, each with its exit code.

    StepFailed                (exit 1)  anything the user can fix: bad config, missing data, …
    ├── DigestMismatch        (exit 2)  the data's digest differs from the Dataset spec's
    ├── ThresholdsFailed      (exit 3)  evaluate: an offline threshold does not hold
    └── UpstreamFailed        (exit 5)  await: the run it waits for failed

A compression or export variant beyond its bound is not a failure: its step records the verdict
and ends 0 (runtimes.verdicts).
"""

from __future__ import annotations

from specs.stepconfig import EXIT_DIGEST_MISMATCH, EXIT_THRESHOLDS_FAILED, EXIT_UPSTREAM_FAILED


class StepFailed(Exception):
    """A failure with one clear message; the dispatcher prints it and exits with ``exit_code``."""

    exit_code = 1


class DigestMismatch(StepFailed):
    exit_code = EXIT_DIGEST_MISMATCH


class ThresholdsFailed(StepFailed):
    exit_code = EXIT_THRESHOLDS_FAILED


class UpstreamFailed(StepFailed):
    exit_code = EXIT_UPSTREAM_FAILED
