"""SMRC-SD: State-Matched Routing and Contextualized Self-Distillation for multi-turn LLM agents.

One step of training (the loop at the bottom reads as this list):
  1. sample task groups        n rollouts (`group_size`) of each of `tasks_per_step` tasks
  2. roll out              every turn is one records.Turn: its prompt, sampled response, sampling log-probs
  3. reference bank        successes of this group (+ archive, + planner solutions if asked) per task
  4. route                 which turns to distil: state-signature matches (smrc-sd), every turn of a task
                           with a reference (fullpath-sd), none (grpo), every turn (skill-sd, sdar, grpo-opsd)
  5. teacher               same weights re-score the sampled tokens with [reference + state summary +
                           candidate] (smrc-sd), [reference] (fullpath-sd) or [skill text] (skill-sd, sdar,
                           grpo-opsd)
  6. advantages            trajectory-level GRPO per task group
  7. update                L = L_GRPO + λ·L_SD (distilled turns only; L_SD's form is set by --algo, grpo.py)
  8. sync, log, checkpoint (and every --eval-every steps: validation on a fixed panel, best weights kept)

Usage:
  python smrc.py --preset tiny                                          # CPU, embedded model, generated games
  python smrc.py --env alfworld --model Qwen/Qwen3-1.7B                 # paper scale, official ALFWorld data
  python smrc.py --env webshop --algo fullpath-sd --router.matcher structured   # an ablation row
  python smrc.py --env alfworld --algo sdar --router.context trajectory         # SDAR's loss, a trajectory
  torchrun --nproc_per_node 8 smrc.py --env alfworld --model Qwen/Qwen3-1.7B

Inference and evaluation see only the ordinary prompt: reference, signatures and teacher context exist only in
steps 3-5 and never enter a rollout prompt.

Read the method in this order: envs.py (the environment contract), rollout.py, router.py, teacher.py, grpo.py,
models.py; the flags and presets are in config.py, the support in environments/, scale/, embedded/ (and
analysis/, bench/ beside evaluate.py).
"""

import copy
import dataclasses
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import envs
import grpo
import rollout
import router
import teacher
from config import ALGOS, PRESETS, Config, config_from_run, parse_config  # noqa: F401 (re-exported)
from embedded.tiny import cache_dir
from embedded.warmstart import RECIPES, TINY, resolve
from environments.pool import EnvPool
from models import HFEngine, load_model
from records import Trajectory, Turn
from scale import distributed
from scale.checkpoint import (initial_weights, latest_checkpoint, load_trainer_state, save_checkpoint,
                              seed_step, set_aside_newer)
from scale.distributed import World, init_distributed, print0
from scale.memory import Memory, return_freed_memory
from scale.memory_plan import check_fits
from scale.monitor import Validation, log_step, save_best, validate
from scale.preflight import check_model, open_run, validate_config
from scale.run_logs import archive_rows, trim_logs
from scale.safe_io import stop_on_io_error
from scale.preempt import Preempted, StopSignals
from scale.trackers import Trackers
from scale.vllm_engine import VLLMEngine

NO_STEP_LIMIT = 10**6  # planner references replay through an env with this step limit (a plan may be long)


# ------------------------------------------------------------------------------------------------------------
# References, advantages, the teacher's log-prob function


@dataclass
class Setup:
    """What the training loop runs on, built once by `setup` (and restored from a checkpoint on --resume)."""
    train_tasks: list[envs.Task]
    model: torch.nn.Module        # the policy, wrapped for DDP/FSDP under torchrun
    tokenizer: object
    ref_model: torch.nn.Module | None  # frozen initial model for the KL anchor (None when kl_coef = 0)
    optimizer: torch.optim.Optimizer
    bank: router.ReferenceBank
    start: int                    # the first step to run (the checkpoint's step on --resume)
    engine: object                # HFEngine or VLLMEngine
    teacher: teacher.TeacherConfig  # --teacher.*, with the candidate-gain diagnostic's auto decided
    validation: Validation | None = None  # the fixed validation panel and its settings (--eval-every)
    replay_env: object = None     # env without a step limit for planner references, made on first use
    nonfinite: int = 0            # optimizer steps skipped in a row (non-finite loss or grad norm); saved
    memory: Memory | None = None  # per-phase peak memory and the out-of-memory watchdog (scale/memory.py)
    trackers: Trackers = field(default_factory=lambda: Trackers((), Path(".")))  # --log-with: the rows too
    saved: tuple[int, float] = (0, 0.0)  # (step, seconds) of the newest checkpoint this process wrote


def step_tasks(cfg: Config, run: Setup, world: World, step: int) -> list[envs.Task]:
    """This rank's shard of the step's task groups (the same draw on every rank, known ahead of the step)."""
    n_tasks, n_pick = len(run.train_tasks), cfg.rollout.tasks_per_step
    pick = np.random.default_rng([cfg.seed, step]).choice(n_tasks, n_pick, replace=n_tasks < n_pick)
    return world.shard([run.train_tasks[i] for i in sorted(pick)])


def planner_references(cfg: Config, run: Setup, tasks: list[envs.Task]) -> list[Trajectory]:
    """The planner's solution of every task not yet in the bank (router choice 4), replayed through an env
    without a step limit (a plan may be longer than the student's max_steps). The plan is built with the run's
    env config."""
    refs = []
    for task in (t for t in tasks if t.task_id not in run.bank.planner):
        result = envs.plan(cfg.env_cfg, task, [])
        if result.status != "ok":
            print(f"[planner] no reference for {task.task_id}: {result.status} {result.message}", flush=True)
            continue
        if run.replay_env is None:
            run.replay_env = envs.make_env(dataclasses.replace(cfg.env_cfg, max_steps=NO_STEP_LIMIT))
        ref = rollout.reference(run.replay_env, task, result.actions)
        refs += [ref] if ref is not None else []
    return refs


def set_advantages(episodes: list[rollout.Episode], penalty: float, norm_by_std: bool) -> None:
    """Turn score s = episode return − penalty·[turn invalid] (verl-agent), then GRPO advantages per task
    group."""
    turns = [t for e in episodes for t in e.turns]
    scores = [e.ret - penalty * (not t.valid) for e in episodes for t in e.turns]
    for turn, advantage in zip(turns, grpo.grpo_advantages(scores, [t.group for t in turns], norm_by_std)):
        turn.advantage = advantage


def teacher_logprob_fn(cfg: Config, run: Setup) -> teacher.LogprobFn:
    temperature = cfg.rollout.sampling.temperature
    if cfg.teacher.backend == "vllm":  # prompt_logprobs over [teacher prompt + response], rollout engine
        return teacher.vllm_logprob_fn(run.engine, temperature)
    # the module under DDP: DDP's forward broadcasts buffers (a collective), and ranks score different numbers
    # of matched turns, none on some steps (scale/distributed.py); in the update's precision
    return teacher.hf_logprob_fn(distributed.unwrap(run.model), run.tokenizer.pad_token_id,
                                 cfg.teacher.micro_batch_tokens, temperature, bf16=cfg.grpo.bf16)


# ------------------------------------------------------------------------------------------------------------
# Training loop


def check_inputs(cfg: Config) -> tuple[list[envs.Task], list[envs.Task]]:
    """Before anything is written or loaded: the settings fit together, the data (train split; the validation
    panel with --eval-every) and the model exist. Each failure is one `error:` line. Returns (train tasks,
    panel)."""
    if cfg.rollout.action_space == "admissible" and ("vllm" in (cfg.rollout.engine, cfg.teacher.backend)
                                                     or cfg.env_cfg.require_think):
        raise SystemExit("error: --rollout.action-space admissible needs --rollout.engine hf "
                         "--teacher.backend hf and require_think False (the response is exactly one "
                         "`<action>...</action>`)")
    if cfg.router.matcher == "every-turn" and cfg.router.context != "skill":
        raise SystemExit(f"error: --router.matcher every-turn distils turns without a reference, which "
                         f"--router.context {cfg.router.context} needs; use --router.context skill or "
                         f"--router.matcher with-reference")
    if cfg.teacher.oracle > 0 and cfg.router.matcher in ("every-turn", "none"):
        raise SystemExit(f"error: --teacher.oracle needs a reference candidate on every distilled turn, "
                         f"which --router.matcher {cfg.router.matcher} does not give; use a matcher with "
                         f"references (structured, with-reference, history, ...), e.g. --algo smrc-sd or "
                         f"--algo fullpath-sd")
    if cfg.model not in (TINY, *RECIPES):  # the embedded models are built on first use (setup)
        check_model(cfg.model, "--model")
    elif not writable(cache_dir()):
        raise SystemExit(f"error: --model {cfg.model} is built under SMRC_CACHE={cache_dir()}, which is not "
                         f"a writable folder; point SMRC_CACHE at one")
    try:  # missing data: one clear message, not a traceback from deep inside
        train = envs.load_tasks(cfg.env_cfg, "train")
        panel = envs.load_tasks(cfg.env_cfg, "eval") if cfg.eval_every else []
    except envs.DataError as e:
        raise SystemExit(f"error: {e}") from None
    except OSError as e:  # generated games written to an unwritable cache, say
        raise SystemExit(f"error: the {cfg.env} tasks could not be prepared ({e.filename or ''}: "
                         f"{e.strerror or e}); if that is a cache, point --alfworld.cache-dir or SMRC_CACHE "
                         f"at a writable folder") from None
    if not train:
        raise SystemExit(f"error: the {cfg.env} train split has no task under these settings (game counts, "
                         f"task types, eval goals); nothing to train on")
    return train, envs.stratified_subset(panel, cfg.eval_tasks, cfg.seed)


def writable(folder: Path) -> bool:
    """Whether `folder` exists (or can be made) and takes a new file."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def setup(cfg: Config, world: World, tasks: tuple[list[envs.Task], list[envs.Task]],
          ckpt: Path | None) -> Setup:
    """With (train tasks, validation panel) from check_inputs and the verified checkpoint to resume (or None):
    the model, reference model, optimizer, bank (and guard counters) restored from it, the engine."""
    out = Path(cfg.output_dir)
    on_vllm = (cfg.rollout.engine, cfg.teacher.backend) == ("vllm", "vllm")
    if world.enabled and cfg.dist.strategy == "fsdp" and not on_vllm:
        raise SystemExit("error: --dist.strategy fsdp needs --rollout.engine vllm --teacher.backend vllm: "
                         "under FSDP every forward is a collective, and per-rank generation lengths differ")
    if world.is_main:  # embedded models are built once, by rank 0 (transformers saves on rank 0 only)
        resolve(cfg.model)
    world.barrier()
    model_path = resolve(cfg.model)
    check_fits(cfg, model_path, world.device, world.world_size)  # CUDA: the memory plan fits the GPU
    if cfg.resume and ckpt is None:
        print0(world, f"[resume] no checkpoint in {out}; starting from step 0")
    model, tokenizer = load_model(str(ckpt) if ckpt else model_path, device=world.device)
    ref_model = None
    if cfg.grpo.kl_coef > 0:  # KL anchor = the initial model, also after a resume
        ref_model = (load_model(model_path, device=world.device)[0] if ckpt else copy.deepcopy(model)).eval()
        ref_model.requires_grad_(False).to(grpo.ref_dtype(cfg.grpo, world.device))  # bf16 on CUDA
    if grpo.grad_checkpointing_on(cfg.grpo, model):
        model.gradient_checkpointing_enable()
        if world.device.type == "cpu":  # the resident size then follows the live tensors (scale/memory.py)
            return_freed_memory()
    model = distributed.wrap(model, world, cfg.dist.strategy)
    if ref_model is not None:
        ref_model = distributed.wrap_frozen(ref_model, world, cfg.dist.strategy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.grpo.lr, weight_decay=cfg.grpo.weight_decay)
    bank = router.ReferenceBank(cfg.router.archive_size)
    guards = {"nonfinite_streak": 0}
    start = load_trainer_state(ckpt, model, optimizer, bank, guards) if ckpt else 0
    if world.is_main:
        with stop_on_io_error(out):
            set_aside_newer(out, start)
            trim_logs(out, start)
    if cfg.rollout.engine == "vllm":  # colocated; started from the model dir, then synced
        engine = VLLMEngine(str(ckpt) if ckpt else model_path, tokenizer, cfg.rollout.sampling,
                            gpu_memory_utilization=cfg.rollout.vllm_gpu_memory, seed=cfg.seed + world.rank,
                            torchrun=world.enabled)  # one engine per rank, on the rank's device
        engine.sync_weights(model)
        print0(world, "[vllm] " + ", ".join(f"rank {r}: {where}" for r, where in
                                            enumerate(world.gather(engine.placement()))))
    else:
        engine = HFEngine(distributed.unwrap(model), tokenizer, cfg.rollout.sampling,
                          cfg.rollout.gen_batch_size, bf16=cfg.grpo.bf16)
    validation = Validation(tasks[1], cfg.rollout, cfg.env_cfg, cfg.eval_temperature, cfg.seed, out,
                            cfg.steps)
    config = None if ckpt else {**dataclasses.asdict(cfg), "resolved": cfg.resolved()}  # a resume keeps it
    trackers = Trackers(cfg.log_with if world.is_main else (), out, config, start)
    n_params = sum(p.numel() for p in model.parameters())
    return Setup(train_tasks=tasks[0], model=model, tokenizer=tokenizer, ref_model=ref_model,
                 optimizer=optimizer, bank=bank, start=start, engine=engine, validation=validation,
                 teacher=teacher.resolved(cfg.teacher, n_params, grpo.MEASURE_MAX_PARAMS),
                 nonfinite=guards["nonfinite_streak"], memory=Memory(world.device), trackers=trackers)


def main(cfg: Config) -> None:
    with distributed.OneErrorLine(lambda: latest_checkpoint(Path(cfg.output_dir))) as once:
        validate_config(cfg)
        tasks = check_inputs(cfg)
        world = once.world = init_distributed(cfg.device, cfg.dist.timeout_s)
        run_locked(cfg, world, tasks)


def run_locked(cfg: Config, world: World, tasks: tuple[list, list]) -> None:
    # the folder is this run's alone (a lock) while it runs; the checkpoint to resume is verified before the
    # config is recorded: what --algo, the preset and the flags resolved to (the λ applied, ...) and the
    # initial weights' sha256 (an embedded model is built then, by rank 0)
    try:
        with open_run(cfg, world, lambda: initial_weights(cfg.model, resolve(cfg.model))) as ckpt:
            seed_step(cfg.seed, 0, world.rank)
            # first: the workers fork before any model or engine exists; sized for this rank's episodes
            episodes = -(-cfg.rollout.tasks_per_step // world.world_size) * cfg.rollout.group_size
            pool = EnvPool(cfg.env_cfg, episodes=episodes)
            try:
                train(cfg, world, pool, tasks, ckpt)
            finally:
                pool.close()
                distributed.close(world)
    except Preempted as p:  # the lock is released and the workers are gone: say where the run stands
        args = [a for a in COMMAND_LINE if a != "--resume"]
        name, newest = signal.Signals(p.signum).name, latest_checkpoint(Path(cfg.output_dir))
        print0(world, f"[smrc] stopped by {name} after step {p.step}{p.note}; newest checkpoint {newest}; "
                      f"continue with: python smrc.py {shlex.join(args)} --resume")
        sys.exit(128 + p.signum)


def train(cfg: Config, world: World, pool: EnvPool, tasks: tuple[list, list], ckpt: Path | None) -> None:
    run = setup(cfg, world, tasks, ckpt)
    oracle = f" oracle alpha={cfg.teacher.oracle:g}" if cfg.teacher.oracle > 0 else ""
    millions = sum(p.numel() for p in run.model.parameters()) / 1e6
    print0(world, f"[smrc] {cfg.algo}: matcher={cfg.router.matcher} context={cfg.router.context} "
                  f"L_SD={cfg.grpo.sd_loss} lambda={cfg.grpo.sd_coef:g}{oracle} | "
                  f"{len(run.train_tasks)} train tasks | {millions:.2f}M "
                  f"params on {world.device} x{world.world_size} | steps {run.start}->{cfg.steps} | "
                  f"engine {cfg.engines()}")
    if cfg.algo != "grpo" and cfg.preset == "none" and cfg.grpo.sd_coef == grpo.SD_COEF[cfg.grpo.sd_loss]:
        print0(world, f"[smrc] lambda {cfg.grpo.sd_coef:g} = {cfg.grpo.sd_loss}'s default; to set it for "
                      "this model: `python analysis/lambda_pilot.py` (README, 'Setting λ')")
    if cfg.rollout.tasks_per_step % world.world_size:  # allowed: GRPO's statistics stay within a group
        print0(world, distributed.uneven_shard(cfg.rollout.tasks_per_step, world.world_size))
    run.memory.start()  # a watchdog: one line, not a silent kill, if memory runs out
    run.saved = (run.start, 0.0)
    try:
        with StopSignals(cfg.preempt_grace_s) as stop:  # SIGTERM / SIGINT: stop between steps
            for step in range(run.start, cfg.steps):
                train_step(cfg, world, pool, run, step)
                if stop.requested(world):
                    stop_after(cfg, world, run, step + 1, stop)
    finally:
        run.memory.close()
        run.trackers.close()
        if run.replay_env is not None:
            run.replay_env.close()
        getattr(run.engine, "shutdown", lambda: None)()  # before the process group goes (vLLM's exit hook)
    out = Path(cfg.output_dir)
    final = latest_checkpoint(out)
    print0(world, f"[smrc] done: checkpoint {final}, metrics {out / 'metrics.jsonl'}; evaluate it with: "
                  f"python evaluate.py eval --checkpoint {final} --split eval --k 4")


def train_step(cfg: Config, world: World, pool: EnvPool, run: Setup, step: int) -> None:
    t_step = time.perf_counter()
    rng = seed_step(cfg.seed, step, world.rank)
    at = lambda phase: world.at(f"step {step + 1}: {phase}")  # noqa: E731 (named if a collective times out)
    # 1. sample task groups (the same draw on every rank), each rank plays its shard of the groups
    at("rollout")
    tasks = step_tasks(cfg, run, world, step)
    for task in (tasks + step_tasks(cfg, run, world, step + 1)) if cfg.router.seed_with_planner else []:
        envs.prefetch_plan(cfg.env_cfg, task, [])  # planned in the background (step 3 waits less)
    # 2. roll out (ordinary prompts only): every turn is one records.Turn, the later stages read and add to it
    with run.memory.phase("rollout"):
        episodes, counters = rollout.collect_rollouts(run.engine, pool, run.tokenizer, tasks, cfg.rollout,
                                                      cfg.env_cfg, tag=f"s{step}r{world.rank}",
                                                      show_progress=world.is_main)
    turns: list[Turn] = [t for e in episodes for t in e.turns]
    if world.all_max(len(turns)) == 0 and world.all_max(counters["prompt_too_long"]):  # every rank decides
        n = int(world.all_sum(len(episodes)))
        raise SystemExit(1 if not world.is_main else  # rank 0 says it
                         f"error: --rollout.max-prompt-tokens {cfg.rollout.max_prompt_tokens} fits no "
                         f"prompt: all {n} episodes of step {step + 1} ended before their first turn, so "
                         f"there is nothing to train on; raise it")
    # 3. reference bank: this group's successes, earlier ones, planner solutions (flag); the same on all ranks
    at("reference bank")
    add_references(cfg, world, run, tasks, episodes)
    # 4. route: which turns get distilled (turn.match); the archive also keeps the audited matchers' picks
    router.route(turns, run.bank, cfg.router, rng)
    audited = router.audited_matches(turns, run.bank, cfg.router) if cfg.archive_max_turns else {}
    # 5. teacher: same weights, privileged context, matched turns only (turn.teacher_logprobs)
    at("teacher")
    with run.memory.phase("teacher"):
        sd_counts = teacher.teacher_signal(turns, cfg.router.context, run.tokenizer, run.teacher,
                                           teacher_logprob_fn(cfg, run))
    # 6. GRPO advantages per task group (turn.advantage)
    set_advantages(episodes, cfg.env_cfg.invalid_action_penalty, cfg.grpo.norm_adv_by_std)
    # 7. update: L = L_GRPO + λ·L_SD (a vLLM engine sleeps meanwhile, freeing its GPU memory)
    at("update")
    t_update = time.perf_counter()
    getattr(run.engine, "sleep", lambda: None)()
    with run.memory.phase("update"):
        actor = grpo.update(run.model, run.optimizer, turns, cfg.grpo, pad_id=run.tokenizer.pad_token_id,
                            temperature=cfg.rollout.sampling.temperature, ref_model=run.ref_model,
                            world=world if world.enabled else None, nonfinite_streak=run.nonfinite)
    run.nonfinite = actor["actor/nonfinite_streak"]
    # 8. sync the rollout engine, archive the turns, log, checkpoint
    at("weight sync")
    run.engine.sync_weights(run.model)
    at("metrics")
    times = {"step_s": time.perf_counter() - t_step, "update_s": time.perf_counter() - t_update}
    report(cfg, world, pool, run, step + 1, (episodes, counters, sd_counts, audited, times), actor)
    if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
        at("validation")
        row = validate(run.validation, run.engine, pool, run.tokenizer, step + 1, world)
        run.trackers.log(row)  # None on ranks > 0
        save_best(Path(cfg.output_dir), run.model, run.tokenizer, cfg, row, world)
    if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
        at("checkpoint")
        save(cfg, world, run, step + 1)


def add_references(cfg: Config, world: World, run: Setup, tasks: list[envs.Task],
                   episodes: list[rollout.Episode]) -> None:
    """Step 3: every rank's trajectories of the step (the group's successes) and new planner references
    (--router.seed-with-planner) into the bank, which is then the same on every rank."""
    new_refs = planner_references(cfg, run, tasks) if cfg.router.seed_with_planner else []
    gathered = world.gather(([rollout.to_trajectory(e) for e in episodes], new_refs))
    run.bank.add_group([t for trajs, _ in gathered for t in trajs])
    for ref in (r for _, refs in gathered for r in refs):
        run.bank.add_planner(ref)


def report(cfg: Config, world: World, pool: EnvPool, run: Setup, step: int, done: tuple, actor: dict) -> None:
    """Step 8's record: every rank's numbers of the step (`done`: episodes, env counters, teacher counts,
    audited matches, times) gathered; rank 0 writes the metrics row, the archive and the trackers."""
    episodes, counters, sd_counts, audited, times = done
    turns = [t for e in episodes for t in e.turns]
    mem = run.memory.metrics()  # mem/<phase>_peak_gb: resident memory on CPU, allocated on CUDA
    local = {"rollout": rollout.episode_stats(episodes), "counters": counters, "sd": sd_counts,
             "rows": archive_rows(step, episodes, audited), "route": router.route_metrics(turns, run.bank),
             "times": {**times, "peak_gpu_mem_gb": max(mem.values()) if world.device.type == "cuda" else 0.0},
             "mem": mem, "tokens": sum(len(t.prompt_ids) + len(t.response_ids) for t in turns),
             "env": pool.take_crashes()}  # env/worker_restarts, env/episodes_replayed
    everyone = world.gather(local)
    if world.is_main:
        run.trackers.log(log_step(Path(cfg.output_dir), step, cfg.steps, everyone, actor, run.bank,
                                  cfg.archive_max_turns))


def save(cfg: Config, world: World, run: Setup, step: int) -> None:
    t0 = time.perf_counter()
    save_checkpoint(Path(cfg.output_dir), step, run.model, run.tokenizer, run.optimizer, run.bank, cfg, world,
                    guards={"nonfinite_streak": run.nonfinite})
    run.saved = (step, time.perf_counter() - t0)


def stop_after(cfg: Config, world: World, run: Setup, step: int, stop: StopSignals) -> None:
    """The stop a signal asked for, after `step`: a checkpoint of it if the newest is older and the save
    (timed as the last one) fits the grace period; then Preempted, which smrc.main reports."""
    newer = run.saved[0] < step
    if newer and stop.fits(run.saved[1]):
        save(cfg, world, run, step)
    note = "" if not newer or run.saved[0] == step else \
        f"; no checkpoint of step {step}: it would not fit --preempt-grace-s {cfg.preempt_grace_s:g}"
    raise Preempted(stop.signum or signal.SIGTERM, step, run.saved[0] == step, note)


COMMAND_LINE = sys.argv[1:]  # as given (a planner library rewrites sys.argv later): the resume command's

if __name__ == "__main__":
    main(parse_config(COMMAND_LINE, __doc__))
