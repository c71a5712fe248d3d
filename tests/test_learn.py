"""bench/learn.py end to end with tiny settings (2 steps, 2 evaluation games): every run trains and is evaluated with
the project's own trainer and evaluation, the results are written, and a second call resumes instead of redoing work.
The learning claim itself lives in the benchmark's output (README), not here.

Run: pytest tests/test_learn.py -q
"""
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["--model", "tiny-agent-quick", "--steps", "2", "--seeds", "0", "--algos", "grpo", "smrc-sd",
         "--oracle-algos", "smrc-sd", "--oracle-seeds", "0", "--eval-every", "2", "--val-games", "2",
         "--train-games", "6", "--eval-games", "2", "--k", "2", "--tasks-per-step", "2", "--group-size", "2",
         "--workers", "2", "--sd-coef", "0.3"]


def test_plan_runs_each_loss_form_at_its_lambda():
    """The trajectory-context methods run at --sd-coef (and the λ sweep), the skill-text baselines at their anchor λ."""
    from bench.learn import LearnArgs, plan
    args = LearnArgs(algos=("grpo", "smrc-sd", "skill-sd", "sdar", "fullpath-sd"), seeds=(0, 1), lambdas=(0.1, 0.3, 1),
                     oracle_algos=(), sd_coef=0.3)
    main = [("grpo", 0.0), ("smrc-sd", 0.3), ("skill-sd", 0.001), ("sdar", 0.01), ("fullpath-sd", 0.3)]
    assert plan(args) == [(a, s, lam) for s in (0, 1) for a, lam in main] + \
        [("smrc-sd", 0, 0.1), ("fullpath-sd", 0, 0.1), ("smrc-sd", 0, 1), ("fullpath-sd", 0, 1)]


def test_plan_puts_the_oracle_rows_beside_their_seeds():
    """Oracle rows run at the reverse-KL λ on their own seeds, each seed's rows together (seed-major), and get their
    own run folders, which pass --teacher.oracle to the trainer."""
    from bench.learn import LearnArgs, _run_dir, plan
    args = LearnArgs(algos=("grpo", "smrc-sd"), seeds=(0, 1, 2), oracle_algos=("fullpath-sd", "smrc-sd"),
                     oracle_seeds=(0, 3), sd_coef=0.2, out="OUT")
    assert plan(args) == [("grpo", 0, 0.0), ("smrc-sd", 0, 0.2), ("oracle-fullpath-sd", 0, 0.2),
                          ("oracle-smrc-sd", 0, 0.2), ("grpo", 1, 0.0), ("smrc-sd", 1, 0.2), ("grpo", 2, 0.0),
                          ("smrc-sd", 2, 0.2), ("oracle-fullpath-sd", 3, 0.2), ("oracle-smrc-sd", 3, 0.2)]
    assert _run_dir(args, "oracle-smrc-sd", 3, 0.2) == Path("OUT/oracle-smrc-sd-lam0.2-seed3")


@pytest.mark.parametrize("change, flag", [
    (dict(steps=0), "--steps 0"), (dict(seeds=()), "--seeds (none)"), (dict(seeds=(0, 0)), "--seeds 0 0"),
    (dict(algos=("grpo", "smrc")), "--algos grpo smrc"), (dict(oracle_algos=("sdar",)), "--oracle-algos sdar"),
    (dict(oracle_alpha=1.5), "--oracle-alpha 1.5"), (dict(lambdas=(float("nan"),)), "--sd-coef / --lambdas"),
    (dict(group_size=1), "--group-size 1"), (dict(eval_every=-1), "--eval-every -1")])
def test_bad_flags_are_one_error_line_before_anything_runs(tmp_path, monkeypatch, change, flag):
    """A sweep with a bad flag stops before the warm start's build (minutes) and writes nothing."""
    from bench import learn

    def build(args):
        raise AssertionError("the warm start was reached with a bad flag")
    monkeypatch.setattr(learn, "check_warm_start", build)
    with pytest.raises(SystemExit, match="^error: " + re.escape(flag)):
        learn.main(dataclasses.replace(learn.LearnArgs(out=str(tmp_path / "out")), **change))
    assert not (tmp_path / "out").exists()


def _learn(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "learn.py"), *SMOKE, "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1500)


def test_learn_runs_end_to_end_and_resumes(tmp_path):
    proc = _learn(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    names = [r["name"] for r in res["rows"]]
    assert names == ["warm start (before RL)", "grpo", "smrc-sd", "oracle-smrc-sd"]
    for row in res["rows"]:
        assert 0.0 <= row["avg@2"][0] <= row["pass@2"][0] <= 1.0
        assert row["valid_action_ratio"][0] == 1.0  # the learn preset decodes admissible commands only
    smrc = next(r for r in res["rows"] if r["name"] == "smrc-sd")
    assert 0.0 <= smrc["router/match_rate"][0] <= 1.0 and "sd/distilled_share" in smrc
    from bench.learn import _metrics
    steps = [m for m in _metrics(tmp_path / "smrc-sd-lam0.3-seed0") if "sd/kl_student_teacher" in m]
    assert len(steps) == 2  # the run's two training steps
    assert ("sd/candidate_gain" in smrc) == any(m.get("sd/candidate_turns", 0) > 0 for m in steps)
    assert "sd/candidate_gain" not in res["rows"][1]  # GRPO has no teacher
    assert all(r["train_min"][0] > 0 and r["eval_min"][0] > 0 for r in res["rows"][1:])  # each run's wall time
    assert res["grpo_gain_avg@k"] is not None
    assert set(res["paired_gain_avg@k"]) == {"grpo", "smrc-sd", "oracle-smrc-sd"}
    assert -1.0 <= res["paired_gain_avg@k"]["grpo"][0] <= 1.0
    assert set(res["paired_difference_avg@k"]) == {"smrc-sd − grpo", "oracle-smrc-sd − grpo"}
    assert res["seed_paired_difference_avg@k"]["smrc-sd − grpo"]["seeds"] == 1  # one seed: no SE over seeds
    oracle = json.loads((tmp_path / "oracle-smrc-sd-lam0.3-seed0" / "config.json").read_text())
    assert oracle["teacher"]["oracle"] == 0.5 and oracle["algo"] == "smrc-sd"  # the oracle row's own trainer flags
    assert res["warm_start_greedy"]["games"] == 2 and 0.0 <= res["warm_start_greedy"]["success"] <= 1.0
    assert json.loads((tmp_path / "eval" / "warm-start-greedy.json").read_text())["temperature"] == 0
    for run in ("grpo-seed0", "smrc-sd-lam0.3-seed0", "oracle-smrc-sd-lam0.3-seed0"):
        rows = [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "rollout/success_rate" in r] == [1, 2]
        assert [r["step"] for r in rows if "val/success_rate" in r] == [2]  # --eval-every 2: the in-loop validation
        assert (tmp_path / run / "step_000002" / "model.safetensors").exists()
        assert json.loads((tmp_path / "eval" / f"{run}.json").read_text())["k"] == 2
    assert "| smrc-sd | 1 |" in (tmp_path / "results.md").read_text()
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/metrics.jsonl")}
    for ckpt in tmp_path.glob("*/step_*"):  # a finished run is its metrics + evaluation (a sweep carried elsewhere)
        shutil.rmtree(ckpt)
    again = _learn(tmp_path)  # everything is done: nothing is retrained or re-evaluated
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/metrics.jsonl")} == stamps
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == res["rows"]
    for run in ("smrc-sd-lam0.3-seed0", "oracle-smrc-sd-lam0.3-seed0"):  # --report-only: what has finished only
        shutil.rmtree(tmp_path / run)
    report = subprocess.run([sys.executable, str(ROOT / "bench" / "learn.py"), *SMOKE, "--out", str(tmp_path),
                             "--report-only"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    assert [r["name"] for r in json.loads((tmp_path / "results.json").read_text())["rows"]] == \
        ["warm start (before RL)", "grpo"]
    assert not (tmp_path / "smrc-sd-lam0.3-seed0").exists() and not (tmp_path / "oracle-smrc-sd-lam0.3-seed0").exists()


def test_seed_paired_difference_pairs_the_seeds_both_rows_have(tmp_path):
    """Row a − row b per seed they share (a seed fixes the task draws), mean ± SE over them, by hand."""
    from bench.learn import seed_paired_difference
    run = lambda name, avg: (tmp_path / name, {"avg@4": avg})  # noqa: E731
    results = {"smrc-sd": [run("smrc-sd-lam0.2-seed0", 0.20), run("smrc-sd-lam0.2-seed1", 0.10),
                           run("smrc-sd-lam0.2-seed2", 0.30)],
               "grpo": [run("grpo-seed0", 0.15), run("grpo-seed1", 0.16), run("grpo-seed12", 0.50)]}
    d = seed_paired_difference(results, "smrc-sd", "grpo", 4)
    assert d["seeds"] == 2 and d["per_seed"] == pytest.approx([0.05, -0.06])  # seeds 2 and 12 have no partner
    assert d["mean_se"][0] == pytest.approx(-0.005)
    assert d["mean_se"][1] == pytest.approx(abs(0.05 + 0.06) / 2)  # two values: SE = |x1 − x2| / 2
    first = {row: runs[:1] for row, runs in results.items()}
    one = seed_paired_difference(first, "smrc-sd", "grpo", 4)
    assert one["seeds"] == 1 and one["mean_se"][0] == pytest.approx(0.05)
    assert one["mean_se"][1] != one["mean_se"][1]  # NaN: no SE from one seed


def test_a_sweep_refuses_runs_of_another_warm_start_build(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    import learn
    args = learn.LearnArgs(model="tiny", out=str(tmp_path))
    sha = learn.check_warm_start(args)  # first sweep into OUT: pins the weights
    assert json.loads((tmp_path / "warm_start.json").read_text()) == {"model": "tiny", "sha256": sha}
    assert learn.check_warm_start(args) == sha  # same build: accepted
    (tmp_path / "warm_start.json").write_text(json.dumps({"model": "tiny", "sha256": "0" * 64}))
    with pytest.raises(SystemExit, match="another build of tiny"):
        learn.check_warm_start(args)


def test_each_worker_gets_its_share_of_the_cores():
    """N runs in flight on C cores: max(1, C // N) torch threads each; idle OpenMP threads sleep (unless
    set)."""
    from bench.learn import worker_env
    for workers, cores, threads in ((2, 2, "1"), (1, 2, "2"), (3, 2, "1"), (2, 16, "8"), (4, 15, "3")):
        env = worker_env(workers, cores, base={"OMP_NUM_THREADS": "64", "PATH": "/bin"})
        assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == (threads, threads)  # inherited: replaced
        assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["PATH"] == "/bin"
    assert worker_env(2, 2, base={"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"  # user's: kept


def test_a_child_run_starts_with_its_threads(tmp_path):
    """The command a sweep child gets (bench/learn._run) starts torch with the worker's thread count."""
    from bench.learn import LearnArgs, _run, usable_cores
    log = tmp_path / "child.log"
    code = "import os, torch; print(torch.get_num_threads(), os.environ['OMP_WAIT_POLICY'])"
    _run(LearnArgs(workers=2), ["-c", code], log)
    policy = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")  # a value set by the user is passed on
    assert log.read_text().split() == [str(max(1, usable_cores() // 2)), policy]
