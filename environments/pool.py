"""Env worker processes (EnvPool), so env time overlaps generation and never hangs.

- `EnvPool(cfg, num_workers, episodes)`: envs built from the environment config `cfg` (`envs.make_env(cfg)`,
  so the pool knows no implementation), in worker processes ('fork' where the OS has it, else 'spawn'; the
  trainer creates the pool before it loads a model or starts an engine, so no CUDA context or compute threads
  exist yet to be copied, as with PyTorch's forked DataLoader workers; 'spawn' would re-import the training
  script, torch included, in every worker), each holding env instances keyed by
  slot (slot s lives on worker s % num_workers, so a slot keeps its loaded games). `reset(slots, tasks)`
  blocks; `step_async(slots, actions)` sends and returns at once, `step_wait()` collects, so the trainer can
  generate for other rows meanwhile. An env call that raises (or answers no `StepResult`) ends that episode
  only: its answer is a lost episode's end (`info['env_error']`), counted as env/errors, the first printed
  with the environment's traceback and the task (the worker survives; the slot's env is rebuilt). A dead or
  silent worker (past cfg.step_timeout_s of the trainer's running time: a job suspended and continued goes
  on) is replaced and its episodes replayed; after MAX_RESTARTS in a row, an `EnvError` (the pool closed).
  num_workers=0 runs the envs in-process (same results, no overlap); -1 (the default) sizes the pool from the
  cores and the episodes stepped at a time (`auto_workers`).
  `pool.stats` counts the seconds the caller spent blocked on envs (`reset_s`, `step_wait_s`) and the seconds
  workers spent computing (`worker_s`), so the trainer can report the env share of step time.
- Workers never outlive the trainer, whatever kills it (SIGKILL included): a forked worker closes its copies
  of the trainer's pipe ends, so the trainer's death is an EOF on its pipe, and on Linux it also asks the
  kernel for SIGKILL when its parent dies (`die_with_parent`, for a worker busy inside an env call).
"""
import ctypes
import multiprocessing as mp
import os
import re
import signal
import sys
import time
import traceback
from pathlib import Path

import envs
from envs import EnvError, StepResult, Task


# what a worker's pipe raises once the trainer is gone (closed, killed, or stopped by a second signal while a
# reply was on its way): the worker then ends quietly, with no traceback on the trainer's stderr
PARENT_GONE = (EOFError, ConnectionError, KeyboardInterrupt)


def die_with_parent(parent_pid: int) -> None:
    """Linux: the kernel sends this process SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG); elsewhere a
    no-op. A parent that died before the request is caught by the pid check."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # no libc prctl: the closed pipe ends still end an idle worker
            pass
    if os.getppid() != parent_pid:
        os._exit(0)


def _worker(conn, cfg, parent_pid: int, inherited: list) -> None:
    # this fork's copies of the trainer's pipe ends: without them, the trainer's death is an EOF
    for c in inherited:
        c.close()
    die_with_parent(parent_pid)
    for s in (signal.SIGTERM, signal.SIGINT):  # the trainer's (scale/preempt.py): it closes the pool
        signal.signal(s, signal.SIG_IGN)
    slots = {}
    while True:
        try:
            cmd, items = conn.recv()
        except PARENT_GONE:
            break
        if cmd == "close":
            break
        t0 = time.perf_counter()
        out = [call(slots, slot, cmd, arg, cfg) for slot, arg in items]
        try:
            conn.send(("ok", out, time.perf_counter() - t0))
        except PARENT_GONE:
            break
    for env in slots.values():
        env.close()


class EnvFailure(str):
    """What an env call that raised (or answered something that is not a `StepResult` with a string
    observation) gives back instead of a result: the environment's own traceback."""


def call(slots: dict, slot: int, cmd: str, arg, cfg) -> StepResult | EnvFailure:
    """reset(arg) or step(arg) on the slot's env (built on first use); a failure is an `EnvFailure` and the
    env is dropped (closed if it can be), so the slot's next reset builds a fresh one."""
    try:
        env = slots.get(slot) or slots.setdefault(slot, envs.make_env(cfg))
        result = env.reset(arg) if cmd == "reset" else env.step(arg)
        if not isinstance(result, StepResult) or not isinstance(result.observation, str) \
                or not isinstance(result.info, dict):
            raise EnvError(f"{cmd} answered {type(result).__name__} {str(result)[:200]!r}, not an "
                           f"envs.StepResult with a str observation and a dict info")
        return result
    except Exception:
        failure = EnvFailure(traceback.format_exc())
    try:
        getattr(slots.pop(slot, None), "close", lambda: None)()
    except Exception:  # a broken env may fail to close too: it is dropped all the same
        pass
    return failure


def failure_site(tb: str) -> str:
    """Where a traceback ends: 'file.py, line N: ExceptionType: message' (its innermost frame, its last
    line)."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', tb)
    last = (tb.strip().splitlines() or ["?"])[-1][:200]
    return f"{Path(frames[-1][0]).name}, line {frames[-1][1]}: {last}" if frames else last


def auto_workers(episodes: int | None = None) -> int:
    """Env workers for `num_workers = -1`: the cores this process may use (divided among the torchrun ranks of
    the node) less one for the trainer, at least 2, at most 32 (so 16 cores and 128 episodes give 15 workers,
    not 2), and no more than the episodes stepped at a time."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cores //= max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    n = min(max(2, cores - 1), 32)
    return max(1, min(n, episodes)) if episodes else n


SUSPENDED_GAP_S = 5.0  # a 1 s poll that returns this much later: the job was suspended, not the worker silent


def poll_running(conn, left: float, tick: float = 1.0) -> tuple[bool, float]:
    """conn.poll(left) that counts only the time this process ran: (answered, seconds left). A suspended job
    (Ctrl-Z, SIGSTOP, a scheduler's suspend: the trainer and its workers stop together) sees one poll return
    long after its tick; that gap is not the worker's silence, so it costs one tick, not the timeout."""
    while left > 0:
        t0 = time.monotonic()
        answered = conn.poll(min(tick, left))
        waited = time.monotonic() - t0
        left -= waited if waited < tick + SUSPENDED_GAP_S else tick
        if answered:
            return True, max(0.0, left)
    return conn.poll(0), 0.0


MAX_RESTARTS = 3  # env worker failures in a row (no answer from any worker between them) before the run stops


class EnvPool:
    def __init__(self, cfg, num_workers: int | None = None, episodes: int | None = None):
        self.cfg = cfg
        n = cfg.num_workers if num_workers is None else num_workers
        self.num_workers = auto_workers(episodes) if n < 0 else n
        self.timeout_s = cfg.step_timeout_s
        self.stats = {"resets": 0, "steps": 0, "reset_s": 0.0, "step_wait_s": 0.0, "worker_s": 0.0}
        # taken by `take_crashes`; env/errors: env calls that raised (each ends its episode, `_checked`)
        self.crashes = {"env/worker_restarts": 0, "env/episodes_replayed": 0, "env/errors": 0}
        self.last_error, self._told = "", False  # where the newest env error was raised; the first printed
        self._tasks: dict[int, Task] = {}
        self._history: dict[int, list[str]] = {}  # each slot's actions since its reset: what a replay replays
        self._pending = None  # the (slots, actions) step_async sent, not yet collected by step_wait
        self._in_a_row = 0  # worker failures since the last answer
        self._local: dict[int, object] = {}
        self._procs, self._conns = [], []
        self._ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        for w in range(self.num_workers):
            self._spawn(w)

    def _spawn(self, w: int) -> None:
        """Start worker w (a new one in place of a dead one)."""
        parent, child = self._ctx.Pipe()
        # spawn inherits none
        inherited = [*self._conns, parent] if self._ctx.get_start_method() == "fork" else []
        proc = self._ctx.Process(target=_worker, args=(child, self.cfg, os.getpid(), inherited), daemon=True)
        proc.start()
        child.close()
        if w < len(self._procs):
            self._procs[w], self._conns[w] = proc, parent
        else:
            self._procs.append(proc)
            self._conns.append(parent)

    def _restart(self, w: int, cmd: str, items: list, error: Exception) -> None:
        """Worker w died or went silent during `cmd`: start a new one, replay its slots' episodes on it
        (reset, then every action since), and send `cmd` again; counted. After MAX_RESTARTS failures in a
        row, an EnvError naming the worker, the task and the game."""
        proc, stuck = self._procs[w], "; ".join(self._describe(s, cmd, a) for s, a in items)
        self._in_a_row += 1
        if self._in_a_row > MAX_RESTARTS:
            self.close(force=True)
            raise EnvError(f"env worker {w} (pid {proc.pid}, exit code {proc.exitcode}) failed during "
                           f"{cmd}, {MAX_RESTARTS} restarts in a row did not help: {error!r}. It was "
                           f"running: {stuck}")
        print(f"[envs] env worker {w} (pid {proc.pid}, exit code {proc.exitcode}) failed during {cmd} "
              f"({error!r}); a new worker replays its episodes. It was running: {stuck}", flush=True)
        proc.kill()
        proc.join(timeout=5)
        self._conns[w].close()
        self._spawn(w)
        replayed = [s for s in sorted(self._tasks) if s % self.num_workers == w]
        for s in replayed:
            for replay_cmd, arg in [("reset", self._tasks[s]), *(("step", a) for a in self._history[s])]:
                self._conns[w].send((replay_cmd, [(s, arg)]))
                if not poll_running(self._conns[w], self.timeout_s)[0] or \
                        isinstance(self._conns[w].recv()[1][0], EnvFailure):
                    self.close(force=True)
                    raise EnvError(f"env worker {w} failed ({error!r}) and its replacement could not replay "
                                   f"slot {s} (task {self._tasks[s].task_id}, game {self._tasks[s].source})")
        self.crashes["env/worker_restarts"] += 1
        self.crashes["env/episodes_replayed"] += len(replayed)
        self._conns[w].send((cmd, items))

    def take_crashes(self) -> dict[str, int]:
        """The worker restarts, replayed episodes and env errors since the last call."""
        out, self.crashes = self.crashes, dict.fromkeys(self.crashes, 0)
        return out

    def _describe(self, slot: int, cmd: str, arg) -> str:
        task = self._tasks.get(slot)
        what = f"reset to task {arg.task_id}" if cmd == "reset" else f"step, action {arg!r}"
        return (f"slot {slot} ({what}; task {task.task_id if task else '?'}, "
                f"game {task.source if task else '?'})")

    def _send(self, cmd: str, slots: list[int], args: list) -> None:
        if self.num_workers and not self._conns:
            raise EnvError("EnvPool is closed (a worker failed earlier, or close() was called)")
        per_worker = {}
        for slot, arg in zip(slots, args):
            per_worker.setdefault(slot % max(1, self.num_workers), []).append((slot, arg))
        if self.num_workers:
            for w, items in per_worker.items():
                try:
                    self._conns[w].send((cmd, items))
                except OSError as e:  # the worker died since its last answer
                    self._restart(w, cmd, items, e)
        self._sent = (cmd, per_worker)

    def _collect(self, slots: list[int]) -> list[StepResult]:
        cmd, per_worker = self._sent
        results = {}
        if not self.num_workers:  # in-process: the work happens here
            t0 = time.perf_counter()
            for slot, arg in per_worker.get(0, []):
                results[slot] = self._checked(slot, cmd, arg, call(self._local, slot, cmd, arg, self.cfg))
            self.stats["worker_s"] += time.perf_counter() - t0
            return [results[s] for s in slots]
        left = self.timeout_s  # shared by the workers: all answers within timeout_s of running time
        for w, items in per_worker.items():
            while True:
                try:
                    answered, left = poll_running(self._conns[w], left)
                    if not answered:
                        raise TimeoutError(f"no answer within {self.timeout_s:.0f} s (cfg.step_timeout_s)")
                    _, payload, seconds = self._conns[w].recv()
                    break
                except (EOFError, OSError, TimeoutError) as e:  # dead or silent: a new worker replays
                    self._restart(w, cmd, items, e)
                    left = self.timeout_s
            self._in_a_row = 0
            self.stats["worker_s"] += seconds
            results.update((slot, self._checked(slot, cmd, arg, r)) for (slot, arg), r in zip(items, payload))
        return [results[s] for s in slots]

    def _checked(self, slot: int, cmd: str, arg, result: StepResult | EnvFailure) -> StepResult:
        """The env's answer, or for a call that failed the end of a lost episode: done, not won, reward 0,
        info['env_error'] naming where the environment raised. Counted (env/errors); the first one is printed
        with the environment's traceback and the task, later ones are counted only."""
        if not isinstance(result, EnvFailure):
            return result
        where = failure_site(result)
        self.crashes["env/errors"] += 1
        self.last_error = f"{where}, on {self._describe(slot, cmd, arg)}"
        if not self._told:
            self._told = True
            print(f"[envs] the environment raised on {self._describe(slot, cmd, arg)}; that episode ends as "
                  f"lost (reward 0, kept in its GRPO group) and the run goes on; env/errors counts them, "
                  f"only this first one is printed:\n{result.rstrip()}", flush=True)
        task = self._tasks.get(slot)
        return StepResult("", [], 0.0, True, False, 0.0, "", (),
                          {"env_error": where, "task": task.task_id if task else ""})

    def reset(self, slots: list[int], tasks: list[Task]) -> list[StepResult]:
        assert self._pending is None, "reset() while a step_async() is pending; call step_wait() first"
        t0 = time.perf_counter()
        self._tasks.update(zip(slots, tasks))
        self._history.update((s, []) for s in slots)
        self._send("reset", slots, tasks)
        out = self._collect(slots)
        self.stats["resets"] += len(slots)
        self.stats["reset_s"] += time.perf_counter() - t0
        return out

    def step_async(self, slots: list[int], actions: list[str]) -> None:
        assert self._pending is None, "step_async() twice without step_wait()"
        assert len(set(slots)) == len(slots), "a slot can take one action per step"
        self._send("step", slots, actions)
        self._pending = (list(slots), list(actions))

    def step_wait(self) -> list[StepResult]:
        assert self._pending is not None, "step_wait() without step_async()"
        (slots, actions), self._pending = self._pending, None
        t0 = time.perf_counter()
        out = self._collect(slots)
        for s, a in zip(slots, actions):
            self._history[s].append(a)
        self.stats["steps"] += len(slots)
        self.stats["step_wait_s"] += time.perf_counter() - t0
        return out

    def step(self, slots: list[int], actions: list[str]) -> list[StepResult]:
        self.step_async(slots, actions)
        return self.step_wait()

    def close(self, force: bool = False) -> None:
        for conn in self._conns if not force else []:
            try:
                conn.send(("close", None))
            except OSError:  # the worker is already gone
                pass
        for proc in self._procs:
            proc.join(timeout=0 if force else 5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        for env in self._local.values():
            env.close()
        self._local.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
