#!/bin/bash
# usage: bench/probes/tiny_run.sh TREE OUT  — a short tiny run exercising mini/micro-batches, SD, KL (house
# step 3: bench/results/house_step3/same_numbers.txt; compare two with bench/probes/same_metrics.py)
cd $1 && OMP_NUM_THREADS=1 ALFWORLD_DATA=/work/shared/alfworld_data SMRC_CACHE=/work/cache /work/main/.venv/bin/python smrc.py --preset tiny --steps 2 --save-every 2 \
  --rollout.tasks-per-step 2 --rollout.group-size 3 --alfworld.max-steps 4 --grpo.mini-batch-size 8 \
  --grpo.micro-batch-tokens 512 --output-dir $2 > $2.log 2>&1
echo "exit $?"; sha256sum $2/step_000002/model.safetensors
