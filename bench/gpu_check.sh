#!/usr/bin/env bash
# One GPU lease's checks, in order, each under its own time limit (under 10 minutes in all), logs under $OUT
# (default runs/gpu_check):
#   1. the machine (nvidia-smi, torch, transformers);
#   2. memory: bench/step.py --arch qwen3-1.7b, 2 SMRC-SD steps of a random Qwen3-1.7B from its config (no
#      download; the transformers engine: the lent device has no vLLM) at the paper config's prompt limit
#      (2048), cut to fit the time: 4 tasks x 4 rollouts (paper 16 x 8), <= 5 turns, 128 new tokens; prints
#      mem/* per phase beside the plan (scale/memory_plan.py);
#   3. CUDA: the tiny preset's smrc.py, 3 steps from v21's committed weights (no build), under python and
#      under torchrun --nproc_per_node 1 (NCCL); each run's metrics.jsonl under $OUT;
#   4. bench/decode.py: ms per decode step of the generation variants;
#   5. the null-context Δ on CUDA in bf16 autocast (tests/test_sd_delta.py -k cuda: the teacher sees the
#      student's own prompt, so Δ must be 0 up to bf16 rounding; its max |Δ| and the SD gradient printed).
# Limits sum to 590 s. Each phase's measured peak beside the plan: the memory stage's report (bench/step.py).
# FULL=1 adds bench/step.py's GRPO-vs-SMRC-SD step timing (5 more minutes). LORA=1 adds the tiny preset
# under --lora.rank 8 on CUDA (the base frozen in bf16, float32 adapters; 1 more minute; needs peft and
# accelerate on PYTHONPATH, e.g. copied from the venv's site-packages into .gpu-site/). An offline GPU node
# needs `bash ../shared/tools/gpu_site.sh` run here first:
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
stage machine 20 bash -c "nvidia-smi; $PY -c 'import torch, transformers; print(\"torch\", torch.__version__, \
torch.version.cuda, torch.cuda.get_device_name(), \"transformers\", transformers.__version__)'"
stage memory 300 "$PY" bench/step.py --arch qwen3-1.7b --algos smrc-sd --steps 2 --floor-repeats 0 \
  --json "$OUT/memory.json" -- --rollout.sampling.max-new-tokens 128 --rollout.max-prompt-tokens 2048
TINY=(smrc.py --preset tiny --steps 3 --save-every 3 --device cuda
  --model bench/results/learn_sweep_v21/warm_start)
stage cuda_python 75 "$PY" "${TINY[@]}" --output-dir "$OUT/cuda_python"
stage cuda_torchrun 75 "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 "${TINY[@]}" \
  --output-dir "$OUT/cuda_torchrun"
stage decode 60 "$PY" bench/decode.py --json "$OUT/decode.json"
stage sd_delta 60 "$PY" -m pytest -q -s -p no:cacheprovider tests/test_sd_delta.py -k cuda
if [ "${FULL:-0}" = 1 ]; then stage step 300 "$PY" bench/step.py --arch qwen3-1.7b --json "$OUT/step.json"; fi
if [ "${LORA:-0}" = 1 ]; then stage lora 60 "$PY" "${TINY[@]}" --lora.rank 8 --output-dir "$OUT/lora"; fi
