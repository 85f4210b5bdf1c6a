#!/usr/bin/env bash
# bench/device-run.sh: every GPU figure of issue 20 in one go, on a lent GPU machine (made for one
# H200: about 7 minutes), into ONE JSON file, $OUT/gpu-results.json, with the whole log in
# $OUT/device-run.log.
#
#   bench/device-run.sh [--smoke] [--device cuda|cpu] [--budget-s 500] [--only ladder|checkpointing]
#
# --only ladder: a SHORT second run (budget 240 s unless --budget-s says otherwise): only the
# training ladder — fp32 eager, bf16 + fused attention, bf16 + fused + compile, the compiled rung at
# twice the batch and with `deterministic: true` (the last ones skipped when the budget runs
# short) — into $OUT/gpu-results-2.json, the log in $OUT/device-run-2.log.
# --only checkpointing: only the gradient-checkpointing part (4 → 64 layers; `false`, `true` and
# `sqrt`; budget 420 s unless --budget-s says otherwise) into $OUT/gpu-results-ckpt.json, the log
# in $OUT/device-run-ckpt.log. $CKPT_MODES picks the modes (e.g. full,checkpointed,sqrt,auto: a
# fourth run per depth, so give it more budget).
#
# Parts, each failing soft (its error goes into the JSON and the next part runs):
#   1. bench/train_gpu.py  — the product's train step (python -m runtimes train, configs rendered by
#      renderers.workflow.plan_steps): the fp32 → bf16 → fused attention → torch.compile ladder
#      (tokens/s, MFU), DDP when there are several GPUs, gradient checkpointing at 4/8/16/32 layers;
#   2. bench/serve.py --device cuda — MLServer adaptive batching vs batch 1 on the GPU, the small
#      transformer classifier and a ~85M one (throughput ratio, p50/p99).
# A total time budget (--budget-s, default 500 s) is shared out: each part skips what would overrun.
#
# The machine is bare: torch is there, pydantic, MLServer and their needs are not. They travel as
# wheels in .whl/ (bench/fetch-device-wheels.sh; pins in bench/device-wheels.txt) and are installed
# into /tmp/site here unless they import already. --smoke: a tiny model and a few seconds per part
# (with --device cpu, how this script is checked without a GPU). $PYTHON picks the interpreter
# (default python3), $WHEELS the wheel folder (default .whl), $SITE where they go (default
# /tmp/site); $OUT defaults to /tmp/forge-device-run-out.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
OUT="${OUT:-/tmp/forge-device-run-out}"
PY="${PYTHON:-python3}"
WHEELS="${WHEELS:-.whl}"
SITE="${SITE:-/tmp/site}"
SMOKE=0
DEVICE=cuda
BUDGET=
ONLY=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --device) DEVICE="$2"; shift ;;
    --budget-s) BUDGET="$2"; shift ;;
    --only) ONLY="$2"; shift ;;
    *) echo "device-run: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
case "$ONLY" in
  "") RESULT=gpu-results.json; LOG=device-run.log; BUDGET="${BUDGET:-500}" ;;
  ladder) RESULT=gpu-results-2.json; LOG=device-run-2.log; BUDGET="${BUDGET:-240}" ;;
  checkpointing) RESULT=gpu-results-ckpt.json; LOG=device-run-ckpt.log; BUDGET="${BUDGET:-420}" ;;
  *) echo "device-run: --only takes ladder or checkpointing, not '$ONLY'" >&2; exit 2 ;;
esac
LADDER_RUNGS=fp32_eager,bf16_fused_attention,bf16_fused_compile,bf16_fused_compile_batch2x,bf16_fused_compile_deterministic
mkdir -p "$OUT"
exec > >(tee -a "$OUT/$LOG") 2>&1
TEE_PID=$!
export PYTHONUNBUFFERED=1
START=$(date +%s)
say() { echo "[device-run $(date +%H:%M:%S) +$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }

say "start: device $DEVICE, smoke $SMOKE, only ${ONLY:-all}, budget ${BUDGET}s, python $($PY -c 'import sys; print(sys.version.split()[0])' 2>&1)"
if ! $PY -c 'import pydantic, mlserver' >/dev/null 2>&1; then
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    say "installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
      || say "WARNING: the wheel install failed; the parts that need those packages will record the error"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  else
    say "WARNING: pydantic/mlserver do not import and there is no $WHEELS/ (run bench/fetch-device-wheels.sh)"
  fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
command -v nvidia-smi >/dev/null && nvidia-smi -L
$PY - <<'EOF'
import importlib, sys
import torch
print(f"[device-run] torch {torch.__version__}, cuda {torch.cuda.is_available()} ({torch.cuda.device_count()} GPU"
      f"{': ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''})")
for name in ("pydantic", "pydantic_core", "mlserver", "fastapi", "starlette", "uvicorn", "grpc", "google.protobuf", "numpy", "pandas",
             "runtimes.train", "runtimes.serve", "renderers.workflow"):
    try:
        mod = importlib.import_module(name)
        print(f"[device-run] import {name}: ok {getattr(mod, '__version__', '')} {getattr(mod, '__file__', '')}")
    except Exception as exc:
        print(f"[device-run] import {name}: FAILED {type(exc).__name__}: {exc}")
EOF

TMP="$(mktemp -d /tmp/forge-device-run.XXXXXX)"
SMOKE_ARGS=()
SERVE_ARGS=(--seconds 8)
RESERVE=110   # seconds kept for the serving part (2 models x 2 servers, ~45 s each)
if [[ $SMOKE == 1 ]]; then
  SMOKE_ARGS=(--smoke)
  SERVE_ARGS=(--seconds 2 --models small --concurrency 4 --max-batch 4)
  RESERVE=45
fi
TRAIN_ARGS=()
# $CPU_COMPILE=1 (with --device cpu): the compiled rungs run too (a C++ toolchain needed), to rehearse them.
[[ $DEVICE == cpu && ${CPU_COMPILE:-0} == 1 ]] && TRAIN_ARGS+=(--cpu-compile)
PARTS=2
if [[ $ONLY == ladder ]]; then
  TRAIN_ARGS+=(--parts ladder --rungs "$LADDER_RUNGS")
  RESERVE=5   # the summary below
  PARTS=1
elif [[ $ONLY == checkpointing ]]; then
  TRAIN_ARGS+=(--parts checkpointing --ckpt-modes "${CKPT_MODES:-full,checkpointed,sqrt}")
  RESERVE=5
  PARTS=1
fi

say "part 1/$PARTS: training (bench/train_gpu.py${ONLY:+ --parts $ONLY}), budget $(( $(left) - RESERVE ))s"
$PY bench/train_gpu.py --device "$DEVICE" "${SMOKE_ARGS[@]}" "${TRAIN_ARGS[@]}" --budget-s $(( $(left) - RESERVE )) \
  --workspace "$TMP/train-ws" --out "$TMP/train.json" >"$TMP/train.stdout"
TRAIN_RC=$?
say "part 1/$PARTS exited $TRAIN_RC"
rm -rf "$TMP/train-ws"

SERVE_RC=skipped
if [[ $PARTS == 2 ]]; then
  say "part 2/2: serving (bench/serve.py --device $DEVICE), budget $(( $(left) - 10 ))s"
  $PY bench/serve.py --device "$DEVICE" "${SERVE_ARGS[@]}" --budget-s $(( $(left) - 10 )) --out "$TMP/serve.json" >"$TMP/serve.stdout"
  SERVE_RC=$?
  say "part 2/2 exited $SERVE_RC"
fi

TRAIN_RC=$TRAIN_RC SERVE_RC=$SERVE_RC TMP="$TMP" START="$START" OUT="$OUT" DEVICE="$DEVICE" SMOKE="$SMOKE" RESULT="$RESULT" ONLY="$ONLY" $PY - <<'EOF'
import json, os, platform, time
from pathlib import Path

tmp = Path(os.environ["TMP"])


def part(name: str, rc: str) -> dict:
    if rc == "skipped":
        return {"skipped": "--only " + os.environ["ONLY"]}
    path = tmp / f"{name}.json"
    try:
        value = json.loads(path.read_text())
    except Exception as exc:
        value = {"error": f"no result ({type(exc).__name__}: {exc}); exit code {rc}; see device-run.log"}
    if rc != "0":
        value.setdefault("exit_code", int(rc))
    return value


result = {
    "what": "bench/device-run.sh: issue 20 GPU figures (training through the product's train step; GPU serving)"
            + (f" — --only {os.environ['ONLY']}" if os.environ["ONLY"] else ""),
    "device": os.environ["DEVICE"], "smoke": os.environ["SMOKE"] == "1", "host": platform.node(),
    "train": part("train", os.environ["TRAIN_RC"]),
    "serve": part("serve", os.environ["SERVE_RC"]),
}
try:
    import torch
    result["torch"] = torch.__version__
    result["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
except Exception as exc:
    result["torch"] = f"{type(exc).__name__}: {exc}"
result["elapsed_s"] = int(time.time()) - int(os.environ["START"])
out = Path(os.environ["OUT"]) / os.environ["RESULT"]
out.write_text(json.dumps(result, indent=2) + "\n")
train, serve = result["train"], result["serve"]
summary = {
    "gpu": result.get("gpu"),
    "targets": train.get("targets"),
    "ladder_tokens_per_s": {k: (v or {}).get("tokens_per_s") for k, v in (train.get("ladder") or {}).items() if k != "ratios"},
    "ladder_mfu": {k: (v or {}).get("mfu") for k, v in (train.get("ladder") or {}).items() if k != "ratios"},
    "ladder_step_s": {k: (v or {}).get("step_s_median") for k, v in (train.get("ladder") or {}).items() if k != "ratios"},
    "serve_ratio": {k: (v or {}).get("throughput_ratio") for k, v in (serve.get("models") or {}).items()},
    "serve_p99_ms_batched": {k: (v or {}).get("p99_ms_batched") for k, v in (serve.get("models") or {}).items()},
    "elapsed_s": result["elapsed_s"],
}
print(f"[device-run] wrote {out}")
print(json.dumps(summary))
EOF
rm -rf "$TMP"
say "done"
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null || true
