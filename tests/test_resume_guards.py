"""A resume is the same run (scale/checkpoint.check_same_run): flags that would make it another run (the
environment, the model and with it the tokenizer and the KL reference, the algorithm, the L_SD form) are one
error line naming them, as is a --steps that is not beyond the checkpoint; safe flags are applied and
recorded. Through the CLI, on a real one-step run.

Run: pytest tests/test_resume_guards.py -q
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)
RUN = ["--preset", "tiny", "--save-every", "1", "--rollout.tasks-per-step", "2", "--rollout.group-size", "2",
       "--alfworld.max-steps", "4"]


def _smrc(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "smrc.py"), *RUN, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    proc = _smrc("--steps", "1", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("flags, said", [
    (["--env", "webshop"], "--env alfworld -> webshop"),
    (["--model", "tiny"], "--model tiny-agent-quick -> tiny"),
    (["--algo", "grpo"], "--algo smrc-sd -> grpo"),
    (["--grpo.sd-loss", "sdar"], "--grpo.sd-loss reverse-kl -> sdar")])
def test_a_resume_that_would_be_another_run_is_refused(run_dir, flags, said):
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    proc = _smrc("--steps", "2", "--resume", "--output-dir", str(run_dir), *flags)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith("error: --resume continues the run in its checkpoint")
    assert said in last and "Traceback" not in proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before  # nothing written


def test_steps_not_beyond_the_checkpoint_is_one_line(run_dir):
    proc = _smrc("--steps", "1", "--resume", "--output-dir", str(run_dir))
    assert proc.returncode != 0 and proc.stderr.strip().splitlines()[-1] == (
        "error: --steps 1 is not beyond the checkpoint's step 1: nothing to train; give --steps > 1 to "
        "continue the run")


def test_safe_flags_are_applied_and_recorded(run_dir):
    proc = _smrc("--steps", "2", "--resume", "--output-dir", str(run_dir), "--eval-every", "2",
                 "--eval-tasks", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumes = [json.loads(x) for x in (run_dir / "config.resumes.jsonl").read_text().splitlines()]
    assert resumes[-1]["step"] == 1 and {"steps", "eval_every", "eval_tasks"} <= set(resumes[-1]["changed"])
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/success_rate" in r] == [2]


def test_evaluate_takes_a_run_folder_as_its_newest_verified_checkpoint(run_dir, tmp_path):
    newest = sorted(run_dir.glob("step_*"))[-1]
    proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "eval", "--checkpoint", str(run_dir),
                           "--split", "eval", "--k", "1", "--limit", "2", "--output", str(tmp_path / "ev")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"is a run folder: its newest verified checkpoint is {newest}" in proc.stdout
    assert json.loads((tmp_path / "ev.json").read_text())["rows"][0]["model"] == str(newest)


def test_a_checkpoint_that_vanished_after_verification_is_named_as_such(tmp_path):
    import evaluate
    gone = str(tmp_path / "step_000003")
    args = evaluate.EvalArgs(checkpoint=(gone,))
    with pytest.raises(SystemExit, match=f"^error: --checkpoint {gone} was verified, then vanished"):
        evaluate.evaluate_model(gone, "x", [], None, args, None)


@pytest.mark.parametrize("flags, env, said", [
    (["--alfworld.num-train-games", "1", "--alfworld.task-types", "pick_two_obj_and_place"], {},
     "error: the alfworld train split has no task under these settings"),
    ([], {"SMRC_CACHE": "/proc/no-cache-here"}, "error: --model tiny-agent-quick is built under SMRC_CACHE="),
    (["--alfworld.cache-dir", "/proc/no-games-here"], {}, "error: the alfworld tasks could not be prepared")])
def test_no_task_or_an_unwritable_cache_is_one_line_before_anything_is_written(tmp_path, flags, env, said):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "smrc.py"), *RUN, "--steps", "1", *flags,
                           "--output-dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith(said) and "Traceback" not in proc.stderr
    assert not (out / "config.json").exists()


def test_webshop_official_without_a_checkout_is_one_line_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WEBSHOP_ROOT": ""}
    proc = subprocess.run([sys.executable, str(ROOT / "smrc.py"), "--env", "webshop", "--webshop.backend",
                           "official", "--model", "tiny", "--steps", "1", "--output-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and not out.exists()
    assert last.startswith("error: --webshop.backend official needs a WebShop checkout")


def test_evaluate_follows_a_run_folder_past_a_checkpoint_rotated_away_while_it_loads(run_dir, tmp_path,
                                                                                     monkeypatch, capsys):
    """Given a run folder, `eval` takes its newest verified checkpoint; if a run still writing rotates that
    one away while it loads, the run's next newest verified checkpoint is evaluated instead, and named. The
    rotation is injected: the first load removes the folder it was given, as `--keep-checkpoints` would."""
    import shutil
    import evaluate
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    first = sorted(run.glob("step_*"))[-1]
    newest = run / f"step_{int(first.name.split('_')[1]) + 1:06d}"
    shutil.copytree(first, newest)  # a second verified checkpoint (checksums are relative to the folder)
    real, calls = evaluate.make_engine, []

    def rotating(name, cfg, args):
        calls.append(name)
        if len(calls) == 1:
            shutil.rmtree(name)
        return real(name, cfg, args)
    monkeypatch.setattr(evaluate, "make_engine", rotating)
    evaluate.main(["eval", "--checkpoint", str(run), "--split", "eval", "--k", "1", "--limit", "1",
                   "--output", str(tmp_path / "ev")])
    out = capsys.readouterr().out
    assert calls == [str(newest), str(first)]
    assert f"{newest} was rotated away by the run still writing into {run}; evaluating its newest verified " \
           f"checkpoint, {first}" in out
    assert json.loads((tmp_path / "ev.json").read_text())["rows"][0]["model"] == str(first)


def test_a_resume_refuses_another_kl_anchor_unless_accepted(tmp_path, quick_agent):
    """Round 4, item 1: the initial weights changed since the run began (one tensor perturbed by 0.01): the
    resume is one error line naming the model and both hashes, before anything loads; with
    --accept-new-initial-weights it runs, and config.resumes.jsonl records both hashes."""
    import shutil
    from safetensors.torch import load_file, save_file
    model = tmp_path / "model"
    shutil.copytree(quick_agent, model)
    out = tmp_path / "run"
    assert _smrc("--model", str(model), "--steps", "1", "--output-dir", str(out)).returncode == 0
    weights = load_file(model / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 0.01
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    refused = _smrc("--model", str(model), "--steps", "2", "--resume", "--output-dir", str(out))
    last = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode != 0 and last.startswith("error: --resume would anchor the KL term to other "
                                                       f"weights: --model {model}"), refused.stderr[-2000:]
    assert "model.safetensors: " in last and " -> " in last and "--accept-new-initial-weights" in last
    accepted = _smrc("--model", str(model), "--steps", "2", "--resume", "--accept-new-initial-weights",
                     "--output-dir", str(out))
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    row = json.loads((out / "config.resumes.jsonl").read_text().splitlines()[-1])
    assert row["initial_weights_accepted"]["recorded"] != row["initial_weights_accepted"]["now"]


def test_a_damaged_run_record_is_restored_from_the_checkpoint(run_dir, tmp_path):
    """Round 4, item 2: config.json cut to 100 bytes: the resume says so in one line, rewrites it from the
    checkpoint's smrc_config.json (the damaged one kept beside it) and runs; the record parses again."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "config.json").write_text((run / "config.json").read_text()[:100])
    beyond = max(int(p.name.split("_")[1]) for p in run.glob("step_*")) + 1  # the fixture may be resumed
    proc = _smrc("--steps", str(beyond), "--resume", "--output-dir", str(run))
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith(f"[resume] {run / 'config.json'}"))
    assert "not a run record" in line and "rewritten from" in line and "config.json.damaged" in line
    record = json.loads((run / "config.json").read_text())
    assert record["model"] == "tiny-agent-quick" and record["resolved"]["initial_weights"]["sha256"]
    assert len((run / "config.json.damaged").read_text()) == 100
