"""An environment of your own that fails now and then (environments/pool.py): the failed episode is lost, the
run goes on, and past --external.max-error-share the run stops with one line.

The environment below raises on the second step of seed 1's episodes and answers a dict instead of a string
on the third step of seed 0's: with 2 tasks a step, every episode of a step is lost.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLAKY = '''
class Flaky:
    def reset(self, seed=None, options=None):
        self.seed, self.n = seed, 0
        return "You are in a room.", {"goal": "leave", "admissible_commands": ["wait", "leave"]}

    def step(self, action):
        self.n += 1
        if self.seed == 1 and self.n == 2:
            raise RuntimeError("the server timed out")
        if self.n == 3:
            return {"not": "a string"}, 0.0, False, False, {}
        return "You are in a room.", 0.0, False, False, {"admissible_commands": ["wait", "leave"]}
'''
RAISE_LINE = FLAKY.splitlines().index('            raise RuntimeError("the server timed out")') + 1
RUN = ["--env", "flaky:Flaky", "--preset", "tiny", "--steps", "2", "--save-every", "2",
       "--rollout.tasks-per-step", "2", "--rollout.group-size", "2", "--external.max-steps", "4",
       "--external.num-train-tasks", "2", "--external.num-workers", "1"]


def smrc(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "flaky.py").write_text(FLAKY)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "smrc.py"), *RUN, *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=900)


@pytest.mark.usefixtures("quick_agent")
def test_a_failing_environment_loses_episodes_not_the_run_and_a_stated_share_stops_it(tmp_path):
    out = tmp_path / "run"
    proc = smrc(tmp_path, "--external.max-error-share", "1", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["env/errors"] for r in rows] == [4, 4] and all(r["rollout/success_rate"] == 0 for r in rows)
    # the lost episodes' turns were played and kept (reward 0): seed 1's 2 turns, seed 0's 3, per episode
    assert [r["rollout/turns"] for r in rows] == [2.5, 2.5]
    assert proc.stdout.count("[envs] the environment raised") == 1  # the first, with its traceback; no more
    told = proc.stdout.split("[envs] the environment raised", 1)[1]
    assert f'flaky.py", line {RAISE_LINE}' in told and "RuntimeError: the server timed out" in told
    assert "Traceback" not in proc.stderr and (out / "step_000002" / "model.safetensors").exists()

    stopped = smrc(tmp_path, "--output-dir", str(tmp_path / "stopped"))  # the default share, 0.5
    lines = [line for line in stopped.stderr.splitlines() if line.strip() and not line.startswith("rollout ")]
    assert stopped.returncode == 1 and len(lines) == 1, stopped.stderr[-3000:]  # the progress bar aside
    assert lines[0].startswith("error: --env flaky:Flaky: 4 of 4 episodes of step 1 ended on an environment "
                               "error, more than --external.max-error-share 0.5; the newest: ")
    assert "newest checkpoint None" in lines[0] and not (tmp_path / "stopped" / "step_000001").exists()
