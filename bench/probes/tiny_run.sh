#!/bin/bash
# usage: bench/probes/tiny_run.sh TREE OUT [FLAGS...] — a short tiny run exercising mini/micro-batches, SD,
# KL, from the checkout TREE into OUT; FLAGS are added (e.g. an oracle row). λ is pinned at 0.1 (the tiny
# preset's before issue 57) so a comparison spans that change. Compare two runs with
# bench/probes/same_metrics.py; records: bench/results/house_step3/same_numbers.txt,
# bench/results/house_step4/same_numbers.txt,
# bench/results/house_step5/same_numbers.txt.
tree=$1; out=$2; shift 2
cd "$tree" && OMP_NUM_THREADS=1 ALFWORLD_DATA=${ALFWORLD_DATA:-/work/shared/alfworld_data} \
  SMRC_CACHE=${SMRC_CACHE:-/work/cache} /work/main/.venv/bin/python smrc.py --preset tiny --steps 2 \
  --save-every 2 --rollout.tasks-per-step 2 --rollout.group-size 3 --alfworld.max-steps 4 \
  --grpo.mini-batch-size 8 --grpo.micro-batch-tokens 512 --grpo.sd-coef 0.1 --output-dir "$out" "$@" \
  > "$out.log" 2>&1
echo "exit $?"; sha256sum "$out/step_000002/model.safetensors"
