"""`forgectl labels` against a cluster: the `autolabel` step's files off the workspace claim, and a
`pvc://` source's merged labels written into its claim — each by a one-off pod
(renderers/labelpods.py) whose log carries the answer back.

`pull` is read-only: `python -m runtimes labels-export` prints the folder (each file's bytes and
sha256) and the files are written here only after every digest matches. `merge` (a `pvc://`
source, sharded or a single file) runs `python -m runtimes merge-labels --then-publish` with the
reviewed file and the auto-labels in a ConfigMap the pod owns (the API server's garbage collector removes it with the pod), stages the
merge on the workspace claim (`labels-merges/<dataset>/<id>`: what a `--withdraw` pod needs) and
prints merge.json. On the local target the same files are read from its workspace folder.
Every pod is deleted once it has answered, or once forgectl stops waiting.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.diagnostics import ForgeError, printable
from reconciler.load.loader import LoadResult
from reconciler.resources import BY_KIND, POD
from reconciler.targets.base import PodAPI, Target
from renderers.labelpods import DEADLINE_SECONDS, INPUTS_PATH, MAX_INPUT_BYTES, inputs_config_map, merge_pod, pull_pod
from renderers.prerequisites import WORKSPACE_PVC
from renderers.versions import model_version
from renderers.workflow import version_dir
from specs import Environment, Model
from specs.stepconfig import EXIT_DIGEST_MISMATCH, RESULT_PREFIX, MergeLabelsConfig

CONFIG_MAP, CLAIM = BY_KIND["ConfigMap"], BY_KIND["PersistentVolumeClaim"]
#: A pod still Pending after this long with a reason the kubelet gives (an image it cannot pull, a
#: claim it cannot mount) is given up on, with that reason.
STUCK_SECONDS = 120.0
#: Where a merge pod stages its shard and merge.json on the workspace claim.
MERGES_DIR = "labels-merges"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PulledLabels:
    """The `autolabel` files of one Model version, written into ``folder``."""

    model: str
    version: str
    folder: Path
    files: tuple[str, ...]
    report: Mapping[str, Any] | None

    def to_json(self) -> dict[str, object]:
        return {"model": self.model, "version": self.version, "folder": str(self.folder), "files": list(self.files),
                "report": dict(self.report) if self.report is not None else None}


def labels_dir(model: str, version: str) -> str:
    """The workspace folder the `autolabel` step of ``model``'s ``version`` writes."""
    return f"{version_dir(model, version)}/labels"


def current_version(result: LoadResult, environment: Environment, model: str) -> str:
    """The version ``model``'s spec renders to now in ``environment`` (what `apply` trains)."""
    doc = result.specs.get(Model, model)
    if doc is None:
        known = ", ".join(m.name for m in result.specs.of(Model)) or "none defined"
        raise ForgeError(f"no Model {model!r} in the specs (known: {known})")
    return model_version(result.specs, doc, environment)


def _quiet(_: str) -> None:
    pass


def pull_labels(target: Target, environment: Environment, model: str, version: str, to: Path,
                progress: Progress = _quiet) -> PulledLabels:
    """Write the `autolabel` files of ``model``'s ``version`` into ``to`` (created; a file already
    there is replaced only once every file has arrived whole): read by a pod on a cluster, or from
    the local target's workspace folder."""
    folder = labels_dir(model, version)
    pods = target.pod_api()
    if pods is not None:
        require_claims(pods, {WORKSPACE_PVC: "the workspace, where the `autolabel` step wrote: apply the specs first"})
        name = f"forge-labels-pull-{secrets.token_hex(4)}"
        progress(f"reading {folder} from the workspace claim (pod {pods.namespace}/{name})")
        answer = run_pod(pods, pull_pod(environment, pods.namespace, name, folder), progress=progress,
                         what=f"reading {folder}")
        files = {}
        for entry in answer.get("files") or []:
            data = base64.b64decode(entry["base64"])
            if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise ForgeError(f"{folder}/{entry['name']}: its bytes arrived damaged (sha256 differs): nothing written")
            files[str(entry["name"])] = data
    else:
        found = target.workspace_files(folder)
        if found is None:
            raise ForgeError(f"{folder}: no such folder in the workspace of the Environment {environment.name} (has "
                             f"the `autolabel` step of {model} {version} run there?)")
        files = found
    if not files:
        raise ForgeError(f"{folder}: the `autolabel` step wrote nothing there")
    for name in files:
        if Path(name).name != name or name in ("", ".", ".."):
            raise ForgeError(f"{folder}: a file named {printable(name)!r} cannot be written here")
    to.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        staged = to / f".{name}.part"
        staged.write_bytes(data)
        staged.replace(to / name)
    try:
        report = json.loads(files["report.json"]) if "report.json" in files else None
    except ValueError:
        report = None
    return PulledLabels(model, version, to, tuple(sorted(files)), report if isinstance(report, dict) else None)


def _pending_reason(pod: Mapping[str, Any]) -> str | None:
    """Why a pending pod waits, as the kubelet or the scheduler says (None when it gives nothing)."""
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") and waiting["reason"] not in ("ContainerCreating", "PodInitializing"):
            return f"{waiting['reason']}: {waiting.get('message', '')}".strip(": ")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"not scheduled: {condition.get('message') or condition.get('reason')}"
    return None


def _result(log: str) -> dict[str, Any] | None:
    lines = [ln[len(RESULT_PREFIX):] for ln in log.splitlines() if ln.startswith(RESULT_PREFIX)]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def require_claims(pods: PodAPI, claims: Mapping[str, str]) -> None:
    """Refuse, before any pod is made, when a claim the pod would mount is not in the namespace (a
    pod would wait unscheduled for it): ``claims`` maps each name to what it is."""
    for name, what in claims.items():
        if pods.get_object(CLAIM, pods.namespace, name) is None:
            raise ForgeError(f"no PersistentVolumeClaim {name!r} in the namespace {pods.namespace} ({what}): nothing "
                             "was written")


def run_pod(target: PodAPI, pod: dict[str, Any], *, inputs: Mapping[str, bytes] | None = None, inputs_name: str = "",
            progress: Progress = _quiet, what: str, where: str = "", timeout: float = DEADLINE_SECONDS + 60.0,
            answer: bool = True) -> dict[str, Any]:
    """Create ``pod`` (and the ConfigMap ``inputs_name`` holding ``inputs``, owned by it), wait for
    it to end, and return the result line of its log (``answer``; else an empty dict). A pod that
    fails raises with the step's own error line (``where`` first when the step said the source
    does not hold what the spec pins). The pod is deleted in every case."""
    namespace, name = target.namespace, pod["metadata"]["name"]
    created = target.create_object(POD, pod)
    try:
        if inputs is not None:
            target.create_object(CONFIG_MAP, inputs_config_map(namespace, inputs_name, inputs, created))
        started = time.monotonic()
        phase, said = "", ""
        while True:
            live = target.get_object(POD, namespace, name)
            if live is None:
                raise ForgeError(f"{what}: the pod {namespace}/{name} was deleted before it finished")
            phase = (live.get("status") or {}).get("phase") or "Pending"
            if phase in ("Succeeded", "Failed"):
                break
            reason = _pending_reason(live) if phase == "Pending" else None
            if reason and time.monotonic() - started > STUCK_SECONDS:
                raise ForgeError(f"{what}: the pod {namespace}/{name} is still pending after {STUCK_SECONDS:.0f} s — "
                                 f"{printable(reason)}")
            if f"{phase} {reason}" != said:
                said = f"{phase} {reason}"
                progress(f"pod {name}: {phase}" + (f" ({reason})" if reason else ""))
            if time.monotonic() - started > timeout:
                raise ForgeError(f"{what}: the pod {namespace}/{name} did not finish in {timeout:.0f} s")
            time.sleep(1.0)
        log = target.read_log(name)
        if phase == "Failed":
            statuses = (live.get("status") or {}).get("containerStatuses") or [{}]
            code = ((statuses[0].get("state") or {}).get("terminated") or {}).get("exitCode")
            errors = [ln.removeprefix("error: ") for ln in log.splitlines() if ln.startswith("error: ")]
            message = printable(errors[-1] if errors else (log.strip()[-2000:] or
                                                            f"{(live.get('status') or {}).get('reason') or 'exit ' + str(code)}"))
            raise ForgeError((f"{where}: " if code == EXIT_DIGEST_MISMATCH and where else "") + f"{what}: {message}")
        result = _result(log) if answer else {}
        if result is None:
            raise ForgeError(f"{what}: the pod {namespace}/{name} ended without its answer in its log")
        return result
    finally:
        target.delete_object(POD, namespace, name)
        if inputs is not None:
            target.delete_object(CONFIG_MAP, namespace, inputs_name)


class ClusterMergeWriter:
    """Writes a merge into a `pvc://` source's claim by pods (see the module docstring): :meth:`stage`
    merges and publishes in one pod — a sharded source's new shard, or a single file replaced (its
    bytes kept on the workspace claim) — and :meth:`withdraw` undoes that: the shard removed, the
    file put back."""

    published_by_stage = True

    def __init__(self, target: PodAPI, environment: Environment, config: Mapping[str, Any], claim: str,
                 inputs: Mapping[str, bytes], where: str, progress: Progress = _quiet) -> None:
        total = sum(len(v) for v in inputs.values())
        if total > MAX_INPUT_BYTES:
            raise ForgeError(f"the reviewed file and the auto-labels hold {total} bytes, more than the "
                             f"{MAX_INPUT_BYTES} a ConfigMap carries into the cluster: nothing was written (run "
                             "`python -m runtimes merge-labels` in a pod that mounts the claims)")
        self.target, self.environment, self.claim, self.inputs = target, environment, claim, inputs
        self.where, self.progress = where, progress
        merge_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        self.config = MergeLabelsConfig.model_validate({**config, "output": f"{MERGES_DIR}/{config['dataset']}/{merge_id}"})

    @staticmethod
    def input_config(dataset: str, spec: Mapping[str, Any], review: str) -> dict[str, Any]:
        """The `merge-labels` config whose inputs are the ConfigMap's keys under :data:`INPUTS_PATH`."""
        return {"step": "merge-labels", "dataset": dataset, "spec": spec, "labels": INPUTS_PATH,
                "review": f"{INPUTS_PATH}/{review}", "output": MERGES_DIR}

    def _pod(self, withdraw: str | None = None) -> tuple[dict[str, Any], str]:
        suffix = secrets.token_hex(4)
        pod = merge_pod(self.environment, self.target.namespace, f"forge-labels-{'withdraw' if withdraw else 'merge'}-{suffix}",
                        self.config, self.claim, f"forge-labels-inputs-{suffix}", withdraw=withdraw)
        return pod, f"forge-labels-inputs-{suffix}"

    def stage(self) -> dict[str, Any]:
        """Merge the rows and write them into the claim; merge.json's content."""
        require_claims(self.target, {WORKSPACE_PVC: "the workspace, where the merge is staged: apply the specs first",
                                     self.claim: "the data set's source"})
        pod, inputs = self._pod()
        self.progress(f"merging in the cluster (pod {self.target.namespace}/{pod['metadata']['name']}), written into "
                      f"the claim {self.claim}")
        return run_pod(self.target, pod, inputs=self.inputs, inputs_name=inputs, progress=self.progress,
                       what="merge-labels", where=self.where)

    def publish(self, name: str) -> None:
        """Nothing more to do: :meth:`stage` wrote into the claim."""

    def withdraw(self, name: str) -> None:
        """Undo what :meth:`stage` wrote into the claim (the shard ``name`` removed, or the file
        ``name`` put back as it was)."""
        pod, inputs = self._pod(withdraw=name)
        run_pod(self.target, pod, inputs=self.inputs, inputs_name=inputs, progress=self.progress,
                what=f"withdrawing {name}", where=self.where, answer=False)
