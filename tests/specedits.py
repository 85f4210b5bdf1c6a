"""Edits the tests make to a copy of an example, as a platform team would commit them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def route_by_gateway(specs: Path, parent_ref: Mapping[str, str]) -> None:
    """The copy's `cluster` Environment (in ``specs``/environments.yaml, the quick-start's layout)
    routes its Endpoints by the Gateway API through ``parent_ref`` (`name`, `namespace`,
    `sectionName`: the Gateway and its listener)."""
    envs = specs / "environments.yaml"
    text = envs.read_text()
    anchor = "    namespace: forge-quickstart\n"
    assert anchor in text, text
    envs.write_text(text.replace(anchor, anchor + "  traffic:\n    router: gatewayAPI\n    parentRef:\n"
                                 f"      name: {parent_ref['name']}\n      namespace: {parent_ref['namespace']}\n"
                                 f"      sectionName: {parent_ref['sectionName']}\n", 1))


#: The variant :func:`add_rejected_variant` adds.
REJECTED_VARIANT = "gutted"


def add_rejected_variant(specs: Path) -> None:
    """The copy's Compression (``specs``/compression.yaml, the quick-start's) gains a variant no
    run can keep — 97 % of the hidden units pruned, no fine-tune, half a point allowed — so its
    step's verdict rejects it while the version registers the others."""
    compression = specs / "compression.yaml"
    text = compression.read_text()
    anchor = "  # ONNX export"
    assert anchor in text, text
    compression.write_text(text.replace(anchor, f"    - name: {REJECTED_VARIANT}\n      maxAccuracyDrop: 0.5\n      stages:\n"
                                        "        - type: prune\n          sparsity: 0.97\n          fineTuneEpochs: 0\n"
                                        + anchor, 1))
