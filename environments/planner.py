"""The expert planner in its own process, so a slow plan is a reported timeout, never a hang.

`Planner(cfg).plan(task, actions, timeout_s)` restores the state reached by replaying `actions` from reset in
an env built from `cfg` (`envs.make_env`), then asks that env for its expert plan (`env.expert_plan()`: for
ALFWorld the engine's Fast Downward planner, what `policy_commands` returns). The process is killed when the
time limit passes (time the trainer ran, `pool.poll_running`: a suspended job's pause does not count; a
planner call on official ALFWorld games can run for minutes, and one in-process call has hung for 10+ minutes)
and restarted on the next call. Results are cached in-process per (task_id, tuple(actions)); timeouts are
cached with their limit, so only a longer limit retries. `prefetch(task, actions, timeout_s)` queues a request
for a background thread, so the trainer can plan the next tasks while it generates: a later `plan` of the same
request returns the cached result, or waits only for the plan in flight (one request at a time goes to the
process). The process dies with its parent, whatever kills it (SIGKILL included), also during its start-up: it
is a fresh interpreter (`_BOOT`) that asks for the Linux parent-death signal before it imports anything (then
`die_with_parent` checks the parent is still there), and it holds no copy of the parent's pipe end or other
files (only its own end is passed), so the parent's death is also an EOF. Its start-up imports only the env,
never the training script.
"""
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection, Pipe

import envs
from environments.pool import PARENT_GONE, die_with_parent, poll_running
from envs import EnvError, PlanResult, Task


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the planner process's first lines: the parent-death signal (1 = PR_SET_PDEATHSIG, 9 = SIGKILL) before any
# import that takes time, so a trainer killed during the start-up takes the planner with it at once; SIGTERM
# and SIGINT are the trainer's to handle (scale/preempt.py)
_BOOT = ("import ctypes, os, signal, sys\n"
         "if sys.platform.startswith('linux'): ctypes.CDLL(None).prctl(1, 9)\n"
         "for s in (signal.SIGTERM, signal.SIGINT): signal.signal(s, signal.SIG_IGN)\n"
         "if os.getppid() != int(sys.argv[1]): os._exit(0)\n"
         "sys.path.insert(0, sys.argv[2])\n"
         "from environments.planner import serve\n"
         "serve(int(sys.argv[3]), int(sys.argv[1]))\n")


def serve(fd: int, parent_pid: int) -> None:
    """The planner process: its env config arrives first on the pipe `fd`, then plan requests."""
    conn = Connection(fd)
    _planner_worker(conn, conn.recv(), parent_pid)


def _planner_worker(conn, cfg, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    env = envs.make_env(cfg)
    conn.send("ready")
    while True:
        try:
            task, actions = conn.recv()
        except PARENT_GONE:
            break
        try:
            results = envs.replay(env, task, actions)
            if len(results) <= len(actions):
                raise EnvError(f"the episode ended (won) after {len(results) - 1} of {len(actions)} "
                               "replayed actions")
            if results[-1].won:
                reply = ("ok", [], "already won")
            else:
                plan = env.expert_plan()
                reply = ("ok", plan, "") if plan else ("unsolvable", None, "the planner found no plan")
        except Exception:
            reply = ("error", None, traceback.format_exc())
        try:
            conn.send(reply)
        except PARENT_GONE:
            break


class Planner:
    """One planner process, started on first use and restarted after a timeout (it is killed then)."""

    def __init__(self, cfg):
        self.cfg = cfg                             # the env config the planner process builds its env from
        self._proc, self._conn = None, None
        self.cache: dict[tuple, PlanResult] = {}  # (task_id, actions) -> ok / unsolvable / timeout result
        self._limit: dict[tuple, float] = {}      # (task_id, actions) -> the limit a cached timeout ran under
        self._lock = threading.Lock()             # one request at a time on the planner process
        self._queue: queue.Queue = queue.Queue()  # prefetched requests for the background thread
        self._thread: threading.Thread | None = None

    def _start(self) -> None:
        self._conn, child = Pipe()
        args = [str(os.getpid()), REPO, str(child.fileno())]
        self._proc = subprocess.Popen([sys.executable, "-c", _BOOT, *args],
                                      pass_fds=(child.fileno(),))  # the only file it inherits
        child.close()
        try:
            self._conn.send(self.cfg)
            ready = poll_running(self._conn, 120)[0] and self._conn.recv() == "ready"
        except (EOFError, OSError):  # it died while starting
            ready = False
        if not ready:
            self._kill()
            raise EnvError("the planner process did not start within 120 s")

    def prefetch(self, task: Task, actions: list[str], timeout_s: float) -> None:
        """Plan in the background; `plan` of the same request later returns the result (or waits for it)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._background, daemon=True)
            self._thread.start()
        self._queue.put((task, list(actions), timeout_s))

    def _background(self) -> None:
        while True:
            task, actions, timeout_s = self._queue.get()
            try:
                self.plan(task, actions, timeout_s)
            except Exception:  # noqa: BLE001 (the caller's own `plan` of this request reports it)
                pass

    def plan(self, task: Task, actions: list[str], timeout_s: float) -> PlanResult:
        with self._lock:
            return self._plan(task, actions, timeout_s)

    def _plan(self, task: Task, actions: list[str], timeout_s: float) -> PlanResult:
        key = (task.task_id, tuple(actions))
        hit = self.cache.get(key)
        if hit and (hit.status != "timeout" or self._limit[key] >= timeout_s):
            return hit
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        t0 = time.perf_counter()
        self._conn.send((task, list(actions)))
        try:
            ready, _ = poll_running(self._conn, timeout_s)  # a suspended job's pause is not planner time
            status, plan, message = (self._conn.recv() if ready
                                     else ("timeout", None, f"no plan within {timeout_s} s"))
        except (EOFError, OSError) as e:
            died = f"planner process died ({e!r}, exit code {self._proc.poll()})"
            status, plan, message = "error", None, died
        if status in ("timeout", "error"):
            self._kill()  # a stuck planner cannot be interrupted in-process; the next call starts a fresh one
        result = PlanResult(plan, status, time.perf_counter() - t0, message)
        if status != "error":
            self.cache[key], self._limit[key] = result, timeout_s
        return result

    def close(self) -> None:
        """Drop the prefetched requests not started yet and end the process
        (the next `plan` starts a new one)."""
        while not self._queue.empty():
            self._queue.get_nowait()
        self._kill()

    def _kill(self) -> None:
        """End the process. Also called by `close` (at exit) while the prefetch thread may be inside `_plan`:
        the handles are taken first, so each is closed once and none is read after it is gone."""
        proc, conn = self._proc, self._conn
        self._proc, self._conn = None, None
        if proc is not None:
            proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # not reaped yet: it is killed, nothing is left to wait for
                pass
        if conn is not None:
            conn.close()
