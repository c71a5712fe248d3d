"""Per-run numbers of a bench/learn.py sweep record and paired-by-seed differences between its rows, read from
the record's files or its archive (analysis/archives.py): the commands that recompute docs/results.md's
readings.

    python bench/sweep_runs.py bench/results/learn_sweep_v21                  # one line per run
    python bench/sweep_runs.py bench/results/learn_sweep_v21 --diff A B       # row A − row B, paired by seed

Per run: Avg@k; the SD / GRPO gradient share (median over steps), the KL per distilled turn and the share of
candidate-sampled turns over the distilled turns matched to a reference (the report's `cand share`), as
analysis.lambda_pilot.run_strength reads them; then the same share over the turns whose candidate is
admissible (`sd/candidate_turns`, logged with the candidate gain: under restricted decoding only those can
sample it)
and those turns as a share of the distilled ones; training minutes. A difference: mean ± SE over the seeds
both rows have, |mean| / SE exact and as the report prints it (rounded down), and a 95% t interval.
"""
import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from analysis.lambda_pilot import run_strength  # noqa: E402
from analysis import archives  # noqa: E402
from bench.learn_report import _floor1, _mean_se, _metrics  # noqa: E402

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
"""the 97.5% quantile of Student's t by degrees of freedom (a 95% interval over up to 10 seeds)"""


def runs(record: Path) -> list[str]:
    """The record's run folders (NAME-seedS) that have metrics, in name order."""
    return sorted(n.split("/")[0] for n in archives.listing(record) if n.endswith("/metrics.jsonl")
                  and n.count("/") == 1 and "-seed" in n.split("/")[0])


def avg(record: Path, run: str) -> float:
    """A run's Avg@k on the held-out panel, from its evaluation."""
    metrics = json.loads(archives.read_text(record / "eval" / f"{run}.json"))["rows"][0]["metrics"]
    return next(v for key, v in metrics.items() if key.startswith("avg@") and not key.endswith("_se"))


def run_numbers(record: Path, run: str) -> dict[str, float]:
    """One run's numbers (the module's text); NaN where the run has none (GRPO: no SD term)."""
    metrics = _metrics(record / run)
    rows = [m for m in metrics if "actor/sd_grpo_grad_ratio" in m]  # training steps
    share, kl, cand = run_strength(rows)
    distilled = sum(m.get("sd/distilled_turns", 0) for m in rows)
    admissible = sum(m.get("sd/candidate_turns", 0) for m in rows)
    sampled = cand * distilled if distilled and math.isfinite(cand) else math.nan
    return {"avg": avg(record, run), "share": share, "KL/turn": kl, "cand share": cand,
            "of admissible": sampled / admissible if admissible else math.nan,
            "admissible/distilled": admissible / distilled if distilled else math.nan,
            "train min": sum(m.get("time/step_s", 0.0) + m.get("time/val_s", 0.0) for m in metrics) / 60}


def table(record: Path) -> list[str]:
    """A line per run, then a line per row: each number's mean ± SE over the row's seeds."""
    numbers = {run: run_numbers(record, run) for run in runs(record)}
    lines = [f"{run:<44} " + "  ".join(f"{k} {v:.4g}" for k, v in n.items()) for run, n in numbers.items()]
    by_row: dict[str, list[dict]] = {}
    for run, n in numbers.items():
        by_row.setdefault(run.rsplit("-seed", 1)[0], []).append(n)
    for row, ns in by_row.items():
        cells = [(k, _mean_se([n[k] for n in ns])) for k in ns[0]]
        lines.append(f"{row} ({len(ns)} seeds): "
                     + "; ".join(f"{k} {m:.3f} ± {se:.3f}" for k, (m, se) in cells))
    return lines


def difference(record: Path, a: str, b: str) -> str:
    """Row a − row b, paired by seed, over the seeds both have."""
    by_row = [r.rsplit("-seed", 1) for r in runs(record)]
    seeds = {s for row, s in by_row if row == a} & {s for row, s in by_row if row == b}
    d = [avg(record, f"{a}-seed{s}") - avg(record, f"{b}-seed{s}") for s in sorted(seeds, key=int)]
    if len(d) < 2:
        return f"{a} − {b}: {len(d)} shared seed(s), no SE"
    mean, se = _mean_se(d)
    if not se:  # every seed the same difference (a row against itself, say)
        return f"{a} − {b}, paired by seed: {mean:+.4f} on each of {len(d)} seeds (SE 0)"
    t = T975.get(len(d) - 1, 1.96)
    return (f"{a} − {b}, paired by seed: {mean:+.4f} ± {se:.4f} over {len(d)} seeds; |mean| / SE "
            f"{abs(mean) / se:.2f} (printed {_floor1(abs(mean) / se):.1f}); 95% t interval "
            f"[{mean - t * se:+.3f}, {mean + t * se:+.3f}]; per seed " + ", ".join(f"{x:+.4f}" for x in d))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("record", type=Path, help="a sweep's folder (bench/results/learn_sweep_v21)")
    ap.add_argument("--diff", nargs=2, metavar=("A", "B"), help="row A − row B, paired by seed")
    args = ap.parse_args(argv)
    if args.diff:
        print(difference(args.record, *args.diff))
        return
    print("\n".join(table(args.record)))


if __name__ == "__main__":
    main()
