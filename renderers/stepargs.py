"""The container arguments that carry a step's config: `<step> --config-json '<JSON>'`.

The encoder and the decoder live together so the rendered manifests (read back by the local
target and by plans) and the runtimes agree on one format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from renderers.labels import canonical_json

CONFIG_FLAG = "--config-json"


def step_args(step: str, config: Mapping[str, Any]) -> list[str]:
    """`args` of a container that runs ``python -m runtimes <step>`` with ``config``."""
    return [step, CONFIG_FLAG, canonical_json(config)]


def decode_step_config(container: Mapping[str, Any]) -> dict[str, Any]:
    """The config a rendered container passes with `--config-json` (empty when it passes none or
    the text is not a JSON object)."""
    args = list(container.get("args") or [])
    if CONFIG_FLAG not in args or args.index(CONFIG_FLAG) + 1 >= len(args):
        return {}
    try:
        value = json.loads(args[args.index(CONFIG_FLAG) + 1])
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
