"""The report of bench/learn.py: each row's numbers from its runs' metrics.jsonl and evaluations, the
differences between rows (paired by task and by seed), and results.json / results.md / curves.png."""
import json
import math
from pathlib import Path

import numpy as np

from analysis.lambda_pilot import pilot_agreement, run_strength, share_per_unit_lambda
from analysis.plots import plot_curves, plot_dose
from analysis import archives


def _run_seed(run: Path) -> int:
    """The seed of a run folder that _run_dir named."""
    return int(run.name.rsplit("-seed", 1)[1])


def _metrics(run: Path) -> list[dict]:
    """A run's metrics.jsonl, one dict per step."""
    return [json.loads(x) for x in archives.read_text(run / "metrics.jsonl").splitlines() if x.strip()]


def _curve(run: Path, key: str = "rollout/success_rate") -> list[tuple[int, float]]:
    """(step, value) of a metric over a run, in step order: training success,
    or the validation's (val/...)."""
    return sorted((r["step"], r[key]) for r in _metrics(run) if key in r)


def _mean_se(values: list[float]) -> tuple[float, float]:
    """Mean ± SE (ddof 1) of the measured values (a NaN is a value not measured, e.g. the valid-action ratio
    of a panel without turns: left out, never averaged in); the SE is NaN for one value, both for none."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if not len(v):
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")


def _row(name: str, evals: list[dict], runs: list[Path], k: int) -> dict:
    row = {"name": name, "runs": [str(r) for r in runs], "n": len(evals)}
    for key in (f"avg@{k}", f"pass@{k}", "valid_action_ratio", "response_tokens", "repeated_4gram_ratio"):
        row[key] = _mean_se([e[key] for e in evals])
    if len(evals) == 1 and f"avg@{k}_se" in evals[0]:  # one evaluation (the warm start):
                                                       # SE over the panel's tasks
        row[f"avg@{k}"] = (evals[0][f"avg@{k}"], evals[0][f"avg@{k}_se"])
    if runs:
        metrics = [_metrics(r) for r in runs]
        for key in ("router/match_rate", "sd/distilled_share", "sd/candidate_gain",
                    "sd/teacher_minus_student_logp", "actor/entropy"):
            per_run = [[m[key] for m in ms if key in m and not np.isnan(m[key])] for ms in metrics]
            if all(per_run):  # a key no step logged (GRPO has no teacher) stays out of the row:
                              # "-" in the table
                row[key] = _mean_se([np.mean(v) for v in per_run])
        for key, per_run in strength(metrics).items():
            if all(np.isfinite(per_run)):  # a key with no reading in some run (GRPO: no SD term) stays "-"
                row[key] = _mean_se(per_run)
        row["train_min"] = _mean_se([sum(m.get("time/step_s", 0.0) + m.get("time/val_s", 0.0)
                                         for m in ms) / 60
                                     for ms in metrics])  # each step once (rows a resume redid moved to
                                                          # metrics.after_step_*)
        row["eval_min"] = _mean_se([_eval_seconds(r.parent / "eval" / f"{r.name}.json") / 60 for r in runs])
    return row


def strength(metrics: list[list[dict]]) -> dict[str, list[float]]:
    """How hard and how sharp each run's SD term was, one value per run (NaN where the run never measured it):
    sd/grpo, kl_per_turn, cand_share as analysis.lambda_pilot.run_strength reads them."""
    values = [run_strength(ms) for ms in metrics]
    return {key: [v[i] for v in values] for i, key in enumerate(("sd/grpo", "kl_per_turn", "cand_share"))}


def _eval_seconds(path: Path) -> float:
    """The wall time evaluate.py recorded for a run's held-out evaluation."""
    return float(json.loads(archives.read_text(path))["rows"][0]["seconds"])


def _per_task(out: Path, name: str) -> dict[str, float]:
    """Success of every panel task averaged over its k attempts, from an evaluation's JSON."""
    eps = json.loads(archives.read_text(out / "eval" / f"{name}.json"))["rows"][0]["episodes"]
    by_task: dict[str, list[float]] = {}
    for e in eps:
        by_task.setdefault(e["task_id"], []).append(float(e["won"]))
    return {t: float(np.mean(v)) for t, v in by_task.items()}


def _per_task_mean(out: Path, names: list[str]) -> dict[str, float]:
    """Each panel task's success averaged over its k attempts and over the evaluations `names` (a row's
    seeds)."""
    per = [_per_task(out, n) for n in names]
    return {t: float(np.mean([p[t] for p in per])) for t in per[0]}


def paired_difference(out: Path, a: list[str], b: list[str]) -> tuple[float, float]:
    """Avg@k of evaluations `a` minus `b` on the same panel, paired by task: per task, (mean over a's seeds)
    − (mean over b's) (the same seeds: `on_shared_seeds`); mean ± SE over tasks. It carries the panel's
    sampling noise, which an SE over seeds does not see."""
    pa, pb = _per_task_mean(out, a), _per_task_mean(out, b)
    return _mean_se([pa[t] - pb[t] for t in sorted(pb)])


def on_shared_seeds(a: list, b: list) -> tuple[list[str], list[str]]:
    """The evaluation names of two rows' (run folder, metrics) pairs on the seeds both rows have: while a
    sweep is in progress, a row − row difference compares the same seeds, not one row's first seed with the
    other's mean over more."""
    seeds = _shared_seeds(a, b)
    return [r.name for r, _ in a if _run_seed(r) in seeds], [r.name for r, _ in b if _run_seed(r) in seeds]


def _shared_seeds(a: list, b: list) -> list[int]:
    """The seeds two rows' (run folder, metrics) pairs both have, in order."""
    return sorted({_run_seed(r) for r, _ in a} & {_run_seed(r) for r, _ in b})


def seed_paired_difference(results: dict[str, list], a: str, b: str, k: int) -> dict:
    """Avg@k of row `a` minus row `b`, paired by seed (the seeds both have: a seed fixes the task
    draws and the first step's rollouts); mean ± SE over seeds. Unlike the paired-by-task SE, it
    carries the run-to-run variation of training, the noise that decides whether one algorithm beats
    another."""
    avg = {r: {_run_seed(run): m[f"avg@{k}"] for run, m in results[r]} for r in (a, b)}
    d = [avg[a][s] - avg[b][s] for s in _shared_seeds(results[a], results[b])]
    return {"mean_se": _mean_se(d), "seeds": len(d), "per_seed": d}


def paired_gain(out: Path, runs: list[Path]) -> tuple[float, float]:
    """Avg@k gain of a row's runs over the warm start, paired by task (paired_difference)."""
    return paired_difference(out, [r.name for r in runs], ["warm-start"])


def markdown(rows: list[dict], k: int) -> str:
    cols = [f"avg@{k}", f"pass@{k}", "valid_action_ratio", "response_tokens", "repeated_4gram_ratio",
            "router/match_rate", "sd/distilled_share", "sd/candidate_gain", "sd/teacher_minus_student_logp",
            "actor/entropy", "sd/grpo", "kl_per_turn", "cand_share", "train_min", "eval_min"]
    labels = {"train_min": "train min", "eval_min": "eval min", "sd/grpo": "SD/GRPO grad",
              "kl_per_turn": "KL/turn", "cand_share": "cand share"}  # per run, with --workers runs at once
    lines = ["| run | seeds | " + " | ".join(labels.get(c, c.split("/")[-1]) for c in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for r in rows:
        lines.append(f"| {r['name']} | {r['n']} | " + " | ".join(_pm(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def _pm(mean_se: tuple[float, float] | None, sign: str = "", seeds: int = 0) -> str:
    """A table cell: mean ± SE, the mean alone where there is no SE (one run), "-" where there is no value;
    with `seeds`, how many SE from 0 the mean is."""
    if mean_se is None or np.isnan(mean_se[0]):
        return "-"
    mean, se = mean_se
    if np.isnan(se):
        return f"{mean:{sign}.3f}"
    z = f" ({_separation(mean, se)[0]})" if seeds else ""
    return f"{mean:{sign}.3f} ± {se:.3f}{z}"


def _separation(mean: float, se: float) -> tuple[str, bool]:
    """How many SE from 0 a difference over seeds is, as printed, and whether that separates the two rows
    (>= SEPARATED). Seeds that all differ by the same non-zero amount (SE 0) separate them: "∞ SE"."""
    if se > 0:
        return f"{_floor1(abs(mean) / se):.1f} SE", abs(mean) / se >= SEPARATED
    return ("∞ SE", True) if mean else ("0.0 SE", False)


def _floor1(z: float) -> float:
    """z rounded down to one decimal: a printed 2.0 SE is never a 1.97 the verdict calls not separated."""
    return math.floor(z * 10 + 1e-9) / 10


def dose_table(rows: list[dict], by_task: dict[str, tuple], by_seed: dict[str, dict], k: int) -> str:
    """The dose-response table: each RL row's Avg@k and Pass@k (mean ± SE over seeds), its difference from
    GRPO paired by seed (how many SE) and by task, how hard its SD term pushed (SD / GRPO gradient share),
    how sharp it was (KL per distilled turn) and how often the student sampled the candidate; then each
    other pair (SMRC − FullPath at equal λ and α) the same way."""
    cols = [f"avg@{k}", f"pass@{k}", "sd/grpo", "kl_per_turn", "cand_share"]
    lines = [f"| row | seeds | Avg@{k} | Pass@{k} | − GRPO, by seed | − GRPO, by task | SD/GRPO grad "
             "| KL/turn | cand share |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows[1:]:  # rows[0] is the warm start
        d = by_seed.get(f"{r['name']} − grpo")
        cells = [_pm(r.get(c)) for c in cols]
        seed_cell = _pm(d["mean_se"], "+", d["seeds"]) if d else "-"
        cells[2:2] = [seed_cell, _pm(by_task.get(f"{r['name']} − grpo"), "+")]
        lines.append(f"| {r['name']} | {r['n']} | " + " | ".join(cells) + " |")
    lines.append(f"\n± is the SE over seeds (a row of one seed: Avg@{k}'s SE over the panel's tasks). "
                 "Per run: SD/GRPO grad is the median over steps, KL/turn is pooled over the distilled "
                 "turns, cand share over the distilled turns matched to a reference: all of SMRC-SD's and "
                 "FullPath-SD's, though FullPath-SD's candidate (the reference's action at the same index) "
                 "can be sampled only where it is admissible (analysis.lambda_pilot.run_strength). By seed: "
                 "(|mean| / SE, rounded down to one decimal). A pair's SD/GRPO grad: each row's own, over "
                 "all its seeds.")
    others = [name for name in by_seed if not name.endswith(" − grpo")]
    share = {r["name"]: _pm(r.get("sd/grpo")) for r in rows}
    if others:  # SMRC − FullPath at equal (λ, α), then the --compare pairs; their strengths side by side
        lines += ["", "| pair | seeds | by seed | by task | SD/GRPO grad, a / b |", "|---|---|---|---|---|"]
        for n in others:
            d, (a, b) = by_seed[n], n.split(" − ")
            lines.append(f"| {n} | {d['seeds']} | {_pm(d['mean_se'], '+', d['seeds'])} | "
                         f"{_pm(by_task.get(n), '+')} | {share.get(a, '-')} / {share.get(b, '-')} |")
    return "\n".join(lines)


def readme_table(summary: dict) -> str:
    """The README's results table from a sweep's results.json (`summarize`'s summary): each row's Avg@k (mean
    ± SE over seeds; the highest mean in bold), its difference from GRPO paired by seed, its SD / GRPO
    gradient share and KL per distilled turn; tests/test_archives.py holds the README to it."""
    k, steps, rows = summary["args"]["k"], summary["args"]["steps"], summary["rows"]
    by_seed = summary["seed_paired_difference_avg@k"]

    def cell(text: str) -> str:  # the README's signs: − for minus, – for nothing
        return "–" if text == "-" else text.replace("-", "−")

    lines = [f"| row ({steps} steps) | seeds | Avg@{k} ± SE over seeds | − GRPO, paired by seed (SE count "
             "rounded down) | SD / GRPO grad, median `actor/sd_grpo_grad_ratio` | KL per distilled turn "
             "(nat) |", "|---|---|---|---|---|---|"]
    mean, se = rows[0][f"avg@{k}"]
    lines.append(f"| warm start (before RL) | – | {mean:.3f} ± {se:.3f} (over tasks) | – | – | – |")
    best = max(r[f"avg@{k}"][0] for r in rows[1:])
    for r in rows[1:]:
        avg = _pm(r[f"avg@{k}"])
        d = by_seed.get(f"{r['name']} − grpo")
        cells = [f"**{avg}**" if r[f"avg@{k}"][0] == best else avg,
                 _pm(d["mean_se"], "+", d["seeds"]) if d else "-", _pm(r.get("sd/grpo")),
                 _pm(r.get("kl_per_turn"))]
        lines.append(f"| {r['name']} | {r['n']} | " + " | ".join(cell(c) for c in cells) + " |")
    return "\n".join(lines)


def pilot_text(agreement: dict[int, dict], units: dict[str, dict[str, tuple[float, float]]]) -> str:
    """results.md's lines on reading λ from a pilot (pilot_agreement, share_per_unit_lambda)."""
    lines = ["Reading λ from a pilot (analysis/lambda_pilot.py). The SD / GRPO share per unit λ of rows that "
             "differ only in λ (mean ± SE over seeds):"]
    lines += [f"- {base}: " + ", ".join(f"{_pm(u)} at λ {lam}" for lam, u in us.items())
              for base, us in units.items()]
    lines.append("A run's share over all its steps / over its first K steps (a K-step pilot's reading, "
                 "at the run's own λ):")
    for k, a in agreement.items():
        lines.append(f"- K = {k}: median {a['median']:.2f} (10–90%: {a['q10']:.2f}–{a['q90']:.2f}) over "
                     f"{a['runs']} runs; within 1.5× in {a['within_1.5x']} of {a['runs']}")
    return "\n".join(lines)


def dose_points(rows: list[dict], by_seed: dict[tuple[str, str], dict]
                ) -> list[tuple[str, float, float, float, int]]:
    """(row, SD / GRPO gradient share, row − GRPO paired by seed, its SE, seeds) of every row with an SD
    term and a GRPO difference (`by_seed` maps a pair (a, b) to a − b): the dose-response figure's points."""
    share = {r["name"]: r["sd/grpo"][0] for r in rows if "sd/grpo" in r}
    return [(a, share[a], *d["mean_se"], d["seeds"]) for (a, b), d in by_seed.items()
            if b == "grpo" and a in share and d["seeds"]]


def summarize(out: Path, k: int, pairs: list[tuple[str, str]], settings: dict, before: dict,
              results: dict[str, list], seconds: float | None, greedy: dict) -> str:
    """Write results.json / results.md / curves.png into `out` from what has finished so far: `results` maps a
    row's name to its (run folder, evaluation metrics) pairs, `pairs` names the differences to report (row a −
    row b, where both have runs), `settings` is the sweep's flags (rewritten after every run)."""
    table_rows = [_row("warm start (before RL)", [before], [], k)]
    table_rows += [_row(name, [m for _, m in rs], [r for r, _ in rs], k) for name, rs in results.items()]
    gain = None
    if len(results.get("grpo", [])) > 0:  # GRPO's gain over the warm start per seed,
                                          # then mean ± SE over seeds
        gain = _mean_se([m[f"avg@{k}"] - before[f"avg@{k}"] for _, m in results["grpo"]])
    table = markdown(table_rows, k)
    paired = {name: paired_gain(out, [r for r, _ in rs]) for name, rs in results.items()}
    present = [(a, b) for a, b in pairs if results.get(a) and results.get(b)]
    shared = {(a, b): on_shared_seeds(results[a], results[b]) for a, b in present}
    differences = {f"{a} − {b}": paired_difference(out, *shared[a, b]) for a, b in present if shared[a, b][0]}
    seed_pairs = {(a, b): seed_paired_difference(results, a, b, k) for a, b in present}
    by_seed = {f"{a} − {b}": d for (a, b), d in seed_pairs.items()}
    summary = {"args": settings, "rows": table_rows, "grpo_gain_avg@k": gain, "paired_gain_avg@k": paired,
               "paired_difference_avg@k": differences, "seed_paired_difference_avg@k": by_seed,
               "wall_s": seconds,
               "warm_start_greedy": {"success": greedy["avg@1"], "se": greedy["avg@1_se"],
                                     "games": greedy["tasks"]}}
    if gain:
        table += f"\n\nGRPO gain over the warm start, avg@{k}: {_over_seeds(*gain, len(results['grpo']))}"
    for name, (g, se) in paired.items():
        table += (f"\n{name} gain over the warm start, avg@{k}, paired by task: {g:+.3f} ± {se:.3f} "
                  "(SE over tasks)")
    for name, (g, se) in differences.items():
        table += f"\n{name}, avg@{k}, paired by task: {g:+.3f} ± {se:.3f} (SE over tasks)"
    for name, d in by_seed.items():
        table += f"\n{name}, avg@{k}, paired by seed: {_over_seeds(*d['mean_se'], d['seeds'])}"
    if by_seed:
        table += ("\n(n SE: |mean| / SE rounded down to one decimal, here and below: a printed 2.0 is at "
                  "least 2)")
    table += "\n\nThe dose-response, compactly:\n\n" + dose_table(table_rows, differences, by_seed, k)
    sd_runs = [r for name, rs in results.items() if name != "grpo" for r, _ in rs]
    summary["pilot_agreement"] = agreement = pilot_agreement([_metrics(r) for r in sd_runs])
    summary["share_per_unit_lambda"] = units = share_per_unit_lambda(table_rows)
    if agreement or units:  # some run with an SD term
        table += "\n\n" + pilot_text(agreement, units)
    archives.write_text(out / "results.json", json.dumps(summary, indent=1))  # where the record keeps it
    (out / "results.md").write_text(table + "\n")
    plot_dose(dose_points(table_rows, seed_pairs), out / "strength.png")
    plot_curves({n: [_curve(r) for r, _ in rs] for n, rs in results.items()},
         {n: [_curve(r, "val/success_rate") for r, _ in rs] for n, rs in results.items()}, out / "curves.png")
    return table


SEPARATED = 2.0  # |mean| / SE over seeds from which the report calls an order of two rows separated


def _over_seeds(mean: float, se: float, seeds: int) -> str:
    """mean ± SE over seeds with how many SE from 0 and whether that separates the rows, or the mean alone
    where one seed gives no SE (not a NaN in the table)."""
    if seeds < 2:
        return f"{mean:+.3f} (1 seed: no SE yet)"
    z, separated = _separation(mean, se)
    return f"{mean:+.3f} ± {se:.3f} (SE over {seeds} seeds; {z}: {'' if separated else 'not '}separated)"
