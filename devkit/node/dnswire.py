"""One DNS question from the host to the node's CoreDNS: the A records of a name over UDP, with the
answer's response code, addresses and authority (dnspython builds and reads the messages). The host
has no DNS client of its own pointed at the node's CoreDNS, and a pod cannot tell whether
kube-proxy already routes the ``kube-dns`` Service from the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import dns.exception
import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype


class DNSWireError(ValueError):
    """A response that is not an answer to the query asked."""


@dataclass(frozen=True)
class Answer:
    """What a name server said about one name: its response code and the A records' addresses."""

    rcode: str
    addresses: tuple[str, ...]
    authoritative: bool


def resolve(server: str, name: str, *, port: int = 53, timeout: float = 2.0) -> Answer:
    """Ask ``server`` over UDP for the A records of ``name`` (recursion desired); :class:`OSError`
    when nothing answers in ``timeout`` seconds, :class:`DNSWireError` for a malformed response."""
    query = dns.message.make_query(name, dns.rdatatype.A)
    try:
        response = dns.query.udp(query, server, port=port, timeout=timeout)
    except dns.exception.Timeout as exc:
        raise TimeoutError(f"{server}:{port} did not answer for {name} within {timeout} s") from exc
    except dns.exception.DNSException as exc:  # a response that is not an answer to this query
        raise DNSWireError(f"{server}:{port} for {name}: {exc}") from exc
    addresses = tuple(rdata.address for rrset in response.answer if rrset.rdtype == dns.rdatatype.A for rdata in rrset)
    return Answer(dns.rcode.to_text(response.rcode()), addresses, bool(response.flags & dns.flags.AA))
