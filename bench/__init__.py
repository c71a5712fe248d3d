"""Benchmarks and checks, run from the repository root: `python bench/bench_sd.py`,
`python bench/bench_rollout.py`, `python bench/cuda_check.py`."""
