"""``python -m runtimes labels-export``: an `autolabel` step's output folder as one line of JSON.

On a cluster the `autolabel` step writes `auto-labels.csv`, the review file and `report.json` to
the workspace claim, which the reviewer's machine cannot read. `forgectl labels pull` runs this in
a pod that mounts the claim read-only and reads the line back from the pod's log: each file's
bytes (base64) with its sha256, so a log cut short or a file changed in between is caught there
rather than merged. The line starts with :data:`RESULT_PREFIX` (the log also holds stderr).
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys

from runtimes._step import in_workspace, parse_config, run_step
from runtimes.errors import StepFailed
from specs.stepconfig import RESULT_PREFIX, LabelsExportConfig

#: The most bytes the folder's files may hold together: the line is read back from the pod's log,
#: which the kubelet rotates at 10 MiB by default (base64 adds a third).
MAX_EXPORT_BYTES = 6 * 1024 * 1024


def export(labels: str) -> dict[str, object]:
    """The files of the folder ``labels`` (workspace-relative): name, sha256 and base64 bytes each."""
    folder = in_workspace(labels)
    if not folder.is_dir():
        raise StepFailed(f"{labels}: no such folder on the workspace (has the `autolabel` step of this version run?)")
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    total = sum(p.stat().st_size for p in files)
    if total > MAX_EXPORT_BYTES:
        raise StepFailed(f"{labels}: its files hold {total} bytes, more than the {MAX_EXPORT_BYTES} a pod's log "
                         "carries back: copy them out from a pod that mounts the workspace claim")
    entries = []
    for path in files:
        data = path.read_bytes()
        entries.append({"name": path.name, "sha256": hashlib.sha256(data).hexdigest(),
                        "base64": base64.b64encode(data).decode("ascii")})
    return {"labels": labels, "files": entries}


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(LabelsExportConfig, argv, "python -m runtimes labels-export")
    print(RESULT_PREFIX + json.dumps(export(config.labels), separators=(",", ":")), flush=True)
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
