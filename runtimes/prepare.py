"""``python -m runtimes prepare``: read, check (digest), clean, label and split a Dataset.

Writes ``output/{train,validation,test}.npz`` and ``output/meta.json``, plus ``metrics.json``
(rows per split, digest). ``--print-digest`` only prints the source's digest (to pin it in a spec).
"""

from __future__ import annotations

import argparse
import logging
import sys

from runtimes._step import in_workspace, parse_config, run_step, write_json
from specs.stepconfig import PrepareConfig

log = logging.getLogger("forge.prepare")


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--print-digest", action="store_true", help="print the source data's digest and exit")


def main(argv: list[str] | None = None) -> int:
    from runtimes import data

    config, args = parse_config(PrepareConfig, argv, "python -m runtimes prepare", _extra)
    if args.print_digest:
        print(data.read_source(config.spec).digest)
        return 0
    out = in_workspace(config.output)
    log.info("preparing dataset %s from %s", config.dataset, config.spec.source.uri)
    meta = data.prepare(config.spec, out, verify_digest=config.verify_digest)
    write_json(out / "metrics.json", {"dataset": config.dataset, "digest": meta["digest"], "rows": meta["rows"], "task": meta["task"]})
    log.info("prepared %s: %s rows (train/validation/test)", config.dataset, "/".join(str(v) for v in meta["rows"].values()))
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
