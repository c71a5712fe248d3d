"""Preemption (scale/preempt.py), with real signals to a real trainer process: SIGTERM stops it after the step
in flight with a checkpoint of that step, one line naming the newest checkpoint and the exact resume command,
no lock left and exit 143; the resumed run ends with the metrics rows (times aside) and the weights of an
uninterrupted run of the same seed. A second signal stops at once without a traceback; SIGINT exits 130.

Run: pytest tests/test_preempt.py -q
"""
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scale import preempt

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)
RUN = ["--preset", "tiny", "--steps", "4", "--save-every", "3", "--rollout.tasks-per-step", "2",
       "--rollout.group-size", "2", "--alfworld.max-steps", "4"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _start(out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "smrc.py"), *RUN, "--output-dir", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def _wait_for_rows(out: Path, proc: subprocess.Popen, n: int) -> None:
    t0 = time.monotonic()
    while not (out / "metrics.jsonl").exists() or len((out / "metrics.jsonl").read_text().splitlines()) < n:
        assert proc.poll() is None and time.monotonic() - t0 < 600, "the run ended before it could be stopped"
        time.sleep(0.2)


def _rows(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items()
             if not k.startswith(("time/", "mem/")) and not k.endswith("_time_s")}
            for x in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_sigterm_stops_after_the_step_saves_it_and_the_resume_ends_as_an_uninterrupted_run(tmp_path):
    whole = subprocess.run([sys.executable, str(ROOT / "smrc.py"), *RUN, "--output-dir",
                            str(tmp_path / "whole")], cwd=ROOT, capture_output=True, text=True, env=ENV,
                           timeout=900)
    assert whole.returncode == 0, whole.stderr[-3000:]
    out = tmp_path / "cut"
    proc = _start(out)
    _wait_for_rows(out, proc, 1)  # inside step 2 (or later): no checkpoint of it exists yet
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 143, stderr[-3000:]
    step = len(_rows(out))
    last = stdout.strip().splitlines()[-1]
    assert last.startswith(f"[smrc] stopped by SIGTERM after step {step}; newest checkpoint "
                           f"{out / f'step_{step:06d}'}; continue with: python smrc.py ")
    assert "Traceback" not in stderr and not (out / "run.lock").exists()
    resume = shlex.split(last.split("continue with: ", 1)[1])
    assert resume[-1] == "--resume" and resume[1] == "smrc.py"
    again = subprocess.run([sys.executable, *resume[1:]], cwd=ROOT, capture_output=True, text=True, env=ENV,
                           timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _rows(out) == _rows(tmp_path / "whole")
    assert _weights(out / "step_000004") == _weights(tmp_path / "whole" / "step_000004")


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_second_signal_stops_at_once_without_a_traceback(tmp_path, signum, code):
    out = tmp_path / "run"
    proc = _start(out)
    _wait_for_rows(out, proc, 1)
    proc.send_signal(signum)
    time.sleep(preempt.SAME_REQUEST_S + 0.5)  # sooner, it is taken as a launcher's copy of the first
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=300)
    name = signal.Signals(signum).name
    assert proc.returncode == code and "Traceback" not in stderr
    assert f"[smrc] a second {name}: stopping now" in stderr or f"[smrc] stopped by {name}" in stdout
