"""The few bytes of the DNS wire format (RFC 1035, section 4) the harness needs to ask a name server
one question from the host: a query for a name's A records over UDP, and the answer's response code
and addresses. The host has no DNS client of its own to point at the node's CoreDNS (no ``dig``,
``nslookup`` or dnspython), and a pod cannot tell whether kube-proxy already routes the ``kube-dns``
Service from the host.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import struct
from dataclasses import dataclass

TYPE_A = 1
CLASS_IN = 1
RCODES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}


class DNSWireError(ValueError):
    """A message that is not an answer to the query asked."""


@dataclass(frozen=True)
class Answer:
    """What a name server said about one name: its response code and the A records' addresses."""

    rcode: str
    addresses: tuple[str, ...]
    authoritative: bool


def query(name: str, ident: int) -> bytes:
    """A standard query (recursion desired) for the A records of ``name`` with message id ``ident``."""
    labels = [p for p in name.rstrip(".").split(".") if p]
    qname = b"".join(bytes([len(p)]) + p.encode("ascii") for p in labels) + b"\0"
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", TYPE_A, CLASS_IN)


def _skip_name(msg: bytes, i: int) -> int:
    """The offset after the (possibly compressed) name at ``i``."""
    while True:
        if i >= len(msg):
            raise DNSWireError("name runs past the message")
        n = msg[i]
        if n & 0xC0 == 0xC0:  # a pointer ends the name
            return i + 2
        if n == 0:
            return i + 1
        i += 1 + n


def parse(msg: bytes, ident: int) -> Answer:
    """The :class:`Answer` in response ``msg`` to the query with id ``ident``."""
    if len(msg) < 12:
        raise DNSWireError(f"a {len(msg)}-byte message has no header")
    rid, flags, qd, an, _, _ = struct.unpack("!HHHHHH", msg[:12])
    if rid != ident or not flags & 0x8000:
        raise DNSWireError(f"not the response to query {ident} (id {rid}, flags {flags:#06x})")
    i = 12
    for _ in range(qd):
        i = _skip_name(msg, i) + 4
    addresses = []
    for _ in range(an):
        i = _skip_name(msg, i)
        rtype, rclass, _, rdlen = struct.unpack("!HHIH", msg[i:i + 10])
        i += 10
        if rtype == TYPE_A and rclass == CLASS_IN and rdlen == 4:
            addresses.append(str(ipaddress.IPv4Address(msg[i:i + 4])))
        i += rdlen
    return Answer(RCODES.get(flags & 0xF, str(flags & 0xF)), tuple(addresses), bool(flags & 0x0400))


def resolve(server: str, name: str, *, port: int = 53, timeout: float = 2.0) -> Answer:
    """Ask ``server`` over UDP for the A records of ``name``; :class:`OSError` when nothing answers."""
    ident = secrets.randbelow(0x10000)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(query(name, ident), (server, port))
        msg, _ = s.recvfrom(4096)
    return parse(msg, ident)
