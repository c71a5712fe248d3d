"""Benchmarks and checks, run from the repository root: `python bench/step.py`,
`python bench/bench_rollout.py`, `bash bench/gpu_check.sh`."""
