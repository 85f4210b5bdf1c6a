"""The watch-fed cache the controller's rollout walk reads (reconciler/targets/kubernetes/informer.py),
against the real kube-apiserver: one LIST, then the watch's events, and a LIST again only where
the server says the watch's history is gone."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from reconciler.resources import BY_KIND, ObjectRef
from reconciler.targets.kubernetes.informer import Informer
from reconciler.targets.kubernetes.target import KubernetesTarget
from tests.polling import wait_until

CONFIGMAP = BY_KIND["ConfigMap"]
SELECTOR = "forge.dev/test-informer=yes"


def configmap(name: str, value: str, namespace: str, *, labelled: bool = True) -> dict[str, Any]:
    labels = {"forge.dev/test-informer": "yes"} if labelled else {}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "data": {"value": value}}


def values(target: KubernetesTarget) -> dict[str, str]:
    return {o["metadata"]["name"]: o["data"]["value"] for o in target.list_current(CONFIGMAP, SELECTOR)}


def informer_of(target: KubernetesTarget) -> Informer:
    (informer,) = target._informers.values()
    return informer


def test_the_cache_follows_creates_changes_and_deletes_from_one_list(kube_cluster: Any, namespace: str) -> None:
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    target.apply(configmap("a", "1", namespace))
    assert target.cache_mark(CONFIGMAP, SELECTOR) is None  # no cache outside `watching`
    with target.watching([CONFIGMAP]):
        assert values(target) == {"a": "1"}  # the first read: the LIST the cache starts from
        informer = informer_of(target)
        listed = target.cache_mark(CONFIGMAP, SELECTOR)
        assert listed is not None
        target.apply(configmap("b", "2", namespace))
        target.apply(configmap("a", "3", namespace))
        target.apply(configmap("other", "9", namespace, labelled=False))  # not selected: never in the cache
        wait_until(lambda: values(target) == {"a": "3", "b": "2"}, 15, "the cache to follow the writes")
        followed = target.cache_mark(CONFIGMAP, SELECTOR)
        assert followed is not None and followed != listed  # the mark moves with the store
        assert target.cache_mark(CONFIGMAP, SELECTOR) == followed and values(target) == {"a": "3", "b": "2"}
        target.delete(ObjectRef("ConfigMap", namespace, "b"))
        wait_until(lambda: values(target) == {"a": "3"}, 15, "the cache to drop the deleted ConfigMap")
        assert target.cache_mark(CONFIGMAP, SELECTOR) not in (None, followed)
        assert informer.lists == 1 and informer.watches == 1  # nothing LISTed again
    assert not target._informers  # its watch ended with the block
    assert target.cache_mark(CONFIGMAP, SELECTOR) is None
    assert values(target) == {"a": "3"}  # outside: a LIST, as before


def test_what_the_caller_wrote_is_read_back_before_its_event(kube_cluster: Any, namespace: str) -> None:
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    target.apply(configmap("a", "1", namespace))
    with target.watching([CONFIGMAP]):
        values(target)
        informer = informer_of(target)
        before = informer.mark()
        stored = target.apply(configmap("a", "2", namespace))
        target.remember(stored)
        assert values(target) == {"a": "2"}  # at once, whenever the watch's event comes
        remembered = informer.mark()
        assert remembered != before  # a reader of the mark reads again after its own write
        older = {**stored, "metadata": {**stored["metadata"], "resourceVersion": "1"}, "data": {"value": "0"}}
        informer.observe(older)  # an older version does not take a newer one back
        assert values(target) == {"a": "2"}


def test_a_watch_whose_history_is_gone_lists_again(kube_cluster: Any, namespace: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A resourceVersion older than the server keeps history for: it says 410, and the informer
    LISTs again (and carries on watching from there)."""
    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig)
    target.apply(configmap("a", "1", namespace))
    first = target.list_snapshot(CONFIGMAP, SELECTOR)
    informer = Informer("test", lambda: target.list_snapshot(CONFIGMAP, SELECTOR),
                        lambda version, seconds: target.watch_kind(CONFIGMAP, SELECTOR, version, seconds))
    caplog.set_level(logging.INFO, logger="forge.informer")
    informer.start(type(first)(first.items, "1"))  # revision 1: long compacted out of the watch cache
    try:
        wait_until(lambda: informer.lists == 2, 15, "the informer to LIST again after the 410")
        assert "the watch's resourceVersion 1 expired: listing again" in caplog.text  # the 410, no other error
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        target.apply(configmap("a", "2", namespace))
        wait_until(lambda: {o["data"]["value"] for o in informer.items() or []} == {"2"}, 15, "the watch after it")
    finally:
        informer.stop()

