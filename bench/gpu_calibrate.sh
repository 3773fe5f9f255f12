#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: calibrate Llama-3.1-8B and one MoE card (Mixtral-8x7B) in
# bf16, write profiles + a log, then check held-out accuracy of each. Budget: under 5 minutes on an H100/H200.
#
#   bench/gpu_calibrate.sh                          # cuda:0, full grids, both cards
#   MODELS="tiny" bench/gpu_calibrate.sh --device cpu --quick    # the same script end to end on a CPU
#
# Outputs go to calibrate/profiles/<card>-<gpu>.json and bench/results/gpu_calibrate-<gpu>.log; when $OUT
# is set (the device runner), copies land there too.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda:0
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --quick) EXTRA+=(--quick); shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
MODELS="${MODELS:-llama-3.1-8b mixtral-8x7b}"
PY="${PY:-.venv/bin/python}"
if [ ! -x "$PY" ]; then
  python3 -m venv .venv && .venv/bin/pip install -q -e . torch==2.13.0
  PY=.venv/bin/python
fi
TAG=$("$PY" - "$DEVICE" <<'PY'
import sys, torch
from capacity.gpus import match_gpu
d = sys.argv[1]
if d.startswith("cuda") and torch.cuda.is_available():
    i = int(d.split(":")[1]) if ":" in d else 0
    print(match_gpu(torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory) or "gpu")
else:
    print("cpu")
PY
)
[ ${#EXTRA[@]} -gt 0 ] && TAG="${TAG}-quick"  # never overwrite a full profile with a smoke run
mkdir -p calibrate/profiles bench/results
LOG="bench/results/gpu_calibrate-${TAG}.log"
{
  echo "# $(date -u +%FT%TZ) device=$DEVICE tag=$TAG models=$MODELS extra=${EXTRA[*]:-}"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
  for m in $MODELS; do
    prof="calibrate/profiles/${m}-${TAG}.json"
    start=$(date +%s)
    "$PY" -c "from capacity.cli import main; main()" calibrate --model "$m" --device "$DEVICE" --out "$prof" "${EXTRA[@]}"
    echo "# $m: $(( $(date +%s) - start )) s"
    "$PY" bench/step_accuracy.py --model "$m" --profile "$prof" --out "bench/results/step_accuracy-${m}-${TAG}.json"
  done
} 2>&1 | tee "$LOG"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp "$LOG" bench/results/step_accuracy-*-"${TAG}".json "$OUT"/ 2>/dev/null || true
  cp calibrate/profiles/*-"${TAG}".json "$OUT"/ 2>/dev/null || true
fi
