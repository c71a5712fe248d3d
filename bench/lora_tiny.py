"""LoRA beside full fine-tuning on the tiny preset (issue 67): the same seeds, the same flags, `--lora.rank R`
the only difference. Runs smrc.py per (mode, seed) into RECORD/<mode>-seed<S>/ (skipping runs whose
metrics.jsonl already has every step), then prints and writes RECORD/summary.json: per step the mean (± SE
over seeds) of rollout/success_rate and actor/kl of each mode, and the paired-by-seed difference of the mean
success over all steps, LoRA − full, with "separated" only at |mean| >= 2 SE.

    python bench/lora_tiny.py bench/results/lora_tiny --seeds 0 1 2   # run what is missing, summarise
    python bench/lora_tiny.py bench/results/lora_tiny --seeds 0 1 2 --no-run   # what finished
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from analysis import archives  # noqa: E402
MODES = {"full": [], "lora": ["--lora.rank", "8"]}


def metrics(run: Path) -> list[dict]:
    """A run's metrics rows, on disk or packed in the record's archive (analysis/archives.py)."""
    path = run / "metrics.jsonl"
    if not archives.exists(path):
        return []
    return [json.loads(line) for line in archives.read_text(path).splitlines()]


def run_one(record: Path, mode: str, seed: int, steps: int) -> None:
    out = record / f"{mode}-seed{seed}"
    if len(metrics(out)) >= steps:
        return
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, str(ROOT / "smrc.py"), "--preset", "tiny", "--seed", str(seed),
           "--steps", str(steps), "--save-every", str(steps), "--output-dir", str(out), *MODES[mode]]
    with open(record / f"{mode}-seed{seed}.log", "w") as log:
        subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    for ckpt in out.glob("step_*"):  # the record keeps the metrics and config, not the weights
        shutil.rmtree(ckpt)


def mean_se(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    se = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs)) if len(xs) > 1 else float("nan")
    return m, se


def summary(record: Path, seeds: list[int], steps: int) -> dict:
    """Curves and the paired difference over the seeds both modes have, on the steps every one of those runs
    finished (all `steps` when they all ran to the end; fewer are said as such)."""
    done = {m: {s: metrics(record / f"{m}-seed{s}") for s in seeds} for m in MODES}
    both = [s for s in seeds if all(done[m][s] for m in MODES)]
    n = min([len(done[m][s]) for m in MODES for s in both] + [steps]) if both else 0
    curves = {m: {k: [mean_se([done[m][s][t][k] for s in both]) for t in range(n)]
                  for k in ("rollout/success_rate", "actor/kl")} for m in MODES}
    diffs = [sum(r["rollout/success_rate"] for r in done["lora"][s][:n]) / n -
             sum(r["rollout/success_rate"] for r in done["full"][s][:n]) / n for s in both] if n else []
    d, se = mean_se(diffs) if diffs else (float("nan"), float("nan"))
    separated = len(diffs) > 1 and se > 0 and abs(d) >= 2 * se
    return {"seeds": both, "steps_finished": n, "steps_asked": steps, "curves": curves,
            "success_diff_lora_minus_full": {"per_seed": diffs, "mean": d, "se": se,
                                             "reading": "separated" if separated else "not separated"}}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("record", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--no-run", action="store_true", help="summarise the finished runs only")
    args = ap.parse_args(argv)
    args.record.mkdir(parents=True, exist_ok=True)
    if not args.no_run:
        for seed in args.seeds:
            for mode in MODES:
                run_one(args.record, mode, seed, args.steps)
    result = summary(args.record, args.seeds, args.steps)
    (args.record / "summary.json").write_text(json.dumps(result, indent=1))
    for m, curves in result["curves"].items():
        for k, points in curves.items():
            form = ".3f" if k == "rollout/success_rate" else ".1e"
            print(f"{m:4s} {k:20s} " + " ".join(f"{p[0]:{form}}±{p[1]:{form}}" for p in points))
    diff = result["success_diff_lora_minus_full"]
    print(f"seeds {result['seeds']}, steps 1-{result['steps_finished']} of {result['steps_asked']}: success "
          f"(mean over the steps) LoRA - full = {diff['mean']:+.3f} ± {diff['se']:.3f} (SE): "
          f"{diff['reading']}")


if __name__ == "__main__":
    main(sys.argv[1:])
