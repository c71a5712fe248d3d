"""Tests of environments/{pool,planner}.py on the real ALFWorld engine (generated games): EnvPool equals
in-process envs, worker errors name the task and the action and never hang, planner timeouts are reported and
prefetched plans reused, no worker or planner outlives a SIGKILLed trainer, a suspended job is not a silent
worker, the pool's size follows the cores, and action normalisation stays linear on a 1 MB action.

Run: .venv/bin/python -m pytest tests/test_envs_pool.py -q
"""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import envs
from environments import alfworld
from environments.alfworld import AlfworldConfig, AlfworldEnv
from environments.planner import Planner
from environments.pool import EnvPool
from test_envs import REPO, cfg, tasks  # noqa: F401 (the fixtures, by name: each module gets its own)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("alfworld") is None or
                                importlib.util.find_spec("textworld") is None,
                                reason="alfworld not installed")


# ---------------------------------------------------------------------------------------------- pool, planner


def test_envpool_matches_in_process(cfg, tasks):
    scripts = [["look", "fly", "inventory"], ["go to " + AlfworldEnv(cfg).reset(tasks[1]).admissible[0][6:]],
               envs.plan(cfg, tasks[3], [], 60).actions]
    chosen = [tasks[0], tasks[1], tasks[3]]
    results = {}
    for n in (0, 2):
        with EnvPool(cfg, num_workers=n) as pool:
            out = pool.reset([0, 1, 2], chosen)
            for t in range(max(map(len, scripts))):
                slots = [s for s in range(3) if t < len(scripts[s])]
                pool.step_async(slots, [scripts[s][t] for s in slots])
                out += pool.step_wait()
            assert pool.stats["resets"] == 3 and pool.stats["steps"] == sum(map(len, scripts))
            assert pool.stats["reset_s"] > 0 and pool.stats["step_wait_s"] > 0
        results[n] = out
    assert results[0] == results[2] and out[-1].won


def test_envpool_errors_name_task_and_action_and_never_hang(cfg, tasks):
    pool = EnvPool(cfg, num_workers=2)
    pool.reset([0, 1], tasks[:2])
    lost = pool.step([0, 1], ["look", None])[1]  # the env raised: that episode ends, lost; the other goes on
    assert lost.done and not lost.won and lost.reward == 0 and lost.info["task"] == "alfworld/gen-train/00001"
    assert "slot 1 (step, action None; task alfworld/gen-train/00001" in pool.last_error
    pool.reset([1], tasks[1:2])  # the slot's env was dropped: a fresh one plays the next episode
    assert pool.step([0], ["look"])[0].observation.startswith("You are in the middle")  # the worker survived
    fresh = EnvPool(cfg, num_workers=0)
    expected = fresh.reset([1], tasks[1:2]) and fresh.step([1], ["look"])
    pool._procs[1].kill()  # a crashed worker: a new one replays its episode (reset + its actions so far)
    assert pool.step([0, 1], ["look", "look"])[1] == expected[0]
    assert pool.take_crashes() == {"env/worker_restarts": 1, "env/episodes_replayed": 1, "env/errors": 1}
    assert pool.take_crashes() == {"env/worker_restarts": 0, "env/episodes_replayed": 0, "env/errors": 0}
    pool.close()
    with pytest.raises(envs.EnvError, match="closed"):
        pool.step([0], ["look"])
    slow = EnvPool(AlfworldConfig(**{**cfg.__dict__, "step_timeout_s": 0.01}), 1)
    with pytest.raises(envs.EnvError, match="no answer within"):  # its replacement is as slow: stop
        slow.reset([0], tasks[:1])


def test_planner_timeout_is_reported_not_hung(tasks):
    import time
    planner = Planner(AlfworldConfig(max_steps=10**9))
    t0 = time.perf_counter()
    r = planner.plan(tasks[5], [], 0.001)
    assert r.status == "timeout" and r.actions is None and time.perf_counter() - t0 < 30
    assert planner.plan(tasks[5], [], 0.001) is r  # cached with its limit
    ok = planner.plan(tasks[5], [], 60)  # a longer limit retries, in a fresh planner process
    assert ok.status == "ok" and ok.actions
    bad = planner.plan(tasks[5], ok.actions + ["look"], 60)
    assert bad.status == "error" and "episode ended" in bad.message
    planner.close()


def test_normalise_action_is_linear_on_a_1mb_action():
    """The old `_PUT` backtracked quadratically when `.` met a newline (4.8 s on 40 KB)."""
    for action in ("put " + "x on " * 200_000 + "\n\nz", "move " + "a to \n" * 170_000 + "z",
                   "put " + "a" * 10**6):
        t0 = time.perf_counter()
        assert alfworld.normalise_action(action, ["look"]) == action  # not admissible: as is
        # the regexes alone, without the length bound
        alfworld._PUT.match(action), alfworld._MOVE.match(action)
        assert time.perf_counter() - t0 < 1, len(action)
    assert (alfworld.normalise_action("put mug 1 in\nshelf 1", ["move mug 1 to shelf 1"])
            == "put mug 1 in\nshelf 1")


ORPHAN_SCRIPT = """
import json, sys, time
sys.path.insert(0, {repo!r})
import envs
from environments.alfworld import AlfworldConfig
from environments.planner import Planner
from environments.pool import EnvPool
cfg = AlfworldConfig(num_train_games=6, num_eval_games=6, cache_dir={cache!r})
pool = EnvPool(cfg, num_workers=2)  # first, as in smrc.main: the workers fork before anything else exists
tasks = envs.load_tasks(cfg, "train")
pool.reset([0, 1], tasks[:2])
planner = Planner(cfg)
assert planner.plan(tasks[0], [], 120).status == "ok"
print(json.dumps([p.pid for p in pool._procs] + [planner._proc.pid]), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_and_planner_exit_when_the_trainer_is_sigkilled(cfg, tasks):
    script = ORPHAN_SCRIPT.format(repo=REPO, cache=cfg.cache_dir)
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = json.loads(next(line for line in trainer.stdout if line.startswith("[")))
    assert len(pids) == 3 and all(_alive(p) for p in pids)
    os.kill(trainer.pid, signal.SIGKILL)
    trainer.wait()
    deadline = time.time() + 5
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if _alive(p)]
    for pid in left:  # do not leak them into the rest of the test session
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} of 2 env workers + planner outlived the SIGKILLed trainer by 5 s"


SUSPEND_SCRIPT = """
import multiprocessing as mp, sys, time
sys.path.insert(0, {repo!r})
from environments.pool import poll_running


def worker(conn):
    t0 = time.process_time()
    while time.process_time() - t0 < 1.0:  # 1 s of CPU time: it makes no progress while the job is stopped
        pass
    conn.send("done")


if __name__ == "__main__":
    ours, theirs = mp.Pipe()
    mp.get_context("fork").Process(target=worker, args=(theirs,), daemon=True).start()
    print("waiting", flush=True)
    answered, left = poll_running(ours, {timeout})
    print(answered, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and SIGSTOP")
@pytest.mark.parametrize("timeout, suspend, answered", [(10.0, 12.0, True), (0.5, 0.0, False)])
def test_a_suspended_job_is_not_a_silent_worker(timeout, suspend, answered):
    """Ctrl-Z or a scheduler's suspend (SIGSTOP, then SIGCONT, to the trainer and its workers together): the
    wait for a worker's answer goes on, where a wall-clock deadline would call the worker silent and end the
    run (a sweep run died so); a worker that is silent while the trainer runs still times out."""
    job = subprocess.Popen([sys.executable, "-c", SUSPEND_SCRIPT.format(repo=REPO, timeout=timeout)],
                           stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert job.stdout.readline().strip() == "waiting"
    if suspend:
        os.killpg(job.pid, signal.SIGSTOP)
        time.sleep(suspend)
        os.killpg(job.pid, signal.SIGCONT)
    assert job.communicate(timeout=60)[0].strip() == str(answered)


def test_pool_size_follows_the_cores_ranks_and_episodes(monkeypatch):
    from environments.pool import auto_workers
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert auto_workers(128) == 15          # a 16-core GPU node: not 2 workers for 128 episodes
    assert auto_workers(4) == 4             # no idle workers beyond the episodes
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert auto_workers(16) == 2            # 8 ranks share the node's 16 cores
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(256)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert auto_workers(1000) == 32
    cfg = AlfworldConfig(source="generated", room_size="small", num_train_games=2, num_eval_games=1)
    assert cfg.num_workers == -1
    with EnvPool(cfg, episodes=3) as pool:  # the default config sizes the pool itself
        assert pool.num_workers == 3
    with EnvPool(cfg, num_workers=1, episodes=3) as pool:  # an explicit number wins
        assert pool.num_workers == 1


def test_prefetched_plan_is_the_plan_and_a_later_call_does_not_replan(tasks):
    planner = Planner(AlfworldConfig(max_steps=10**9))
    planner.prefetch(tasks[3], [], 60)
    planner.prefetch(tasks[4], [], 60)
    deadline = time.time() + 90
    while len(planner.cache) < 2 and time.time() < deadline:  # the background thread fills the cache
        time.sleep(0.1)
    cached = planner.cache[(tasks[4].task_id, ())]
    assert planner.plan(tasks[4], [], 60) is cached and cached.status == "ok" and cached.actions
    fresh = Planner(AlfworldConfig(max_steps=10**9))
    assert fresh.plan(tasks[4], [], 60).actions == cached.actions  # the same plan as a foreground call
    fresh.close()
    planner.prefetch(tasks[5], [], 60)
    planner.close()  # drops queued requests; the next plan starts a new process
    assert planner.plan(tasks[3], [], 60) is planner.cache[(tasks[3].task_id, ())]
    planner.close()


@pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)
def test_a_worker_killed_mid_run_is_replaced_and_the_run_ends_as_without_the_crash(tmp_path):
    """kill -9 one env worker of a running trainer: a new worker replays its episodes, the run ends (exit 0)
    with every metric of an uninterrupted run of the same seed (times and the crash counts aside), and the
    restart is counted in metrics.jsonl."""
    run = [sys.executable, os.path.join(REPO, "smrc.py"), "--preset", "tiny", "--steps", "3", "--save-every",
           "3", "--rollout.tasks-per-step", "2", "--rollout.group-size", "2", "--alfworld.max-steps", "6",
           "--alfworld.num-workers", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    whole = subprocess.run([*run, "--output-dir", str(tmp_path / "whole")], cwd=REPO, capture_output=True,
                           text=True, env=env, timeout=900)
    assert whole.returncode == 0, whole.stderr[-3000:]
    out = tmp_path / "crash"
    trainer = subprocess.Popen([*run, "--output-dir", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    t0 = time.monotonic()
    while not (out / "metrics.jsonl").exists():
        assert trainer.poll() is None and time.monotonic() - t0 < 600
        time.sleep(0.1)
    children = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(trainer.pid)], capture_output=True,
                              text=True).stdout.splitlines()
    workers = [int(c.split()[0]) for c in children if "smrc.py" in c]  # forked: the trainer's command line
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)
    stdout, stderr = trainer.communicate(timeout=900)
    assert trainer.returncode == 0, stderr[-3000:]

    def rows(run_dir):
        return [{k: v for k, v in json.loads(x).items() if not k.startswith(("time/", "mem/", "env/"))
                 and not k.endswith("_time_s")} for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows(out) == rows(tmp_path / "whole")
    counted = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["env/worker_restarts"] for r in counted) == 1 and "a new worker replays" in stdout
