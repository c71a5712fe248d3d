"""One short CUDA check (for a machine with a GPU): the tiny preset on CUDA in bf16 autocast, with the
transformers engine, under plain `python` and under `torchrun --nproc_per_node 1` (NCCL), 3 steps each. Prints
the mean step time (first step dropped) and the peak GPU memory of each, and exits non-zero if a run fails or
did not run on CUDA.

    python bench/cuda_check.py
    python bench/cuda_check.py --model bench/results/learn_sweep_v21/warm_start  # committed weights: no build
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

# bf16 autocast is on by default
FLAGS = ["--preset", "tiny", "--steps", "3", "--device", "cuda", "--save-every", "3"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="the model to train (default: the tiny preset's, "
                    "tiny-agent-quick, built on first use)")
    args = ap.parse_args()
    flags = FLAGS + (["--model", args.model] if args.model else [])
    assert torch.cuda.is_available(), "no CUDA device: this check is for GPU machines"
    here = Path(__file__).resolve().parents[1]  # the repository root, where smrc.py is
    runs = {"python": [sys.executable, str(here / "smrc.py")],
            "torchrun x1": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                            "1", str(here / "smrc.py")]}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd in runs.items():
            out = Path(tmp) / name.replace(" ", "_")
            proc = subprocess.run([*cmd, *flags, "--output-dir", str(out)], capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
            assert "on cuda" in proc.stdout, proc.stdout[-2000:]
            step_s = sum(r["time/step_s"] for r in rows[1:]) / len(rows[1:])
            peak = max(r["time/peak_gpu_mem_gb"] for r in rows)
            print(f"{name:12s} {torch.cuda.get_device_name()}: {len(rows)} steps, mean step {step_s:.2f} s, "
                  f"peak GPU memory {peak:.3f} GiB, tokens/s {rows[-1]['time/tokens_per_s']:.0f}")


if __name__ == "__main__":
    main()
