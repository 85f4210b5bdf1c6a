"""devkit/node/dnswire.py: the query the harness sends and the answers it reads (no network; the node
test tests/cluster/test_dns_node.py asks the real CoreDNS)."""

from __future__ import annotations

import struct

import pytest

from devkit.node import dnswire


def test_the_query_asks_for_a_records_with_recursion() -> None:
    q = dnswire.query("kubernetes.default.svc.cluster.local.", 0x1234)
    assert q[:12] == struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    assert q[12:] == b"\x0akubernetes\x07default\x03svc\x07cluster\x05local\x00" + b"\x00\x01\x00\x01"


def _response(ident: int, flags: int, question: bytes, answers: list[bytes]) -> bytes:
    return struct.pack("!HHHHHH", ident, flags, 1, len(answers), 0, 0) + question + b"".join(answers)


def test_an_answer_with_compressed_names_a_cname_and_two_addresses() -> None:
    q = dnswire.query("web.ns.svc.cluster.local", 7)
    question = q[12:]
    ptr = b"\xc0\x0c"  # the question's name, at offset 12
    cname = ptr + struct.pack("!HHIH", 5, 1, 30, 2) + ptr  # rdata: a pointer
    a1 = ptr + struct.pack("!HHIH", 1, 1, 30, 4) + bytes([10, 244, 0, 7])
    aaaa = ptr + struct.pack("!HHIH", 28, 1, 30, 16) + bytes(16)
    a2 = ptr + struct.pack("!HHIH", 1, 1, 30, 4) + bytes([10, 244, 0, 8])
    got = dnswire.parse(_response(7, 0x8580, question, [cname, a1, aaaa, a2]), 7)
    assert got == dnswire.Answer("NOERROR", ("10.244.0.7", "10.244.0.8"), authoritative=True)


def test_nxdomain_and_a_response_to_another_query() -> None:
    question = dnswire.query("nope.cluster.local", 9)[12:]
    assert dnswire.parse(_response(9, 0x8583, question, []), 9) == dnswire.Answer("NXDOMAIN", (), True)
    with pytest.raises(dnswire.DNSWireError):
        dnswire.parse(_response(10, 0x8583, question, []), 9)
    with pytest.raises(dnswire.DNSWireError):  # a query, not a response
        dnswire.parse(dnswire.query("nope.cluster.local", 9), 9)
    with pytest.raises(dnswire.DNSWireError):
        dnswire.parse(b"\x00\x09", 9)
