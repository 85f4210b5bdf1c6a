"""The fencing token of a Lease tenure (reconciler/targets/kubernetes/lease.py): read from a stored
Lease, written to and read from an annotation, and ordered only within one Lease object."""

from __future__ import annotations

from reconciler.targets.kubernetes.lease import FenceToken


def lease(uid: str | None, holder: str | None, transitions: int | None = None) -> dict[str, object]:
    spec: dict[str, object] = {"holderIdentity": holder} if holder else {}
    if transitions is not None:
        spec["leaseTransitions"] = transitions
    return {"metadata": {"uid": uid} if uid else {}, "spec": spec}


def test_a_stored_lease_names_its_tenure() -> None:
    assert FenceToken.of(lease("u1", "a@h:1")) == FenceToken("u1", 0, "a@h:1")  # a new Lease: no transition yet
    assert FenceToken.of(lease("u1", "b@h:2", 3)) == FenceToken("u1", 3, "b@h:2")
    assert FenceToken.of(lease(None, "a@h:1")) is None
    assert FenceToken.of(lease("u1", None)) is None


def test_the_annotation_round_trips_and_garbage_reads_as_none() -> None:
    token = FenceToken("u1", 2, "a@h:1 (reconcile --watch)")
    assert FenceToken.from_text(token.to_text()) == token
    for text in (None, "", "{", "[]", '{"lease": "u1"}', '{"lease": "u1", "transitions": "x", "holder": "a"}'):
        assert FenceToken.from_text(text) is None, text


def test_only_a_later_tenure_of_the_same_lease_supersedes() -> None:
    first, second = FenceToken("u1", 0, "a"), FenceToken("u1", 1, "b")
    assert second.supersedes(first) and not first.supersedes(second)
    assert not first.supersedes(first)
    assert not FenceToken("u2", 5, "c").supersedes(first)  # a Lease deleted and created again: not comparable
