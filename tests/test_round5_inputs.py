"""Inputs a new user brings (issue 64, items 5-7): an ALFWorld split assembled from symlinks to task folders
loads every game (a link back up is no loop); a model folder that needs its own code is one `error:` line and
trust_remote_code stays off; a number not measured prints as '–' on the progress line, never `nan`; the
resume command keeps torchrun's own options however torchrun was started (issue 69); under torchrun a run that
ends on an error keeps SIGTERM/SIGINT off while it closes, so the agent's SIGTERM cannot cut its last line; a
checkpoint that predates the saved world size is said not checked; a launcher's copy of the stop signal
(Slurm, torchrun) is the same request.

Run: pytest tests/test_round5_inputs.py -q
"""
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scale.monitor import _sd_text

ROOT = Path(__file__).resolve().parents[1]
DATA = os.environ.get("ALFWORLD_DATA", "")


def smrc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "smrc.py"), "--preset", "tiny", *args], cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, text=True, capture_output=True,
                          timeout=300)


@pytest.mark.skipif(not DATA, reason="needs the official ALFWorld sample (ALFWORLD_DATA)")
def test_a_split_of_symlinked_task_folders_loads_every_game(tmp_path):
    real = Path(DATA) / "json_2.1.1" / "train"
    linked = tmp_path / "data" / "json_2.1.1" / "train"
    linked.mkdir(parents=True)
    for folder in sorted(real.iterdir()):
        (linked / folder.name).symlink_to(folder, target_is_directory=True)
    (linked / "loop").symlink_to(linked, target_is_directory=True)  # a link back up
    said = []
    (tmp_path / "a_file").touch()
    for data in (Path(DATA), tmp_path / "data"):  # stops after loading the tasks: the output dir is a file
        proc = smrc("--alfworld.source", "official", "--alfworld.data-dir", str(data), "--output-dir",
                    str(tmp_path / "a_file"))
        said.append([x.split(" (skipped")[0].split(" from ")[0] for x in proc.stdout.splitlines()
                     if x.startswith("alfworld official train: ")])
    assert said[0] == said[1] and len(said[0]) == 1 and not said[0][0].endswith(": 0 games"), said


def test_a_model_that_needs_its_own_code_is_one_error_line(tmp_path):
    model = tmp_path / "custom"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "my_net", "auto_map": {
        "AutoConfig": "configuration_my_net.MyNetConfig", "AutoModelForCausalLM": "modeling_my_net.MyNet"}}))
    (model / "modeling_my_net.py").write_text("raise SystemExit('this code must never run')\n")
    proc = smrc("--model", str(model), "--output-dir", str(tmp_path / "run"))
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith(f"error: --model {model} needs its own Python code to load (model_type "
                               f"'my_net', auto_map ['AutoConfig', 'AutoModelForCausalLM'])")
    assert "trust_remote_code" in lines[0] and "never turns it on" in lines[0]
    assert not (tmp_path / "run").exists()


def test_what_was_not_measured_prints_as_a_dash_never_nan():
    row = {"sd/distilled_turns": 3, "sd/teacher_minus_student_logp": 0.5, "sd/kl_per_turn": math.nan,
           "sd/candidate_sampled_share": math.nan, "actor/sd_grpo_grad_ratio": math.nan}  # no cand gain
    text = _sd_text(row)
    assert "nan" not in text.lower() and text.count("–") == 4 and "gap 0.500" in text
    assert "cand gain 0.250" in _sd_text({**row, "sd/candidate_gain": 0.25})


@pytest.mark.parametrize("launcher", [
    ["/venv/bin/python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "smrc.py",
     "-x"],
    ["/venv/bin/python3", "/venv/bin/torchrun", "--standalone", "--nproc_per_node", "2", "smrc.py", "-x"],
    ["torchrun", "--standalone", "--nproc_per_node", "2", "smrc.py", "-x"]])
def test_the_resume_command_keeps_torchrun_s_options_however_it_was_started(launcher):
    from scale.launcher import options_before
    assert options_before(launcher, "smrc.py") == ["--standalone", "--nproc_per_node", "2"]
    assert options_before(launcher, "other.py") is None


def test_a_run_ending_on_an_error_under_torchrun_keeps_the_stop_signals_off(monkeypatch):
    """scale/preempt.StopSignals: outside torchrun, and on a clean end under it, the old handlers come back;
    under torchrun (TORCHELASTIC_RUN_ID) an exit on an exception leaves SIGTERM and SIGINT ignored."""
    from scale.preempt import StopSignals
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def end(env: str | None, error: bool) -> dict:
        if env is None:
            monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
        else:
            monkeypatch.setenv("TORCHELASTIC_RUN_ID", env)
        try:
            with StopSignals(30.0):
                if error:
                    raise RuntimeError("a collective failed")
        except RuntimeError:
            pass
        return {s: signal.getsignal(s) for s in old}
    try:
        assert end(None, error=True) == old and end("run", error=False) == old
        assert set(end("run", error=True).values()) == {signal.SIG_IGN}
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def test_a_checkpoint_without_a_world_size_is_said_not_checked(tmp_path, capsys):
    """A checkpoint written before checkpoints saved their world size resumes on any size, with one line
    (rank 0) saying it was not checked; one that saved it is refused on another size."""
    import torch
    from scale.run_folder import check_world_size
    torch.save({"step": 1}, tmp_path / "trainer_state.pt")
    check_world_size(tmp_path, 2)
    check_world_size(tmp_path, 2, say=False)  # the other ranks: no second line
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1 and "does not record how many ranks" in said[0] and "not checked" in said[0]
    torch.save({"step": 1, "world_size": 1}, tmp_path / "trainer_state.pt")
    check_world_size(tmp_path, 1)
    assert capsys.readouterr().out == ""
    with pytest.raises(SystemExit, match="trained on one process"):
        check_world_size(tmp_path, 2)


def test_a_launchers_copy_of_the_stop_signal_is_the_same_request(monkeypatch, capsys):
    """Slurm signals every process of the step and torchrun's agent forwards its own SIGTERM (after a Ctrl-C
    on torchrun: SIGINT from the terminal, then SIGTERM): a second signal within SAME_REQUEST_S keeps the
    stop at the end of the step; one later stops at once."""
    from scale import preempt
    now = [100.0]
    monkeypatch.setattr(preempt.time, "monotonic", lambda: now[0])
    exits = []
    monkeypatch.setattr(preempt.os, "_exit", exits.append)
    stop = preempt.StopSignals(grace_s=60)
    stop._handle(signal.SIGINT, None)
    now[0] += preempt.SAME_REQUEST_S / 2
    stop._handle(signal.SIGTERM, None)
    assert exits == [] and stop.signum == signal.SIGINT
    assert stop.t_signal == 100.0  # the grace counts from the first
    assert "the same stop request" in capsys.readouterr().out
    now[0] += preempt.SAME_REQUEST_S
    stop._handle(signal.SIGTERM, None)
    assert exits == [128 + signal.SIGTERM] and "a second SIGTERM: stopping now" in capsys.readouterr().err
