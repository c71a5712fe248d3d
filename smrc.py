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
  python smrc.py --env textworld --preset tiny                                  # TextWorld's generated games
  python smrc.py --env my_package.my_env:MyEnv         # your environment (docs/environments.md, envs.py)
  torchrun --nproc_per_node 8 smrc.py --env alfworld --model Qwen/Qwen3-1.7B

Inference and evaluation see only the ordinary prompt: reference, signatures and teacher context exist only in
steps 3-5 and never enter a rollout prompt.

Read the method in this order: envs.py (the environment contract), rollout.py, router.py, teacher.py, grpo.py,
models.py; the flags and presets are in config.py. The run's lifecycle around the loop (checks, lock, resume,
preemption, memory watchdog, metrics and trackers, validation, checkpoints) is scale/lifecycle.py; what a step
measures beside the method is measure/; the support is in environments/, scale/, embedded/, configs/ (and
analysis/, bench/ beside evaluate.py).
"""

import copy
import dataclasses
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

import envs
import grpo
import rollout
import router
import teacher
from analysis.view import run_view
from config import (ALGOS, Config, config_from_run, default_sd_coef, parse_config,  # noqa: F401
                    resolve_for_model)
from measure.step_readings import step_readings
from models import HFEngine, load_model
from records import StepRecord, Trajectory, Turn
from scale import distributed, lora, vllm_engine
from scale.lifecycle import Lifecycle, started
from scale.vllm_engine import VLLMEngine

NO_STEP_LIMIT = 10**6  # planner references replay through an env with this step limit (a plan may be long)


@dataclass
class Run:
    """The parts the method steps use, built once by `setup` (restored from a checkpoint on --resume)."""
    train_tasks: list[envs.Task]
    model: torch.nn.Module        # the policy, wrapped for DDP/FSDP under torchrun
    tokenizer: object
    ref_model: torch.nn.Module | None  # frozen initial model for the KL anchor (None when kl_coef = 0)
    optimizer: torch.optim.Optimizer
    bank: router.ReferenceBank
    engine: object                # HFEngine or VLLMEngine
    replay_env: object = None     # env without a step limit for planner references, made on first use


# ------------------------------------------------------------------------------------------------------------
# The training loop


def main(cfg: Config) -> None:
    with started(cfg, COMMAND_LINE) as life:  # checks, torchrun, the locked run folder, env workers
        cfg, run = setup(cfg, life)  # cfg: every auto the model's size and the device decide, decided
        banner(cfg, life, run)
        with life.running(run, view=run_view):  # watchdog, stop signals; at the end: close, log the view
            for step in range(life.start, cfg.steps):
                train_step(cfg, life, run, step)


def train_step(cfg: Config, life: Lifecycle, run: Run, step: int) -> None:
    t_step = time.perf_counter()
    rng = life.seed(step)  # torch, numpy, random; the router's own generator
    # 1. sample task groups (the same draw on every rank), each rank plays its shard of the groups
    life.at(step, "rollout")
    tasks = step_tasks(cfg, life, step)
    for task in (tasks + step_tasks(cfg, life, step + 1)) if cfg.router.seed_with_planner else []:
        envs.prefetch_plan(cfg.env_cfg, task, [])  # planned in the background (step 3 waits less)
    # 2. roll out (ordinary prompts only): every turn is one records.Turn, the later stages read and add to it
    with life.phase("rollout"):
        episodes, counters = rollout.collect_rollouts(
            run.engine, life.pool, run.tokenizer, tasks, cfg.rollout, cfg.env_cfg,
            tag=f"s{step}r{life.world.rank}", show_progress=life.world.is_main)
    turns: list[Turn] = [t for e in episodes for t in e.turns]
    life.nothing_to_train(step, episodes, counters)  # every prompt over the limit: one error line
    # 3. reference bank: this group's successes, earlier ones, planner solutions (flag); the same on all ranks
    life.at(step, "reference bank")
    add_references(cfg, life, run, tasks, episodes)
    # 4. route: which turns get distilled (turn.match)
    router.route(turns, run.bank, cfg.router, rng)
    # 5. teacher: same weights, privileged context, matched turns only (turn.teacher_logprobs)
    life.at(step, "teacher")
    with life.phase("teacher"):
        logprob_fn = teacher_logprob_fn(cfg, run)
        sd_counts = teacher.teacher_signal(turns, cfg.router.context, run.tokenizer, cfg.teacher, logprob_fn)
        measured, audited = step_readings(turns, run.bank, cfg.router, cfg.teacher, run.tokenizer, logprob_fn,
                                          audit=cfg.archive_max_turns > 0)  # measurement only (measure/)
    # 6. GRPO advantages per task group (turn.advantage)
    set_advantages(episodes, cfg.env_cfg.invalid_action_penalty, cfg.grpo.norm_adv_by_std)
    # 7. update: L = L_GRPO + λ·L_SD (a vLLM engine sleeps meanwhile, freeing its GPU memory)
    life.at(step, "update")
    t_update = time.perf_counter()
    getattr(run.engine, "sleep", lambda: None)()
    with life.phase("update"):
        world = life.world if life.world.enabled else None
        actor = grpo.update(run.model, run.optimizer, turns, cfg.grpo, pad_id=run.tokenizer.pad_token_id,
                            temperature=cfg.rollout.sampling.temperature, ref_model=run.ref_model,
                            world=world, nonfinite_streak=life.nonfinite)
    # 8. sync the rollout engine; log (and check the last sync), archive, validate and checkpoint when due
    life.at(step, "weight sync")
    run.engine.sync_weights(run.model)
    times = {"step_s": time.perf_counter() - t_step, "update_s": time.perf_counter() - t_update}
    life.end_step(run, step + 1, StepRecord(episodes, counters, sd_counts, measured, audited, times, actor))


# ------------------------------------------------------------------------------------------------------------
# The steps' parts: tasks, references, advantages, the teacher's log-prob function


def step_tasks(cfg: Config, life: Lifecycle, step: int) -> list[envs.Task]:
    """This rank's shard of the step's task groups (the same draw on every rank, known ahead of the step)."""
    n_tasks, n_pick = len(life.train_tasks), cfg.rollout.tasks_per_step
    pick = np.random.default_rng([cfg.seed, step]).choice(n_tasks, n_pick, replace=n_tasks < n_pick)
    return life.world.shard([life.train_tasks[i] for i in sorted(pick)])


def add_references(cfg: Config, life: Lifecycle, run: Run, tasks: list[envs.Task],
                   episodes: list[rollout.Episode]) -> None:
    """Step 3: every rank's trajectories of the step (the group's successes) and new planner references
    (--router.seed-with-planner) into the bank, which is then the same on every rank."""
    new_refs = planner_references(cfg, run, tasks) if cfg.router.seed_with_planner else []
    gathered = life.world.gather(([rollout.to_trajectory(e) for e in episodes], new_refs))
    run.bank.add_group([t for trajs, _ in gathered for t in trajs])
    for ref in (r for _, refs in gathered for r in refs):
        run.bank.add_planner(ref)


def planner_references(cfg: Config, run: Run, tasks: list[envs.Task]) -> list[Trajectory]:
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


def teacher_logprob_fn(cfg: Config, run: Run) -> teacher.LogprobFn:
    temperature = cfg.rollout.sampling.temperature
    if cfg.teacher.backend == "vllm":  # prompt_logprobs over [teacher prompt + response], rollout engine
        return teacher.vllm_logprob_fn(run.engine, temperature)
    # the module under DDP: DDP's forward broadcasts buffers (a collective), and ranks score different numbers
    # of matched turns, none on some steps (scale/distributed.py); in the update's precision
    return teacher.hf_logprob_fn(distributed.unwrap(run.model), run.tokenizer.pad_token_id,
                                 cfg.teacher.micro_batch_tokens, temperature, bf16=cfg.grpo.bf16)


# ------------------------------------------------------------------------------------------------------------
# The method's parts


def setup(cfg: Config, life: Lifecycle) -> tuple[Config, Run]:
    """The policy (from the checkpoint on --resume), the frozen KL reference (the initial weights), the
    optimizer and the bank (their state restored by `life.restore`), the rollout engine; and `cfg` with every
    auto the model's size and the device decide filled in (config.resolve_for_model)."""
    world, ckpt, adapters = life.world, life.ckpt, cfg.lora.rank > 0
    model_path = life.model_path()  # an embedded model is built by rank 0; on CUDA the memory plan must fit
    lora.check_resume(cfg.lora, ckpt)  # LoRA: the base from --model, the adapters from the checkpoint
    model, tokenizer = load_model(str(ckpt) if ckpt and not adapters else model_path, device=world.device)
    cfg = resolve_for_model(cfg, sum(p.numel() for p in model.parameters()), world.device.type)
    ref_model = None
    if cfg.grpo.kl_coef > 0 and not adapters:  # KL anchor = the initial model, also after a resume
        ref_model = (load_model(model_path, device=world.device)[0] if ckpt else copy.deepcopy(model)).eval()
        ref_model.requires_grad_(False).to(getattr(torch, cfg.grpo.ref_dtype))  # bf16 on CUDA
    if cfg.grpo.grad_checkpointing == "on":
        model.gradient_checkpointing_enable()
    if adapters:  # student and teacher: base + adapters; the optimizer holds the adapters only
        model = model.to(getattr(torch, cfg.grpo.ref_dtype))  # the frozen base is the reference: its dtype
        model = lora.load_adapters(model, ckpt) if ckpt else lora.add_adapters(model, cfg.lora)
        distributed.print0(world, lora.describe(model, cfg.lora))
    model = distributed.wrap(model, world, cfg.dist.strategy, cfg.grpo.bf16)
    if adapters and cfg.grpo.kl_coef > 0:  # KL anchor = the same model with its adapters off: no copy
        ref_model = lora.AdaptersOff(distributed.unwrap(model))
    elif ref_model is not None:
        ref_model = distributed.wrap_frozen(ref_model, world, cfg.dist.strategy)
    optimizer = torch.optim.AdamW(lora.trainable(model), lr=cfg.grpo.lr, weight_decay=cfg.grpo.weight_decay)
    bank = router.ReferenceBank(cfg.router.archive_size)
    life.restore(model, optimizer, bank)  # --resume: optimizer, bank, RNG and guard counter
    if cfg.rollout.engine == "vllm":  # colocated, one engine per rank on its device; started from the model
        start_from = str(ckpt) if ckpt and not adapters else model_path  # LoRA: the base, then the sync
        engine = VLLMEngine(start_from, tokenizer, cfg.rollout.sampling,
                            gpu_memory_utilization=cfg.rollout.vllm_gpu_memory, seed=cfg.seed + world.rank,
                            torchrun=world.enabled, limits=vllm_limits(cfg, world.world_size),
                            sleep_level=cfg.rollout.vllm_sleep_level)
        engine.sync_weights(model)
        distributed.print0(world, "[vllm] " + ", ".join(f"rank {r}: {where}" for r, where in
                                                        enumerate(world.gather(engine.placement()))))
    else:
        engine = HFEngine(distributed.unwrap(model), tokenizer, cfg.rollout.sampling,
                          cfg.rollout.gen_batch_size, bf16=cfg.grpo.bf16)
    return cfg, Run(train_tasks=life.train_tasks, model=model, tokenizer=tokenizer, ref_model=ref_model,
                    optimizer=optimizer, bank=bank, engine=engine)


def vllm_limits(cfg: Config, world_size: int) -> dict:
    """vLLM sized from the run (scale/vllm_engine.engine_limits): the longest prompt it is given (teacher
    prompts too when it scores the teacher), the response, this rank's share of the rollout batch."""
    longest = max(cfg.rollout.max_prompt_tokens,
                  cfg.teacher.max_prompt_tokens if cfg.teacher.backend == "vllm" else 0)
    batch = -(-cfg.rollout.tasks_per_step * cfg.rollout.group_size // world_size)
    return vllm_engine.engine_limits(longest, cfg.rollout.sampling.max_new_tokens, batch)


def banner(cfg: Config, life: Lifecycle, run: Run) -> None:
    """What the run resolved to, once (rank 0)."""
    world, say = life.world, lambda text: distributed.print0(life.world, text)
    oracle = f" oracle alpha={cfg.teacher.oracle:g}" if cfg.teacher.oracle > 0 else ""
    millions = sum(p.numel() for p in run.model.parameters()) / 1e6
    say(f"[smrc] {cfg.algo}: matcher={cfg.router.matcher} context={cfg.router.context} "
        f"L_SD={cfg.grpo.sd_loss} lambda={cfg.grpo.sd_coef:g}{oracle} | {len(run.train_tasks)} train tasks | "
        f"{millions:.2f}M params on {world.device} x{world.world_size} | steps {life.start}->{cfg.steps} | "
        f"engine {cfg.engines()}")
    if cfg.algo != "grpo" and cfg.preset == "none" and \
            cfg.grpo.sd_coef == default_sd_coef(cfg.algo, cfg.grpo.sd_loss, "none"):
        say(f"[smrc] lambda {cfg.grpo.sd_coef:g} = {cfg.grpo.sd_loss}'s default; to set it for this model: "
            "`python analysis/lambda_pilot.py` (README, 'Setting λ')")
    if cfg.rollout.tasks_per_step % world.world_size:  # allowed: GRPO's statistics stay within a group
        say(distributed.uneven_shard(cfg.rollout.tasks_per_step, world.world_size))


COMMAND_LINE = sys.argv[1:]  # as given (a planner library rewrites sys.argv later): the resume command's

if __name__ == "__main__":
    main(parse_config(COMMAND_LINE, __doc__))
