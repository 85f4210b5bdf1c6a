"""What benches share on their command line: the options of a depth ladder, the command that made
the figures, and the JSON object printed as the last line (and written, indented, to ``--out``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def ladder_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line with the options of a ladder of model depths
    (``--layers``), the device (``--device``) and ``--out``; the bench adds its own."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--out", help="also write the JSON object to this file")
    return parser


def command_line(script: str, args: argparse.Namespace) -> str:
    """``python bench/<script>`` with the options ``args`` holds (lists space-separated; unset ones left out)."""
    options = (f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
               for k, v in vars(args).items() if v is not None)
    return " ".join([f"python bench/{script}", *options])


def emit(result: dict[str, Any], out: str | None) -> None:
    """Print ``result`` as one JSON line (a bench's last) and, with ``out``, write it there indented."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)
