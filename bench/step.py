"""Where a training step's time, model passes and memory go, for one or more algorithms in one run.

Runs the project's own step (`smrc.train_step` on a `scale.lifecycle.Lifecycle`) `--steps` times per algorithm
and prints per phase the means over the steps after the first (which loads games and warms caches):
- seconds: generation, env (waited on the workers), rollout prompts (template, tokenisation), teacher, its
  candidate-gain diagnostic, teacher prompts, update (of it the reference model's KL forward) and "other"
  (references, routing, advantages, archive, logging): smrc.py's logged times and this script's clock;
- floor (`--floor-repeats` > 0): one bare batched forward of the same tokens, timed after the step (update:
  forward + backward, x ppo_epochs; env: the workers' own compute / workers, no overlap, no IPC);
- passes per trained token: forward / backward tokens of each phase (model hooks) over the prompt + response
  tokens the update trains on (generation: each prompt once, each sampled token but the last; gradient
  checkpointing recomputes each layer once, printed as `recompute`);
- peak memory per phase (mem/*) beside the plan (scale/memory_plan.py); the step-time ratio of each
  algorithm to the first; distilled turns, teacher tokens, match rate.

The model is `--model` (a name or folder, as smrc.py loads it) or `--arch`, a random model of a public
architecture over the tiny tokenizer's ids, built in memory (no download). The settings are smrc.py's flags
after `--`, over the learn preset (`--model`) or REAL_SIZE (`--arch`: real-size generated rooms, every train
game every step, the planner's solutions as references: a random policy never wins).

    python bench/step.py                                   # tiny-agent, learn preset, GRPO and SMRC-SD (CPU)
    python bench/step.py --algos grpo fullpath-sd smrc-sd --steps 6 -- --preset tiny   # what SD costs
    python bench/step.py --arch qwen3-1.7b                 # GPU, offline: 4 tasks x 4 rollouts, 5 turns
    python bench/step.py --arch tiny --device cpu --steps 2 -- --rollout.tasks-per-step 2 \\
        --rollout.group-size 2 --alfworld.num-train-games 2 --alfworld.max-steps 2 --alfworld.room-size small

Times are wall-clock: on a loaded machine they carry the load, the floors too (the ratios less so). On an
offline GPU node, `../shared/tools/gpu_site.sh` packs the pure-Python packages it needs into .gpu-site/.
"""
import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpo  # noqa: E402
import rollout  # noqa: E402
import smrc  # noqa: E402
import teacher  # noqa: E402
from embedded import tiny  # noqa: E402
from environments.pool import EnvPool  # noqa: E402
from measure import candidate_gain  # noqa: E402
from models import micro_batches, score  # noqa: E402
from scale import distributed, memory_plan, preflight  # noqa: E402
from scale.lifecycle import Lifecycle  # noqa: E402
from scale.memory import peak_bytes, reset_peak  # noqa: E402
from scale.preflight import check_inputs, prepare_output_dir, validate_config  # noqa: E402
from scale.seeds import seed_step  # noqa: E402

ROPE = {"rope_type": "default", "rope_theta": 1e6}
ARCHS = {"qwen3-1.7b": "Qwen/Qwen3-1.7B", "qwen2.5-3b": "Qwen/Qwen2.5-3B-Instruct", "tiny": None}
"""each architecture's public config.json values (scale.memory_plan.PUBLIC); tiny: embedded/tiny.py's"""
REAL_SIZE = ["--env", "alfworld", "--alfworld.source", "generated", "--alfworld.room-size", "real",
             "--alfworld.num-train-games", "4", "--alfworld.num-eval-games", "1", "--alfworld.max-steps", "5",
             "--alfworld.no-require-think", "--rollout.tasks-per-step", "4", "--rollout.group-size", "4",
             "--rollout.sampling.max-new-tokens", "192", "--rollout.max-prompt-tokens", "4096",
             "--rollout.gen-batch-size", "64", "--grpo.micro-batch-tokens", "16384",
             "--teacher.micro-batch-tokens", "16384", "--archive-max-turns", "0",
             "--router.seed-with-planner"]
PHASES = ("generation", "env", "rollout prompts", "teacher", "candidate gain", "teacher prompts", "update",
          "reference KL", "other")
PASSED = ("generation", "teacher", "candidate gain", "reference KL", "update")  # phases with model passes
LABELS = ((rollout, "collect_rollouts", "generation"), (teacher, "teacher_signal", "teacher"),
          (candidate_gain, "measure", "candidate gain"), (grpo, "update", "update"))


def build_model(arch: str, tok, device: torch.device, seed: int):
    """A randomly initialised model of `arch` in float32 (the trainer's master weights), built on `device`."""
    if arch == "tiny":
        return tiny.new_model(tok, layers=2, hidden=128, seed=seed).to(device)
    torch.manual_seed(seed)
    with device:
        config = AutoConfig.for_model(**memory_plan.PUBLIC[ARCHS[arch]], rope_parameters=ROPE,
                                      bos_token_id=None, eos_token_id=tok.eos_token_id,
                                      pad_token_id=tok.pad_token_id)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    (model.generation_config.eos_token_id,
     model.generation_config.pad_token_id) = tok.eos_token_id, tok.pad_token_id
    return model


class Recorder:
    """One step's phases, by wrapping the project's phase functions where smrc.train_step looks them up (the
    real functions run unchanged) and hooking the models: the seconds inside each, the tokens its model
    passes processed (forward / backward), and what it processed (for the floors)."""

    def __init__(self, device: torch.device):
        self.device, self.label, self.active = device, "other", False  # active: inside `patched`
        self.clear()

    def clear(self) -> None:
        self.wall = dict.fromkeys(PHASES, 0.0)
        self.fwd, self.bwd = dict.fromkeys(PHASES, 0), dict.fromkeys(PHASES, 0)
        self.turns, self.counters, self._t0 = [], {}, 0.0
        self.scored = {"teacher": ([], []), "candidate gain": ([], [])}  # (prompts, responses) per pass

    def count(self, phase: str | None):
        def hook(module, args, kwargs):
            if not self.active:  # the floors' passes, timed after the step
                return
            ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
            # a device tensor, read after the step: a .item() here would sync every decode step
            real = mask[:, -ids.shape[1]:].sum() if mask is not None and mask.dim() == 2 else ids.numel()
            self.fwd[phase or self.label] += real
            self.bwd[phase or self.label] += real if torch.is_grad_enabled() else 0
        return hook

    def hook(self, model, ref_model) -> list:
        """Count the policy's passes under the running phase, the reference's as 'reference KL' (timed)."""
        hooks = [model.register_forward_pre_hook(self.count(None), with_kwargs=True)]
        if ref_model is not None:
            def start(*_):
                _sync(self.device)
                self._t0 = time.perf_counter()

            def end(*_):
                _sync(self.device)
                self.wall["reference KL"] += time.perf_counter() - self._t0
            hooks += [ref_model.register_forward_pre_hook(self.count("reference KL"), with_kwargs=True),
                      ref_model.register_forward_pre_hook(start), ref_model.register_forward_hook(end)]
        return hooks

    def _labelled(self, fn, label: str):
        def run(*a, **kw):
            self.label, t0 = label, time.perf_counter()
            try:
                out = fn(*a, **kw)
            finally:
                self.wall[label] += time.perf_counter() - t0
                self.label = "other"
            if label == "generation":  # the step's turns: what the teacher scores and the update trains on
                self.turns += [t for e in out[0] for t in e.turns]
                self.counters = dict(out[1])
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

    @contextlib.contextmanager
    def patched(self):
        """Install the wrappers for the duration of the block."""
        new = [(mod, name, lambda f, label=label: self._labelled(f, label)) for mod, name, label in LABELS]
        new.append((smrc, "teacher_logprob_fn", self._scorer))
        saved = [(mod, name, getattr(mod, name)) for mod, name, _ in new]
        for (mod, name, wrap), (_, _, fn) in zip(new, saved):
            setattr(mod, name, wrap(fn))
        self.active = True
        try:
            yield self
        finally:
            self.active = False
            for mod, name, fn in saved:
                setattr(mod, name, fn)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_floor(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int, budget: int,
                  temperature: float, backward: bool = False, bf16: bool = True) -> float:
    """Seconds of one bare batched pass over (prompt + response) pairs: the response tokens' log-probs
    (models.score, no mask, no entropy) in micro-batches of `budget` padded tokens; with `backward`,
    forward + backward of their sum (the gradients are dropped after, nothing is stepped). 0 when there is
    nothing to pass."""
    if not prompts:
        return 0.0
    device = next(model.parameters()).device
    was_training = model.training
    model.train(backward)
    _sync(device)
    t0 = time.perf_counter()
    for idx in micro_batches([len(p) + len(r) for p, r in zip(prompts, responses)], budget):
        with torch.set_grad_enabled(backward):  # the trainer's scoring path, in the update's precision
            _, logp, _ = score(model, [prompts[i] for i in idx], [responses[i] for i in idx], pad_id,
                               temperature, bf16=bf16)
        if backward:
            logp.sum().backward()
    _sync(device)
    seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return seconds


def _tokens(prompts: list[list[int]], responses: list[list[int]]) -> int:
    return sum(len(p) + len(r) for p, r in zip(prompts, responses))


def measure_floors(cfg, s: smrc.Run, rec: Recorder, repeats: int) -> dict:
    """{phase: (floor seconds, the least of `repeats` timings, or None without repeats; tokens)} of each
    model phase of the step `rec` recorded."""
    pad, temp, bf16 = s.tokenizer.pad_token_id, cfg.rollout.sampling.temperature, cfg.grpo.bf16

    def floor(p, r, budget, backward=False):
        return min(forward_floor(s.model, p, r, pad, budget, temp, backward, bf16)
                   for _ in range(repeats)) if repeats else None
    turns = ([t.prompt_ids for t in rec.turns], [t.response_ids for t in rec.turns])
    out = {name: (floor(p, r, cfg.teacher.micro_batch_tokens), _tokens(p, r))
           for name, (p, r) in {"generation": turns, **rec.scored}.items()}
    epochs = cfg.grpo.ppo_epochs  # the update passes the step's turns once per epoch
    f = floor(*turns, cfg.grpo.micro_batch_tokens, backward=True)
    out["update"] = (None if f is None else epochs * f, epochs * _tokens(*turns))
    return out


def step_record(row: dict, rec: Recorder, floors: dict, env: dict, step_s: float) -> dict:
    """One step's phases: seconds, floor seconds (None: no floor), tokens, forward / backward tokens."""
    gen, env_s = rec.counters["gen_s"], rec.counters["env_s"]
    teacher_s, cand_s = row.get("sd/teacher_time_s", 0.0), row.get("sd/candidate_gain_time_s", 0.0)
    seconds = {"generation": gen, "env": env_s, "rollout prompts": rec.wall["generation"] - gen - env_s,
               "teacher": teacher_s, "candidate gain": cand_s,
               "teacher prompts": rec.wall["teacher"] - teacher_s,
               "update": rec.wall["update"], "reference KL": rec.wall["reference KL"]}
    seconds["other"] = step_s - sum(v for k, v in seconds.items() if k != "reference KL")  # KL: in update
    floors = {**floors, "env": (env["worker_s"] / max(1, env["workers"]), None)}
    phases = {name: {"seconds": seconds[name], "floor_s": floors.get(name, (None, None))[0],
                     "tokens": floors.get(name, (None, None))[1],
                     "fwd": int(rec.fwd[name]), "bwd": int(rec.bwd[name])} for name in PHASES}
    n = max(1, len(rec.turns))
    return {"step": row["step"], "step_s": step_s, "phases": phases, "turn_samples": len(rec.turns),
            "trained_tokens": floors["generation"][1],  # the update trains on the step's turns
            "mean_prompt_tokens": sum(len(t.prompt_ids) for t in rec.turns) / n,
            "mean_response_tokens": sum(len(t.response_ids) for t in rec.turns) / n,
            "env_calls": env["calls"], "env_workers": env["workers"], "logged": row}


def run_algo(args, algo: str, flags: list[str], world, pool: EnvPool, tok, out: Path) -> dict:
    """`args.steps` training steps of `algo`, each followed by its floors: per step its record, and the run's
    memory beside the plan."""
    cfg = smrc.parse_config(flags + ["--algo", algo, "--steps", str(10**6), "--save-every", str(10**6),
                                     "--output-dir", str(out / algo)])
    validate_config(cfg)
    no_folder = mock.patch.object(preflight, "check_model", lambda *_: None)
    with no_folder if args.arch else contextlib.nullcontext():
        tasks = check_inputs(cfg)  # every check but the model's folder: --arch builds the model in memory
    prepare_output_dir(out / algo, fresh=True)
    seed_step(cfg.seed, 0, world.rank)
    reset_peak(world.device)
    life = Lifecycle(cfg, world, pool, tasks, ckpt=None)
    if args.arch:  # smrc.setup as it is, with the random model built where it would load --model
        life.model_path = lambda: args.arch
        built = lambda path, device: (build_model(args.arch, tok, device, cfg.seed), tok)  # noqa: E731
    with mock.patch.object(smrc, "load_model", built) if args.arch else contextlib.nullcontext():
        cfg, s = smrc.setup(cfg, life)
    rec, records = Recorder(world.device), []
    hooks = rec.hook(s.model, s.ref_model)
    try:
        for step in range(args.steps):
            rec.clear()
            before = (pool.stats["worker_s"], pool.stats["resets"] + pool.stats["steps"])
            with rec.patched():
                t0 = time.perf_counter()
                smrc.train_step(cfg, life, s, step)
                step_s = time.perf_counter() - t0
            env = {"worker_s": pool.stats["worker_s"] - before[0], "workers": pool.num_workers,
                   "calls": pool.stats["resets"] + pool.stats["steps"] - before[1]}
            row = json.loads((out / algo / "metrics.jsonl").read_text().splitlines()[-1])
            floors = measure_floors(cfg, s, rec, args.floor_repeats)
            records.append(step_record(row, rec, floors, env, step_s))
    finally:
        for h in hooks:
            h.remove()
        if s.replay_env is not None:
            s.replay_env.close()
        getattr(s.engine, "shutdown", lambda: None)()
    cuda = world.device.type == "cuda"
    gpu_gib = torch.cuda.get_device_properties(world.device).total_memory / 2**30 if cuda else 0.0
    planned = memory_plan.plan(cfg, memory_plan.arch_of(s.model.config.to_dict(), cfg.model), cuda, gpu_gib)
    rows = [r["logged"] for r in records]
    result = {"steps": records, "params": sum(p.numel() for p in s.model.parameters()),
              "grad_checkpointing": cfg.grpo.grad_checkpointing == "on",
              "peak_mem_gib": max([peak_bytes(world.device) / 2**30]
                                  + [v for r in rows for k, v in r.items() if k.startswith("mem/")]),
              "mem_vs_plan": {ph: (max(r.get(f"mem/{ph}_peak_gb", 0.0) for r in rows), sum(parts.values()))
                              for ph, parts in planned["phases"].items()}}
    del s
    if cuda:
        torch.cuda.empty_cache()
    return result


def summarise(result: dict) -> dict:
    """Means over the timed steps (all but the first when there are more): per phase seconds, floor, ratio,
    tokens and passes per trained token; the step's counts."""
    timed = result["steps"][1:] if len(result["steps"]) > 1 else result["steps"]

    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None
    phases, trained = {}, max(1, sum(r["trained_tokens"] for r in timed))
    for name in PHASES:
        cells = [r["phases"][name] for r in timed]
        sec, floor, tok = (mean([c[k] for c in cells]) for k in ("seconds", "floor_s", "tokens"))
        phases[name] = {"seconds": sec, "floor_s": floor, "tokens": tok,
                        "ratio": sec / floor if floor else None,
                        "passes": tuple(sum(c[k] for c in cells) / trained for k in ("fwd", "bwd"))}
    logged = {k: mean([r["logged"].get(k) for r in timed]) for k in (
        "sd/distilled_turns", "sd/teacher_tokens", "router/match_rate", "time/tokens_per_s")}
    keys = ("step_s", "turn_samples", "trained_tokens", "mean_prompt_tokens", "mean_response_tokens",
            "env_calls")
    return {"steps_timed": [r["step"] for r in timed], "phases": phases, "logged": logged,
            **{k: mean([r[k] for r in timed]) for k in keys}, "env_workers": timed[-1]["env_workers"],
            **{k: result[k] for k in ("params", "grad_checkpointing", "peak_mem_gib", "mem_vs_plan")}}


def table(algo: str, s: dict) -> str:
    """phase | seconds | floor seconds | ratio | tokens | passes per trained token, then the step."""
    def cell(v, fmt):
        return "-" if v is None else format(v, fmt)
    lines = [f"{algo:<16}{'seconds':>10}{'floor s':>10}{'ratio':>9}{'tokens':>11}"
             f"{'fwd/bwd per trained token':>28}"]
    for name, p in s["phases"].items():
        passes = f"{p['passes'][0]:.2f}/{p['passes'][1]:.2f}" if name in PASSED else "-"
        lines.append(f"{name:<16}{p['seconds']:10.2f}{cell(p['floor_s'], '10.3f'):>10}"
                     f"{cell(p['ratio'], '9.1f'):>9}{cell(p['tokens'], '11,.0f'):>11}{passes:>28}")
    fwd, bwd = (sum(p["passes"][i] for p in s["phases"].values()) for i in (0, 1))
    recompute = f" (+{bwd:.2f} recompute: gradient checkpointing)" if s["grad_checkpointing"] else ""
    lg = {k: v or 0 for k, v in s["logged"].items()}
    lines.append(f"{'step':<16}{s['step_s']:10.2f}  | {fwd:.2f} forward + {bwd:.2f} backward per trained "
                 f"token{recompute} | {lg['sd/distilled_turns']:.1f} distilled turns, "
                 f"{lg['sd/teacher_tokens']:,.0f} teacher tokens, match rate {lg['router/match_rate']:.3f}, "
                 f"{lg['time/tokens_per_s']:,.0f} tok/s")
    lines.append("peak memory per phase, GiB (mem/*, the steps' largest, beside the plan): " + "  ".join(
        f"{ph} {got:.2f} / plan {want:.2f}" for ph, (got, want) in s["mem_vs_plan"].items()))
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--model", default="tiny-agent", help="the policy: a name or folder, as smrc.py's")
    which.add_argument("--arch", choices=sorted(ARCHS), default="",
                       help="instead: a random model of this architecture, built in memory (REAL_SIZE)")
    ap.add_argument("--algos", nargs="+", default=["grpo", "smrc-sd"], choices=list(smrc.ALGOS),
                    help="algorithms, each timed in turn; ratios are to the first")
    ap.add_argument("--steps", type=int, default=3, help="steps per algorithm (the first untimed when > 1)")
    ap.add_argument("--floor-repeats", type=int, default=1,
                    help="timings of each floor, the least kept (0: no floors)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="", help="also write every number here")
    ap.add_argument("flags", nargs=argparse.REMAINDER, help="-- then smrc.py's flags")
    args = ap.parse_args(argv)
    args.flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    if args.steps < 1 or args.floor_repeats < 0:
        raise SystemExit("error: --steps must be >= 1 and --floor-repeats >= 0")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    base = REAL_SIZE if args.arch else [] if "--preset" in args.flags else ["--preset", "learn"]
    flags = base + ["--model", args.arch or args.model, "--seed", str(args.seed), "--device", args.device]
    cfg = smrc.parse_config(flags + args.flags)
    world = distributed.init_distributed(args.device)
    tok = AutoTokenizer.from_pretrained(tiny.model_dir()) if args.arch else None
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_step_") as tmp:
        # first: the workers fork before any model exists (as in smrc.main)
        pool = EnvPool(cfg.env_cfg, episodes=cfg.rollout.tasks_per_step * cfg.rollout.group_size)
        try:
            for algo in args.algos:
                results[algo] = run_algo(args, algo, flags + args.flags, world, pool, tok, Path(tmp))
        finally:
            pool.close()
            distributed.close(world)
    summary = {a: summarise(r) for a, r in results.items()}
    first = summary[args.algos[0]]
    print(f"\n{cfg.model} ({first['params'] / 1e6:.1f}M parameters) on {world.device}, "
          f"{torch.get_num_threads()} torch threads, {first['env_workers']} env workers | "
          f"{cfg.rollout.tasks_per_step} tasks x {cfg.rollout.group_size} rollouts, "
          f"<= {cfg.env_cfg.max_steps} turns | means over steps {first['steps_timed']}: "
          f"{first['turn_samples']:.0f} turn-samples of "
          f"{first['mean_prompt_tokens']:.0f} prompt + {first['mean_response_tokens']:.1f} response tokens")
    for algo, s in summary.items():
        print("\n" + table(algo, s))
    print("\nfloor: one no-grad forward of the same tokens (update: forward + backward); env: the workers' "
          "own compute / workers. '-': none")
    for algo in args.algos[1:]:
        print(f"step time ratio {algo}/{args.algos[0]} = {summary[algo]['step_s'] / first['step_s']:.3f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "threads": torch.get_num_threads(),
                                               "summary": summary, "runs": results}, indent=1, default=str))
    return summary


if __name__ == "__main__":
    main()
