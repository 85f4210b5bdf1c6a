"""``python -m runtimes.outcome``: the workflow's `onExit` handler — records how a model
version's workflow ended (status and failures) in ``outcome.json``, whatever happened before."""

from __future__ import annotations

import argparse
import json
import sys
import time

from runtimes._step import in_workspace, write_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtimes.outcome", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--status", required=True, help="{{workflow.status}}: Succeeded, Failed or Error")
    parser.add_argument("--failures", default="", help="{{workflow.failures}}: JSON list of failed nodes")
    parser.add_argument("--output", required=True, help="path of outcome.json, relative to the workspace")
    args = parser.parse_args(argv)
    try:
        failures = json.loads(args.failures) if args.failures.strip() else []
    except json.JSONDecodeError:
        failures = [{"message": args.failures}]  # Argo leaves the template text when there are none
    outcome = {"model": args.model, "version": args.version, "status": args.status, "failures": failures, "at": time.time()}
    write_json(in_workspace(args.output), outcome)
    print(json.dumps({"event": "outcome", **outcome}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
