"""Benchmark: what distillation costs per training step, SMRC-SD vs FullPath-SD vs GRPO, in one run.

Runs `smrc.py` three times with the same preset, seed and flags, differing only in `--algo`, and prints the
mean step time (the first step is dropped: it builds caches and loads games), the ratios smrc-sd/grpo and
fullpath-sd/grpo, and the teacher work per step (teacher tokens scored, distilled turns, teacher seconds).

    python bench/bench_sd.py                      # tiny preset, 6 steps each (CPU), from the repository root
    python bench/bench_sd.py --steps 10 -- --model Qwen/Qwen3-1.7B --env alfworld   # extra flags after --
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ALGOS = ("grpo", "fullpath-sd", "smrc-sd")
SMRC = Path(__file__).resolve().parents[1] / "smrc.py"


def run(algo: str, steps: int, extra: list[str], out: Path) -> list[dict]:
    cmd = [sys.executable, str(SMRC), "--preset", "tiny", "--algo", algo,
           "--steps", str(steps), "--save-every", "1000", "--output-dir", str(out / algo), *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return [json.loads(line) for line in (out / algo / "metrics.jsonl").read_text().splitlines()]


def mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("extra", nargs="*", help="flags passed to smrc.py (after --)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = {a: run(a, args.steps, args.extra, Path(tmp))[1:] for a in ALGOS}
    print(f"{'algo':<12} {'step s':>8} {'teacher tok/step':>17} {'distilled turns':>16} {'teacher s':>10} "
          f"{'match rate':>11}")
    for a in ALGOS:
        print(f"{a:<12} {mean(rows[a], 'time/step_s'):8.2f} {mean(rows[a], 'sd/teacher_tokens'):17.0f} "
              f"{mean(rows[a], 'sd/distilled_turns'):16.1f} {mean(rows[a], 'sd/teacher_time_s'):10.2f} "
              f"{mean(rows[a], 'router/match_rate'):11.3f}")
    g = mean(rows["grpo"], "time/step_s")
    print(f"step time ratio smrc-sd/grpo = {mean(rows['smrc-sd'], 'time/step_s') / g:.3f} "
          "(issue 11 target <= 1.10)")
    print(f"step time ratio fullpath-sd/grpo = {mean(rows['fullpath-sd'], 'time/step_s') / g:.3f}")
    f = mean(rows["fullpath-sd"], "sd/teacher_tokens")
    print("teacher tokens smrc-sd/fullpath-sd = "
          f"{mean(rows['smrc-sd'], 'sd/teacher_tokens') / max(f, 1):.3f}")


if __name__ == "__main__":
    main()
