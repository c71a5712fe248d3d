"""Preemption and lost ranks under torchrun, on 2 gloo ranks (scale/launcher.py, scale/lifecycle.py,
scale/run_folder.py, scale/distributed.py; issues 64 and 69):
- SIGTERM to the launcher during a step longer than torchrun's default 30 s grace, launched with
  `--shutdown-timeout 60`, saves that step; the ranks print the resume command once, as a torchrun command
  with --nproc_per_node 2; torchrun exits 1 with its own report after our line; no process is left; the
  printed command resumes it and the run ends as the uninterrupted one. Resuming it on one process is one
  error line naming both world sizes, with no row in config.resumes.jsonl.
- A SIGTERM in the last step (one process) says the run is complete, exits 0 and prints no resume command;
  2 ranks may not resume that one-process checkpoint (one error line, no row).
- A rank SIGKILLed after step 1: rank 0's line says it lost a rank (not that it waited out a timeout), with
  the phase and the newest checkpoint; no process is left.

The environment is docs/environments.md's KeyDoor; a trigger file makes one env step sleep the seconds it
holds, so the test knows a step is in flight when it sends the signal.

Run: pytest tests/test_torchrun_preempt.py -q   (about 3 minutes on 2 busy cores)
"""
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_external_env import example_source
from tests.test_preempt import _rows, _weights
from tests.test_ranks import _rank_pids

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
LAUNCH = ["--standalone", "--nproc_per_node", "2", "--shutdown-timeout", "60"]
RUN = ["--env", "slow_door:SlowDoor", "--preset", "tiny", "--save-every", "4",
       "--rollout.tasks-per-step", "2", "--rollout.group-size", "2", "--external.max-steps", "6",
       "--external.num-workers", "1", "--preempt-grace-s", "60"]
SLOW = '''import os
import time

from key_door import KeyDoor


class SlowDoor(KeyDoor):
    def step(self, action):
        trigger = os.environ["SLOW_TRIGGER"]
        try:  # one env call takes the trigger and sleeps the seconds it says
            os.rename(trigger, trigger + ".taken")
        except FileNotFoundError:
            return super().step(action)
        time.sleep(float(open(trigger + ".taken").read()))
        return super().step(action)
'''


def _env(tmp_path: Path) -> dict:
    (tmp_path / "key_door.py").write_text(example_source())
    (tmp_path / "slow_door.py").write_text(SLOW)
    return {**os.environ, "OMP_NUM_THREADS": "1", "SLOW_TRIGGER": str(tmp_path / "trigger"),
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_sigterm_to_torchrun_saves_a_long_step_and_the_printed_resume_continues_it(tmp_path):
    env = _env(tmp_path)
    whole = _run([*TORCHRUN, *LAUNCH, "smrc.py", *RUN, "--steps", "4", "--output-dir",
                  str(tmp_path / "whole")], env)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]

    out = tmp_path / "cut"
    proc = subprocess.Popen([*TORCHRUN, *LAUNCH, "smrc.py", *RUN, "--steps", "4", "--output-dir", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    t0 = time.monotonic()
    while not (out / "metrics.jsonl").exists():
        assert proc.poll() is None and time.monotonic() - t0 < 600, "the run ended before it could be stopped"
        time.sleep(0.2)
    (tmp_path / "trigger").write_text("35")
    while not (tmp_path / "trigger.taken").exists():  # an env step of the next step sleeps 35 s from now
        assert proc.poll() is None and time.monotonic() - t0 < 600, "no step took the trigger"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    t_signal = time.monotonic()
    stdout, stderr = proc.communicate(timeout=300)
    assert time.monotonic() - t_signal > 30  # the step in flight outlived torchrun's default grace (sleep 35)
    step = len(_rows(out))
    assert 2 <= step < 4, stdout[-3000:] + stderr[-3000:]
    stopped = [x for x in stdout.splitlines() if x.startswith("[smrc] stopped by SIGTERM")]
    assert stopped == [x for x in stdout.splitlines() if "continue with:" in x] and len(stopped) == 1, stdout
    assert stopped[0].startswith(f"[smrc] stopped by SIGTERM after step {step}; newest checkpoint "
                                 f"{out / f'step_{step:06d}'}; continue with: torchrun ")
    assert proc.returncode == 1 and "SignalException" in stderr  # torchrun's own report after our line
    time.sleep(1)
    assert not subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
    assert not (out / "run.lock").exists() and not (out / "config.resumes.jsonl").exists()

    resume = shlex.split(stopped[0].split("continue with: ", 1)[1])
    assert resume[:7] == ["torchrun", *LAUNCH, "smrc.py"] and resume[-1] == "--resume", resume
    one = _run([sys.executable, *resume[resume.index("smrc.py"):]], env)  # the same run on one process
    lines = [x for x in one.stderr.splitlines() if x.strip()]
    assert one.returncode == 1 and len(lines) == 1, one.stderr[-3000:]
    assert lines[0].startswith(f"error: --resume: {out / f'step_{step:06d}'} was trained on 2 ranks "
                               f"(torchrun --nproc_per_node 2), this launch has one process (python smrc.py)")
    assert not (out / "config.resumes.jsonl").exists()
    again = _run([*TORCHRUN, *resume[1:]], env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert _rows(out) == _rows(tmp_path / "whole")
    assert _weights(out / "step_000004") == _weights(tmp_path / "whole" / "step_000004")
    assert len((out / "config.resumes.jsonl").read_text().splitlines()) == 1


def test_a_stop_in_the_last_step_says_the_run_is_complete_and_2_ranks_may_not_resume_it(tmp_path):
    env, out = _env(tmp_path), tmp_path / "last"
    (tmp_path / "trigger").write_text("3")  # step 1's rollout takes it: the signal comes inside the step
    proc = subprocess.Popen([sys.executable, "smrc.py", *RUN, "--steps", "1", "--output-dir", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not (tmp_path / "trigger.taken").exists():
        assert proc.poll() is None and time.monotonic() - t0 < 600, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    assert "[smrc] SIGTERM came during the last step (1): the run is complete" in stdout
    assert "continue with" not in stdout and stdout.strip().splitlines()[-1].startswith("[smrc] done: ")
    assert (out / "step_000001" / "model.safetensors").exists()
    two = _run([*TORCHRUN, *LAUNCH, "smrc.py", *RUN, "--steps", "2", "--resume", "--output-dir", str(out)],
               env)  # a one-process checkpoint on 2 ranks
    ours = [x for x in (two.stdout + two.stderr).splitlines() if "error:" in x]
    assert two.returncode != 0 and len(ours) == 1, two.stdout[-3000:] + two.stderr[-3000:]
    assert ours[0].startswith(f"error: --resume: {out / 'step_000001'} was trained on one process (python "
                              f"smrc.py), this launch has 2 ranks (torchrun --nproc_per_node 2)")
    assert not (out / "config.resumes.jsonl").exists() and "Traceback" not in two.stdout


def test_a_killed_rank_is_named_as_lost_not_as_a_timeout(tmp_path):
    env, out = _env(tmp_path), tmp_path / "dead"
    proc = subprocess.Popen([*TORCHRUN, *LAUNCH[:3], "smrc.py", *RUN, "--steps", "4", "--save-every", "1",
                             "--output-dir", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    t0 = time.monotonic()
    while not (out / "step_000001").exists():
        assert proc.poll() is None and time.monotonic() - t0 < 600, proc.communicate()[0][-3000:]
        time.sleep(0.2)
    os.kill(_rank_pids(proc.pid)[1], signal.SIGKILL)
    log = proc.communicate(timeout=300)[0]
    lines = [x for x in log.splitlines() if x.startswith("error: rank 0 ")]
    assert proc.returncode != 0 and len(lines) == 1, log[-3000:]
    assert lines[0].startswith("error: rank 0 lost another rank in step 2: ") and "stalled" not in lines[0]
    assert "waited more than" not in log and f"newest checkpoint {out / 'step_000001'}" in lines[0], lines
    # launched without --shutdown-timeout: torchrun's 30 s are shorter than --preempt-grace-s 60, said once
    assert log.count("[smrc] torchrun kills the ranks 30 s after it passes on SIGTERM") == 1
    assert "launch with torchrun --shutdown-timeout 60" in log
    time.sleep(1)
    assert not subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
