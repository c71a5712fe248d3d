"""smrc.py end to end through its real CLI (tiny preset): training changes the weights, checkpoints load with
from_pretrained, SMRC-SD distils matched turns, resume reproduces the uninterrupted run,
bad input fails clearly.

Run: pytest tests/test_smrc.py -q   (about 3 minutes on 2 cores)
"""
import dataclasses
import gzip
import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scale import preflight

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)
pytest.importorskip("alfworld", reason="the training loop runs on the real ALFWorld engine")
# small enough for CI, big enough to exercise groups, halves of the rollout pipeline, routing and the update
FAST = ["--preset", "tiny", "--rollout.tasks-per-step", "2", "--rollout.group-size", "3",
        "--alfworld.max-steps", "4"]


def run(*args, env=None, check=True):
    """smrc.py through its CLI, on one torch thread: a run's numbers then do not depend on the machine's core
    count (test_numbers_equal_the_recorded_run compares them bit for bit)."""
    proc = subprocess.run([sys.executable, str(ROOT / "smrc.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, timeout=900)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def smrc_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smrc")
    # λ 0.1: the tiny preset's until issue 57, at which the run was recorded
    # (test_numbers_equal_the_recorded_run)
    proc = run(*FAST, "--steps", "2", "--save-every", "1", "--grpo.sd-coef", "0.1", "--output-dir", str(out))
    (out / "stdout.txt").write_text(proc.stdout)
    return out


def test_the_end_of_a_run_says_what_it_made_and_how_to_evaluate_it(smrc_run):
    """One last line: the newest checkpoint, the metrics file and the before-after command for the run that
    parses (issue 68: its output shows the run's effect; tests/test_view.py runs it)."""
    last = (smrc_run / "stdout.txt").read_text().strip().splitlines()[-1]
    ckpt = smrc_run / "step_000002"
    done = f"[smrc] done: checkpoint {ckpt}, metrics {smrc_run / 'metrics.jsonl'}; before/after"
    assert last.startswith(done)
    import tyro
    from analysis.before_after import BeforeAfterArgs
    command = last.split("python evaluate.py before-after ", 1)[1].split(";")[0]
    args = tyro.cli(BeforeAfterArgs, args=command.split())
    assert (Path(args.run), args.k, args.limit) == (smrc_run, 4, 0)


def test_two_steps_change_the_weights_and_checkpoint_loads_with_from_pretrained(smrc_run):
    from transformers import AutoModelForCausalLM
    from embedded.warmstart import resolve
    rows = metrics(smrc_run)
    assert [r["step"] for r in rows] == [1, 2]
    trained = AutoModelForCausalLM.from_pretrained(smrc_run / "step_000002")
    initial = AutoModelForCausalLM.from_pretrained(resolve("tiny-agent-quick"))  # the tiny preset's
                                                                                 # starting model
    changed = [n for (n, p), q in zip(trained.named_parameters(), initial.parameters())
               if not torch.equal(p, q)]
    assert len(changed) == len(list(initial.parameters())), "every parameter should have moved"
    for key in ("rollout/success_rate", "rollout/valid_action_ratio", "actor/entropy", "actor/kl", "actor/lr",
                "time/step_s", "time/tokens_per_s", "time/env_share", "rollout/response_tokens"):
        assert key in rows[-1]


def test_smrc_sd_distils_matched_turns_only(smrc_run, capsys):
    import smrc
    rows = metrics(smrc_run)
    for r in rows:
        assert r["router/match_rate"] > 0          # planner references seed the bank in the tiny preset
        assert r["sd/distilled_turns"] == r["router/matched_turns"] - r["sd/over_length_turns"]
        assert r["sd/teacher_tokens"] > 0
        # the diagnostics: k1 KL on distilled tokens, the candidate's gain, the two terms' gradient norms
        assert r["sd/kl_student_teacher"] == pytest.approx(-r["sd/teacher_minus_student_logp"])
        assert (0 < r["sd/candidate_turns"] <= r["sd/distilled_turns"]
                and math.isfinite(r["sd/candidate_gain"]))
        g_pg, g_sd = r["actor/grad_norm_grpo"], r["actor/grad_norm_sd"]  # g_pg = 0 when every return is equal
        ratio = r["actor/sd_grpo_grad_ratio"]  # not measured (NaN) without a GRPO signal
        assert g_sd > 0 and (ratio == pytest.approx(g_sd / g_pg) if g_pg else math.isnan(ratio))
    resolved = json.loads((smrc_run / "config.json").read_text())["resolved"]
    init = resolved.pop("initial_weights")  # the warm start's name, folder and weights' sha256
    assert resolved == {"matcher": "structured", "context": "smrc", "sd_loss": "reverse-kl", "sd_coef": 0.1,
                        "teacher_oracle": 0.0}
    from embedded.warmstart import resolve
    folder = Path(resolve("tiny-agent-quick"))
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    assert init == {"model": "tiny-agent-quick", "path": str(folder), "sha256": {"model.safetensors": digest}}
    assert (smrc.config_from_run(smrc_run, "none").grpo.sd_coef == 0.1
            and "unknown keys" not in capsys.readouterr().out)
    with gzip.open(smrc_run / "rollouts.jsonl.gz", "rt") as f:
        turns = [json.loads(line) for line in f]
    assert len(turns) == sum(r["rollout/turns"] * 6 for r in rows)
    assert sum(t["routed"] for t in turns) == sum(r["router/matched_turns"] for r in rows) > 0
    for t in turns:  # structured routing: a routed turn's state equals the reference's state
                     # at the matched position
        assert (t["match"] is None) == (not t["routed"])
        if t["routed"]:
            assert t["match"]["ref_signature"] == t["signature"], t
            assert t["match"]["candidate"] == t["match"]["ref_suffix"][0]


RECORDED = ROOT / "tests" / "recorded" / "smrc_run.json"  # its numbers, re-recorded with a new warm start


def _sha256(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_numbers_equal_the_recorded_run(smrc_run):
    """smrc_run's metrics (times aside) and final weights equal the recorded ones (first recorded before issue
    22's refactor, again with warm start v21), bit for bit: a change of code alone keeps every number (a
    diagnostic added later, e.g. issue 36's sd/candidate_sampled_share, adds keys; the recorded ones stay).
    Skipped where the warm start itself came out other (another machine's arithmetic), since every number
    follows from it."""
    from embedded.warmstart import resolve
    recorded = json.loads(RECORDED.read_text())
    if _sha256(Path(resolve("tiny-agent-quick")) / "model.safetensors") != recorded["warm_start_sha256"]:
        pytest.skip("tiny-agent-quick was built with other numbers here than where the run was recorded")
    rows = metrics(smrc_run)
    assert len(rows) == len(recorded["metrics"])
    for row, old in zip(rows, recorded["metrics"]):
        assert set(old) <= set(row), f"recorded metrics no longer logged: {sorted(set(old) - set(row))}"
        # every recorded key, in the recorded order, NaN included; metrics added since may sit between them
        assert json.dumps({k: row[k] for k in old}) == json.dumps(old)
    assert _sha256(smrc_run / "step_000002" / "model.safetensors") == recorded["weights_sha256"]


def test_no_privileged_text_in_rollout_prompts(tiny, tmp_path):
    """The prompts the policy acts on (training rollouts and evaluation alike) contain no reference, summary,
    candidate or signature text, whichever algorithm runs."""
    import envs
    import rollout
    import router
    import smrc
    from environments.pool import EnvPool
    from models import HFEngine
    model, tok = tiny
    cfg = smrc.parse_config(FAST)
    tasks = envs.load_tasks(cfg.alfworld, "train")[:2]
    engine = HFEngine(model, tok, cfg.rollout.sampling)
    with EnvPool(cfg.alfworld, 0) as pool:
        eps, _ = rollout.collect_rollouts(engine, pool, tok, tasks, cfg.rollout, cfg.alfworld, tag="t",
                                          show_progress=False)
    markers = [router.SUMMARY_TEMPLATE.split("\n")[0], router.CANDIDATE_TEMPLATE.split("\n")[0][:20],
               router.TRAJECTORY_TEMPLATE.split("\n")[0][:20], router.SKILL_TEMPLATE.split("\n")[0],
               "General skills", router.CLOSING_TEMPLATE, "('task',", "signature"]
    for t in (t for e in eps for t in e.turns):
        assert not any(m in t.user_text for m in markers), t.user_text
        assert tok.decode(t.prompt_ids) .count("<|im_start|>user") == 1


def test_resume_reproduces_the_uninterrupted_run(smrc_run, tmp_path):
    full, part = smrc_run, tmp_path / "part"  # the uninterrupted run: smrc_run's 2 steps, at its λ
    same = (*FAST, "--grpo.sd-coef", "0.1", "--save-every", "100", "--output-dir", str(part))
    run(*same, "--steps", "1")               # "killed" after step 1
    run(*same, "--steps", "2", "--resume")
    def archive_steps(run_dir):
        with gzip.open(run_dir / "rollouts.jsonl.gz", "rt") as f:
            return [json.loads(line)["step"] for line in f]
    assert archive_steps(part) == archive_steps(full)   # no archived turn lost or written twice
                                                        # across the resume
    a, b = metrics(full)[1], metrics(part)[1]
    assert a["step"] == b["step"] == 2
    for k in a:
        if not k.startswith(("time/", "mem/")) and not k.endswith("_time_s"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7, nan_ok=True), k


def test_algo_sets_matcher_and_context_and_flags_override():
    import smrc
    cfg = smrc.parse_config(["--algo", "grpo"])
    assert (cfg.router.matcher, cfg.model) == ("none", "Qwen/Qwen3-1.7B")
    cfg = smrc.parse_config(["--algo", "fullpath-sd", "--router.matcher", "structured"])
    assert (cfg.router.matcher, cfg.router.context) == ("structured", "trajectory")
    cfg = smrc.parse_config(["--preset", "tiny", "--algo", "smrc-sd"])
    assert (cfg.router.matcher, cfg.router.context, cfg.model) == ("structured", "smrc", "tiny-agent-quick")
    table = {a: (smrc.parse_config(["--algo", a]).router.matcher,
                 smrc.parse_config(["--algo", a]).router.context,
                 smrc.parse_config(["--algo", a]).grpo.sd_loss) for a in ("skill-sd", "sdar", "grpo-opsd")}
    assert table == {"skill-sd": ("every-turn", "skill", "skill-sd"), "sdar": ("every-turn", "skill", "sdar"),
                     "grpo-opsd": ("every-turn", "skill", "grpo-opsd")}
    cfg = smrc.parse_config(["--algo", "sdar", "--router.context", "fullpath"])  # a trajectory context:
                                                                                 # FullPath routing
    assert ((cfg.router.matcher, cfg.router.context, cfg.grpo.sd_loss)
            == ("with-reference", "trajectory", "sdar"))
    cfg = smrc.parse_config(["--algo", "sdar", "--router.context", "full",
                             "--router.matcher", "all"])  # old names
    assert (cfg.router.matcher, cfg.router.context) == ("with-reference", "smrc")
    cfg = smrc.parse_config(["--algo", "smrc-sd", "--grpo.sd-loss", "skill-sd"])
    assert (cfg.router.matcher, cfg.grpo.sd_loss) == ("structured", "skill-sd")
    with pytest.raises(SystemExit,
                       match="^error: --router.matcher every-turn .* --router.context smrc needs"):
        preflight.check_inputs(smrc.parse_config(["--preset", "tiny", "--router.matcher", "every"]))
    for algo in ("sdar", "grpo"):  # no reference candidate to be an oracle of
        with pytest.raises(SystemExit, match="^error: --teacher.oracle needs a reference candidate"):
            preflight.check_inputs(smrc.parse_config(["--preset", "tiny", "--algo", algo,
                                                      "--teacher.oracle", "0.5"]))


def test_lambda_applied_after_algo_preset_and_flag():
    """A preset's λ is of the reverse-kl forms only; the skill-text forms keep their anchor λ;
    --grpo.sd-coef wins."""
    import smrc
    runs = [("learn", "smrc-sd"), ("learn", "grpo"), ("learn", "sdar"), ("tiny", "skill-sd"),
            ("tiny", "smrc-sd"),
            ("none", "fullpath-sd"), ("learn", "sdar", "--grpo.sd-coef", "0.5"),
            ("learn", "smrc-sd", "--grpo.sd-loss", "grpo-opsd")]
    lam = [smrc.parse_config(["--preset", preset, "--algo", algo, *flags]).grpo.sd_coef
           for preset, algo, *flags in runs]
    assert lam == [0.2, 0.2, 0.01, 0.001, 0.02, 0.01, 0.5, 0.01]  # none: the reverse-kl anchor's 0.01


def _distils_every_turn(rows: list[dict]) -> None:
    for r in rows:
        assert r["router/match_rate"] == 1.0 and r["sd/distilled_turns"] > 0
        assert r["sd/distilled_turns"] == r["router/matched_turns"] - r["sd/over_length_turns"]
        assert r["actor/optimizer_steps"] >= 1 and r["sd/teacher_tokens"] > 0


def test_skill_sd_trains_two_steps_with_in_loop_validation(tmp_path):
    """--algo skill-sd: every turn distilled under the skill context with the rho*k3 form; --eval-every 1 on a
    2-task panel logs a validation row after each step and keeps the best weights."""
    proc = run(*FAST, "--algo", "skill-sd", "--steps", "2", "--save-every", "2", "--eval-every", "1",
               "--eval-tasks", "2", "--output-dir", str(tmp_path))
    assert "matcher=every-turn context=skill L_SD=skill-sd" in proc.stdout
    rows = metrics(tmp_path)
    train, val = ([r for r in rows if "val/success_rate" not in r],
                  [r for r in rows if "val/success_rate" in r])
    assert [r["step"] for r in train] == [1, 2] and [r["step"] for r in val] == [1, 2]
    _distils_every_turn(train)
    assert all(r["actor/sd_gate"] == 1.0 for r in train)  # no gate in this form
    for r in val:
        assert r["val/tasks"] == 2 and r["val/temperature"] == 0.4 and 0.0 <= r["val/success_rate"] <= 1.0
        assert len([k for k in r if k.startswith("val/success/")]) == 2  # stratified: two task types
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["step"] in (1, 2) and best["val/success_rate"] == max(r["val/success_rate"] for r in val)
    assert ((tmp_path / "best" / "model.safetensors").exists()
            and (tmp_path / "best" / "smrc_config.json").exists())


def test_sdar_trains_two_steps(tmp_path):
    proc = run(*FAST, "--algo", "sdar", "--steps", "2", "--save-every", "2", "--output-dir", str(tmp_path))
    assert "matcher=every-turn context=skill L_SD=sdar lambda=0.01 |" in proc.stdout  # the anchor λ
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    _distils_every_turn(rows)
    assert all(0.0 < r["actor/sd_gate"] < 1.0 for r in rows)  # σ(5·Δ) gate
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["algo"] == "sdar" and config["resolved"]["sd_coef"] == 0.01


@pytest.mark.parametrize("algo,alpha,matcher", [("fullpath-sd", "1", "with-reference"),
                                                ("smrc-sd", "0.5", "structured")])
def test_oracle_teacher_trains_two_steps(tmp_path, algo, alpha, matcher):
    """--teacher.oracle: the same routed turns distilled without a teacher forward; the oracle's candidate
    gain log((1−α)·π(c) + α) − log π(c) is >= 0."""
    proc = run(*FAST, "--algo", algo, "--teacher.oracle", alpha, "--steps", "2", "--save-every", "2",
               "--output-dir", str(tmp_path))
    assert (f"matcher={matcher} context=" in proc.stdout
            and f"lambda=0.02 oracle alpha={alpha} |" in proc.stdout)
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["sd/distilled_turns"] == r["router/matched_turns"] - r["sd/over_length_turns"] > 0
        assert r["sd/teacher_tokens"] == 0 and math.isfinite(r["sd/kl_student_teacher"])
        assert r["sd/candidate_turns"] > 0 and r["sd/candidate_gain"] >= 0
        assert r["actor/grad_norm_sd"] > 0 and r["actor/optimizer_steps"] >= 1


def _fields(cls, prefix=""):
    """(flag, field, the dataclass declaring it) of every option of a config tree,
    nested sections included."""
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            yield from _fields(type(default), f"{prefix}{f.name}.")
        else:
            owner = next(c for c in cls.__mro__ if f.name in getattr(c, "__annotations__", {}))
            yield "--" + (prefix + f.name).replace("_", "-"), f.name, owner


def _documented(cls) -> set[str]:
    """The fields of `cls` followed by an attribute docstring in its source (what tyro turns into --help
    text)."""
    import ast
    import inspect
    body = ast.parse(inspect.getsource(cls).strip()).body[0].body
    return {a.target.id for a, b in zip(body, body[1:]) if isinstance(a, ast.AnnAssign)
            and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
            and isinstance(b.value.value, str)}


def test_help_documents_every_section():
    """Every option of every config section is a flag in --help, with its own attribute docstring as help
    text."""
    import config
    out = run("--help").stdout
    options = list(_fields(config.Config))
    assert len(options) > 80 and {f.rsplit(".", 1)[0] for f, _, _ in options if "." in f} >= {
        "--alfworld", "--webshop", "--rollout", "--rollout.sampling", "--grpo", "--router", "--teacher",
        "--dist"}
    for flag, name, owner in options:
        head, _, last = flag[2:].rpartition(".")
        assert flag in out or f"--{head + '.' if head else ''}no-{last}" in out, flag  # a bool may show as
                                                                                       # --no-X
        assert name in _documented(owner), \
            f"{owner.__name__}.{name} has no docstring (no --help text for {flag})"


def test_missing_alfworld_data_is_one_clear_error(tmp_path):
    proc = run("--preset", "tiny", "--alfworld.source", "official", "--output-dir", str(tmp_path),
               env={"ALFWORLD_DATA": str(tmp_path / "nowhere")}, check=False)
    assert proc.returncode != 0
    assert "ALFWORLD_DATA" in proc.stderr and "alfworld-download" in proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------------------------
# Runs that survive: bad input is one error line before any heavy work; a non-finite update is skipped,
# never saved

BAD_CONFIG = [  # (flags, the flag the error names)
    (["--grpo.lr", "nan"], "--grpo.lr"),
    (["--grpo.lr", "-1"], "--grpo.lr"),
    (["--grpo.lr", "inf"], "--grpo.lr"),
    (["--steps", "-1"], "--steps"),
    (["--steps", "0"], "--steps"),
    (["--rollout.tasks-per-step", "0"], "--rollout.tasks-per-step"),
    (["--rollout.group-size", "1"], "--rollout.group-size"),
    (["--algo", "grpo", "--rollout.group-size", "1"], "--rollout.group-size"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints"),
    (["--save-every", "0"], "--save-every"),
    (["--grpo.max-grad-norm", "0"], "--grpo.max-grad-norm"),
    (["--rollout.sampling.temperature", "0"], "--rollout.sampling.temperature"),
    (["--alfworld.max-steps", "0"], "--alfworld.max-steps"),
    (["--eval-every", "-1"], "--eval-every"),
    (["--eval-temperature", "nan"], "--eval-temperature"),
    (["--router.history-window", "-1"], "--router.history-window"),
    (["--router.archive-size", "-1"], "--router.archive-size"),
    (["--grpo.sd-coef", "-0.1"], "--grpo.sd-coef"),
    (["--grpo.sd-gate-beta", "inf"], "--grpo.sd-gate-beta"),
    (["--teacher.oracle", "1.5"], "--teacher.oracle"),
]


@pytest.mark.parametrize("flags,named", BAD_CONFIG)
def test_config_validation_table(flags, named):
    import smrc
    from scale.preflight import validate_config
    with pytest.raises(SystemExit) as e:
        validate_config(smrc.parse_config(["--preset", "tiny", *flags]))
    assert (str(e.value).startswith(f"error: {named} ") and "allowed:" in str(e.value)
            and "\n" not in str(e.value))
    validate_config(smrc.parse_config(["--preset", "tiny"]))  # the preset itself passes


def test_bad_input_is_one_error_line_before_any_work(tmp_path):
    used = tmp_path / "used"
    for step in (2, 4, 8):
        (used / f"step_{step:06d}").mkdir(parents=True)
    for flags, expected in [(["--grpo.lr", "nan", "--output-dir", str(tmp_path / "new")],
                             "error: --grpo.lr nan"),
                            (["--output-dir", str(used)], "--resume")]:
        proc = run("--preset", "tiny", *flags, check=False)
        assert proc.returncode != 0 and expected in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "new").exists()  # nothing written for a rejected config
    assert sorted(p.name for p in used.iterdir()) == ["step_000002", "step_000004", "step_000008"]  # kept


def test_nan_loss_is_skipped_counted_never_saved_and_stops_the_run(tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file
    import smrc
    calls = []

    def nan_advantages(episodes, *args, **kwargs):  # every step's loss is NaN
        calls.append(1)
        set_advantages(episodes, *args, **kwargs)
        for turn in (t for e in episodes for t in e.turns):
            turn.advantage = float("nan")
    set_advantages = smrc.set_advantages
    monkeypatch.setattr(smrc, "set_advantages", nan_advantages)
    cfg = smrc.parse_config(["--preset", "tiny", "--rollout.tasks-per-step", "1", "--rollout.group-size", "2",
                             "--alfworld.max-steps", "2", "--alfworld.num-workers", "0", "--steps", "3",
                             "--save-every", "1", "--grpo.max-nonfinite-steps", "2",
                             "--output-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="^error: 2 optimizer steps in a row had a non-finite loss"):
        smrc.main(cfg)
    assert len(calls) == 2 and "1 non-finite steps skipped" in capsys.readouterr().out
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1] and rows[0]["actor/nonfinite_skips"] == 1
    assert rows[0]["actor/optimizer_steps"] == 0
    assert (tmp_path / "latest").read_text() == "step_000001" and not (tmp_path / "step_000002").exists()
    weights = load_file(tmp_path / "step_000001" / "model.safetensors")
    state = torch.load(tmp_path / "step_000001" / "trainer_state.pt", weights_only=True)
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert all(torch.isfinite(t).all() for s in state["optimizer"]["state"].values() for t in s.values()
               if t.is_floating_point()) and not math.isnan(state["step"])


def test_resume_from_a_corrupt_checkpoint_names_the_file_and_the_intact_one(smrc_run, tmp_path):
    import shutil
    run_dir = tmp_path / "run"
    shutil.copytree(smrc_run, run_dir)
    weights = run_dir / "step_000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    proc = run(*FAST, "--steps", "3", "--resume", "--output-dir", str(run_dir), check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert (line.startswith("error:") and str(weights) in line
            and f"--resume-from {run_dir / 'step_000001'}" in line)
    small = ["--preset", "tiny", "--rollout.tasks-per-step", "1", "--rollout.group-size", "2",
             "--alfworld.max-steps", "2"]  # one cheap step from the intact checkpoint
    proc = run(*small, "--steps", "2", "--resume-from", str(run_dir / "step_000001"),
               "--output-dir", str(run_dir))
    assert [r["step"] for r in metrics(run_dir)] == [1, 2] and "steps 1->2" in proc.stdout
    assert (run_dir / "step_000002.after_step_1" / "model.safetensors").exists()  # set aside, not deleted
    assert len(list(run_dir.glob("metrics.after_step_1*.jsonl"))) == 1


def test_data_and_model_are_checked_before_the_config_dump(tmp_path):
    for flags, expected in [(["--alfworld.source", "official"], "ALFWORLD_DATA"),
                            (["--model", str(tmp_path / "no-model")], "--model")]:
        out = tmp_path / flags[-1].replace("/", "_")
        proc = run("--preset", "tiny", *flags, "--output-dir", str(out),
                   env={"ALFWORLD_DATA": str(tmp_path / "no")}, check=False)
        assert (proc.returncode != 0 and expected in proc.stderr
                and "Traceback" not in proc.stderr), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and '"preset"' not in proc.stdout  # no config dump
        assert not out.exists()  # no config.json for a run that never starts
