#!/usr/bin/env bash
# The whole GPU session as one prepared command (the device runner gives 15 minutes in all):
#   1. device ceilings (bf16 matmul, copy) -> bench/results/gpu_peaks-<gpu>.json
#   2. tests/test_devices.py on the GPU (kernels vs reference attention, quick suite, CUDA-graph replay)
#   3. full calibration of each model (MODEL or MODEL:fp8 for FP8 GEMMs) -> capacity/data/profiles/<model>-<gpu>.json
#      (time-boxed per model; an
#      interrupted one leaves <profile>.partial.json, which a rerun resumes)
#   4. ten named step shapes, eager and as CUDA graphs -> bench/results/step_shapes-<model>[-paged]-<gpu>.json
#   5. a ViT-sized encoder block (Qwen2.5-VL-7B's shape) against the vision encoder roofline
#      -> bench/results/vision_encoder-<gpu>.json (bench/vision_encoder.py; docs/vision.md)
#   6. one eager Llama-3.1-8B decoder layer at batch 1 vs its CUDA-graph replay, and torch's view/empty/module-call
#      dispatch costs -> bench/results/eager_step-<gpu>.json (bench/eager_step.py; docs/fidelity.md "One eager step")
#   7. NCCL all-reduce, bf16 2 KiB-64 MiB, world sizes 2/4/8, eager and in a CUDA graph, against capacity's model
#      -> bench/results/allreduce-<gpu>.json and .report.json (bench/allreduce_sweep.py; docs/fidelity.md (c')).
#      NEEDS >= 2 GPUs: on a one-GPU machine (the lent device) it says so and skips in seconds.
# Expected time per stage on one H100/H200 (the whole run must fit the 15-minute device budget; the stage limits
# below are `timeout`s): peaks ~30 s (60), tests ~90 s (120), calibration 230 + 170 s (BUDGETS), step shapes ~60 s
# (90), vision ~30 s (90), eager step ~40 s (90), all-reduce: one GPU ~5 s; on an 8-GPU host ~2-3 min (300;
# 90 s a world size).
# Attention (ATTN, default auto): one FlashAttention varlen call per layer over a paged KV pool, as vLLM runs it,
#   where the GPU's torch passes the start-up probe (calibrate/paged.py), else padded SDPA; ATTN=sdpa forces the
#   padded layout the committed H200 profiles used; ATTN=paged on a CPU rehearses the paged path (reference kernel).
# Everything lands in $OUT/results.tar.gz (re-packed after every stage, so a cut-off run still returns what
# it finished), with the log and nvidia-smi output beside it. Analysis runs afterwards on any machine:
#   python bench/step_accuracy.py --model llama-3.1-8b --profile capacity/data/profiles/llama-3.1-8b-h200.json ...
#   python bench/step_shapes.py report --measured bench/results/step_shapes-llama-3.1-8b-h200.json ...
#
# Device machine (python3 holds CUDA torch; wheels for missing packages travel in .whl/, fetched beforehand with
#   pip download --no-deps -d .whl pydantic pydantic-core simpy typer rich pyyaml scipy nvidia-ml-py psutil
# nvidia-ml-py lets tests/test_devices.py check the load tester's NVML sampling against the real GPU):
#   bash bench/device_run.sh
# The same script on a CPU, end to end, in about two minutes (the all-reduce stage with gloo over 2 processes):
#   DEVICE=cpu QUICK=1 MODELS=tiny SHAPES_MODELS=tiny NO_WHEELS=1 OUT=/tmp/devout PY=.venv/bin/python \
#     ATTN=paged bash bench/device_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda:0}
OUT=${OUT:-/tmp/device-out}
PY=${PY:-python3}
# The bf16 Llama-8B profile is measured (2026-11-30); next: its FP8 GEMMs and Mixtral as CUDA graphs (issue 25).
MODELS=${MODELS:-llama-3.1-8b:fp8 mixtral-8x7b}
BUDGETS=(${BUDGETS:-230 170})       # seconds of calibration per model, in MODELS order
SHAPES_MODELS=${SHAPES_MODELS:-llama-3.1-8b}
QUICK=${QUICK:-}
ATTN=${ATTN:-auto}
SUFFIX=-paged; [ "$ATTN" = sdpa ] && SUFFIX=""  # the committed step shapes are padded SDPA: keep them
COMPILE=${COMPILE:-}  # COMPILE=1: torch.compile each layer's work around attention (calibrate/fusion.py), as vLLM
CARG=(); PSUFFIX=""
if [ -n "$COMPILE" ]; then CARG=(--compile); SUFFIX="$SUFFIX-compiled"; PSUFFIX=-compiled; fi
STAGES=${STAGES:-peaks tests calibrate shapes vision eager allreduce}  # a rerun can name fewer
has() { [[ " $STAGES " == *" $1 "* ]]; }
mkdir -p "$OUT" capacity/data/profiles bench/results
exec > >(tee -a "$OUT/device_run.log") 2>&1
stamp() { echo "## $(date -u +%T) $*"; }
stamp "start device=$DEVICE models=$MODELS quick=${QUICK:-no} attention=$ATTN compile=${COMPILE:-no}"
export PYTHONPATH=$PWD
if [ -z "${NO_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then  # packages the device image lacks
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || echo "wheel install failed; trying without"
fi
export PYTHONUNBUFFERED=1 CAPACITY_CACHE_DIR=off
if command -v nvidia-smi >/dev/null; then
  { nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
      --format=csv; } > "$OUT/nvidia-smi.txt" 2>&1
  cat "$OUT/nvidia-smi.txt"
fi
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
TAG=$("$PY" - "$DEVICE" <<'PY'
import sys, torch
from capacity.model.gpus import match_gpu
d = sys.argv[1]
if d.startswith("cuda") and torch.cuda.is_available():
    i = int(d.split(":")[1]) if ":" in d else 0
    print(match_gpu(torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory) or "gpu")
else:
    print("cpu")
PY
) || { echo "cannot import capacity/torch"; exit 3; }
QARG=()
SMALL=()
if [ -n "$QUICK" ]; then TAG="${TAG}-quick"; QARG=(--quick); SMALL=(--small); fi
stamp "tag=$TAG"
pack() {
  tar czf "$OUT/results.tar.gz.tmp" $(ls capacity/data/profiles/*-"$TAG".json capacity/data/profiles/*-"$TAG".json.partial.json \
    bench/results/*-"$TAG".json bench/results/*-"$TAG".report.json 2>/dev/null) 2>/dev/null && mv "$OUT/results.tar.gz.tmp" "$OUT/results.tar.gz"
  stamp "packed: $(tar tzf "$OUT/results.tar.gz" 2>/dev/null | tr '\n' ' ')"
}

if has peaks; then
  stamp "1/4 peaks"
  if [ -n "$QUICK" ]; then PK=(--size 512 --copy-mib 64); else PK=(); fi
  timeout 60 "$PY" bench/gpu_peaks.py --device "$DEVICE" "${PK[@]}" --out "bench/results/gpu_peaks-$TAG.json"
  pack
fi
if has tests; then
  stamp "2/4 tests/test_devices.py"
  timeout 120 "$PY" -m pytest -o addopts= -q -p no:cacheprovider tests/test_devices.py 2>&1 | tail -15
fi
stamp "3/4 calibration"
i=0
has calibrate || MODELS=""
for spec in $MODELS; do  # MODEL or MODEL:WEIGHT_DTYPE[/BLOCK] (llama-3.1-8b:fp8 -> FP8 GEMMs, profile
  m=${spec%%:*}           # llama-3.1-8b-fp8-<gpu>; qwen2.5-7b:fp8/128 -> FP8 with 128 x 128 block scales)
  wd=${spec#"$m"}; wd=${wd#:}
  WARG=(); name=$m
  if [ -n "$wd" ]; then
    blk=${wd#*/}; wd=${wd%%/*}; WARG=(--weight-dtype "$wd"); name="$m-$wd"
    if [ "$blk" != "$wd" ]; then WARG+=(--quant-group-size "$blk"); name="$name-b$blk"; fi
  fi
  name="$name$PSUFFIX"
  budget=${BUDGETS[$i]:-${BUDGETS[-1]}}
  i=$((i + 1))
  stamp "calibrate $spec (budget ${budget}s)"
  start=$(date +%s)
  timeout --signal=INT --kill-after=20 "$budget" "$PY" -c "from capacity.cli import main; main()" calibrate \
    --model "$m" "${WARG[@]}" --device "$DEVICE" --out "capacity/data/profiles/$name-$TAG.json" "${QARG[@]}" \
    --attention-kernel "$ATTN" "${CARG[@]}"
  stamp "$m: rc=$? after $(( $(date +%s) - start )) s"
  pack
done
has shapes || SHAPES_MODELS=""
for m in $SHAPES_MODELS; do
  stamp "4/4 step shapes $m"
  timeout --signal=INT --kill-after=10 90 "$PY" bench/step_shapes.py measure --model "$m" --device "$DEVICE" \
    --out "bench/results/step_shapes-$m$SUFFIX-$TAG.json" "${SMALL[@]}" --attention "$ATTN" "${CARG[@]}"
  pack
  base="bench/results/step_shapes-$m-$TAG.json"  # the padded SDPA shapes (committed): side by side in the log
  if [ -n "$SUFFIX" ] && [ -f "$base" ] && [ -f "bench/results/step_shapes-$m$SUFFIX-$TAG.json" ]; then
    "$PY" bench/step_shapes.py compare "$base" "bench/results/step_shapes-$m$SUFFIX-$TAG.json"
  fi
done
if has vision; then
  stamp "5/5 vision encoder"
  VARG=(); [ -n "$QUICK" ] && VARG=(--layers 1 --patches 256 1024 --repeats 3)
  timeout --signal=INT --kill-after=10 90 "$PY" bench/vision_encoder.py --device "$DEVICE" \
    --out "bench/results/vision_encoder-$TAG.json" "${VARG[@]}"
  pack
fi
if has eager; then
  stamp "6/7 eager step"
  EARG=(); [ -n "$QUICK" ] && EARG=(--quick)
  EMODEL=${SHAPES_MODELS%% *}; EMODEL=${EMODEL:-llama-3.1-8b}
  timeout --signal=INT --kill-after=10 90 "$PY" bench/eager_step.py --device "$DEVICE" --model "$EMODEL" \
    --out "bench/results/eager_step-$TAG.json" "${EARG[@]}"
  pack
fi
if has allreduce; then
  stamp "7/7 all-reduce by world size (needs >= 2 GPUs)"
  if [ "$DEVICE" = cpu ]; then  # the rehearsal: gloo, 2 processes, small messages
    AR=(--device cpu --world-sizes 2 --max-bytes 262144 --repeats 3 --iters 10)
  else
    AR=(--device cuda); [ -n "$QUICK" ] && AR+=(--max-bytes 1048576 --repeats 3)
  fi
  timeout --signal=INT --kill-after=20 300 "$PY" bench/allreduce_sweep.py measure "${AR[@]}" \
    --out "bench/results/allreduce-$TAG.json"
  pack
fi
stamp done
