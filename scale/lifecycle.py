"""A training run's lifecycle: everything smrc.py's loop needs that is not the method.

smrc.py reaches it through `started` (the run's context) and the `Lifecycle` it yields:
  before the loop  the settings fit together, the data and the model exist (scale/preflight.py); torchrun's
                   process group, with bounded collectives and one error line for the whole job
                   (scale/distributed.py); the run folder locked, the checkpoint to resume verified,
                   config.json recorded; the env workers forked before any model exists (environments/pool.py)
  setting up       `model_path`: an embedded model built once (rank 0) and, on CUDA, the memory plan checked
                   (scale/memory_plan.py); `restore`: the trainer state of the checkpoint (weights are loaded
                   from it by smrc.setup), newer folders set aside, logs trimmed to it, trackers opened
  each step        `phase`: per-phase peak memory and the out-of-memory watchdog (scale/memory.py);
                   `end_step`: every rank's numbers gathered into one metrics row, the turn archive and the
                   trackers (scale/monitor.py, run_logs.py, trackers.py), validation on the fixed panel with
                   the best weights kept (--eval-every), a checkpoint (--save-every, scale/checkpoint.py), and
                   the stop a signal asked for
  a signal         SIGTERM / SIGINT: the step in flight ends, a checkpoint if it fits the grace period (the
                   shorter of --preempt-grace-s and torchrun's shutdown timeout, said at the start), then one
                   line with the command that continues the run, the same launch (scale/preempt.py,
                   scale/launcher.py); a stop in the last step says the run is complete
  the end          trackers, watchdog and engine closed, one line naming the checkpoint, the command that
                   shows its before/after and the one that draws the run (analysis/before_after.py)
"""
import dataclasses
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import rollout
import router
from embedded.warmstart import resolve
from environments.pool import EnvPool
from records import StepRecord
from scale import distributed
from scale.checkpoint import (initial_weights, latest_checkpoint, load_trainer_state, save_checkpoint,
                              set_aside_newer)
from scale.distributed import print0
from scale.launcher import resume_command, torchrun_grace_s
from scale.memory import Memory, return_freed_memory
from scale.memory_plan import check_fits
from scale.monitor import Validation, log_step, save_best, validate
from scale.preempt import Preempted, StopSignals
from scale.preflight import check_inputs, check_world, validate_config
from scale.run_folder import open_run
from scale.run_logs import archive_rows, trim_logs
from scale.safe_io import stop_on_io_error
from scale.seeds import seed_step
from scale.trackers import Trackers
from scale.vllm_engine import sync_warning


@contextmanager
def started(cfg, argv: list[str]):
    """The run's context, from the checks to the closed workers: yields the `Lifecycle` of a run whose inputs
    are there, whose folder is this run's alone and whose env workers run. Any error is one line (by rank 0
    under torchrun); a stop signal ends it with the command that continues it (`argv`: the command line as
    given)."""
    with distributed.OneErrorLine(lambda: latest_checkpoint(Path(cfg.output_dir))) as once:
        validate_config(cfg)
        with distributed.rank0_stdout():  # every rank loads the same tasks: their lines once
            tasks = check_inputs(cfg)
        world = once.world = distributed.init_distributed(cfg.device, cfg.dist.timeout_s)
        check_world(cfg, world)
        try:
            # the checkpoint to resume is verified before the config is recorded, with the initial weights'
            # sha256 (an embedded model is built then, by rank 0)
            with open_run(cfg, world, lambda: initial_weights(cfg.model, resolve(cfg.model))) as opened:
                ckpt, resumed = opened  # the checkpoint (None: from step 0); resumed(): its resumes row
                seed_step(cfg.seed, 0, world.rank)
                # first: the workers fork before any model or engine exists; sized for this rank's episodes
                episodes = -(-cfg.rollout.tasks_per_step // world.world_size) * cfg.rollout.group_size
                pool = EnvPool(cfg.env_cfg, episodes=episodes)
                try:
                    yield Lifecycle(cfg, world, pool, tasks, ckpt, resumed)
                finally:
                    pool.close()
                    distributed.close(world)
        except Preempted as p:  # the lock is released and the workers are gone: say where the run stands
            name, newest = signal.Signals(p.signum).name, latest_checkpoint(Path(cfg.output_dir))
            print0(world, f"[smrc] stopped by {name} after step {p.step}{p.note}; newest checkpoint "
                          f"{newest}; continue with: {resume_command(argv)}")
            sys.exit(128 + p.signum)


class Lifecycle:
    """What a run keeps besides the method's parts: the process group (`world`), the env workers (`pool`),
    the train tasks, the checkpoint it resumed from (`ckpt`) and the step to start at, the guard counter a
    checkpoint saves, the memory watchdog, the trackers, the validation panel and the newest save."""

    def __init__(self, cfg, world, pool, tasks: tuple[list, list], ckpt: Path | None, resumed=lambda: None):
        self.cfg, self.world, self.pool, self.ckpt, self.resumed = cfg, world, pool, ckpt, resumed
        self.train_tasks, panel = tasks
        self.out = Path(cfg.output_dir)
        self.start = 0
        self.nonfinite = 0               # optimizer steps skipped in a row (non-finite loss or grad norm)
        self.saved = (0, 0.0)            # (step, seconds) of the newest checkpoint this process wrote
        self.memory = Memory(world.device)
        self.trackers = Trackers((), self.out)
        self.validation = Validation(panel, cfg.rollout, cfg.env_cfg, cfg.eval_temperature, cfg.seed,
                                     self.out, cfg.steps)
        self.stop: StopSignals | None = None

    def model_path(self) -> str:
        """--model's folder: an embedded model is built once, by rank 0; on CUDA the memory plan must fit."""
        if self.world.is_main:
            resolve(self.cfg.model)
        self.world.barrier()
        path = resolve(self.cfg.model)
        check_fits(self.cfg, path, self.world.device, self.world.world_size)
        if self.cfg.resume and self.ckpt is None:
            print0(self.world, f"[resume] no checkpoint in {self.out}; starting from step 0")
        return path

    def restore(self, model, optimizer, bank) -> None:
        """The trainer state of the checkpoint to resume (optimizer, bank, RNG, guard counter; nothing on a
        fresh run); newer checkpoint folders set aside and the logs trimmed to it; the trackers opened."""
        if self.world.device.type == "cpu":  # the resident size follows the live tensors (scale/memory.py)
            return_freed_memory()
        guards = {"nonfinite_streak": 0}
        self.start = load_trainer_state(self.ckpt, model, optimizer, bank, guards) if self.ckpt else 0
        self.nonfinite = guards["nonfinite_streak"]
        if self.world.is_main:
            with stop_on_io_error(self.out):
                self.resumed()  # the resume has started: its row in config.resumes.jsonl (rank 0)
                set_aside_newer(self.out, self.start)
                trim_logs(self.out, self.start)
        cfg = self.cfg  # a resume keeps the config the run started with
        config = None if self.ckpt else {**dataclasses.asdict(cfg), "resolved": cfg.resolved()}
        self.trackers = Trackers(cfg.log_with if self.world.is_main else (), self.out, config, self.start)

    def seed(self, step: int):
        """Everything seeded for `step` on this rank (torch, numpy, random); returns the router's rng."""
        return seed_step(self.cfg.seed, step, self.world.rank)

    def phase(self, name: str):
        """Peak memory of a phase of the step (mem/<phase>_peak_gb)."""
        return self.memory.phase(name)

    def at(self, step: int, phase: str) -> None:
        """Where the step is, named if a collective times out."""
        self.world.at(f"step {step + 1}: {phase}")

    @contextmanager
    def running(self, run, view=None):
        """The training loop's context: the memory watchdog and the stop signals on; at the end the trackers
        (with the run's `view` writer: wandb and MLflow log the page), the watchdog and `run`'s planner env
        and engine closed, and the line naming the final checkpoint."""
        self.memory.start()  # a watchdog: one line, not a silent kill, if memory runs out
        self.saved = (self.start, 0.0)
        try:
            with StopSignals(self.grace_s()) as self.stop:  # SIGTERM / SIGINT: stop between steps
                yield
        finally:
            self.stop = None
            self.memory.close()
            self.trackers.close(view=view)  # wandb, MLflow: the run view too (evaluate.py view)
            if run.replay_env is not None:
                run.replay_env.close()
            getattr(run.engine, "shutdown", lambda: None)()  # before the process group goes (vLLM's hook)
        final = latest_checkpoint(self.out)
        print0(self.world, f"[smrc] done: checkpoint {final}, metrics {self.out / 'metrics.jsonl'}; "
                           + suggestion(self.out, self.cfg.preset, len(self.train_tasks)))

    def grace_s(self) -> float:
        """The seconds a stop signal leaves: --preempt-grace-s, or torchrun's shutdown timeout where that is
        shorter (its agent SIGKILLs the ranks then; said once, with the option that lengthens it)."""
        ours, torchrun = self.cfg.preempt_grace_s, torchrun_grace_s()
        if torchrun is None or torchrun >= ours:
            return ours
        print0(self.world, f"[smrc] torchrun kills the ranks {torchrun:g} s after it passes on SIGTERM (its "
                           f"--shutdown-timeout), before --preempt-grace-s {ours:g}: a step still in flight "
                           f"then is lost on preemption; launch with torchrun --shutdown-timeout {ours:g}")
        return torchrun

    def nothing_to_train(self, step: int, episodes: list, counters: dict) -> None:
        """No rank has a turn because every prompt was over --rollout.max-prompt-tokens, or more of the step's
        episodes than the environment's max_error_share were lost to env errors: one error line."""
        self.too_many_env_errors(step, episodes)
        turns = sum(len(e.turns) for e in episodes)
        if self.world.all_max(turns) == 0 and self.world.all_max(counters["prompt_too_long"]):  # all decide
            n = int(self.world.all_sum(len(episodes)))
            raise SystemExit(1 if not self.world.is_main else  # rank 0 says it
                             f"error: --rollout.max-prompt-tokens {self.cfg.rollout.max_prompt_tokens} fits "
                             f"no prompt: all {n} episodes of step {step + 1} ended before their first turn, "
                             f"so there is nothing to train on; raise it")

    def too_many_env_errors(self, step: int, episodes: list) -> None:
        """Every rank's episodes lost to an env error (environments/pool.py): past the environment's
        max_error_share of the step's episodes, the run stops with one line naming the environment, where its
        newest error was raised and the newest checkpoint (every rank takes the same decision)."""
        lost = self.world.all_sum(sum(e.stop_reason == "env_error" for e in episodes))
        n, share = self.world.all_sum(len(episodes)), self.cfg.env_cfg.max_error_share
        if not lost or lost <= share * n:
            return
        where = [w for w in self.world.gather(self.pool.last_error) if w]
        flag = f"--{self.cfg.env if self.cfg.env in ('alfworld', 'webshop', 'textworld') else 'external'}"
        raise SystemExit(1 if not self.world.is_main else  # rank 0 says it
                         f"error: --env {self.cfg.env}: {int(lost)} of {int(n)} episodes of step {step + 1} "
                         f"ended on an environment error, more than {flag}.max-error-share {share:g}; the "
                         f"newest: {where[-1] if where else '?'}; newest checkpoint "
                         f"{latest_checkpoint(self.out)}")

    def end_step(self, run, step: int, record: StepRecord) -> None:
        """After step `step` (1-based) of the method: its record, validation and a checkpoint when due, and
        the stop a signal asked for."""
        self.nonfinite = record.actor_metrics["actor/nonfinite_streak"]
        if self.cfg.rollout.engine == "vllm" and (line := sync_warning(
                record.actor_metrics["actor/rollout_logprob_gap"], step, self.cfg.rollout.vllm_sleep_level)):
            print0(self.world, line)  # the samples of the last sync are far from the trainer's weights
        self.at(step - 1, "metrics")
        self.report(run, step, record)
        cfg = self.cfg
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
            self.at(step - 1, "validation")
            row = validate(self.validation, run.engine, self.pool, run.tokenizer, step, self.world)
            self.trackers.log(row)  # None on ranks > 0
            save_best(self.out, run.model, run.tokenizer, cfg, row, self.world)
        if step % cfg.save_every == 0 or step == cfg.steps:
            self.at(step - 1, "checkpoint")
            self.save(run, step)
        if self.stop is not None and self.stop.requested(self.world):
            self.stop_after(run, step)

    def report(self, run, step: int, record: StepRecord) -> None:
        """The step's record: every rank's numbers gathered; rank 0 writes the metrics row, the archive and
        the trackers."""
        episodes, times = record.episodes, record.times
        turns = [t for e in episodes for t in e.turns]
        mem = self.memory.metrics()  # mem/<phase>_peak_gb: resident memory on CPU, allocated on CUDA
        on_cuda = self.world.device.type == "cuda"
        local = {"rollout": rollout.episode_stats(episodes), "counters": record.env_counters,
                 "sd": record.teacher_counts | record.measured_counts,
                 "rows": archive_rows(step, episodes, record.audited_matches, run.tokenizer,
                                      self.cfg.archive_token_turns, self.cfg.router.context),
                 "route": router.route_metrics(turns, run.bank),
                 "times": {**times, "peak_gpu_mem_gb": max(mem.values()) if on_cuda else 0.0},
                 "mem": mem, "tokens": sum(len(t.prompt_ids) + len(t.response_ids) for t in turns),
                 "env": self.pool.take_crashes()}  # env/worker_restarts, env/episodes_replayed
        everyone = self.world.gather(local)
        if self.world.is_main:
            self.trackers.log(log_step(self.out, step, self.cfg.steps, everyone, record.actor_metrics,
                                       run.bank, self.cfg.archive_max_turns))

    def save(self, run, step: int) -> None:
        t0 = time.perf_counter()
        save_checkpoint(self.out, step, run.model, run.tokenizer, run.optimizer, run.bank, self.cfg,
                        self.world, guards={"nonfinite_streak": self.nonfinite})
        self.saved = (step, time.perf_counter() - t0)

    def stop_after(self, run, step: int) -> None:
        """The stop a signal asked for, after `step`: a checkpoint of it if the newest is older and the save
        (timed as the last one) fits the grace period; then Preempted, which `started` reports."""
        if step >= self.cfg.steps:  # the last step is saved: nothing is left to continue
            name = signal.Signals(self.stop.signum or signal.SIGTERM).name
            print0(self.world, f"[smrc] {name} came during the last step ({step}): the run is complete")
            return
        newer = self.saved[0] < step
        if newer and self.stop.fits(self.saved[1]):
            self.save(run, step)
        note = "" if not newer or self.saved[0] == step else \
            f"; no checkpoint of step {step}: it would not fit the {self.stop.grace_s:g} s grace " \
            f"(--preempt-grace-s, or torchrun's --shutdown-timeout where shorter)"
        raise Preempted(self.stop.signum or signal.SIGTERM, step, self.saved[0] == step, note)


TINY_MINUTES = 5  # the tiny preset's before-after: 5.1 min on 2 busy CPU cores (docs/results.md, issue 68)
BIG_LIMIT = 32  # a run of more training games than twice this: before-after on this many of each split


def suggestion(out: Path, preset: str, n_train: int) -> str:
    """The end-of-run line's next commands: this run's before-after (its time where measured: the tiny preset;
    a run of many games gets --limit 32 of each split), then its view (curves and turns, analysis/view.py)."""
    limit = f" --limit {BIG_LIMIT}" if n_train > 2 * BIG_LIMIT else ""
    when = f"; about {TINY_MINUTES} min on 2 busy CPU cores" if preset == "tiny" else ""
    games = f"{BIG_LIMIT} of its {n_train}" if limit else f"its {n_train}"
    return (f"before/after (the warm start vs this checkpoint on {games} training games and on held-out games"
            f"{when}): python evaluate.py before-after --run {out}{limit}; curves and turns: "
            f"python evaluate.py view --run {out}")
