"""The CPU mini-reproduction: does RL improve the embedded agent, and how do GRPO, FullPath-SD and SMRC-SD compare?

    python bench/learn.py          # GRPO, FullPath-SD, SMRC-SD x 5 seeds + their oracle-teacher rows x 3 seeds,
                                   # 30 steps each, eval on 200 held-out games, k=4
    python bench/learn.py --seeds 0 --lambdas 0.1 0.3 1     # + the λ sweep of the distillation runs (seed 0)
    python bench/learn.py --algos grpo fullpath-sd smrc-sd skill-sd sdar          # the paper's five rows
    python bench/learn.py --steps 2 --eval-games 2 --train-games 6 --oracle-algos --out /tmp/learn  # smoke test

Every run is the project's own trainer, `smrc.py --preset learn --algo A --seed S` (tiny-agent on small generated
games, admissible action space, references = the policy's own successes), in its own folder; every evaluation is the
project's own `evaluate.py eval` of the run's final checkpoint on the same held-out panel; the warm start itself is
evaluated once as the "before" row. All runs of one algorithm differ only in the seed; no algorithm gets its own tuning.
Oracle rows (`oracle-A`): algorithm A with `--teacher.oracle α` (no model teacher: a perfect reader of A's candidate),
so "routing helps" and "the tiny model reads its reference well enough" are two separate answers.
λ: --sd-coef for the trajectory-context methods (fullpath-sd, smrc-sd: reverse-KL L_SD), and each skill-text
baseline's anchor value for its own loss form (skill-sd 0.001, sdar 0.01, grpo-opsd 0.01: grpo.SD_COEF), since their
loss terms live on other scales; the λ sweep (--lambdas) is of the reverse-KL methods.

Resumable: a run is started with `--resume` (it continues from its latest checkpoint), and a finished evaluation (its
JSON exists) is not repeated, so an interrupted sweep picks up where it stopped. A finished run needs only its
`metrics.jsonl` and its evaluation's JSON, so a sweep can be continued on another machine from those small files
(bench/results/learn_sweep_v8/ holds the record of the README's sweep); OUT/warm_start.json pins the warm start's
weights (sha256), and a sweep with another build of it is refused.
Writes OUT/results.json (every number), OUT/results.md (the table, each row's Avg@k gain over
the warm start, the differences of PAIRS paired by task and paired by seed: the SE over tasks
carries the panel's sampling noise, the SE over seeds the run-to-run noise of training) and
OUT/curves.png (training success, a moving average, and the in-loop validation success on fixed
games, mean ± standard error over seeds; the λ sweep is in the table only).
"""
import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from embedded.warmstart import resolve  # noqa: E402
from grpo import SD_COEF  # noqa: E402
from scale.preflight import check_rules, int_at_least, real_in  # noqa: E402
from smrc import ALGOS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


ORACLE = "oracle-"  # a row name's prefix: the algorithm with the oracle teacher (--teacher.oracle α), no model teacher
PAIRS = (("smrc-sd", "fullpath-sd"), ("smrc-sd", "grpo"), ("fullpath-sd", "grpo"),
         ("oracle-smrc-sd", "oracle-fullpath-sd"), ("oracle-smrc-sd", "grpo"), ("oracle-fullpath-sd", "grpo"))


@dataclass
class LearnArgs:
    algos: tuple[str, ...] = ("grpo", "fullpath-sd", "smrc-sd")
    """algorithms compared (same warm start, same budget)"""
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    """seeds per algorithm"""
    oracle_algos: tuple[str, ...] = ("fullpath-sd", "smrc-sd")
    """algorithms also run with the oracle teacher, as rows `oracle-A` (a perfect reader of A's candidate); () for
    none"""
    oracle_seeds: tuple[int, ...] = (0, 1, 2)
    """seeds of the oracle rows"""
    oracle_alpha: float = 0.5
    """α of the oracle rows' teacher (1−α)·π_student + α·δ_candidate (0.5: on the candidate, about the model
    teacher's measured gain of ~1 nat over a student that gives it ~0.2)"""
    steps: int = 30
    """RL steps per run"""
    save_every: int = 5
    """checkpoint every N steps, so an interrupted sweep loses at most N steps of each run in flight"""
    model: str = "tiny-agent"
    """the warm start every run starts from (tiny-agent-quick for smoke runs)"""
    tasks_per_step: int = 4
    """task groups per RL step"""
    group_size: int = 8
    """rollouts per task"""
    sd_coef: float = 0.2
    """λ of the main table's reverse-KL distillation runs (fullpath-sd, smrc-sd and their oracle rows); skill-sd, sdar
    and grpo-opsd run at their loss form's anchor λ. The rule, fixed before the sweep: the λ at which the SD term's
    gradient norm equals the GRPO term's, mean over the seed-0 10-step SMRC-SD pilot at λ = 0.3 on the warm start
    (bench/results/smrc_sd_10steps_v8: 0.3 × 0.1000 / 0.1311 = 0.229), to one significant digit"""
    lambdas: tuple[float, ...] = ()
    """extra λ values for fullpath-sd and smrc-sd (first seed only): the λ sweep"""
    train_games: int = 320
    """training games (the warm start's games)"""
    eval_games: int = 200
    """held-out evaluation games: the learn preset's 200-game panel, or a type-stratified subset of it (evaluate.py
    --limit, the same subset for every row)"""
    k: int = 4
    """sampled attempts per evaluation game (Avg@k, Pass@k)"""
    eval_every: int = 10
    """in-loop validation every N steps (smrc.py --eval-every; 0: none): a curve on fixed games, free of which tasks
    a step drew"""
    val_games: int = 48
    """games of the in-loop validation panel (smrc.py --eval-tasks)"""
    out: str = "runs/learn"
    """where runs, evaluations and the results go"""
    report_only: bool = False
    """rewrite results.json / results.md / curves.png from the runs of OUT that have finished; start nothing"""
    workers: int = 2
    """runs (training + evaluation) in flight at once; each child gets max(1, cores // workers) torch
    threads (`worker_env`; on 2 cores, 2 one-thread runs beat one two-thread run: tiny matrices use a
    second thread poorly, and env workers overlap)"""


def check_args(args: LearnArgs) -> None:
    """Bad flags are one `error:` line before anything is built, trained or evaluated (the trainer's own checks
    would come only after the warm start's minutes-long build)."""
    def bad(flag: str, value, allowed: str):
        raise SystemExit(f"error: --{flag} {value} is not allowed; allowed: {allowed}")
    with_candidate = [a for a in ALGOS if ALGOS[a][0] not in ("none", "every-turn")]  # what an oracle needs
    for flag, allowed in (("algos", list(ALGOS)), ("oracle-algos", with_candidate)):
        values = getattr(args, flag.replace("-", "_"))
        if any(a not in allowed for a in values) or len(set(values)) < len(values):
            bad(flag, " ".join(values), "distinct names among " + ", ".join(allowed))
    if not args.algos:
        bad("algos", "(none)", "one or more of " + ", ".join(ALGOS))
    for flag in ("seeds", "oracle-seeds"):
        seeds = getattr(args, flag.replace("-", "_"))
        if any(s < 0 for s in seeds) or len(set(seeds)) < len(seeds) or (flag == "seeds" and not seeds):
            bad(flag, " ".join(map(str, seeds)) or "(none)", "one or more distinct integers >= 0")
    check_rules(args, [(name, int_at_least(low)) for name, low in (
        ("steps", 1), ("save_every", 1), ("tasks_per_step", 1), ("group_size", 2), ("train_games", 1),
        ("eval_games", 1), ("k", 1), ("eval_every", 0), ("val_games", 1), ("workers", 1))]
        + [("oracle_alpha", real_in(0, 1, open_lo=True))])  # the trainer's rules, its message
    if not all(np.isfinite(lam) and lam > 0 for lam in (args.sd_coef, *args.lambdas)):
        bad("sd-coef / --lambdas", " ".join(map(str, (args.sd_coef, *args.lambdas))), "finite numbers > 0")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one), else os.cpu_count()."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def worker_env(workers: int, cores: int | None = None, base: dict | None = None) -> dict[str, str]:
    """The environment of every child (training or evaluation run) when `workers` run at once on
    `cores` (default: `usable_cores()`): max(1, cores // workers) torch threads each (OMP_NUM_THREADS and
    MKL_NUM_THREADS, which torch reads when it starts; they replace inherited values), and OpenMP threads
    that sleep instead of spinning when idle (OMP_WAIT_POLICY=PASSIVE unless `base` sets it), so the runs
    in flight do not oversubscribe the cores."""
    threads = str(max(1, (cores or usable_cores()) // max(1, workers)))
    env = dict(os.environ if base is None else base)
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def _run(args: LearnArgs, cmd: list[str], log: Path) -> None:
    """A child process (its threads set by `worker_env`) with its output in `log`; a failure stops the
    sweep with the log's tail."""
    env = worker_env(args.workers)
    with open(log, "a") as f:
        rc = subprocess.run([sys.executable, *cmd], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        tail = log.read_text().splitlines()[-20:]
        raise SystemExit(f"error: {' '.join(cmd[:3])} ... failed (exit {rc}); {log}:\n" + "\n".join(tail))


def main_lambda(args: LearnArgs, row: str) -> float:
    """λ of a row's main-table runs: 0 for GRPO, --sd-coef for the reverse-KL L_SD of the trajectory-context
    methods (oracle rows too), the anchors' value for the other loss forms (an ρ·k3 or a gated likelihood term at
    λ = 0.3 would be another method than the one the anchors run)."""
    algo = row.removeprefix(ORACLE)
    form = ALGOS[algo][2]
    return 0.0 if algo == "grpo" else (args.sd_coef if form == "reverse-kl" else SD_COEF[form])


def plan(args: LearnArgs) -> list[tuple[str, int, float]]:
    """(row, seed, λ) of every run, seed-major (an interrupted sweep has every row at the same number of seeds): each
    seed's algorithms, then its oracle rows (seeds in --oracle-seeds); then the λ sweep of the reverse-KL methods on
    the first seed."""
    jobs = [(row, s, main_lambda(args, row)) for s in args.seeds
            for row in [*args.algos, *(ORACLE + a for a in args.oracle_algos if s in args.oracle_seeds)]]
    jobs += [(ORACLE + a, s, main_lambda(args, a)) for s in args.oracle_seeds if s not in args.seeds
             for a in args.oracle_algos]
    return jobs + [(a, args.seeds[0], lam) for lam in args.lambdas for a in args.algos
                   if a != "grpo" and ALGOS[a][2] == "reverse-kl" and lam != args.sd_coef]


def _run_dir(args: LearnArgs, row: str, seed: int, sd_coef: float) -> Path:
    return Path(args.out) / (f"{row}-lam{sd_coef:g}-seed{seed}" if row != "grpo" else f"grpo-seed{seed}")


def _run_seed(run: Path) -> int:
    """The seed of a run folder that _run_dir named."""
    return int(run.name.rsplit("-seed", 1)[1])


def _train(args: LearnArgs, row: str, seed: int, sd_coef: float) -> Path:
    run = _run_dir(args, row, seed, sd_coef)
    final = run / f"step_{args.steps:06d}"
    if not (final / "config.json").exists():
        run.mkdir(parents=True, exist_ok=True)
        oracle = ["--teacher.oracle", str(args.oracle_alpha)] if row.startswith(ORACLE) else []
        val = ["--eval-every", str(args.eval_every), "--eval-tasks", str(args.val_games)] if args.eval_every else []
        _run(args, ["smrc.py", "--preset", "learn", "--algo", row.removeprefix(ORACLE), *oracle, *val,
                    "--seed", str(seed),
                    "--steps", str(args.steps), "--save-every", str(min(args.save_every, args.steps)),
                    "--output-dir", str(run),
                    "--grpo.sd-coef", str(sd_coef), "--model", args.model,
                    "--rollout.tasks-per-step", str(args.tasks_per_step),
                    "--rollout.group-size", str(args.group_size),
                    "--alfworld.num-train-games", str(args.train_games), "--resume"], run / "train.log")
    return run


def _finished(args: LearnArgs, run: Path) -> bool:
    return (run / "metrics.jsonl").exists() and (Path(args.out) / "eval" / f"{run.name}.json").exists()


def check_warm_start(args: LearnArgs) -> str:
    """Build the warm start here (all cores, before the pool) and pin OUT to it: the sha256 of its weights is written
    to OUT/warm_start.json by the first sweep, and a later sweep into the same OUT with other weights (another build)
    is refused, so runs of two warm starts never share a table."""
    path = Path(resolve(args.model)) / "model.safetensors"
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    record = Path(args.out) / "warm_start.json"
    pinned = json.loads(record.read_text())["sha256"] if record.exists() else sha
    if pinned != sha:
        raise SystemExit(f"error: {args.out} holds runs from another build of {args.model} (weights sha256 "
                         f"{pinned[:12]}, this build {sha[:12]}); use a new --out")
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"model": args.model, "sha256": sha}) + "\n")
    return sha


def _evaluate(args: LearnArgs, model: str, name: str, checkpoint: bool, greedy: bool = False) -> dict:
    out = str(Path(args.out) / "eval" / name)  # evaluate.py writes OUT.json / OUT.md (a name may hold dots: lam0.3)
    if not Path(out + ".json").exists():
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        which = ["--checkpoint", model] if checkpoint else ["--baseline", model, "--preset", "learn"]
        sampling = ["--k", "1", "--temperature", "0"] if greedy else ["--k", str(args.k)]
        _run(args, ["evaluate.py", "eval", *which, "--split", "eval", *sampling, "--output", out,
                    "--tasks-per-batch", "32", "--limit", str(args.eval_games)], Path(out + ".log"))
    return json.loads(Path(out + ".json").read_text())["rows"][0]["metrics"]


def _metrics(run: Path) -> list[dict]:
    """A run's metrics.jsonl, one dict per step."""
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _curve(run: Path, key: str = "rollout/success_rate") -> list[tuple[int, float]]:
    """(step, value) of a metric over a run, in step order: training success, or the validation's (val/...)."""
    return sorted((r["step"], r[key]) for r in _metrics(run) if key in r)


def _mean_se(values: list[float]) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")


def _row(name: str, evals: list[dict], runs: list[Path], k: int) -> dict:
    row = {"name": name, "runs": [str(r) for r in runs], "n": len(evals)}
    for key in (f"avg@{k}", f"pass@{k}", "valid_action_ratio", "response_tokens", "repeated_4gram_ratio"):
        row[key] = _mean_se([e[key] for e in evals])
    if len(evals) == 1 and f"avg@{k}_se" in evals[0]:  # one evaluation (the warm start): SE over the panel's tasks
        row[f"avg@{k}"] = (evals[0][f"avg@{k}"], evals[0][f"avg@{k}_se"])
    if runs:
        metrics = [_metrics(r) for r in runs]
        for key in ("router/match_rate", "sd/distilled_share", "sd/candidate_gain", "sd/teacher_minus_student_logp",
                    "actor/entropy"):
            per_run = [[m[key] for m in ms if key in m and not np.isnan(m[key])] for ms in metrics]
            if all(per_run):  # a key no step logged (GRPO has no teacher) stays out of the row: "-" in the table
                row[key] = _mean_se([np.mean(v) for v in per_run])
        row["train_min"] = _mean_se([sum(m.get("time/step_s", 0.0) + m.get("time/val_s", 0.0) for m in ms) / 60
                                     for ms in metrics])  # each step once (rows a resume redid moved to metrics.after_step_*)
        row["eval_min"] = _mean_se([_eval_seconds(r.parent / "eval" / f"{r.name}.json") / 60 for r in runs])
    return row


def _eval_seconds(path: Path) -> float:
    """The wall time evaluate.py recorded for a run's held-out evaluation."""
    return float(json.loads(path.read_text())["rows"][0]["seconds"])


def _per_task(args: LearnArgs, name: str) -> dict[str, float]:
    """Success of every panel task averaged over its k attempts, from an evaluation's JSON."""
    eps = json.loads((Path(args.out) / "eval" / f"{name}.json").read_text())["rows"][0]["episodes"]
    by_task: dict[str, list[float]] = {}
    for e in eps:
        by_task.setdefault(e["task_id"], []).append(float(e["won"]))
    return {t: float(np.mean(v)) for t, v in by_task.items()}


def _per_task_mean(args: LearnArgs, names: list[str]) -> dict[str, float]:
    """Each panel task's success averaged over its k attempts and over the evaluations `names` (a row's seeds)."""
    per = [_per_task(args, n) for n in names]
    return {t: float(np.mean([p[t] for p in per])) for t in per[0]}


def paired_difference(args: LearnArgs, a: list[str], b: list[str]) -> tuple[float, float]:
    """Avg@k of evaluations `a` minus `b` on the same panel, paired by task: per task, (mean over a's seeds) − (mean
    over b's); mean ± SE over tasks. It carries the panel's sampling noise, which an SE over seeds does not see."""
    pa, pb = _per_task_mean(args, a), _per_task_mean(args, b)
    d = np.asarray([pa[t] - pb[t] for t in sorted(pb)])
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")


def seed_paired_difference(results: dict[str, list], a: str, b: str, k: int) -> dict:
    """Avg@k of row `a` minus row `b`, paired by seed (the seeds both have: a seed fixes the task
    draws and the first step's rollouts); mean ± SE over seeds. Unlike the paired-by-task SE, it
    carries the run-to-run variation of training, the noise that decides whether one algorithm beats
    another."""
    avg = {r: {_run_seed(run): m[f"avg@{k}"] for run, m in results[r]} for r in (a, b)}
    d = [avg[a][s] - avg[b][s] for s in sorted(set(avg[a]) & set(avg[b]))]
    return {"mean_se": _mean_se(d), "seeds": len(d), "per_seed": d}


def paired_gain(args: LearnArgs, runs: list[Path]) -> tuple[float, float]:
    """Avg@k gain of a row's runs over the warm start, paired by task (paired_difference)."""
    return paired_difference(args, [r.name for r in runs], ["warm-start"])


def markdown(rows: list[dict], k: int) -> str:
    cols = [f"avg@{k}", f"pass@{k}", "valid_action_ratio", "response_tokens", "repeated_4gram_ratio",
            "router/match_rate", "sd/distilled_share", "sd/candidate_gain", "sd/teacher_minus_student_logp",
            "actor/entropy", "train_min", "eval_min"]
    labels = {"train_min": "train min", "eval_min": "eval min"}  # per run, with --workers runs at once
    lines = ["| run | seeds | " + " | ".join(labels.get(c, c.split("/")[-1]) for c in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for r in rows:
        cells = [f"{r[c][0]:.3f} ± {r[c][1]:.3f}" if c in r and not np.isnan(r[c][1]) else
                 (f"{r[c][0]:.3f}" if c in r else "-") for c in cols]
        lines.append(f"| {r['name']} | {r['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


SMOOTH = 5  # steps in the training curve's moving average (which tasks a step drew moves the raw curve a lot)


def _band(ax, runs: list[list[tuple[int, float]]], label: str, smooth: int = 1) -> None:
    """Mean ± SE over runs (their common steps), after a trailing moving average of `smooth` points per run."""
    n = min(map(len, runs))
    c = np.asarray([[v for _, v in r[:n]] for r in runs])
    c = np.stack([[row[max(0, i - smooth + 1):i + 1].mean() for i in range(n)] for row in c])
    mean, se = c.mean(0), (c.std(0, ddof=1) / np.sqrt(len(c)) if len(c) > 1 else np.zeros(n))
    steps = [s for s, _ in runs[0][:n]]
    ax.plot(steps, mean, marker="o" if n < 8 else None, label=f"{label} (n={len(c)})")
    ax.fill_between(steps, mean - se, mean + se, alpha=0.2)


def plot(train: dict[str, list], val: dict[str, list], path: Path) -> None:
    """Training success (moving average over SMOOTH steps) and in-loop validation success, mean ± SE over seeds."""
    try:
        import matplotlib
    except ImportError:
        print(f"[learn] matplotlib is not installed: {path} not drawn (pip install matplotlib)", flush=True)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
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


def summarize(args: LearnArgs, before: dict, results: dict[str, list], seconds: float | None, greedy: dict) -> str:
    """Write results.json / results.md / curves.png from what has finished so far (rewritten after every run)."""
    out = Path(args.out)
    rows = [_row("warm start (before RL)", [before], [], args.k)]
    rows += [_row(name, [m for _, m in rs], [r for r, _ in rs], args.k) for name, rs in results.items()]
    gain = None
    if len(results.get("grpo", [])) > 0:  # GRPO's gain over the warm start per seed, then mean ± SE over seeds
        gain = _mean_se([m[f"avg@{args.k}"] - before[f"avg@{args.k}"] for _, m in results["grpo"]])
    table = markdown(rows, args.k)
    paired = {name: paired_gain(args, [r for r, _ in rs]) for name, rs in results.items()}
    names = {row: [r.name for r, _ in rs] for row, rs in results.items()}
    present = [(a, b) for a, b in PAIRS if results.get(a) and results.get(b)]
    differences = {f"{a} − {b}": paired_difference(args, names[a], names[b]) for a, b in present}
    by_seed = {f"{a} − {b}": seed_paired_difference(results, a, b, args.k) for a, b in present}
    summary = {"args": vars(args), "rows": rows, "grpo_gain_avg@k": gain, "paired_gain_avg@k": paired,
               "paired_difference_avg@k": differences, "seed_paired_difference_avg@k": by_seed,
               "wall_s": seconds,
               "warm_start_greedy": {"success": greedy["avg@1"], "se": greedy["avg@1_se"], "games": greedy["tasks"]}}
    if gain:
        table += f"\n\nGRPO gain over the warm start, avg@{args.k}: {gain[0]:+.3f} ± {gain[1]:.3f} (SE over seeds)"
    for name, (g, se) in paired.items():
        table += f"\n{name} gain over the warm start, avg@{args.k}, paired by task: {g:+.3f} ± {se:.3f} (SE over tasks)"
    for name, (g, se) in differences.items():
        table += f"\n{name}, avg@{args.k}, paired by task: {g:+.3f} ± {se:.3f} (SE over tasks)"
    for name, d in by_seed.items():
        (g, se), n = d["mean_se"], d["seeds"]
        table += f"\n{name}, avg@{args.k}, paired by seed: {g:+.3f} ± {se:.3f} (SE over {n} seeds)"
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    (out / "results.md").write_text(table + "\n")
    main_rows = {n: rs for n, rs in results.items() if n.removeprefix(ORACLE) in args.algos}  # λ sweep: table only
    plot({n: [_curve(r) for r, _ in rs] for n, rs in main_rows.items()},
         {n: [_curve(r, "val/success_rate") for r, _ in rs] for n, rs in main_rows.items()}, out / "curves.png")
    return table


def main(args: LearnArgs) -> None:
    t0 = time.perf_counter()
    check_args(args)
    jobs = plan(args)
    if args.report_only:  # the finished runs only; nothing is built, trained or evaluated
        jobs = [j for j in jobs if _finished(args, _run_dir(args, *j))]
        assert all((Path(args.out) / "eval" / f"{n}.json").exists() for n in ("warm-start", "warm-start-greedy")), \
            f"{args.out} has no finished evaluation of the warm start"
    else:
        sha = check_warm_start(args)
        threads = worker_env(args.workers)["OMP_NUM_THREADS"]
        print(f"[learn] warm start {args.model}: weights sha256 {sha[:12]}; {args.workers} runs at once x "
              f"{threads} torch threads on {usable_cores()} cores", flush=True)
    results: dict[str, list] = {}

    def train_and_evaluate(job: tuple) -> tuple[Path, dict]:
        run = _run_dir(args, *job)  # a finished run needs only its metrics and evaluation, not its checkpoints
        if not _finished(args, run):
            _train(args, *job)
        return run, _evaluate(args, str(run / f"step_{args.steps:06d}"), run.name, checkpoint=True)

    table = ""
    with ThreadPoolExecutor(args.workers) as ex:  # FIFO: the warm start's two evaluations first, then the runs
        greedy_job = ex.submit(_evaluate, args, args.model, "warm-start-greedy", False, True)
        before_job = ex.submit(_evaluate, args, args.model, "warm-start", False)
        runs = ex.map(train_and_evaluate, jobs)  # results are gathered in job order, whatever finishes first
        greedy, before = greedy_job.result(), before_job.result()
        print(f"[learn] warm start, greedy: success {greedy['avg@1']:.3f} ± {greedy['avg@1_se']:.3f} (SE over "
              f"{greedy['tasks']} held-out games)", flush=True)
        for (row, seed, lam), (run, metrics) in tqdm(zip(jobs, runs), total=len(jobs), desc="learn: runs"):
            name = row if lam == main_lambda(args, row) else f"{row} λ={lam:g}"
            results.setdefault(name, []).append((run, metrics))
            wall = None if args.report_only else time.perf_counter() - t0  # a report runs nothing: no wall time
            table = summarize(args, before, results, wall, greedy)
    print(table)
    print(f"[learn] wrote {args.out}/results.json, results.md, curves.png in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main(tyro.cli(LearnArgs))
