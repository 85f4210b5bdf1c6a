"""A source's git credentials, read from the Kubernetes Secret its configuration points at
(`secretRef`, in the controller's namespace) right before each fetch — never from a spec, an
argument or a file the controller was started with — and handed to the fetch runner
(:func:`reconciler.load.gitrepo.fetch_source`), which gives them to git through its environment
and files of that fetch alone. The keys are Flux's: `username` and `password`, or `bearerToken`
(http/https); `identity` and `known_hosts` (ssh); `ca.crt` (or Flux's older `caFile`), the PEM
certificate of a private certificate authority an https server's certificate is checked against
besides the system's, and `tls.crt` with `tls.key`, a client certificate for an https server that
asks one. Messages name the Secret and its keys, never a value.
"""

from __future__ import annotations

import base64
import binascii
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.diagnostics import ForgeError
from reconciler.load.gitrepo import GitCredentials
from reconciler.resources import Resource
from reconciler.targets.base import ControllerAPI

SECRET = Resource("", "v1", "Secret", "secrets")
#: Secret key → GitCredentials field.
KEYS = {"username": "username", "password": "password", "bearerToken": "bearer_token", "identity": "identity",
        "known_hosts": "known_hosts", "ca.crt": "ca_cert", "tls.crt": "client_cert", "tls.key": "client_key"}
#: Flux's older name of `ca.crt`, read when `ca.crt` is absent (as Flux does).
CA_FILE_KEY = "caFile"


def _decoded(encoded: str, what: str, *, text: bool) -> bytes:
    """A Secret's value (base64 in `data`, as the API server returns it); with ``text``, it must be
    UTF-8. :class:`ForgeError` naming ``what`` otherwise."""
    try:
        value = base64.b64decode(encoded, validate=True)
        if text:
            value.decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ForgeError(f"{what} is not base64{' of UTF-8 text' if text else ''}") from None
    return value


def credentials_of(secret: Mapping[str, Any], where: str) -> GitCredentials:
    """The credentials a Secret object holds (its `data`, base64 as the API server returns it)."""
    data = secret.get("data") or {}
    values: dict[str, str] = {}
    for key, name in KEYS.items():
        key = CA_FILE_KEY if key == "ca.crt" and key not in data and CA_FILE_KEY in data else key
        if key not in data:
            continue
        values[name] = _decoded(data[key], f"Secret {where}: key {key!r}", text=True).decode()
        if name in ("ca_cert", "client_cert"):
            _check_certificates(values[name], f"Secret {where}: key {key!r}")
    if not values:
        raise ForgeError(f"Secret {where} holds none of the keys {', '.join(KEYS)}")
    if ("client_cert" in values) != ("client_key" in values):
        raise ForgeError(f"Secret {where}: key 'tls.crt' (a client certificate) and key 'tls.key' (its private key) "
                         "go together; it holds one of them")
    if "client_key" in values and "PRIVATE KEY-----" not in values["client_key"]:
        raise ForgeError(f"Secret {where}: key 'tls.key' holds no PEM private key; expected a "
                         "-----BEGIN … PRIVATE KEY----- block (the client certificate's key)")
    return GitCredentials(**values)


def _check_certificates(pem: str, what: str) -> None:
    """:class:`ForgeError` naming ``what`` unless ``pem`` holds PEM certificates that OpenSSL loads,
    so a pasted key or a DER file is named here rather than as git's TLS failure at the fetch."""
    loads = "-----BEGIN CERTIFICATE-----" in pem
    if loads:
        try:
            ssl.create_default_context(cadata=pem)
        except ssl.SSLError:
            loads = False
    if not loads:
        raise ForgeError(f"{what} holds no PEM certificate OpenSSL can load; expected one or more "
                         "-----BEGIN CERTIFICATE----- blocks")


#: The key of the webhook's Secret (`webhook.secretRef`) that holds its secret.
WEBHOOK_KEY = "secret"


def read_webhook_secret(api: ControllerAPI | None, namespace: str, name: str) -> bytes:
    """The webhook's secret: key ``secret`` of Secret ``namespace``/``name`` (1 to 4096 bytes);
    :class:`ForgeError` naming the Secret and the key, never a value."""
    if api is None:
        raise ForgeError(f"Secret {namespace}/{name}: a webhook secret from a Secret needs a cluster")
    secret = api.get_object(SECRET, namespace, name)
    if secret is None:
        raise ForgeError(f"Secret {namespace}/{name} (the webhook's secretRef) does not exist")
    encoded = (secret.get("data") or {}).get(WEBHOOK_KEY)
    if encoded is None:
        raise ForgeError(f"Secret {namespace}/{name} has no key {WEBHOOK_KEY!r} (the webhook's secret)")
    value = _decoded(encoded, f"Secret {namespace}/{name}: key {WEBHOOK_KEY!r}", text=False).strip()
    if not value or len(value) > 4096:
        raise ForgeError(f"Secret {namespace}/{name}: key {WEBHOOK_KEY!r} must hold 1 to 4096 bytes")
    return value


@dataclass
class WebhookSecret:
    """The webhook's secret as last read (the HTTP thread reads it, the controller's loop refreshes
    it from the Secret every :data:`WEBHOOK_REFRESH` seconds, as the kubelet refreshes a mounted one):
    a Secret made or rotated after the start is taken without a restart; while there is none,
    ``problem`` says why and the webhook answers 503."""

    value: bytes | None = None
    problem: str = "the webhook's secret has not been read yet"
    #: ``time.monotonic()`` of the next read from the Secret.
    next_read: float = 0.0


#: Seconds between two reads of the webhook's Secret (the kubelet's sync period is a minute).
WEBHOOK_REFRESH = 30.0


def read_credentials(api: ControllerAPI | None, namespace: str, name: str) -> GitCredentials:
    """The credentials in Secret ``namespace``/``name``; :class:`ForgeError` when it is missing
    or unreadable (the sync is then FetchFailed, and retried)."""
    if api is None:
        raise ForgeError(f"Secret {namespace}/{name}: credentials from a Secret need a cluster")
    secret = api.get_object(SECRET, namespace, name)
    if secret is None:
        raise ForgeError(f"Secret {namespace}/{name} (the source's secretRef) does not exist")
    return credentials_of(secret, f"{namespace}/{name}")
