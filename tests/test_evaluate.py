"""Tests of evaluate.py and its companions in analysis/ (audits.py, plots.py; intervention:
tests/test_intervention.py), CPU only.

- metrics: Avg@k / Pass@k and the repeated 4-gram ratio against hand-computed values;
- matcher comparison on a constructed archive with known overlaps;
- replay audit on an archive built from a real generated ALFWorld game and the planner: the correct candidate
  replays 1/1, a corrupted candidate fails, a wrong archived signature is a restore failure (not a match
  failure);
- `evaluate.py eval` end to end through its CLI on a tiny-preset checkpoint (ALFWorld generated split and
  WebShop);
- `evaluate.py plot` (skipped without matplotlib).

Run: .venv/bin/python -m pytest tests/test_evaluate.py -q
"""
import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import envs
import evaluate
import config
import rollout
from analysis import audits
from environments.alfworld import AlfworldConfig

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)


# ---------------------------------------------------------------------------------------------------- metrics

def test_avg_and_pass_at_k_match_hand_computed_values():
    outcomes = [[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1]]
    assert evaluate.avg_at_k(outcomes) == pytest.approx((0.25 + 0 + 1 + 0.5) / 4)
    assert evaluate.pass_at_k(outcomes) == pytest.approx(3 / 4)
    assert evaluate.avg_at_k([[0, 0]]) == 0.0 and evaluate.pass_at_k([[0, 0]]) == 0.0


def test_panel_metrics_webshop_score_and_accuracy():
    tasks = [envs.Task(f"webshop/{i:05d}", "webshop", "webshop", str(i)) for i in range(2)]
    eps = []
    for i, (task, scores) in enumerate(zip(tasks, [(1.0, 0.5), (0.0, 0.25)])):
        for a, s in enumerate(scores):
            ep = rollout.Episode(task, i, f"e-{i}-{a}", slot=2 * i + a, score=s, won=s == 1.0,
                                 stop_reason="env_done")
            eps.append(ep)
    m = evaluate.panel_metrics(eps, k=2)
    assert m["score"] == pytest.approx((1.0 + 0.5 + 0.0 + 0.25) / 4)
    assert m["accuracy"] == pytest.approx(1 / 4)
    assert m["avg@2"] == pytest.approx(0.25) and m["pass@2"] == pytest.approx(0.5)
    assert "env errors" not in evaluate.markdown_table([{"label": "a", "metrics": m}], 2, "webshop")
    eps[1].stop_reason = "env_error"  # an episode the environment lost: a failure, and said in the table
    lost = evaluate.panel_metrics(eps, k=2)
    rows = [{"label": "a", "metrics": m}, {"label": "b", "metrics": lost}]
    table = evaluate.markdown_table(rows, 2, "webshop")
    assert table.splitlines()[0].endswith("| env errors |")
    assert [line.rsplit("|", 2)[1].strip() for line in table.splitlines()[2:]] == ["0 of 4", "1 of 4"]


def test_repeated_4gram_ratio_on_known_strings():
    assert evaluate.repeated_ngram_ratio(["a b c d a b c d"]) == pytest.approx(1 / 5)
    assert evaluate.repeated_ngram_ratio(["the the the the the"]) == pytest.approx(1 / 2)
    assert evaluate.repeated_ngram_ratio(["a b c"]) == 0.0  # shorter than 4 words: no 4-gram
    # pooled, lowercased
    assert evaluate.repeated_ngram_ratio(["A b c d a B c D", "x y z w"]) == pytest.approx(1 / 6)
    # repeats count within a response only
    assert evaluate.repeated_ngram_ratio(["a b c d", "a b c d"]) == 0.0


# ----------------------------------------------------------------------------------------- matcher comparison

def _m(candidate, ref="r", position=0):
    return {"ref": ref, "position": position, "candidate": candidate, "ref_suffix": [candidate]}


def test_matcher_comparison_on_known_overlaps():
    rows = [{"structured": None, "history_match": None, "match": None} for _ in range(10)]
    for i in range(4):                       # structured matches turns 0-3
        rows[i]["structured"] = rows[i]["match"] = _m(f"a{i}")
    for i in range(2, 6):                    # history matches turns 2-5; same candidate on 2, another on 3
        rows[i]["history_match"] = _m(f"a{i}" if i != 3 else "other", position=0 if i != 3 else 5)
    c = audits.matcher_comparison(rows)
    assert (c["turns"], c["structured_matches"], c["history_matches"], c["common_matches"]) == (10, 4, 4, 2)
    assert c["coverage_structured"] == pytest.approx(0.4) and c["coverage_history"] == pytest.approx(0.4)
    assert c["history_matches_reproduced_by_structured"] == pytest.approx(0.5)
    assert c["structured_matches_reproduced_by_history"] == pytest.approx(0.5)
    assert c["candidate_agreement_on_common"] == pytest.approx(0.5)
    assert c["same_reference_position_on_common"] == pytest.approx(0.5)
    assert c["coverage_routed"] == pytest.approx(0.4)
    empty = audits.matcher_comparison([{"structured": None, "history_match": None}])
    assert empty["candidate_agreement_on_common"] is None  # nothing to divide: null, not a made-up 0


# ----------------------------------------------------------------------------------------------- replay audit

@pytest.fixture(scope="module")
def game(tmp_path_factory):
    """A generated small ALFWorld game whose planner solution takes an object, with the solution."""
    cfg = AlfworldConfig(source="generated", room_size="small", num_train_games=6, max_steps=50,
                              require_think=False, cache_dir=str(tmp_path_factory.mktemp("alfworld_gen")))
    for task in envs.load_tasks(cfg, "train"):
        p = envs.plan(cfg, task, [], 60.0)
        if p.status == "ok" and any(a.startswith("take ") for a in p.actions):
            return cfg, task, p.actions
    pytest.fail("no generated game with a 'take' in its plan")


def _archive(cfg, task, actions_before, matched_turn_match):
    """Rows of one student trajectory: 'inventory' first (history differs, state does not), then
    actions_before; the last row is the matched turn."""
    env = envs.make_env(cfg)
    res, rows = env.reset(task), []
    student = ["inventory"] + actions_before + ["<matched turn>"]
    for i, a in enumerate(student):
        rows.append({"step": 1, "task_id": task.task_id, "task_type": task.task_type, "source": task.source,
                     "traj_id": "s0-0-0", "turn": i, "action": a,
                     "signature": json.loads(json.dumps(res.signature)), "history_key": "",
                     "structured": None, "history_match": None, "match": None})
        if i < len(student) - 1:
            res = env.step(a)
    env.close()
    rows[-1]["structured"] = matched_turn_match
    return rows


def test_replay_audit_correct_candidate_replays_and_corrupted_fails(game):
    cfg, task, actions = game
    t = next(i for i, a in enumerate(actions) if a.startswith("take "))
    match = {"ref": "planner", "position": t, "candidate": actions[t], "ref_suffix": actions[t:]}
    rows = _archive(cfg, task, actions[:t], match)
    good = audits.replay_audit(rows, cfg, ("structured",), samples=10, show_progress=False)["structured"]
    assert (good["audited"], good["successes"], good["restore_failed"], good["summary"]) == (1, 1, 0, "1/1")

    bad_rows = copy.deepcopy(rows)
    bad_rows[-1]["structured"]["candidate"] = "look"  # the object is never taken: the suffix cannot succeed
    bad = audits.replay_audit(bad_rows, cfg, ("structured",), show_progress=False)["structured"]
    assert (bad["audited"], bad["successes"], bad["failures"], bad["summary"]) == (1, 0, 1, "0/1")

    lost = copy.deepcopy(rows)
    lost[-1]["signature"][1][1] = ["nowhere 9"]  # the archived state cannot be restored: not a match failure
    lost = audits.replay_audit(lost, cfg, ("structured",), show_progress=False)["structured"]
    assert (lost["audited"], lost["restore_failed"], lost["summary"]) == (0, 1, "0/0")

    gap = [r for r in rows if r["turn"] != 1]  # an earlier turn missing from the archive
    missing = audits.replay_audit(gap, cfg, ("structured",), show_progress=False)["structured"]
    assert missing["prefix_missing"] == 1 and missing["audited"] == 0


# --------------------------------------------------------------------------------------------- CLI end to end

@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A tiny-preset checkpoint as the trainer writes it (save_pretrained + tokenizer + smrc_config.json),
    with the untrained weights: what evaluate.py reads is the format."""
    from embedded.warmstart import resolve
    from models import load_model
    model, tok = load_model(resolve("tiny"))
    ckpt = tmp_path_factory.mktemp("tiny_run") / "step_000001"
    model.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    (ckpt / "smrc_config.json").write_text(json.dumps(dataclasses.asdict(config.tiny_preset()), indent=1))
    return ckpt


def test_config_from_run_restores_a_saved_config_and_reports_unknown_keys(tmp_path, capsys):
    saved = dataclasses.asdict(config.parse_config(["--preset", "tiny", "--env", "webshop",
                                                    "--webshop.catalog-seed", "3", "--router.matcher",
                                                    "history"]))
    saved["alfworld"]["data_dir"] = ""        # a run saved before ALFWORLD_DATA was set
    saved["from_the_future"] = 1
    (tmp_path / "config.json").write_text(json.dumps(saved))
    cfg = config.config_from_run(tmp_path, "none")
    assert (cfg.env, cfg.webshop.catalog_seed, cfg.router.matcher, cfg.model) == ("webshop", 3, "history",
                                                                       "tiny-agent-quick")
    # JSON lists come back as tuples
    assert cfg.alfworld.task_types == config.tiny_preset().alfworld.task_types
    assert "from_the_future" in capsys.readouterr().out
    assert config.config_from_run(None, "tiny") == config.resolve(config.tiny_preset())


@pytest.mark.parametrize("env_name", ["alfworld", "webshop"])
def test_eval_cli_end_to_end_on_tiny_checkpoint(tiny_checkpoint, tmp_path, env_name):
    out = tmp_path / f"eval_{env_name}"
    cmd = [sys.executable, str(ROOT / "evaluate.py"), "eval", "--checkpoint", str(tiny_checkpoint),
           "--baseline", "tiny", "--env", env_name, "--split", "eval", "--k", "2", "--limit", "2",
           "--max-steps", "2", "--max-new-tokens", "8", "--output", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ}, timeout=600)
    res = json.loads(out.with_suffix(".json").read_text())
    assert res["env"] == env_name and res["k"] == 2 and len(res["tasks"]) == 2 and not res["full_panel"]
    assert ([r["label"] for r in res["rows"]]
            == ["baseline (tiny)", f"{tiny_checkpoint.parent.name}/step_000001"])
    for r in res["rows"]:
        m = r["metrics"]
        assert m["tasks"] == 2 and m["episodes"] == 4 and 0 <= m["avg@2"] <= m["pass@2"] <= 1
        assert 0 < m["turns"] <= 2 and 0 < m["response_tokens"] <= 8 and 0 <= m["repeated_4gram_ratio"] <= 1
        assert r["seeds"] == [0] and len(r["episodes"]) == 4
    # same weights, same seeds: same panel outcome
    assert res["rows"][0]["episodes"] == res["rows"][1]["episodes"]
    table = out.with_suffix(".md").read_text()
    assert "avg@2" in table and ("score" in table) == (env_name == "webshop")


def test_plot_writes_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    runs = []
    for name, s in (("a", 0.1), ("b", 0.3)):
        run = tmp_path / name
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps(
            {"step": i, "rollout/success_rate": s * i, "rollout/reward": i, "router/match_rate": 0.5,
             "rollout/response_tokens": 20 + i}) + "\n" for i in range(1, 5)))
        runs += ["--run", str(run)]
    subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "plot", *runs,
                    "--output-dir", str(tmp_path / "p")],
                   check=True, cwd=ROOT, timeout=300)
    from matplotlib.image import imread
    curves, bars = (imread(tmp_path / "p" / "training_curves.png"),
                    imread(tmp_path / "p" / "comparison_bars.png"))
    assert curves.shape[:2] == (700, 1000) and bars.shape[:2] == (350, 1400)  # the figure sizes at 100 dpi

    def pixels_of(image, hex_colour):  # pixels drawn in a matplotlib cycle colour (C0 = run a, C1 = run b)
        rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        return int((abs(image[..., :3] - rgb).max(-1) < 0.02).sum())
    # a line per run, 4 panels
    assert pixels_of(curves, "#1f77b4") > 500 and pixels_of(curves, "#ff7f0e") > 500
    assert pixels_of(bars, "#1f77b4") > 2000 and pixels_of(bars, "#ff7f0e") == 0      # bars: one colour


# ----------------------------------------------------------------------------------------- as a user meets it

def _task(i, task_type):
    return envs.Task(f"alfworld/valid_seen/{i:03d}", task_type, "alfworld", f"/g/{i}")


def test_limit_takes_a_seeded_type_stratified_subset_in_panel_order():
    types = ["look_at_obj_in_light"] * 13 + ["pick_and_place_simple"] * 5 + ["pick_two_obj_and_place"] * 4
    panel = [_task(i, t) for i, t in enumerate(types)]
    sub = envs.stratified_subset(panel, 6, seed=0)
    assert sorted(t.task_type for t in sub) == sorted(["look_at_obj_in_light", "pick_and_place_simple",
                                                       "pick_two_obj_and_place"] * 2)
    assert sub == sorted(sub, key=panel.index)  # the panel's pinned order
    assert sub == envs.stratified_subset(panel, 6, seed=0)  # deterministic for a seed
    assert any(envs.stratified_subset(panel, 6, seed=s) != sub for s in range(1, 6))  # and drawn by it
    assert sub != panel[:6]  # not the first N (13 of one type come first)
    assert len(envs.stratified_subset(panel, 7, seed=0)) == 7
    assert envs.stratified_subset(panel, 0, seed=0) == panel == envs.stratified_subset(panel, 99, seed=0)


def _eval_error(*flags, env=None) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "eval", *flags], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_user_errors_are_one_line_naming_flags_evaluate_has(tmp_path):
    line = _eval_error("--checkpoint", "tiny-agent", "--output", str(tmp_path / "x"))
    assert "not a checkpoint folder" in line and "--baseline tiny-agent" in line
    line = _eval_error("--preset", "tiny", "--baseline", "tiny", "--split", "valid_seen")
    assert "--alfworld-source official" in line
    line = _eval_error("--preset", "tiny", "--baseline", "tiny", "--split", "valid_seen", "--alfworld-source",
                       "official", "--alfworld-data-dir", str(tmp_path / "nowhere"))
    assert ("--alfworld-data-dir" in line and "--alfworld.data-dir" not in line
            and "--alfworld.source" not in line)
    assert not (tmp_path / "x.json").exists()


def test_an_embedded_baseline_alone_gets_its_own_preset_not_the_full_size_defaults():
    for name, preset in (("tiny-agent", "learn"), ("tiny-agent-quick", "tiny")):
        cfg = evaluate.eval_config(evaluate.EvalArgs(baseline=name))
        want = config.PRESETS[preset]()
        assert (cfg.alfworld.require_think, cfg.alfworld.max_steps, cfg.rollout.action_space) == \
            (False, want.alfworld.max_steps, "admissible")
    # unchanged
    assert evaluate.eval_config(evaluate.EvalArgs(baseline="Qwen/Qwen3-1.7B")).alfworld.require_think


def test_audit_text_puts_the_papers_numbers_beside_ours():
    rows = [{"structured": {"ref": "r", "position": 0, "candidate": "a"}, "history_match": None,
             "match": None}] * 2
    text = audits.format_audit(audits.matcher_comparison(rows), {})
    assert "covers 100.0% of turns (2) [paper 20.2%]" in text
    assert "[paper 98.8%]" in text and "[paper 75.4%]" in text and "[paper 99.4%]" in text
