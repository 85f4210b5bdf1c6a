"""A source's git credentials, read from the Kubernetes Secret its configuration points at
(`secretRef`, in the controller's namespace) right before each fetch — never from a spec, an
argument or a file the controller was started with — and handed to the fetch runner
(:func:`reconciler.load.gitrepo.fetch_source`), which gives them to git through its environment
and files of that fetch alone. The keys are Flux's: `username` and `password`, or `bearerToken`
(http/https); `identity` and `known_hosts` (ssh). Messages name the Secret and its keys, never a value.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from reconciler.diagnostics import ForgeError
from reconciler.load.gitrepo import GitCredentials
from reconciler.resources import Resource
from reconciler.targets.base import ControllerAPI

SECRET = Resource("", "v1", "Secret", "secrets")
#: Secret key → GitCredentials field.
KEYS = {"username": "username", "password": "password", "bearerToken": "bearer_token", "identity": "identity",
        "known_hosts": "known_hosts"}


def credentials_of(secret: Mapping[str, Any], where: str) -> GitCredentials:
    """The credentials a Secret object holds (its `data`, base64 as the API server returns it)."""
    data = secret.get("data") or {}
    values: dict[str, str] = {}
    for key, name in KEYS.items():
        if key not in data:
            continue
        try:
            values[name] = base64.b64decode(data[key], validate=True).decode()
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise ForgeError(f"Secret {where}: key {key!r} is not base64 of UTF-8 text") from None
    if not values:
        raise ForgeError(f"Secret {where} holds none of the keys {', '.join(KEYS)}")
    return GitCredentials(**values)


def read_credentials(api: ControllerAPI | None, namespace: str, name: str) -> GitCredentials:
    """The credentials in Secret ``namespace``/``name``; :class:`ForgeError` when it is missing
    or unreadable (the sync is then FetchFailed, and retried)."""
    if api is None:
        raise ForgeError(f"Secret {namespace}/{name}: credentials from a Secret need a cluster")
    secret = api.get_object(SECRET, namespace, name)
    if secret is None:
        raise ForgeError(f"Secret {namespace}/{name} (the source's secretRef) does not exist")
    return credentials_of(secret, f"{namespace}/{name}")
