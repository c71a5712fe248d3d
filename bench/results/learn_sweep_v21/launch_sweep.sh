#!/usr/bin/env bash
# issue 36's dose-response sweep, from the frozen worktree at 12a3ca6; resumable (rerun this script).
# (a copy of the session script /work/runs/launch_sweep.sh; paths are this project's machines': /work/wt-sweep, /work/runs)
cd /work/wt-sweep
export ALFWORLD_DATA=/work/shared/alfworld_data SMRC_CACHE=/work/cache
exec /work/main/.venv/bin/python bench/learn.py --model bench/results/learn_sweep_v21/warm_start \
  --out /work/runs/learn_v21 --rows grpo smrc-sd-lam0.2 smrc-sd-lam0.03 oracle-smrc-sd-a0.99-lam0.2 \
  oracle-fullpath-sd-a0.99-lam0.2 oracle-smrc-sd-a0.5-lam1 oracle-smrc-sd-a0.5-lam0.2 \
  oracle-fullpath-sd-a0.5-lam0.2 fullpath-sd-lam0.2 oracle-fullpath-sd-a0.5-lam0.1 --seeds 0 1 2 3 4
