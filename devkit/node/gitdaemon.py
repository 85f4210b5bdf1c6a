"""A git server the cluster's pods reach: Debian's `git daemon` in a pod on the node, from the
controller image (:mod:`devkit.node.controller_image`, which holds Debian's git), with one empty
bare repository ``specs.git`` that accepts pushes, and a Service in front of it.

The controller fetches it by the Service's ClusterIP (kube-proxy's rules; by name once the node has
cluster DNS); the host pushes to the pod's IP over the pods' bridge. Nothing listens on the host.
The repository lives in the pod's ``emptyDir``: deleting the pod empties it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kubernetes import client

NAME = "git-server"
PORT = 9418
REPOSITORY = "specs.git"


@dataclass(frozen=True)
class GitDaemon:
    """``url``: what pods fetch (the Service's ClusterIP); ``push_url``: what the host pushes to."""

    namespace: str
    url: str
    push_url: str


def start(core: client.CoreV1Api, namespace: str, image: str, timeout: float = 180.0) -> GitDaemon:
    """The pod and its Service in ``namespace`` (which exists), once the daemon answers."""
    labels = {"app.kubernetes.io/name": NAME}
    script = (f"git init --quiet --bare --initial-branch=main /srv/git/{REPOSITORY} && "
              f"exec git daemon --reuseaddr --export-all --enable=receive-pack --base-path=/srv/git --port={PORT} /srv/git")
    core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name=NAME, labels=labels),
        spec=client.V1PodSpec(termination_grace_period_seconds=1, containers=[client.V1Container(
            name="git-daemon", image=image, image_pull_policy="Never", command=["/bin/sh", "-c", script],
            ports=[client.V1ContainerPort(container_port=PORT, name="git")],
            readiness_probe=client.V1Probe(tcp_socket=client.V1TCPSocketAction(port=PORT), period_seconds=1),
            security_context=client.V1SecurityContext(
                run_as_non_root=True, read_only_root_filesystem=True, allow_privilege_escalation=False,
                capabilities=client.V1Capabilities(drop=["ALL"])),
            volume_mounts=[client.V1VolumeMount(name="srv", mount_path="/srv/git")])],
            volumes=[client.V1Volume(name="srv", empty_dir=client.V1EmptyDirVolumeSource())])))
    service = core.create_namespaced_service(namespace, client.V1Service(
        metadata=client.V1ObjectMeta(name=NAME, labels=labels),
        spec=client.V1ServiceSpec(selector=labels, ports=[client.V1ServicePort(name="git", port=PORT, target_port="git")])))

    deadline = time.monotonic() + timeout
    while True:
        status = core.read_namespaced_pod(NAME, namespace).status
        if status is not None and status.pod_ip and any(c.type == "Ready" and c.status == "True"
                                                        for c in status.conditions or ()):
            pod_ip = status.pod_ip
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the git server's pod {namespace}/{NAME} not Ready after {timeout:g} s: {status}")
        time.sleep(1)
    cluster_ip = service.spec.cluster_ip if service.spec is not None else None
    return GitDaemon(namespace, f"git://{cluster_ip}:{PORT}/{REPOSITORY}",
                     f"git://{pod_ip}:{PORT}/{REPOSITORY}")
