"""The CPU mini-reproduction: does RL improve the embedded agent, and how do GRPO, FullPath-SD and
SMRC-SD compare?

    python bench/learn.py     # GRPO, FullPath-SD, SMRC-SD, their oracle-teacher rows: 5 seeds, 30 steps each,
                              # eval on 200 held-out games, k=4
    python bench/learn.py --rows smrc-sd-lam0.03 oracle-smrc-sd-a0.99-lam0.2   # any rows: λ and α in the name
    python bench/learn.py --rows grpo fullpath-sd smrc-sd skill-sd sdar          # the paper's five rows
    python bench/learn.py --steps 2 --eval-games 2 --train-games 6 --out /tmp/learn  # smoke test

A row is named as its run folders are, `[oracle-]ALGO[-aα][-lamλ]`:
- ALGO is one of smrc.ALGOS; λ is its --grpo.sd-coef, and a row without one runs at the λ `config.resolve`
  gives the learn preset (0.2 for the reverse-KL forms; the skill-text forms at their anchors' λ, which live
  on other scales);
- `oracle-` rows replace the model teacher with a perfect reader of the candidate, `--teacher.oracle α`: the
  teacher (1−α)·π_student + α·δ_candidate. So "routing helps" and "the tiny model reads its reference well
  enough" are separate answers, and α sets how sharp the teacher is while λ sets how hard it pushes.
Every row runs at every seed of --seeds, seed-major (an interrupted sweep has its rows at equal seed counts).

Every run is the project's own trainer, `smrc.py --preset learn --algo A --seed S` (tiny-agent on small
generated games, admissible action space, references = the policy's own successes), in its own folder; every
evaluation is the project's own `evaluate.py eval` of the run's final checkpoint on the same held-out panel;
the warm start itself is evaluated once as the "before" row. All runs of one row differ only in the seed;
no algorithm gets its own tuning.

Resumable: a run is started with `--resume` (it continues from its latest checkpoint), and a finished
evaluation (its JSON exists) is not repeated, so an interrupted sweep picks up where it stopped. A finished
run needs only its `metrics.jsonl` and its evaluation's JSON, so a sweep can be continued on another machine
from those small files and the warm start (a run left unfinished on the first machine starts again from step
0 unless its whole folder, checkpoints included, is copied too). bench/results/learn_sweep_v21/ holds issue
36's table and its warm start's weights: pass that folder's warm_start/ as --model, and its evaluations of
the warm start are reused rather than repeated. OUT/warm_start.json pins the warm start's weights (sha256),
and a sweep with another build of it is refused.
Writes OUT/results.json (every number), OUT/results.md (the table: each row's Avg@k, Pass@k, gain over the
warm start, SD strength (the SD / GRPO gradient-norm ratio, the KL per distilled turn, the share
of candidate turns whose sampled action is the candidate), and the differences against GRPO and of
SMRC − FullPath at equal (λ, α), paired by task (the SE carries the panel's sampling noise) and by seed
(the run-to-run noise of training)) and OUT/curves.png (training success, a moving average, and the in-loop
validation success on fixed games, mean ± SE over seeds) and OUT/strength.png (the dose-response: each SD
row's difference from GRPO, paired by seed, against its SD / GRPO gradient share).
"""
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import tyro
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from config import ALGOS, learn_preset, resolve as resolve_config  # noqa: E402
from analysis import archives  # noqa: E402
from bench.learn_report import readme_table, summarize  # noqa: E402
from embedded.warmstart import resolve  # noqa: E402
from scale.preflight import check_rules, int_at_least  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


ORACLE = "oracle-"  # a row name's prefix: the algorithm with the oracle teacher (--teacher.oracle α),
                    # no model teacher
ROW_NAME = re.compile(r"(?P<oracle>oracle-)?(?P<algo>[a-z-]+?)(?:-a(?P<alpha>[^-]+))?(?:-lam(?P<lam>[^-]+))?")


@dataclass(frozen=True)
class Row:
    """One row of the table: an algorithm, its λ (0 for GRPO) and the oracle teacher's α (0: the model
    teacher)."""
    algo: str
    sd_coef: float
    oracle: float = 0.0

    @property
    def name(self) -> str:
        """The row's name, and its run folders' prefix (NAME-seedS): grpo, smrc-sd-lam0.2,
        oracle-smrc-sd-a0.99-lam0.2."""
        if self.algo == "grpo":
            return "grpo"
        return ((f"{ORACLE}{self.algo}-a{self.oracle:g}" if self.oracle else self.algo)
                + f"-lam{self.sd_coef:g}")


def row_lambda(algo: str, sd_coef: float | None = None) -> float:
    """λ of `algo` under the learn preset, as the trainer resolves it (config.resolve): `sd_coef` if given."""
    cfg = learn_preset()
    cfg.algo, cfg.grpo.sd_coef = algo, sd_coef
    return resolve_config(cfg).grpo.sd_coef


def parse_row(spec: str) -> Row:
    """A row from its name, `[oracle-]ALGO[-aα][-lamλ]` (module docstring);
    one `error:` line if it is not one."""
    m = ROW_NAME.fullmatch(spec)
    with_candidate = [a for a in ALGOS if ALGOS[a][0] not in ("none", "every-turn")]  # what an oracle needs
    problem = None
    if m is None or m["algo"] not in ALGOS:
        problem = "ALGO is one of " + ", ".join(ALGOS)
    elif m["oracle"] and (m["algo"] not in with_candidate or m["alpha"] is None):
        problem = ("an oracle row names an algorithm with a candidate (" + ", ".join(with_candidate)
                   + ") and its α")
    elif m["alpha"] and not m["oracle"]:
        problem = "-aα belongs to oracle- rows only"
    elif m["algo"] == "grpo" and m["lam"]:
        problem = "grpo has no SD term, so no λ"
    else:
        try:
            alpha, lam = float(m["alpha"] or 0), float(m["lam"]) if m["lam"] else None
        except ValueError:
            alpha, lam = math.nan, math.nan
        if m["oracle"] and not 0 < alpha <= 1:
            problem = "α is a number in (0, 1]"
        elif lam is not None and not (math.isfinite(lam) and lam > 0):
            problem = "λ is a finite number > 0"
    if problem:
        raise SystemExit(f"error: --rows {spec} is not a row: [oracle-]ALGO[-aα][-lamλ]; {problem}")
    return Row(m["algo"], 0.0 if m["algo"] == "grpo" else row_lambda(m["algo"], lam), alpha)


def pairs(rows: list[Row]) -> list[tuple[Row, Row]]:
    """The differences a table reports: every row against GRPO, and SMRC-SD against FullPath-SD at the same
    (λ, α): the same teacher, not the same strength (FullPath-SD distils more turns, so at one λ it pushes
    harder; its SD / GRPO gradient share says how much: --compare names a pair at equal strength)."""
    out = [(r, g) for g in rows if g.algo == "grpo" for r in rows if r.algo != "grpo"]
    return out + [(r, f) for r in rows if r.algo == "smrc-sd" for f in rows
                  if f.algo == "fullpath-sd" and (f.sd_coef, f.oracle) == (r.sd_coef, r.oracle)]


@dataclass
class LearnArgs:
    rows: tuple[str, ...] = ("grpo", "fullpath-sd", "smrc-sd", "oracle-fullpath-sd-a0.5",
                             "oracle-smrc-sd-a0.5")
    """the table's rows, each named `[oracle-]ALGO[-aα][-lamλ]` (module docstring), all from the same warm
    start and budget"""
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    """seeds of every row"""
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
    train_games: int = 320
    """training games (the warm start's games)"""
    eval_games: int = 200
    """held-out evaluation games: the learn preset's 200-game panel, or a type-stratified subset of it
    (evaluate.py --limit, the same subset for every row)"""
    k: int = 4
    """sampled attempts per evaluation game (Avg@k, Pass@k)"""
    eval_every: int = 10
    """in-loop validation every N steps (smrc.py --eval-every; 0: none): a curve on fixed games, free of which
    tasks a step drew"""
    val_games: int = 48
    """games of the in-loop validation panel (smrc.py --eval-tasks)"""
    compare: tuple[str, ...] = ()
    """more differences to report, each `A:B` (row A − row B, paired by seed and by task; both in --rows),
    e.g. routing at equal strength: oracle-smrc-sd-a0.5-lam0.2:oracle-fullpath-sd-a0.5-lam0.1"""
    out: str = "runs/learn"
    """where runs, evaluations and the results go"""
    report_only: bool = False
    """rewrite results.json / results.md / curves.png / strength.png from the runs of OUT that have finished;
    start nothing"""
    workers: int = 2
    """runs (training + evaluation) in flight at once; each child gets max(1, cores // workers) torch
    threads (`worker_env`; on 2 cores, 2 one-thread runs beat one two-thread run: tiny matrices use a
    second thread poorly, and env workers overlap)"""


def check_args(args: LearnArgs) -> list[Row]:
    """The sweep's rows, or one `error:` line for a bad flag before anything is built, trained or evaluated
    (the trainer's own checks would come only after the warm start's minutes-long build)."""
    rows = [parse_row(r) for r in args.rows]
    if not rows or len({r.name for r in rows}) < len(rows):
        raise SystemExit(f"error: --rows {' '.join(args.rows) or '(none)'} is not allowed; "
                         "allowed: one or more distinct rows")
    if any(s < 0 for s in args.seeds) or len(set(args.seeds)) < len(args.seeds) or not args.seeds:
        raise SystemExit(f"error: --seeds {' '.join(map(str, args.seeds)) or '(none)'} is not allowed; "
                         "allowed: one or more distinct integers >= 0")
    names = {r.name for r in rows}
    for spec in args.compare:
        if len(spec.split(":")) != 2 or not set(spec.split(":")) <= names or len(set(spec.split(":"))) < 2:
            raise SystemExit(f"error: --compare {spec} is not allowed; allowed: A:B, two different rows of "
                             "--rows")
    check_rules(args, [(name, int_at_least(low)) for name, low in (
        ("steps", 1), ("save_every", 1), ("tasks_per_step", 1), ("group_size", 2), ("train_games", 1),
        ("eval_games", 1), ("k", 1), ("eval_every", 0), ("val_games", 1), ("workers", 1))])
    return rows


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
        rc = subprocess.run([sys.executable, *cmd], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            env=env).returncode
    if rc != 0:
        tail = log.read_text().splitlines()[-20:]
        raise SystemExit(f"error: {' '.join(cmd[:3])} ... failed (exit {rc}); {log}:\n" + "\n".join(tail))


def plan(args: LearnArgs, rows: list[Row]) -> list[tuple[Row, int]]:
    """(row, seed) of every run, seed-major: an interrupted sweep has every row at the same number of
    seeds."""
    return [(row, s) for s in args.seeds for row in rows]


def _run_dir(args: LearnArgs, row: Row, seed: int) -> Path:
    return Path(args.out) / f"{row.name}-seed{seed}"


def _train(args: LearnArgs, row: Row, seed: int) -> Path:
    run = _run_dir(args, row, seed)
    final = run / f"step_{args.steps:06d}"
    if not (final / "config.json").exists():
        run.mkdir(parents=True, exist_ok=True)
        oracle = ["--teacher.oracle", f"{row.oracle:g}"] if row.oracle else []
        val = (["--eval-every", str(args.eval_every), "--eval-tasks", str(args.val_games)]
               if args.eval_every else [])
        _run(args, ["smrc.py", "--preset", "learn", "--algo", row.algo, *oracle, *val, "--seed", str(seed),
                    "--steps", str(args.steps), "--save-every", str(min(args.save_every, args.steps)),
                    "--output-dir", str(run), "--grpo.sd-coef", f"{row.sd_coef:g}", "--model", args.model,
                    "--rollout.tasks-per-step", str(args.tasks_per_step),
                    "--rollout.group-size", str(args.group_size),
                    "--alfworld.num-train-games", str(args.train_games), "--resume"], run / "train.log")
    return run


def _finished(args: LearnArgs, run: Path) -> bool:
    """A run's metrics and evaluation are there (on disk, or in its record's archive: archives.py)."""
    evaluation = Path(args.out) / "eval" / f"{run.name}.json"
    return archives.exists(run / "metrics.jsonl") and archives.exists(evaluation)


def check_warm_start(args: LearnArgs) -> str:
    """Build the warm start here (all cores, before the pool) and pin OUT to it: the sha256 of its weights is
    written to OUT/warm_start.json by the first sweep, and a later sweep into the same OUT with other weights
    (another build) is refused, so runs of two warm starts never share a table."""
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


def reuse_warm_start_evaluations(args: LearnArgs, sha: str) -> list[str]:
    """Copy a record's evaluations of this very warm start into OUT/eval instead of repeating them (two
    evaluations, ~30 min on 2 cores). A sweep record (learn_sweep_v21) keeps its warm start as
    RECORD/warm_start/, pinned by RECORD/warm_start.json, and its evaluations as
    RECORD/eval/warm-start[-greedy].json (packed in the record's archive: analysis/archives.py); one is taken
    only for the same weights (sha256), the same number of games and the same k."""
    record, out = Path(args.model).parent, Path(args.out) / "eval"
    pin = record / "warm_start.json"
    if not pin.exists() or json.loads(pin.read_text()).get("sha256") != sha:
        return []
    taken = []
    for name, k in (("warm-start", args.k), ("warm-start-greedy", 1)):
        src = record / "eval" / f"{name}.json"
        if archives.exists(out / f"{name}.json") or not archives.exists(src):  # OUT may be the record itself
            continue
        done = json.loads(archives.read_text(src))
        if done["k"] == k and len(done["tasks"]) == args.eval_games:
            out.mkdir(parents=True, exist_ok=True)
            for suffix in (".json", ".md"):
                (out / (name + suffix)).write_bytes(archives.read_bytes(src.with_name(name + suffix)))
            taken.append(str(src))
    return taken


def _evaluate(args: LearnArgs, model: str, name: str, checkpoint: bool, greedy: bool = False) -> dict:
    out = str(Path(args.out) / "eval" / name)  # evaluate.py writes OUT.json / OUT.md
                                               # (a name may hold dots: lam0.3)
    if not archives.exists(out + ".json"):
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        which = ["--checkpoint", model] if checkpoint else ["--baseline", model, "--preset", "learn"]
        sampling = ["--k", "1", "--temperature", "0"] if greedy else ["--k", str(args.k)]
        _run(args, ["evaluate.py", "eval", *which, "--split", "eval", *sampling, "--output", out,
                    "--tasks-per-batch", "32", "--limit", str(args.eval_games)], Path(out + ".log"))
    return json.loads(archives.read_text(out + ".json"))["rows"][0]["metrics"]


def main(args: LearnArgs) -> None:
    t0 = time.perf_counter()
    rows = check_args(args)
    jobs = plan(args, rows)
    if args.report_only:  # the finished runs only; nothing is built, trained or evaluated
        jobs = [j for j in jobs if _finished(args, _run_dir(args, *j))]
        assert all(archives.exists(Path(args.out) / "eval" / f"{n}.json")
                   for n in ("warm-start", "warm-start-greedy")), \
            f"{args.out} has no finished evaluation of the warm start"
    else:
        sha = check_warm_start(args)
        for src in reuse_warm_start_evaluations(args, sha):
            print(f"[learn] the warm start's evaluation is {src}'s (same weights, games and k)", flush=True)
        threads = worker_env(args.workers)["OMP_NUM_THREADS"]
        print(f"[learn] warm start {args.model}: weights sha256 {sha[:12]}; {args.workers} runs at once x "
              f"{threads} torch threads on {usable_cores()} cores", flush=True)
    results: dict[str, list] = {}
    differences = [(a.name, b.name) for a, b in pairs(rows)] + [tuple(c.split(":")) for c in args.compare]

    def train_and_evaluate(job: tuple) -> tuple[Path, dict]:
        run = _run_dir(args, *job)  # a finished run needs only its metrics and evaluation,
                                    # not its checkpoints
        if not _finished(args, run):
            _train(args, *job)
        return run, _evaluate(args, str(run / f"step_{args.steps:06d}"), run.name, checkpoint=True)

    table = ""
    with ThreadPoolExecutor(args.workers) as ex:  # FIFO: the warm start's two evaluations first,
                                                  # then the runs
        greedy_job = ex.submit(_evaluate, args, args.model, "warm-start-greedy", False, True)
        before_job = ex.submit(_evaluate, args, args.model, "warm-start", False)
        runs = ex.map(train_and_evaluate, jobs)  # results are gathered in job order, whatever finishes first
        greedy, before = greedy_job.result(), before_job.result()
        print(f"[learn] warm start, greedy: success {greedy['avg@1']:.3f} ± {greedy['avg@1_se']:.3f} "
              f"(SE over {greedy['tasks']} held-out games)", flush=True)
        done = tqdm(zip(jobs, runs), total=len(jobs), desc="learn: runs")
        for i, ((row, _), (run, metrics)) in enumerate(done):
            results.setdefault(row.name, []).append((run, metrics))
            if args.report_only and i + 1 < len(jobs):  # a report writes once, from all the finished runs
                continue
            wall = None if args.report_only else time.perf_counter() - t0  # a report runs nothing:
                                                                           # no wall time
            table = summarize(Path(args.out), args.k, differences, vars(args), before, results, wall, greedy)
    print(table)
    if table:  # the README's form of the table (bench.learn_report.readme_table)
        print("\n" + readme_table(json.loads(archives.read_text(Path(args.out) / "results.json"))))
    print(f"[learn] wrote {args.out}/results.json, results.md, curves.png, strength.png "
          f"in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main(tyro.cli(LearnArgs))
