"""Where a learn-preset training step's time goes: each phase beside its compute floor, measured in the same
run.

Runs `--steps` steps of the project's own training step (`smrc.train_step`, set up by `smrc.setup` on a
`scale.lifecycle.Lifecycle`, from `smrc.py --preset learn` plus the flags below) and, after each step,
times the floor of every model phase on the same model and the same tokens that phase processed:

- generation: the prompt + response tokens of the step's turn-samples through one bare batched forward (no
  grad; `models.collate` / `models.token_logprobs`, packed by `models.micro_batches` at the teacher's
  --teacher.micro-batch-tokens);
- teacher, and its candidate-gain diagnostic (a phase of its own): the prompts + responses it scored,
  likewise;
- update: the update's samples through one forward + backward at --grpo.micro-batch-tokens (x ppo_epochs);
- env: the env workers' own compute (seconds inside reset/step, divided by the workers): what the trainer
  would wait with no overlap and no IPC; the measured env time is what it did wait (below the floor when
  generation hides env time).

The rest of the step has no floor: the rollout's prompts (template, tokenisation, tries), the teacher's
prompts (context, tokenisation) and "other" (references, routing, advantages, archive, logging). Measured
times are those smrc.py logs (time/generate_s, time/env_s, sd/teacher_time_s, sd/candidate_gain_time_s) and
this script's clock around collect_rollouts, teacher_signal, grpo.update and the whole step. Floors are timed
after each step (the weights have moved by one update, the shapes and the cost have not), off the step's
clock.

    python bench/step.py                        # learn preset: tiny-agent, smrc-sd, 4 tasks x 8 rollouts
    python bench/step.py --algo grpo --steps 3 --output runs/step_grpo.json
    python bench/step.py --model tiny --steps 1 --tasks-per-step 1 --group-size 2 --max-steps 2 \\
        --train-games 2 --planner-references    # seconds: the smoke test's settings

Means are over the steps after the first when there are more (the first loads games and warms caches).
Times are wall-clock: on a loaded machine they carry the load, the floors too (the ratios less so).
"""
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import candidate_gain  # noqa: E402
import grpo  # noqa: E402
import rollout  # noqa: E402
import smrc  # noqa: E402
import teacher  # noqa: E402
from environments.pool import EnvPool  # noqa: E402
from models import collate, micro_batches, token_logprobs  # noqa: E402
from scale import distributed  # noqa: E402
from scale.checkpoint import seed_step  # noqa: E402
from scale.lifecycle import Lifecycle  # noqa: E402
from scale.preflight import check_inputs, prepare_output_dir, validate_config  # noqa: E402

PHASES = ("generation", "env", "rollout prompts", "teacher", "candidate gain", "teacher prompts", "update",
          "other")
FLOORED = ("generation", "env", "teacher", "candidate gain", "update")


@dataclass
class StepArgs:
    model: str = "tiny-agent"
    """the policy (the learn preset's tiny-agent; `tiny` = the untrained embedded model, nothing to build)"""
    algo: Literal["grpo", "fullpath-sd", "smrc-sd", "skill-sd", "sdar", "grpo-opsd"] = "smrc-sd"
    """training algorithm (smrc.py --algo)"""
    steps: int = 3
    """training steps timed (the first is left out of the means when there are more)"""
    tasks_per_step: int = 4
    """task groups per step (learn preset: 4)"""
    group_size: int = 8
    """rollouts per task (learn preset: 8)"""
    max_steps: int = 20
    """episode step limit (learn preset: 20)"""
    train_games: int = 320
    """training games the tasks are drawn from (learn preset: 320; generated on first use)"""
    planner_references: bool = False
    """add the planner's solution of each task to the reference bank (--router.seed-with-planner): gives
    a policy that never wins (`tiny`) turns to distil; the learn preset uses the policy's own successes"""
    threads: int = 1
    """torch threads in this process (1 = one worker of `bench/learn.py --workers 2` on 2 cores; 0 =
    torch's default)"""
    floor_repeats: int = 2
    """timings of each floor, the least kept (a floor is the least the machine needs; a busy machine
    inflates one timing)"""
    seed: int = 0
    """seed of the run (task draw, sampling)"""
    output: str = ""
    """also write every number (per step and the means) to this JSON file"""


def smrc_argv(args: StepArgs, out: Path) -> list[str]:
    """The smrc.py flags of the benchmarked run: the learn preset, no checkpoint, no validation."""
    argv = ["--preset", "learn", "--model", args.model, "--algo", args.algo, "--seed", str(args.seed),
            "--steps", str(10**6), "--save-every", str(10**6), "--output-dir", str(out),
            "--rollout.tasks-per-step", str(args.tasks_per_step),
            "--rollout.group-size", str(args.group_size), "--alfworld.max-steps", str(args.max_steps),
            "--alfworld.num-train-games", str(args.train_games)]
    return argv + (["--router.seed-with-planner"] if args.planner_references else [])


class Recorder:
    """What one step's phases processed and how long they took, by wrapping the project's phase functions
    where smrc.train_step looks them up (the real functions run unchanged)."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.turns, self.samples, self.counters, self.label = [], [], {}, "teacher"
        self.scored = {"teacher": ([], []), "candidate gain": ([], [])}  # (prompts, responses) per pass
        self.wall = {"rollout": 0.0, "teacher_signal": 0.0, "update": 0.0}

    def _timed(self, name: str, fn, keep):
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                out = fn(*a, **kw)
            finally:
                self.wall[name] += time.perf_counter() - t0
            keep(a, kw, out)
            return out
        return run

    def _scorer(self, make):
        def make_recording(*a, **kw):
            score = make(*a, **kw)

            def scorer(prompts, responses, allowed=None):
                self.scored[self.label][0].extend(prompts)
                self.scored[self.label][1].extend(responses)
                return score(prompts, responses, allowed)
            return scorer
        return make_recording

    def _labelled(self, fn, label: str):
        def run(*a, **kw):
            self.label = label
            try:
                return fn(*a, **kw)
            finally:
                self.label = "teacher"
        return run

    def _keep_rollout(self, a, kw, out) -> None:
        self.turns += [t for e in out[0] for t in e.turns]
        self.counters = dict(out[1])

    def _keep_samples(self, a, kw, out) -> None:
        self.samples += list(kw["samples"] if "samples" in kw else a[2])

    @contextlib.contextmanager
    def patched(self):
        """Install the wrappers for the duration of the block."""
        new = [(rollout, "collect_rollouts", lambda f: self._timed("rollout", f, self._keep_rollout)),
               (teacher, "teacher_signal", lambda f: self._timed("teacher_signal", f, lambda *_: None)),
               (candidate_gain, "measure", lambda f: self._labelled(f, "candidate gain")),
               (smrc, "teacher_logprob_fn", self._scorer),
               (grpo, "update", lambda f: self._timed("update", f, self._keep_samples))]
        saved = [(mod, name, getattr(mod, name)) for mod, name, _ in new]
        for (mod, name, wrap), (_, _, fn) in zip(new, saved):
            setattr(mod, name, wrap(fn))
        try:
            yield self
        finally:
            for mod, name, fn in saved:
                setattr(mod, name, fn)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_floor(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int, budget: int,
                  temperature: float, backward: bool = False, bf16: bool = True) -> float:
    """Seconds of one bare batched pass over (prompt + response) pairs: the response tokens' log-probs
    (token_logprobs, no mask, no entropy) in micro-batches of `budget` padded tokens; with `backward`,
    forward + backward of their sum (the gradients are dropped after, nothing is stepped). 0 when there is
    nothing to pass."""
    if not prompts:
        return 0.0
    device = next(model.parameters()).device
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and device.type == "cuda" else \
        contextlib.nullcontext()
    was_training = model.training
    model.train(backward)
    _sync(device)
    t0 = time.perf_counter()
    for idx in micro_batches([len(p) + len(r) for p, r in zip(prompts, responses)], budget):
        batch = collate([prompts[i] for i in idx], [responses[i] for i in idx], pad_id).to(device)
        with torch.set_grad_enabled(backward), autocast:
            logp, _ = token_logprobs(model, batch, temperature)
        if backward:
            logp.sum().backward()
    _sync(device)
    seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return seconds


def _tokens(prompts: list[list[int]], responses: list[list[int]]) -> int:
    return sum(len(p) + len(r) for p, r in zip(prompts, responses))


def measure_floors(cfg, s: smrc.Setup, rec: Recorder, repeats: int = 1) -> dict:
    """The floor seconds (the least of `repeats` timings) and tokens of each model phase of the step `rec`
    recorded."""
    pad, temp, bf16 = s.tokenizer.pad_token_id, cfg.rollout.sampling.temperature, cfg.grpo.bf16

    def floor(p, r, budget, backward=False):
        return min(forward_floor(s.model, p, r, pad, budget, temp, backward, bf16)
                   for _ in range(max(1, repeats)))
    turns = ([t.prompt_ids for t in rec.turns], [t.response_ids for t in rec.turns])
    passes = {"generation": turns, **rec.scored}
    out = {name: {"floor_s": floor(p, r, cfg.teacher.micro_batch_tokens), "tokens": _tokens(p, r)}
           for name, (p, r) in passes.items()}
    p, r = [x.prompt_ids for x in rec.samples], [x.response_ids for x in rec.samples]
    epochs = cfg.grpo.ppo_epochs  # the update passes its samples once per epoch
    out["update"] = {"floor_s": epochs * floor(p, r, cfg.grpo.micro_batch_tokens, backward=True),
                     "tokens": epochs * _tokens(p, r)}
    return out


def step_record(row: dict, rec: Recorder, floors: dict, env: dict, step_s: float) -> dict:
    """One step's phases: measured seconds, floor seconds (None: no floor), tokens; the rest of the step is
    'other'."""
    gen, env_s = rec.counters["gen_s"], rec.counters["env_s"]
    teacher_s, cand_s = row.get("sd/teacher_time_s", 0.0), row.get("sd/candidate_gain_time_s", 0.0)
    seconds = {"generation": gen, "env": env_s, "rollout prompts": rec.wall["rollout"] - gen - env_s,
               "teacher": teacher_s, "candidate gain": cand_s,
               "teacher prompts": rec.wall["teacher_signal"] - teacher_s,
               "update": rec.wall["update"]}
    seconds["other"] = step_s - sum(seconds.values())
    floors = {**floors, "env": {"floor_s": env["worker_s"] / max(1, env["workers"]), "tokens": None}}
    phases = {name: {"seconds": seconds[name], "floor_s": floors.get(name, {}).get("floor_s"),
                     "tokens": floors.get(name, {}).get("tokens")} for name in PHASES}
    n = max(1, len(rec.turns))
    logged = ("time/step_s", "time/generate_s", "time/env_s", "time/update_s", "sd/teacher_time_s",
              "sd/candidate_gain_time_s", "sd/distilled_turns", "rollout/success_rate")
    return {"step": row["step"], "step_s": step_s, "phases": phases, "turn_samples": len(rec.turns),
            "mean_prompt_tokens": sum(len(t.prompt_ids) for t in rec.turns) / n,
            "mean_response_tokens": sum(len(t.response_ids) for t in rec.turns) / n,
            "env_calls": env["calls"], "env_workers": env["workers"],
            "logged": {k: row[k] for k in logged if k in row}}


def run_steps(args: StepArgs, out: Path) -> list[dict]:
    """The benchmarked run: smrc.py's own set-up and training step, each step followed by its floors."""
    cfg = smrc.parse_config(smrc_argv(args, out))
    validate_config(cfg)
    tasks = check_inputs(cfg)
    world = distributed.init_distributed(cfg.device)
    prepare_output_dir(out, fresh=True)
    seed_step(cfg.seed, 0, world.rank)
    # first: the workers fork before any model exists (as in smrc.main)
    pool = EnvPool(cfg.env_cfg, episodes=cfg.rollout.tasks_per_step * cfg.rollout.group_size)
    records, s, rec = [], None, Recorder()
    try:
        life = Lifecycle(cfg, world, pool, tasks, ckpt=None)  # a fresh run in a temporary folder
        s = smrc.setup(cfg, life)
        for step in range(args.steps):
            rec.clear()
            before = (pool.stats["worker_s"], pool.stats["resets"] + pool.stats["steps"])
            with rec.patched():
                t0 = time.perf_counter()
                smrc.train_step(cfg, life, s, step)
                step_s = time.perf_counter() - t0
            env = {"worker_s": pool.stats["worker_s"] - before[0], "workers": pool.num_workers,
                   "calls": pool.stats["resets"] + pool.stats["steps"] - before[1]}
            row = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
            floors = measure_floors(cfg, s, rec, args.floor_repeats)
            records.append(step_record(row, rec, floors, env, step_s))
    finally:
        if s is not None and s.replay_env is not None:
            s.replay_env.close()
        if s is not None:
            getattr(s.engine, "shutdown", lambda: None)()
        pool.close()
        distributed.close(world)
    return records


def summarise(records: list[dict]) -> dict:
    """Means over the timed steps (all but the first when there are more): seconds, floor, ratio and tokens
    per phase."""
    timed = records[1:] if len(records) > 1 else records

    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None
    phases = {}
    for name in PHASES:
        cells = [r["phases"][name] for r in timed]
        sec, floor, tok = (mean([c[k] for c in cells]) for k in ("seconds", "floor_s", "tokens"))
        phases[name] = {"seconds": sec, "floor_s": floor, "tokens": tok,
                        "ratio": sec / floor if floor else None}
    keys = ("step_s", "turn_samples", "mean_prompt_tokens", "mean_response_tokens", "env_calls")
    return {"steps_timed": [r["step"] for r in timed], "phases": phases,
            **{k: mean([r[k] for r in timed]) for k in keys}, "env_workers": timed[-1]["env_workers"]}


def table(summary: dict) -> str:
    """phase | seconds | floor seconds | ratio | tokens, then the step."""
    def cell(v, fmt):
        return "-" if v is None else format(v, fmt)
    lines = [f"{'phase':<16}{'seconds':>10}{'floor s':>10}{'ratio':>9}{'tokens':>11}"]
    for name, p in summary["phases"].items():
        lines.append(f"{name:<16}{p['seconds']:10.2f}{cell(p['floor_s'], '10.3f'):>10}"
                     f"{cell(p['ratio'], '9.1f'):>9}{cell(p['tokens'], '11,.0f'):>11}")
    lines.append(f"{'step':<16}{summary['step_s']:10.2f}")
    return "\n".join(lines)


def main(args: StepArgs) -> dict:
    if args.steps < 1:
        raise SystemExit("error: --steps must be >= 1")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench_step_") as tmp:
        records = run_steps(args, Path(tmp) / "run")
    summary = summarise(records)
    print(f"\n{args.model}, {args.algo}, learn preset: {args.tasks_per_step} tasks x {args.group_size} "
          f"rollouts, <= {args.max_steps} turns | {torch.get_num_threads()} torch threads, "
          f"{summary['env_workers']} env workers | means over steps {summary['steps_timed']}: "
          f"{summary['turn_samples']:.0f} turn-samples of {summary['mean_prompt_tokens']:.0f} prompt + "
          f"{summary['mean_response_tokens']:.1f} response tokens, {summary['env_calls']:.0f} env calls")
    print(table(summary))
    print("floors: generation, teacher, candidate gain = one no-grad forward of the same tokens; update = "
          "forward + backward;\nenv = the env workers' own compute / workers (no overlap, no IPC). "
          "'-': no floor")
    result = {"args": dataclasses.asdict(args), "threads": torch.get_num_threads(), "summary": summary,
              "steps": records}
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(tyro.cli(StepArgs, description=__doc__))
