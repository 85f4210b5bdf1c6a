"""``kubectl`` as the node cluster's admin: the one place the harness runs it. Below both the node
(:mod:`devkit.node.node`) and what runs on it, so CoreDNS — which the node starts — uses it too
without importing the node back."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class KubectlNode(Protocol):
    """What running kubectl needs of a node: its binaries and the admin kubeconfig."""

    @property
    def kubeconfig(self) -> str: ...

    @property
    def exes(self) -> Mapping[str, Any]: ...


def kubectl(node: KubectlNode, *args: str, stdin: str | None = None, error: type[Exception] = RuntimeError) -> str:
    """Its stdout; ``error`` with its stderr when it fails."""
    proc = subprocess.run([str(node.exes["kubectl"]), f"--kubeconfig={node.kubeconfig}", *args],
                          input=stdin, capture_output=True, text=True)
    if proc.returncode != 0:
        raise error(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def apply_list(node: KubectlNode, docs: Sequence[Mapping[str, Any]], error: type[Exception] = RuntimeError) -> None:
    """Server-side apply ``docs`` as one List (conflicts forced: the harness owns what it applies)."""
    kubectl(node, "apply", "--server-side", "--force-conflicts", "-f", "-", error=error,
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)}))
