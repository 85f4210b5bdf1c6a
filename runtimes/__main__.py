"""``python -m runtimes <step> --config FILE | --config-json TEXT``: the one entry point."""

from __future__ import annotations

import importlib
import sys

from runtimes import STEPS

_MODULES = {
    "prepare": "runtimes.prepare",
    "prepare-group": "runtimes.shard_steps:run_prepare_group",
    "join-shards": "runtimes.shard_steps:run_join",
    "train": "runtimes.train",
    "pick-best": "runtimes.pick_best",
    "evaluate": "runtimes.evaluate",
    "explain": "runtimes.explain",
    "compress": "runtimes.compress",
    "export": "runtimes.export",
    "build-engine": "runtimes.engine",
    "benchmark": "runtimes.benchmark",
    "register": "runtimes.register",
    "serve": "runtimes.serve",
    "serve-seldon": "runtimes.serve_seldon",
    "await": "runtimes.await_files",
    "autolabel": "runtimes.autolabel",
    "merge-labels": "runtimes.merge_labels",
    "labels-export": "runtimes.labels_export",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in _MODULES:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"error: unknown step {argv[0]!r}; expected one of {', '.join(STEPS)}", file=sys.stderr)
        print(f"usage: python -m runtimes {{{','.join(STEPS)}}} --config FILE | --config-json TEXT", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module, _, function = _MODULES[argv[0]].partition(":")
    return int(getattr(importlib.import_module(module), function or "run")(argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
