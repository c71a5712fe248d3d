#!/usr/bin/env bash
# One GPU lease's checks, in order, each under its own time limit (under 10 minutes in all), logs under $OUT
# (default runs/gpu_check):
#   1. the machine (nvidia-smi, torch, transformers);
#   2. memory: bench/gpu.py, 2 SMRC-SD steps of a random Qwen3-1.7B from its config (no download; the
#      transformers engine: the lent device has no vLLM) at the paper config's prompt limit (2048), cut to
#      fit the time: 4 tasks x 4 rollouts (paper 16 x 8), <= 5 turns, 128 new tokens; prints mem/* per phase
#      beside the plan (scale/memory_plan.py);
#   3. bench/cuda_check.py: the tiny preset on CUDA under python and torchrun (NCCL), from v21's weights;
#   4. bench/gpu.py --decode-profile --steps 0: ms per decode step of the generation variants.
# FULL=1 adds bench/gpu.py's GRPO-vs-SMRC-SD step timing (5 more minutes).
# The CUDA check trains the committed v21 warm start, so no stage spends its minutes on a build. An offline
# GPU node needs `bash ../shared/tools/gpu_site.sh` run here first:
#     PYTHONPATH=.gpu-site:. bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
stage() {  # stage NAME SECONDS CMD...: run CMD under a time limit, log to $OUT/NAME.log, note the exit code
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/stages.txt"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$OUT/stages.txt"
}
stage machine 30 bash -c "nvidia-smi; $PY -c 'import torch, transformers; print(\"torch\", torch.__version__, \
torch.version.cuda, torch.cuda.get_device_name(), \"transformers\", transformers.__version__)'"
stage memory 300 "$PY" bench/gpu.py --algos smrc-sd --steps 2 --new-tokens 128 --max-prompt-tokens 2048 \
  --json "$OUT/memory.json"
stage cuda_check 150 "$PY" bench/cuda_check.py --model bench/results/learn_sweep_v21/warm_start
stage decode 90 "$PY" bench/gpu.py --decode-profile --steps 0 --json "$OUT/decode.json"
if [ "${FULL:-0}" = 1 ]; then stage gpu 300 "$PY" bench/gpu.py --json "$OUT/gpu.json"; fi
