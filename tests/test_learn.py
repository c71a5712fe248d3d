"""bench/learn.py end to end with tiny settings (2 steps, 2 evaluation games): every run trains and is
evaluated with the project's own trainer and evaluation, the results are written, and a second call resumes
instead of redoing work. The learning claim itself lives in the benchmark's output (README), not here.

Run: pytest tests/test_learn.py -q
"""
import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)
SMOKE = ["--model", "tiny-agent-quick", "--steps", "2", "--seeds", "0",
         "--rows", "grpo", "smrc-sd-lam0.3", "oracle-smrc-sd-a0.5-lam0.3", "--eval-every", "2",
         "--val-games", "2",
         "--train-games", "6", "--eval-games", "2", "--k", "2", "--tasks-per-step", "2", "--group-size", "2",
         "--workers", "2", "--compare", "oracle-smrc-sd-a0.5-lam0.3:smrc-sd-lam0.3"]


def test_a_row_name_gives_its_algorithm_lambda_and_alpha():
    """A row without λ runs at the λ the trainer resolves for the learn preset (reverse-KL forms 0.2, the
    skill-text forms their anchors'); a named λ or α is the row's; the name is the run folders' prefix."""
    from bench.learn import Row, parse_row
    from config import ALGOS
    assert parse_row("grpo") == Row("grpo", 0.0)
    assert parse_row("smrc-sd") == Row("smrc-sd", ALGOS["smrc-sd"].learn)
    assert (parse_row("sdar") == Row("sdar", ALGOS["sdar"].sd_coef)
            and parse_row("skill-sd").sd_coef == ALGOS["skill-sd"].sd_coef)
    assert parse_row("grpo-opsd-lam0.05") == Row("grpo-opsd", 0.05)
    row = parse_row("oracle-fullpath-sd-a0.99-lam1")
    assert row == Row("fullpath-sd", 1.0, 0.99) and row.name == "oracle-fullpath-sd-a0.99-lam1"
    assert parse_row("oracle-smrc-sd-a0.5").name == f"oracle-smrc-sd-a0.5-lam{ALGOS['smrc-sd'].learn:g}"
    assert parse_row("smrc-sd-lam0.03").name == "smrc-sd-lam0.03"


def test_plan_is_seed_major_with_one_folder_per_row_and_seed():
    """Every row at every seed, each seed's rows together; variants of α and λ never share a folder."""
    from bench.learn import LearnArgs, _run_dir, check_args, plan
    args = LearnArgs(rows=("grpo", "oracle-smrc-sd-a0.5", "oracle-smrc-sd-a0.99", "smrc-sd-lam1"),
                     seeds=(0, 3), out="OUT")
    rows = check_args(args)
    jobs = plan(args, rows)
    assert [(r.name, s) for r, s in jobs] == [(n, s) for s in (0, 3) for n in (
        "grpo", "oracle-smrc-sd-a0.5-lam0.2", "oracle-smrc-sd-a0.99-lam0.2", "smrc-sd-lam1")]
    folders = [_run_dir(args, *j) for j in jobs]
    assert len(set(folders)) == len(jobs) and folders[2] == Path("OUT/oracle-smrc-sd-a0.99-lam0.2-seed0")


def test_pairs_are_against_grpo_and_smrc_against_fullpath_at_equal_lambda_and_alpha():
    from bench.learn import pairs, parse_row
    rows = [parse_row(r) for r in ("grpo", "smrc-sd", "fullpath-sd", "oracle-smrc-sd-a0.99",
                                   "oracle-fullpath-sd-a0.5", "oracle-fullpath-sd-a0.99", "smrc-sd-lam0.03")]
    got = {(a.name, b.name) for a, b in pairs(rows)}
    assert got == {(r.name, "grpo") for r in rows[1:]} | {
        ("smrc-sd-lam0.2", "fullpath-sd-lam0.2"),
        ("oracle-smrc-sd-a0.99-lam0.2", "oracle-fullpath-sd-a0.99-lam0.2")}


def test_strength_per_run_by_hand():
    """The finite median of the gradient ratio, the KL summed per distilled turn,
    the candidate-sampled share."""
    from bench.learn_report import strength
    run = [{"actor/sd_grpo_grad_ratio": 0.5, "sd/teacher_minus_student_logp": -0.2, "sd/distilled_tokens": 10,
            "sd/distilled_turns": 2, "sd/candidate_routed_turns": 2, "sd/candidate_sampled_turns": 1},
           {"actor/sd_grpo_grad_ratio": math.inf, "sd/teacher_minus_student_logp": -0.1,
            "sd/distilled_tokens": 20, "sd/distilled_turns": 2, "sd/candidate_routed_turns": 2,
            "sd/candidate_sampled_turns": 2},
           {"actor/sd_grpo_grad_ratio": 0.9, "sd/distilled_tokens": 0, "sd/distilled_turns": 0},
           {"actor/sd_grpo_grad_ratio": 0.1, "sd/distilled_tokens": 0, "sd/distilled_turns": 0}]
    grpo = [{"actor/sd_grpo_grad_ratio": math.nan, "sd/distilled_turns": 0}]
    got = strength([run, grpo])
    assert got["sd/grpo"][0] == pytest.approx(0.5)  # median of 0.5, 0.9, 0.1 (inf left out)
    assert got["kl_per_turn"][0] == pytest.approx((0.2 * 10 + 0.1 * 20) / 4)
    assert got["cand_share"][0] == pytest.approx(3 / 4)
    assert all(math.isnan(v[1]) for v in got.values())  # GRPO: no reading of any


@pytest.mark.parametrize("change, flag", [
    (dict(steps=0), "--steps 0"), (dict(seeds=()), "--seeds (none)"), (dict(seeds=(0, 0)), "--seeds 0 0"),
    (dict(rows=("grpo", "smrc")), "--rows smrc"),
    (dict(rows=("oracle-sdar-a0.5",)), "--rows oracle-sdar-a0.5"),
    (dict(rows=("oracle-smrc-sd-a1.5",)), "--rows oracle-smrc-sd-a1.5"),
    (dict(rows=("oracle-smrc-sd",)), "--rows oracle-smrc-sd"),
    (dict(rows=("smrc-sd-a0.5",)), "--rows smrc-sd-a0.5"),
    (dict(rows=("smrc-sd-lamnan",)), "--rows smrc-sd-lamnan"),
    (dict(rows=("grpo-lam0.2",)), "--rows grpo-lam0.2"),
    (dict(rows=("smrc-sd", "smrc-sd-lam0.2")), "--rows smrc-sd smrc-sd-lam0.2"),
    (dict(rows=()), "--rows (none)"),
    (dict(compare=("grpo:smrc-sd-lam0.1",)), "--compare grpo:smrc-sd-lam0.1"),  # a row not in --rows
    (dict(compare=("grpo-smrc-sd",)), "--compare grpo-smrc-sd"),
    (dict(compare=("grpo:grpo",)), "--compare grpo:grpo"),
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
    return subprocess.run([sys.executable, str(ROOT / "bench" / "learn.py"), *SMOKE, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1500)


def _check_gains_by_hand(out: Path, res: dict) -> None:
    """GRPO's gain over the warm start, from the two evaluations' JSON: per seed (one seed: no SE) and
    paired by task (each task's success over its k attempts, GRPO's minus the warm start's)."""
    evals = {n: json.loads((out / "eval" / f"{n}.json").read_text())["rows"][0]
             for n in ("grpo-seed0", "warm-start")}
    gain, se = res["grpo_gain_avg@k"]
    avg = {n: e["metrics"]["avg@2"] for n, e in evals.items()}
    assert gain == pytest.approx(avg["grpo-seed0"] - avg["warm-start"])
    assert math.isnan(se)
    per_task = {}
    for name, sign in (("grpo-seed0", 1), ("warm-start", -1)):
        for e in evals[name]["episodes"]:
            per_task[e["task_id"]] = per_task.get(e["task_id"], 0.0) + sign * float(e["won"]) / 2
    assert res["paired_gain_avg@k"]["grpo"][0] == pytest.approx(sum(per_task.values()) / len(per_task))


def _check_runs(out: Path) -> None:
    """Each run trained 2 steps, validated in the loop at step 2 (--eval-every 2), saved, and was evaluated
    at k = 2."""
    for run in ("grpo-seed0", "smrc-sd-lam0.3-seed0", "oracle-smrc-sd-a0.5-lam0.3-seed0"):
        rows = [json.loads(x) for x in (out / run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "rollout/success_rate" in r] == [1, 2]
        assert [r["step"] for r in rows if "val/success_rate" in r] == [2]
        assert (out / run / "step_000002" / "model.safetensors").exists()
        assert json.loads((out / "eval" / f"{run}.json").read_text())["k"] == 2
    oracle = json.loads((out / "oracle-smrc-sd-a0.5-lam0.3-seed0" / "config.json").read_text())
    assert oracle["teacher"]["oracle"] == 0.5 and oracle["algo"] == "smrc-sd"  # the row's trainer flags


def test_learn_runs_end_to_end_and_resumes(tmp_path):
    proc = _learn(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    names = [r["name"] for r in res["rows"]]
    assert names == ["warm start (before RL)", "grpo", "smrc-sd-lam0.3", "oracle-smrc-sd-a0.5-lam0.3"]
    for row in res["rows"]:
        assert 0.0 <= row["avg@2"][0] <= row["pass@2"][0] <= 1.0
        assert row["valid_action_ratio"][0] == 1.0  # the learn preset decodes admissible commands only
    smrc = next(r for r in res["rows"] if r["name"] == "smrc-sd-lam0.3")
    assert 0.0 <= smrc["router/match_rate"][0] <= 1.0 and "sd/distilled_share" in smrc
    from bench.learn_report import _metrics
    steps = [m for m in _metrics(tmp_path / "smrc-sd-lam0.3-seed0") if "sd/kl_student_teacher" in m]
    assert len(steps) == 2  # the run's two training steps
    assert ("sd/candidate_gain" in smrc) == any(m.get("sd/candidate_turns", 0) > 0 for m in steps)
    assert "sd/candidate_gain" not in res["rows"][1]  # GRPO has no teacher
    assert all(r["train_min"][0] > 0 and r["eval_min"][0] > 0 for r in res["rows"][1:])  # wall time per run
    _check_gains_by_hand(tmp_path, res)
    assert set(res["paired_gain_avg@k"]) == {"grpo", "smrc-sd-lam0.3", "oracle-smrc-sd-a0.5-lam0.3"}
    assert set(res["paired_difference_avg@k"]) == {  # every row against GRPO, and the --compare pair
        "smrc-sd-lam0.3 − grpo", "oracle-smrc-sd-a0.5-lam0.3 − grpo",
        "oracle-smrc-sd-a0.5-lam0.3 − smrc-sd-lam0.3"}
    assert res["seed_paired_difference_avg@k"]["smrc-sd-lam0.3 − grpo"]["seeds"] == 1  # one seed: no SE
    assert res["warm_start_greedy"]["games"] == 2 and 0.0 <= res["warm_start_greedy"]["success"] <= 1.0
    assert json.loads((tmp_path / "eval" / "warm-start-greedy.json").read_text())["temperature"] == 0
    _check_runs(tmp_path)
    assert "| smrc-sd-lam0.3 | 1 |" in (tmp_path / "results.md").read_text()
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/metrics.jsonl")}
    for ckpt in tmp_path.glob("*/step_*"):  # a finished run is its metrics + evaluation (a sweep moved)
        shutil.rmtree(ckpt)
    again = _learn(tmp_path)  # everything is done: nothing is retrained or re-evaluated
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/metrics.jsonl")} == stamps
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == res["rows"]
    for run in ("smrc-sd-lam0.3-seed0", "oracle-smrc-sd-a0.5-lam0.3-seed0"):  # --report-only: the finished
        shutil.rmtree(tmp_path / run)
    report = subprocess.run([sys.executable, str(ROOT / "bench" / "learn.py"), *SMOKE, "--out", str(tmp_path),
                             "--report-only"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    names = [r["name"] for r in json.loads((tmp_path / "results.json").read_text())["rows"]]
    assert names == ["warm start (before RL)", "grpo"]
    assert not any((tmp_path / r).exists()
                   for r in ("smrc-sd-lam0.3-seed0", "oracle-smrc-sd-a0.5-lam0.3-seed0"))


def test_seed_paired_difference_pairs_the_seeds_both_rows_have(tmp_path):
    """Row a − row b per seed they share (a seed fixes the task draws), mean ± SE over them, by hand."""
    from bench.learn_report import seed_paired_difference
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


def test_a_by_task_difference_compares_the_seeds_both_rows_have(tmp_path):
    """While a sweep is in progress, row a − row b paired by task takes the seeds both have: a row with
    seed 0 against GRPO with seeds 0 and 1 is seed 0 against seed 0, by hand."""
    from bench.learn_report import on_shared_seeds, paired_difference
    (tmp_path / "eval").mkdir()
    won = {"smrc-sd-lam0.2-seed0": [1, 0, 0, 0], "grpo-seed0": [0, 0, 0, 0], "grpo-seed1": [1, 1, 1, 1]}
    for name, w in won.items():  # two tasks of two attempts each
        eps = [{"task_id": f"t{i // 2}", "won": x} for i, x in enumerate(w)]
        (tmp_path / "eval" / f"{name}.json").write_text(json.dumps({"rows": [{"episodes": eps}]}))
    rows = {name.rsplit("-seed", 1)[0]: [] for name in won}
    for name in won:
        rows[name.rsplit("-seed", 1)[0]].append((tmp_path / name, {}))
    a, b = on_shared_seeds(rows["smrc-sd-lam0.2"], rows["grpo"])
    assert (a, b) == (["smrc-sd-lam0.2-seed0"], ["grpo-seed0"])
    assert paired_difference(tmp_path, a, b)[0] == pytest.approx(0.25)  # tasks: 0.5 − 0 and 0 − 0
    assert paired_difference(tmp_path, a, ["grpo-seed0", "grpo-seed1"])[0] == pytest.approx(-0.25)  # mixed


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


def test_a_records_evaluation_of_the_same_warm_start_is_reused_not_repeated(tmp_path):
    """A warm start kept in a sweep record (RECORD/warm_start/, pinned by RECORD/warm_start.json) brings the
    record's evaluations of it into a new OUT; other weights, another k or panel size bring nothing."""
    sys.path.insert(0, str(ROOT / "bench"))
    import learn
    record = tmp_path / "record"
    (record / "warm_start").mkdir(parents=True)
    (record / "warm_start" / "model.safetensors").write_bytes(b"weights")
    (record / "eval").mkdir()
    for name, k in (("warm-start", 4), ("warm-start-greedy", 1)):
        (record / "eval" / f"{name}.json").write_text(json.dumps({"k": k, "tasks": ["a", "b", "c"]}))
        (record / "eval" / f"{name}.md").write_text(name)

    def reuse(pinned: bytes, out: str, **kw) -> list[str]:
        (record / "warm_start.json").write_text(json.dumps({"sha256": hashlib.sha256(pinned).hexdigest()}))
        args = learn.LearnArgs(model=str(record / "warm_start"), eval_games=3, k=4, out=str(tmp_path / out))
        args = dataclasses.replace(args, **kw)
        return learn.reuse_warm_start_evaluations(args, learn.check_warm_start(args))

    greedy = str(record / "eval" / "warm-start-greedy.json")
    assert reuse(b"other weights", "a") == [] and reuse(b"weights", "b", eval_games=2) == []
    assert reuse(b"weights", "c", k=2) == [greedy]  # greedy is k=1 whatever --k is
    assert reuse(b"weights", "d") == [str(record / "eval" / "warm-start.json"), greedy]
    assert sorted(f.name for f in (tmp_path / "d" / "eval").iterdir()) == [
        "warm-start-greedy.json", "warm-start-greedy.md", "warm-start.json", "warm-start.md"]
    assert reuse(b"weights", "d") == []  # already there: nothing copied again


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


def test_dose_points_pair_each_sd_row_with_its_difference_from_grpo(tmp_path):
    """The dose-response figure's points: rows with an SD share and a difference against GRPO, by hand (the
    SMRC − FullPath difference and rows without a share are not points); the figure is drawn from them."""
    from analysis.plots import plot_dose
    from bench.learn_report import dose_points
    rows = [{"name": "grpo"}, {"name": "smrc-sd-lam0.2", "sd/grpo": (0.7, 0.05)},
            {"name": "fullpath-sd-lam0.2", "sd/grpo": (0.4, 0.02)}]
    by_seed = {("smrc-sd-lam0.2", "grpo"): {"mean_se": (-0.05, 0.02), "seeds": 5},
               ("fullpath-sd-lam0.2", "grpo"): {"mean_se": (-0.03, float("nan")), "seeds": 1},
               ("smrc-sd-lam0.2", "fullpath-sd-lam0.2"): {"mean_se": (-0.02, 0.02), "seeds": 5}}
    points = dose_points(rows, by_seed)
    assert points == [("smrc-sd-lam0.2", 0.7, -0.05, 0.02, 5), ("fullpath-sd-lam0.2", 0.4, -0.03,
                                                                 pytest.approx(float("nan"), nan_ok=True), 1)]
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    plot_dose(points, tmp_path / "strength.png")
    assert (tmp_path / "strength.png").stat().st_size > 0
    assert plt.get_fignums() == []  # a sweep redraws after each of its runs: no figure is left open


def test_a_by_seed_difference_says_whether_it_separates_the_rows():
    """The report's verdict on an ordering: separated at >= 2 SE over seeds, "not separated" below, no SE
    (and no verdict) from one seed, by hand."""
    from bench.learn_report import _over_seeds, _pm
    assert _over_seeds(-0.099, 0.023, 2) == "-0.099 ± 0.023 (SE over 2 seeds; 4.3 SE: separated)"
    assert _over_seeds(-0.115, 0.061, 5) == "-0.115 ± 0.061 (SE over 5 seeds; 1.8 SE: not separated)"  # 1.885
    assert _over_seeds(-0.067, 0.034, 3).endswith("1.9 SE: not separated)")  # 1.97: rounded down, not to 2.0
    assert _over_seeds(0.04, 0.02, 3).endswith("2.0 SE: separated)")  # the threshold is inclusive
    assert _over_seeds(0.0, 0.0, 3).endswith("0.0 SE: not separated)")  # equal seeds: no order
    assert _over_seeds(0.011, float("nan"), 1) == "+0.011 (1 seed: no SE yet)"
    assert _over_seeds(-0.05, 0.0, 2).endswith("∞ SE: separated)")  # all seeds one gap: no overflow
    assert _pm((-0.05, 0.0), "+", 2) == "-0.050 ± 0.000 (∞ SE)"  # the dose table's cell says the same


def test_a_value_not_measured_is_left_out_of_a_mean_not_averaged_in():
    """NaN (e.g. the valid-action ratio of a panel without turns) never reaches a mean or a table cell."""
    from bench.learn_report import _mean_se, _pm
    assert _mean_se([0.5, float("nan"), 0.25]) == pytest.approx((0.375, 0.125))
    assert _mean_se([0.5, float("nan")]) == (0.5, pytest.approx(float("nan"), nan_ok=True))
    assert _pm(_mean_se([float("nan")])) == "-" and _pm(_mean_se([0.5, float("nan")])) == "0.500"


def test_the_dose_table_puts_each_rows_difference_from_grpo_beside_its_strength():
    """One line per RL row: Avg@k, Pass@k, − GRPO by seed (with how many SE) and by task, the SD term's share,
    KL per turn and candidate share; the other pairs below it, by hand."""
    from bench.learn_report import dose_table
    rows = [{"name": "warm start"}, {"name": "grpo", "n": 2, "avg@4": (0.24, 0.02), "pass@4": (0.5, 0.05)},
            {"name": "smrc-sd-lam0.03", "n": 2, "avg@4": (0.23, 0.01), "pass@4": (0.48, float("nan")),
             "sd/grpo": (0.118, 0.011), "kl_per_turn": (3.17, 0.04), "cand_share": (0.49, 0.001)}]
    by_task = {"smrc-sd-lam0.03 − grpo": (-0.01, 0.014),
               "smrc-sd-lam0.03 − fullpath-sd-lam0.03": (0.05, 0.02)}
    by_seed = {"smrc-sd-lam0.03 − grpo": {"mean_se": (-0.01, 0.004), "seeds": 2},
               "smrc-sd-lam0.03 − fullpath-sd-lam0.03": {"mean_se": (0.05, float("nan")), "seeds": 1}}
    lines = dose_table(rows, by_task, by_seed, 4).splitlines()
    assert lines[2] == "| grpo | 2 | 0.240 ± 0.020 | 0.500 ± 0.050 | - | - | - | - | - |"
    assert lines[3] == ("| smrc-sd-lam0.03 | 2 | 0.230 ± 0.010 | 0.480 | -0.010 ± 0.004 (2.5 SE) "
                        "| -0.010 ± 0.014 | 0.118 ± 0.011 | 3.170 ± 0.040 | 0.490 ± 0.001 |")
    assert lines[-1] == ("| smrc-sd-lam0.03 − fullpath-sd-lam0.03 | 1 | +0.050 | +0.050 ± 0.020 "
                         "| 0.118 ± 0.011 / - |")  # the pair's strengths side by side (b has no run)


def test_the_report_checks_the_pilots_premises_on_the_sweeps_runs(tmp_path):
    """pilot_agreement: a run's median SD / GRPO share over all its steps / over its first K steps (steps with
    no distilled turn, an inf ratio or validation rows read nothing); share_per_unit_lambda: share / λ of rows
    alike but for λ, a row with no λ sibling left out; by hand."""
    from analysis.lambda_pilot import pilot_agreement, share_per_unit_lambda
    from bench.learn_report import _metrics, pilot_text

    def run(name, ratios):  # None: a step with no distilled turn
        rows = [{"step": i, "actor/sd_grpo_grad_ratio": math.nan if r is None else r,
                 "sd/distilled_turns": 0 if r is None else 3} for i, r in enumerate(ratios)]
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in rows + [
            {"step": len(rows), "val/success_rate": 0.2}]))
        return tmp_path / name

    a = run("a-seed0", [1.0, math.inf, 1.0, 1.0, 1.0] + [4.0] * 7)  # all: median 4; first 5: 1; first 10: 4
    b = run("b-seed0", [None] + [0.5] * 5)  # 1 at any K
    c = run("c-seed0", [None] * 4)  # nothing measured: left out
    agreement = pilot_agreement([_metrics(r) for r in (a, b, c)], steps=(5, 10))
    assert agreement[5] == {"runs": 2, "median": 2.5, "q10": pytest.approx(1.3), "q90": pytest.approx(3.7),
                            "within_1.5x": 1}
    assert agreement[10] == {"runs": 2, "median": 1.0, "q10": 1.0, "q90": 1.0, "within_1.5x": 2}
    rows = [{"name": "grpo"}, {"name": "smrc-sd-lam0.2", "sd/grpo": (0.8, 0.1)},
            {"name": "smrc-sd-lam0.03", "sd/grpo": (0.12, 0.006)},
            {"name": "oracle-smrc-sd-a0.5-lam1", "sd/grpo": (0.6, 0.02)}]
    units = share_per_unit_lambda(rows)
    assert units == {"smrc-sd": {"0.2": pytest.approx((4.0, 0.5)), "0.03": pytest.approx((4.0, 0.2))}}
    text = pilot_text(agreement, units)
    assert "- smrc-sd: 4.000 ± 0.500 at λ 0.2, 4.000 ± 0.200 at λ 0.03" in text
    assert "- K = 5: median 2.50 (10–90%: 1.30–3.70) over 2 runs; within 1.5× in 1 of 2" in text
