"""Runs that cannot mix, checkpoints that are always verified, no traceback for any bad input (issue 23): one
test per numbered item of the issue (test_itemNN_...), each at tiny settings. The end-to-end runs are few and
small: one in-process run and its resume (items 4 and 5), one in-process run with a full disk (item 7), and
five CLI calls that stop before any model is loaded; the rest call the real functions on checkpoints of the
embedded tiny model saved the way the trainer saves them.

Run: pytest tests/test_run_guards.py -q   (about a minute on 2 cores)
"""
import errno
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import evaluate
import smrc
from scale import checkpoint as ck
from scale import run_logs
from scale.preflight import validate_config
from test_checkpoint import _rows, save, trainer  # noqa: F401 (trainer: a fixture)
from test_evaluate import _eval_error
from test_smrc import metrics, run

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)
# the cheapest real training step: one task group of two rollouts of two turns, in-process envs, GRPO without
# planner references (what is tested here, the loop's saving, logging and resuming, is the same for
# every algo)
SMALL = ["--preset", "tiny", "--algo", "grpo", "--router.no-seed-with-planner", "--rollout.tasks-per-step",
         "1", "--rollout.group-size", "2", "--alfworld.max-steps", "2", "--alfworld.num-workers", "0",
         "--save-every", "1"]


def one_line_error(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert msg.startswith("error: ") and "\n" not in msg, msg
    return msg


def flip(path: Path, n: int = 16) -> None:
    """Flip n bytes in the middle of a file (its header intact: it still loads)."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + n] = bytes(b ^ 0xFF for b in data[mid:mid + n])
    path.write_bytes(bytes(data))


@pytest.fixture
def plain_model(tiny, tmp_path) -> Path:
    """A plain save_pretrained folder (no checksums, no trainer state): a model from outside a run."""
    model, tok = tiny
    folder = tmp_path / "plain"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# ------------------------------------------------------------------------------------------ 1. runs never mix

HOLDER = ("import fcntl, os, sys, time\nf = open(sys.argv[1], 'a+')\nfcntl.flock(f, fcntl.LOCK_EX)\n"
          "f.write(str(os.getpid())); f.flush()\nprint('held', flush=True)\ntime.sleep(600)\n")


def test_item01_a_second_run_into_a_folder_in_use_is_refused_and_a_dead_runs_lock_is_not(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out / "run.lock")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = run(*SMALL, "--steps", "1", "--output-dir", str(out), check=False)
        line = proc.stderr.strip()
        assert proc.returncode != 0 and "Traceback" not in line, proc.stderr[-2000:]
        assert len(line.splitlines()) == 1, line
        assert line.startswith(f"error: --output-dir {out} is in use by another run (PID {holder.pid} ")
        assert sorted(p.name for p in out.iterdir()) == ["run.lock"]  # nothing written, no config.json
    finally:
        holder.kill()  # SIGKILL: its lock file stays behind, unlocked
        holder.wait()
    from scale.preflight import lock_run
    lock = lock_run(out)  # a dead run's stale lock blocks no later run (or --resume)
    assert (out / "run.lock").read_text().strip() == str(os.getpid())
    with pytest.raises(SystemExit, match=f"in use by another run \\(PID {os.getpid()} "):
        lock_run(out)
    lock.release()
    assert not (out / "run.lock").exists()


# ------------------------------------------------------------------------- 2, 3, 10, 11. checkpoints verified

def test_item02_evaluate_verifies_checksums_and_names_the_newest_intact_one(trainer, plain_model, tmp_path,
                                                                           capsys):
    for step in (1, 2, 3):
        save(tmp_path, step, trainer)
    weights = tmp_path / "step_000003" / "model.safetensors"
    flip(weights)
    line = _eval_error("--checkpoint", str(tmp_path / "step_000003"), "--limit", "1", "--k", "1", "--output",
                       str(tmp_path / "eval"))
    assert f"error: --checkpoint {tmp_path / 'step_000003'} fails verification: {weights} is corrupt" in line
    assert f"the newest intact checkpoint is {tmp_path / 'step_000002'}: use it with --checkpoint" in line
    assert not (tmp_path / "eval.json").exists()
    # an intact checkpoint is verified; a plain save_pretrained folder is still evaluated, as unverified
    checked = evaluate.check_checkpoints(evaluate.EvalArgs(checkpoint=(str(tmp_path / "step_000002"),
                                                                       str(plain_model))))
    assert checked == {str(tmp_path / "step_000002"): "verified", str(plain_model): "unverified"}
    assert "its weights are unverified" in capsys.readouterr().out


def test_item03_an_empty_or_incomplete_checksum_file_fails_verification(trainer, tmp_path):
    save(tmp_path, 1, trainer)
    path = save(tmp_path, 2, trainer)
    sums, weights = path / ck.CHECKSUMS, path / "model.safetensors"
    listed = sums.read_text()
    flip(weights)
    for text, problem in [("", f"{sums} is empty"),
                          ("".join(ln + "\n" for ln in listed.splitlines() if "model.safetensors" not in ln),
                           f"{weights} is not listed in {sums}")]:
        sums.write_text(text)
        with pytest.raises(SystemExit) as e:
            ck.resume_checkpoint(tmp_path)  # what --resume runs
        msg = one_line_error(e)
        assert problem in msg and f"--resume-from {tmp_path / 'step_000001'}" in msg
    sums.unlink()
    assert "is missing" in ck.verify(path)
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated, an empty checksum file (item 9's resume)
    sums.write_text("")
    assert f"{sums} is empty" in ck.verify(path)


def test_item10_an_empty_latest_names_itself_and_the_newest_intact_checkpoint(trainer, tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step, trainer)
    for text, said in [("", "is empty"),
                       ("../elsewhere\n", "names '../elsewhere', not a step_XXXXXX checkpoint")]:
        (tmp_path / "latest").write_text(text)
        with pytest.raises(SystemExit) as e:
            ck.resume_checkpoint(tmp_path)
        msg = one_line_error(e)
        assert f"{tmp_path / 'latest'} {said}" in msg
        newest = tmp_path / "step_000003"
        assert f"intact checkpoint is {newest}: continue from it with --resume-from {newest}" in msg


def test_item11_a_garbage_checksum_file_is_named_as_such(trainer, tmp_path):
    save(tmp_path, 1, trainer)
    path = save(tmp_path, 2, trainer)
    sums = path / ck.CHECKSUMS
    sums.write_text("garbage\n" + sums.read_text())
    with pytest.raises(SystemExit) as e:
        ck.resume_checkpoint(tmp_path)
    msg = one_line_error(e)
    assert f"{sums} is malformed (line 1 " in msg and "Is a directory" not in msg
    assert f"--resume-from {tmp_path / 'step_000001'}" in msg
    from scale.preflight import check_model_dir
    with pytest.raises(SystemExit, match=f"--checkpoint {path} fails verification: {sums} is malformed"):
        check_model_dir(path, "--checkpoint")  # evaluate.py's (and the intervention's) path: the same check


# --------------------------------------------------------------------- 4, 5. state that survives, config kept

@pytest.fixture(scope="module")
def nonfinite_run(tmp_path_factory):
    """`--steps 2` where every loss is NaN (limit 3: two skips, saved), then `--resume --steps 4`."""
    out = tmp_path_factory.mktemp("nonfinite")
    flags = [*SMALL, "--grpo.max-nonfinite-steps", "3", "--output-dir", str(out)]
    set_advantages = smrc.set_advantages

    def nan_advantages(episodes, *args, **kwargs):
        set_advantages(episodes, *args, **kwargs)
        for turn in (t for e in episodes for t in e.turns):
            turn.advantage = float("nan")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(smrc, "set_advantages", nan_advantages)
        smrc.main(smrc.parse_config([*flags, "--steps", "2"]))
        config = (out / "config.json").read_text()
        try:
            smrc.main(smrc.parse_config([*flags, "--steps", "4", "--resume"]))
            resumed = "the resume ran to its end"
        except SystemExit as e:
            resumed = str(e)
    return out, config, resumed


def test_item04_resume_continues_the_nonfinite_streak(nonfinite_run, trainer, tmp_path):
    out, _, resumed = nonfinite_run
    state = torch.load(out / "step_000002" / "trainer_state.pt", weights_only=True)
    assert state["guards"] == {"nonfinite_streak": 2}
    assert resumed.startswith("error: 3 optimizer steps in a row had a non-finite loss")  # at step 3, not 5
    assert [r["step"] for r in metrics(out)] == [1, 2] and (out / "latest").read_text() == "step_000002"
    old = save(tmp_path, 1, trainer)  # a checkpoint without guard counters restores their defaults
    model, _, optimizer, bank = trainer
    guards = {"nonfinite_streak": 0}
    assert ck.load_trainer_state(old, model, optimizer, bank, guards) == 1
    assert guards == {"nonfinite_streak": 0}


def test_item05a_evaluate_k_0_is_an_error_not_a_table_of_nan(tmp_path):
    with pytest.raises(SystemExit) as e:
        evaluate.run_eval(evaluate.EvalArgs(baseline="tiny", preset="tiny", k=0, output=str(tmp_path / "x")))
    assert one_line_error(e).startswith("error: --k 0 is out of range; allowed: an integer >= 1")
    assert not (tmp_path / "x.json").exists()


def test_item05b_a_negative_history_length_is_refused():
    with pytest.raises(SystemExit) as e:
        validate_config(smrc.parse_config(["--preset", "tiny", "--alfworld.history-length", "-1"]))
    assert one_line_error(e).startswith("error: --alfworld.history-length -1 is out of range")


def test_item05c_a_resume_never_overwrites_config_json(nonfinite_run, trainer, tmp_path):
    out, config, _ = nonfinite_run
    assert (out / "config.json").read_text() == config  # the resume's --steps 4 went beside it
    rows = [json.loads(ln) for ln in (out / "config.resumes.jsonl").read_text().splitlines()]
    assert rows == [{"step": 2, "checkpoint": str(out / "step_000002"), "changed": {"steps": [2, 4]}}]
    failed = tmp_path / "failed"  # a resume that fails its checks writes nothing at all
    save(failed, 1, trainer)
    (failed / "step_000001" / ck.CHECKSUMS).write_text("")
    (failed / "config.json").write_text('{"seed": 1}')
    proc = run("--preset", "tiny", "--resume", "--seed", "2", "--output-dir", str(failed), check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().startswith(f"error: cannot resume from {failed / 'step_000001'}: ")
    assert (failed / "config.json").read_text() == '{"seed": 1}'
    assert not (failed / "config.resumes.jsonl").exists()


def test_item05d_archive_repair_counts_the_rows_lost(tmp_path, capsys):
    path = tmp_path / "rollouts.jsonl.gz"
    for step in (1, 2, 3):  # one gzip member per append, as write_archive does
        run_logs.write_archive(path, [json.loads(r) for r in _rows([step] * 50)], 10**6)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - len(data) // 6])  # the last append cut in the middle of its member
    run_logs.trim_logs(tmp_path, 3)
    kept = len(run_logs.read_archive(path))
    assert 100 <= kept < 149  # more than one row lost
    assert f"{150 - kept} partial rows dropped" in capsys.readouterr().out


# ---------------------------------------------------------------------------- 6, 8, 9, 12. one line, no trace

def test_item06_a_learning_rate_that_overflows_adamw_is_one_error():
    with pytest.raises(SystemExit) as e:
        validate_config(smrc.parse_config(["--preset", "tiny", "--grpo.lr", "3e38"]))
    msg = one_line_error(e)
    assert msg.startswith("error: --grpo.lr 3e+38 is out of range; allowed: a finite number >= 0")
    assert "<= 1e+37" in msg
    validate_config(smrc.parse_config(["--preset", "tiny", "--grpo.lr", "1e37"]))
    for lr, overflows in [(1e37, False), (3e38, True)]:  # the bound is AdamW's own
        w = torch.nn.Parameter(torch.ones(2))
        w.grad = torch.ones(2)
        optimizer = torch.optim.AdamW([w], lr=lr)
        if overflows:
            with pytest.raises(RuntimeError, match="overflow"):
                optimizer.step()
        else:
            optimizer.step()


def _device_bad() -> str:
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


@pytest.mark.parametrize("flags,named", [
    (["--alfworld.task-types", "bogus"], "--alfworld.task-types bogus"),
    (["--alfworld.num-train-games", "0"], "--alfworld.num-train-games 0"),
    (["--alfworld.step-timeout-s", "0"], "--alfworld.step-timeout-s 0"),
    (["--device", "CUDA_BAD"], "--device cuda"),
    (["--device", "bogus"], "--device 'bogus'"),
])
def test_item08_flags_that_reach_a_library_are_checked_first(flags, named):
    flags = [_device_bad() if f == "CUDA_BAD" else f for f in flags]
    with pytest.raises(SystemExit) as e:
        validate_config(smrc.parse_config(["--preset", "tiny", *flags]))
    assert one_line_error(e).startswith(f"error: {named}")


def test_item08_through_the_cli_before_anything_is_loaded(tmp_path):
    proc = run("--preset", "tiny", "--device", "bogus", "--output-dir", str(tmp_path / "x"), check=False)
    expected = "error: --device 'bogus' is not a device; allowed: auto, cpu, cuda, cuda:N"
    assert proc.returncode != 0 and proc.stderr.strip() == expected, proc.stderr[-2000:]
    assert not (tmp_path / "x").exists()


def test_item09_evaluate_bad_input_is_one_error_line(plain_model, tmp_path):
    base = dict(baseline="tiny", preset="tiny", k=1, limit=1, output=str(tmp_path / "x"))
    for changes, named in [({"split": "bogus"}, "--split 'bogus' is not a split of generated ALFWorld games"),
                           ({"tasks_per_batch": 0}, "--tasks-per-batch 0 is out of range"),
                           ({"temperature": -1.0}, "--temperature -1.0 is out of range")]:
        with pytest.raises(SystemExit) as e:
            evaluate.run_eval(evaluate.EvalArgs(**{**base, **changes}))
        assert one_line_error(e).startswith(f"error: {named}")
    own = evaluate.EvalArgs(checkpoint=(str(plain_model),), k=1, limit=1, output=base["output"])
    (plain_model / "smrc_config.json").write_text("{garbage")
    with pytest.raises(SystemExit) as e:
        evaluate.run_eval(own)
    assert one_line_error(e).startswith(f"error: {plain_model / 'smrc_config.json'} is not a run config")
    weights = plain_model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:len(weights.read_bytes()) // 2])
    with pytest.raises(SystemExit) as e:
        evaluate.run_eval(own)
    assert f"{weights} is damaged or truncated" in one_line_error(e)
    line = _eval_error("--preset", "tiny", "--baseline", "tiny", "--split", "bogus")  # and through the CLI
    assert line.startswith("error: --split 'bogus'")
    assert not (tmp_path / "x.json").exists()


def test_item12_a_model_folder_without_weights_is_refused_before_config_json(tiny, tmp_path):
    model, tok = tiny
    folder = tmp_path / "no-weights"
    model.config.save_pretrained(folder)
    tok.save_pretrained(folder)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        smrc.main(smrc.parse_config(["--preset", "tiny", "--model", str(folder), "--output-dir", str(out)]))
    assert one_line_error(e).startswith(f"error: --model {folder} holds no weights")
    assert not out.exists()


def test_item12_a_missing_model_is_refused_before_the_task_list_is_read(tmp_path, monkeypatch):
    def no_tasks(*args, **kwargs):
        raise AssertionError("the task list was read before the model was checked")
    monkeypatch.setattr(smrc.envs, "load_tasks", no_tasks)
    with pytest.raises(SystemExit) as e:
        smrc.main(smrc.parse_config(["--preset", "tiny", "--model", str(tmp_path / "nowhere"),
                                     "--output-dir", str(tmp_path / "run")]))
    assert one_line_error(e).startswith("error: --model")
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------------------------- 7. a full disk

def test_item07_a_full_disk_while_appending_metrics_is_one_line_and_loses_nothing(tmp_path, monkeypatch):
    out, appends, real_open = tmp_path / "run", [], open

    class FullDisk:  # what a full disk does to an append: part of the row lands, then ENOSPC
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[:len(text) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def full_from_the_second_row(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        if Path(path).name == "metrics.jsonl":
            appends.append(path)
            return FullDisk(f) if len(appends) > 1 else f
        return f
    for name in ("scale.monitor", "scale.safe_io"):  # where metrics rows are appended (now, and before)
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        monkeypatch.setattr(module, "open", full_from_the_second_row, raising=False)
    with pytest.raises(SystemExit) as e:
        smrc.main(smrc.parse_config([*SMALL, "--steps", "2", "--output-dir", str(out)]))
    said = f"error: could not write {out / 'metrics.jsonl'}: no space left on device;"
    assert one_line_error(e).startswith(said)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["step"] == 1 and len(lines) == 2  # row 1 kept; torn row 2: repaired on resume
    assert (out / "latest").read_text() == "step_000001" and ck.verify(out / "step_000001") is None
    assert {r["step"] for r in run_logs.read_archive(out / "rollouts.jsonl.gz")} == {1, 2}
    assert not (out / "run.lock").exists()  # the run stopped cleanly: its lock is released


# --------------------------------------------------------------------------------- 13. the planner's start-up

TRAINER = """
import sys, threading, time
sys.path.insert(0, {repo!r})
import smrc  # noqa: F401 (the trainer's imports: torch, transformers)
from environments.alfworld import AlfworldConfig
from environments.planner import Planner
planner = Planner(AlfworldConfig())
threading.Thread(target=planner._start, daemon=True).start()
while getattr(planner._proc, "pid", None) is None:
    time.sleep(0.001)
print(planner._proc.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_item13_the_planner_dies_with_a_trainer_killed_during_its_start_up(tmp_path):
    from test_envs_pool import _alive
    script = tmp_path / "trainer.py"  # a script file, as smrc.py is
    script.write_text(TRAINER.format(repo=str(ROOT)))
    trainer_proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                                    cwd=ROOT)
    planner_pid = int(trainer_proc.stdout.readline())
    os.kill(trainer_proc.pid, signal.SIGKILL)  # while the planner process is still starting
    trainer_proc.wait()
    deadline = time.time() + 2
    while time.time() < deadline and _alive(planner_pid):
        time.sleep(0.05)
    alive = _alive(planner_pid)
    if alive:
        os.kill(planner_pid, signal.SIGKILL)
    assert not alive, "the planner outlived the SIGKILLed trainer by 2 s"
