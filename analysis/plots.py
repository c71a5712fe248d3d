"""PNG figures from training runs and evaluations
(`python evaluate.py plot --run DIR [--run DIR2] [--eval-json F]`).

- training_curves.png: success rate, reward, router match rate and response length per step, one line per run.
- comparison_bars.png: the same four metrics averaged over each run's last `--last` logged steps,
  one bar per run.
- eval_bars.png (with --eval-json): Avg@k and Pass@k of every row of the given eval result files.
- a sweep's curves.png and strength.png (bench/learn_report.py draws them): `plot_curves`, `plot_dose`.
matplotlib is optional: without it the command says how to install it and exits, nothing else needs it.
"""
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
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


def _pyplot(path: Path | None = None):
    """matplotlib's pyplot, drawing to files. Without matplotlib: exit with how to install it or, drawing
    `path` beside other work (a sweep's report), say it is not drawn and return None."""
    try:
        import matplotlib
    except ImportError:
        if path is not None:
            print(f"[plot] matplotlib is not installed: {path} not drawn (pip install matplotlib)",
                  flush=True)
            return None
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


SMOOTH = 5  # steps in the training curve's moving average (which tasks a step drew moves the raw curve a lot)


def _band(ax, runs: list[list[tuple[int, float]]], label: str, smooth: int = 1) -> None:
    """Mean ± SE over runs (their common steps), after a trailing moving average of `smooth` points per
    run."""
    n = min(map(len, runs))
    c = np.asarray([[v for _, v in r[:n]] for r in runs])
    c = np.stack([[row[max(0, i - smooth + 1):i + 1].mean() for i in range(n)] for row in c])
    mean, se = c.mean(0), (c.std(0, ddof=1) / np.sqrt(len(c)) if len(c) > 1 else np.zeros(n))
    steps = [s for s, _ in runs[0][:n]]
    ax.plot(steps, mean, marker="o" if n < 8 else None, label=f"{label} (n={len(c)})")
    ax.fill_between(steps, mean - se, mean + se, alpha=0.2)


def plot_curves(train: dict[str, list], val: dict[str, list], path: Path) -> None:
    """A sweep's training success (moving average over SMOOTH steps) and in-loop validation success, mean ± SE
    over seeds (bench/learn.py's curves.png); `train`, `val`: a row's (step, value) curves, one per run."""
    plt = _pyplot(path)
    if plt is None:
        return
    val = {n: runs for n, runs in val.items() if runs and all(runs)}
    fig, axes = plt.subplots(1, 1 + bool(val), figsize=(6 + 5 * bool(val), 4), squeeze=False)
    for name, runs in train.items():
        _band(axes[0][0], runs, name, SMOOTH)
    axes[0][0].set_ylabel(f"training success (sampled, {SMOOTH}-step moving average)")
    for name, runs in val.items():
        _band(axes[0][1], runs, name)
    if val:
        axes[0][1].set_ylabel("validation success (fixed panel)")
    for ax in axes[0]:
        ax.set_xlabel("RL step")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)  # a sweep redraws after every run: an open figure per draw would pile up


def plot_dose(points: list[tuple[str, float, float, float, int]], path: Path) -> None:
    """Each SD row's Avg@k − GRPO (paired by seed, ± SE where there are ≥ 2 seeds) against its SD / GRPO
    gradient share (log scale): the dose-response (bench/learn.py's strength.png). Not drawn without
    matplotlib or points."""
    plt = _pyplot(path)
    if plt is None or not points:
        return
    from matplotlib import ticker
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for i, (name, x, y, se, n) in enumerate(points, 1):  # a number by each point, its name in the key
        style = dict(marker="s" if name.startswith("oracle-") else "o",
                     color="tab:blue" if "smrc" in name else "tab:orange")
        ax.errorbar([x], [y], yerr=[0 if np.isnan(se) else se], capsize=3,
                    label=f"{i}  {name} ({n} seed{'s' * (n > 1)})", **style)
        ax.annotate(str(i), (x, y), fontsize=8, xytext=(4, 3), textcoords="offset points")
    ax.axhline(0, color="grey", lw=1)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ticker.ScalarFormatter())
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    shares = [x for _, x, *_ in points]
    ax.set_xlim(min(shares) / 1.6, max(shares) * 1.6)
    ax.margins(y=0.15)
    ax.set_xlabel("SD / GRPO gradient share (median per run, mean over seeds)")
    ax.set_ylabel("Avg@k − GRPO, paired by seed")
    ax.set_title("SMRC (blue) / FullPath (orange); model teacher (o), oracle (s)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


VIEW_CURVES = (("rollout/success_rate", "success rate"), ("router/match_rate", "match rate"),
               ("sd/distilled_share", "distilled share"), ("sd/kl_per_turn", "KL per distilled turn"),
               ("actor/sd_grpo_grad_ratio", "SD / GRPO gradient share"))


def curves_png(rows: list[dict], curves=VIEW_CURVES) -> bytes | None:
    """One small panel per (metric, title) of `curves` against the step, as PNG bytes (the run viewer,
    analysis/view.py, embeds them); a metric the run did not log says so in its panel. None without
    matplotlib. A row without the metric (a validation row) or with a NaN there is skipped."""
    plt = _pyplot(Path("the run view's curves"))
    if plt is None:
        return None
    import io
    from matplotlib.ticker import MaxNLocator
    fig, axes = plt.subplots(1, len(curves), figsize=(2.8 * len(curves), 2.4), squeeze=False)
    for ax, (key, title) in zip(axes[0], curves):
        pts = [(r["step"], r[key]) for r in rows
               if isinstance(r.get(key), (int, float)) and np.isfinite(r[key])]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if not pts:
            ax.set_xticks([])
            ax.set_yticks([])
            ax.text(0.5, 0.5, f"{key}\nnot logged (or not finite)", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()
