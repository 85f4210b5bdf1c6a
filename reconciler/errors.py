"""Errors of planning and applying. Retry decisions are made on these types, never on text.

    ForgeError (reconciler.diagnostics)
    ├── TargetError                   the target refused or failed an operation on an object
    │   ├── ForbiddenError            RBAC said no (403): names verb, resource, namespace
    │   ├── ConflictError             409: the object changed under us
    │   ├── InvalidObjectError        422: the API server rejected the object (names the fields)
    │   ├── TransientError            worth retrying: connection reset, 429, 500/502/503/504
    │   │   └── UnreachableError      still failing after the retries: names the URL
    │   └── LeaseLost                 the environment's Lease is no longer ours: nothing more is written
    ├── StalePlanError                a saved plan's live state moved since it was made
    ├── LockHeldError                 another apply holds the environment's lease
    ├── ApplyFailed                   an apply stopped part-way: carries what was and wasn't done
    └── TargetNotAvailable            the environment's target cannot be used here
"""

from __future__ import annotations

from reconciler.changeset import ChangeSet
from reconciler.diagnostics import ForgeError
from reconciler.resources import ObjectRef


class TargetError(ForgeError):
    """An operation on the target failed; ``ref``: the object it was about, when it was about one."""

    def __init__(self, message: str, *, status: int | None = None, ref: ObjectRef | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.ref = ref


class ForbiddenError(TargetError):
    """The credential may not do this (HTTP 403)."""

    def __init__(self, verb: str, resource: str, namespace: str | None, detail: str = "") -> None:
        where = f" in namespace {namespace!r}" if namespace else " (cluster-scoped)"
        super().__init__(
            f"forbidden: cannot {verb} {resource}{where}. {detail}".rstrip()
            + "\n  The credential needs the role in docs/rbac/forgectl-role.yaml (bind it to your user or "
            "service account in this namespace).",
            status=403,
        )
        self.verb, self.resource, self.namespace = verb, resource, namespace


class ConflictError(TargetError):
    """The object was modified concurrently (HTTP 409)."""


class InvalidObjectError(TargetError):
    """The API server rejected the object (HTTP 422), e.g. against a CRD schema."""


class TransientError(TargetError):
    """A failure that may pass: retried with backoff."""


class StorageFullError(TargetError):
    """The cluster's storage refuses every write (etcd's NOSPACE alarm) until its operator frees
    space: not retried (it does not pass by itself), but nothing is half-done — a refused write
    was not made — so a watch holds and goes on."""


class UnreachableError(TransientError):
    """The API server could not be reached, even after retries."""


class LeaseLost(TargetError):
    """The environment's Lease is no longer held by this writer (taken over, deleted, or not
    renewed before its fencing deadline): the write was not sent, and the apply stops. Never
    retried: another holder may be writing now."""


class StalePlanError(ForgeError):
    """The live state moved since a saved plan was made."""


class LockHeldError(ForgeError):
    """Another apply holds the environment's lock."""


class TargetNotAvailable(ForgeError):
    """The selected environment's target cannot be used (not configured, not built yet…)."""


class ApplyFailed(ForgeError):
    """An apply stopped part-way; ``changeset`` says what was applied and what was not."""

    def __init__(self, message: str, changeset: ChangeSet) -> None:
        super().__init__(message)
        self.changeset = changeset
