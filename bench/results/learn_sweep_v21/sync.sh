#!/usr/bin/env bash
# Copy the sweep's finished runs (their evaluation exists) into the committed record, then rewrite the table
# with main's report (the frozen worktree's report left the candidate-share column NaN).
set -euo pipefail
SRC=/work/runs/learn_v21; DST=/work/main/bench/results/learn_sweep_v21
for ev in "$SRC"/eval/*.json; do
  name=$(basename "$ev" .json)
  [ -d "$SRC/$name" ] || continue
  mkdir -p "$DST/$name"
  for f in config.json metrics.jsonl config.resumes.jsonl; do
    [ -f "$SRC/$name/$f" ] && cp "$SRC/$name/$f" "$DST/$name/"
  done
  cp "$SRC/eval/$name.json" "$SRC/eval/$name.md" "$DST/eval/"
done
cd /work/main
.venv/bin/python bench/learn.py --model bench/results/learn_sweep_v21/warm_start --out bench/results/learn_sweep_v21 --report-only \
  --seeds 0 1 2 3 4 --rows grpo smrc-sd-lam0.2 smrc-sd-lam0.03 oracle-smrc-sd-a0.99-lam0.2 \
  oracle-fullpath-sd-a0.99-lam0.2 oracle-smrc-sd-a0.5-lam1 oracle-smrc-sd-a0.5-lam0.2 \
  oracle-fullpath-sd-a0.5-lam0.2 fullpath-sd-lam0.2 oracle-fullpath-sd-a0.5-lam0.1 \
  --compare oracle-smrc-sd-a0.5-lam0.2:oracle-fullpath-sd-a0.5-lam0.1 | tail -12
