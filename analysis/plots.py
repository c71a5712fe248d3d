"""PNG figures from training runs and evaluations
(`python evaluate.py plot --run DIR [--run DIR2] [--eval-json F]`).

- training_curves.png: success rate, reward, router match rate and response length per step, one line per run.
- comparison_bars.png: the same four metrics averaged over each run's last `--last` logged steps,
  one bar per run.
- eval_bars.png (with --eval-json): Avg@k and Pass@k of every row of the given eval result files.
matplotlib is optional: without it the command says how to install it and exits, nothing else needs it.
"""
import json
from dataclasses import dataclass
from pathlib import Path

import tyro



@dataclass
class PlotArgs:
    """PNG training curves and comparison bars from metrics.jsonl (and optionally eval JSON files)."""
    run: tyro.conf.UseAppendAction[tuple[str, ...]] = ()
    """a run directory (with metrics.jsonl); repeat --run for each run to draw"""
    eval_json: tyro.conf.UseAppendAction[tuple[str, ...]] = ()
    """an eval result file (evaluate.py eval --output X -> X.json) for an Avg@k / Pass@k bar chart; repeat the
    flag for several"""
    last: int = 5
    """comparison bars average the last N logged steps of each run"""
    output_dir: str = "plots"
    """where the PNG files go"""


CURVES = (("rollout/success_rate", "success rate"), ("rollout/reward", "reward"),
          ("router/match_rate", "match rate"), ("rollout/response_tokens", "response tokens"))


def read_metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        raise SystemExit(f"no metrics.jsonl in {run}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plot needs matplotlib (optional dependency): "
                         ".venv/bin/pip install matplotlib") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def run_plots(args: PlotArgs) -> list[Path]:
    plt = _pyplot()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = {Path(r).name or r: read_metrics(Path(r)) for r in args.run}
    written = []
    if runs:
        fig, axes = plt.subplots(2, 2, figsize=(10, 7))
        for ax, (key, title) in zip(axes.flat, CURVES):
            for name, rows in runs.items():
                pts = [(r["step"], r[key]) for r in rows if key in r]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name)
            ax.set_title(title)
            ax.set_xlabel("step")
        axes.flat[0].legend(fontsize=8)
        fig.tight_layout()
        written.append(out / "training_curves.png")
        fig.savefig(written[-1], dpi=100)
        fig, axes = plt.subplots(1, 4, figsize=(14, 3.5))
        for ax, (key, title) in zip(axes, CURVES):
            tails = [[r[key] for r in rows[-args.last:] if key in r] for rows in runs.values()]
            vals = [sum(t) / len(t) if t else float("nan") for t in tails]
            ax.bar(range(len(vals)), vals, tick_label=list(runs), color="C0")
            ax.set_title(f"{title} (last {args.last} steps)", fontsize=9)
            ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        fig.tight_layout()
        written.append(out / "comparison_bars.png")
        fig.savefig(written[-1], dpi=100)
    if args.eval_json:
        rows = [(r["label"], r["metrics"], res["k"]) for f in args.eval_json
                for res in [json.loads(Path(f).read_text())] for r in res["rows"]]
        fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(rows)), 3.5))
        for i, (label, m, k) in enumerate(rows):
            ax.bar(i - 0.2, m[f"avg@{k}"], 0.4, color="C0", label="Avg@k" if i == 0 else None)
            ax.bar(i + 0.2, m[f"pass@{k}"], 0.4, color="C1", label="Pass@k" if i == 0 else None)
        ax.set_xticks(range(len(rows)), [r[0] for r in rows], rotation=30, fontsize=7)
        ax.legend()
        fig.tight_layout()
        written.append(out / "eval_bars.png")
        fig.savefig(written[-1], dpi=100)
    for p in written:
        print(f"[plot] wrote {p}", flush=True)
    return written
