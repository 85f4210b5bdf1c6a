"""``python -m runtimes build-engine``: a TensorRT engine from a verified ONNX export.

The engine is built with TensorRT's own ``trtexec`` (``$PATH``, else
``/usr/src/tensorrt/bin/trtexec`` as in NVIDIA's TensorRT and JetPack images), on the device it is
for: an engine is specific to the GPU and the TensorRT version that built it, so the step is
scheduled on the target's nodes (one ``nvidia.com/gpu``; ``kubernetes.io/arch: arm64`` for a
Jetson). The optimisation profile covers batch 1 … ``maxBatchSize`` of the ONNX graph's dynamic
batch dimension; ``precision: fp16`` adds ``--fp16``.

Where there is no TensorRT or no NVIDIA GPU (the local target on this kind of machine) the step
cannot build anything. With ``required: false`` (how the local target renders it) it writes
``report.json`` with ``built: false`` and the reason, and succeeds, so the rest of the workflow —
the verified ONNX export included — is still registered; with ``required: true`` (a cluster) it
fails. Writes ``output/model.engine`` and ``report.json`` (``built``, ``sizeBytes``, the command,
and the latency ``trtexec`` measured).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from runtimes._step import in_workspace, parse_config, read_json, run_step, write_json
from runtimes.errors import StepFailed
from specs.stepconfig import EngineConfig

log = logging.getLogger("forge.engine")
TRTEXEC_FALLBACK = Path("/usr/src/tensorrt/bin/trtexec")


def find_trtexec() -> str | None:
    """Path of `trtexec`, or None."""
    found = shutil.which("trtexec")
    if found:
        return found
    return str(TRTEXEC_FALLBACK) if TRTEXEC_FALLBACK.is_file() and os.access(TRTEXEC_FALLBACK, os.X_OK) else None


def nvidia_gpu() -> bool:
    """Whether the kernel exposes an NVIDIA GPU (desktop/datacenter driver or Jetson's)."""
    return Path("/dev/nvidia0").exists() or Path("/dev/nvhost-ctrl-gpu").exists() or Path("/dev/nvgpu").exists()


def command(trtexec: str, onnx: Path, engine: Path, config: EngineConfig, input_name: str, features: list[int]) -> list[str]:
    """The `trtexec` command line (the shapes name the ONNX graph's input and its batch profile)."""
    trt = config.tensorrt
    shape = "x".join(str(d) for d in features)

    def profile(batch: int) -> str:
        return f"{input_name}:{batch}x{shape}" if shape else f"{input_name}:{batch}"

    opt = max(1, min(trt.max_batch_size, 8))
    argv = [trtexec, f"--onnx={onnx}", f"--saveEngine={engine}", f"--memPoolSize=workspace:{trt.workspace_mib}M",
            f"--minShapes={profile(1)}", f"--optShapes={profile(opt)}", f"--maxShapes={profile(trt.max_batch_size)}"]
    if trt.precision == "fp16":
        argv.append("--fp16")
    return argv


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(EngineConfig, argv, "python -m runtimes build-engine")
    onnx_dir = in_workspace(config.onnx_dir)
    info = read_json(onnx_dir / "model.json")
    onnx = onnx_dir / info.get("file", "model.onnx")
    if not onnx.is_file():
        raise StepFailed(f"build-engine: no ONNX graph at {onnx}")
    out = in_workspace(config.output)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"model": config.model, "source": config.source, "hardwareTarget": config.hardware_target,
                              "precision": config.tensorrt.precision, "onnx": str(config.onnx_dir), "built": False}
    trtexec = find_trtexec()
    missing = ("TensorRT's trtexec is not installed" if trtexec is None else
               "no NVIDIA GPU is visible (/dev/nvidia0, /dev/nvhost-ctrl-gpu)" if not nvidia_gpu() else None)
    if missing:
        report["reason"] = (f"not built on this machine: {missing}; a {config.hardware_target} engine is built on "
                            "the device itself (the cluster step runs on a node of that kind)")
        write_json(out / "report.json", report)
        write_json(out / "metrics.json", {"built": False, "reason": report["reason"]})
        if config.required:
            raise StepFailed(f"build-engine: {missing}")
        log.warning("%s", report["reason"])
        return 0
    assert trtexec is not None
    import onnx as onnx_lib

    graph = onnx_lib.load(str(onnx), load_external_data=False).graph
    first = graph.input[0]
    dims = [d.dim_value for d in first.type.tensor_type.shape.dim][1:]
    engine = out / "model.engine"
    argv_trt = command(trtexec, onnx, engine, config, first.name, dims)
    log.info("building: %s", " ".join(argv_trt))
    proc = subprocess.run(argv_trt, capture_output=True, text=True, timeout=3600)
    (out / "trtexec.log").write_text(proc.stdout + proc.stderr)
    report["command"] = argv_trt
    if proc.returncode != 0 or not engine.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        report["reason"] = f"trtexec failed (exit {proc.returncode}): {tail[0]}"
        write_json(out / "report.json", report)
        raise StepFailed(f"build-engine: {report['reason']} (log: {config.output}/trtexec.log)")
    report.update({"built": True, "sizeBytes": engine.stat().st_size})
    median = re.search(r"GPU Compute Time:.*?median = ([0-9.]+) ms", proc.stdout)
    if median:
        report["gpuComputeMsMedian"] = float(median.group(1))
    write_json(out / "report.json", report)
    write_json(out / "metrics.json", {k: report[k] for k in ("built", "sizeBytes", "gpuComputeMsMedian") if k in report})
    log.info("engine %s: %d bytes", engine, report["sizeBytes"])
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
