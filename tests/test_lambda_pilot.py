"""analysis/lambda_pilot.py: the λ a pilot run recommends, read by hand from its rows, and one real pilot."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analysis import lambda_pilot

ROOT = Path(__file__).resolve().parents[1]


def _run_folder(path: Path, sd_coef: float, rows: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"grpo": {"sd_coef": sd_coef}}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _step(ratio, turns=4, tokens=40, gap=-0.5, routed=2, sampled=1, share=0.2):
    return {"actor/sd_grpo_grad_ratio": ratio, "sd/distilled_turns": turns, "sd/distilled_tokens": tokens,
            "sd/teacher_minus_student_logp": gap, "sd/candidate_routed_turns": routed,
            "sd/candidate_sampled_turns": sampled, "sd/distilled_share": share}


def test_recommendation_by_hand(tmp_path, capsys):
    """Ratios 0.02, 0.04, 0.01, 0.03 at λ₀ = 0.01 (an inf step, a NaN step, a step without a distilled turn
    and a validation row left out): u = median(2, 4, 1, 3) = 2.5, so a target of 0.1 asks for λ = 0.04."""
    rows = [_step(0.02), _step(0.04, gap=-0.25), _step(math.inf), _step(math.nan),
            _step(0.5, turns=0, tokens=0),
            {"step": 4, "val/success_rate": 0.5}, _step(0.01), _step(0.03, routed=0, sampled=0)]
    run = _run_folder(tmp_path / "run", 0.01, rows)
    p = lambda_pilot.measure(run)
    assert (p.sd_coef, p.steps, p.measured) == (0.01, 7, 4)
    assert p.ratio == pytest.approx(0.025) and p.unit_ratio == pytest.approx(2.5)
    quartiles = (np.quantile([1, 2, 3, 4], 0.25), np.quantile([1, 2, 3, 4], 0.75))
    assert p.unit_quartiles == pytest.approx(quartiles)
    assert p.kl_per_turn == pytest.approx((0.5 * 40 * 5 + 0.25 * 40) / (4 * 6))  # Σ −gap·tokens / Σ turns
    assert p.candidate_share == pytest.approx(6 / 12)
    assert lambda_pilot.recommend(p, 0.1) == pytest.approx(0.04)
    lambda_pilot.main([str(run), "--target", "0.2"])
    out = capsys.readouterr().out
    assert "--grpo.sd-coef 0.08 " in out and "4 of 7 steps measured at λ₀ = 0.01" in out
    saved = json.loads((run / "lambda_pilot.json").read_text())
    assert saved["recommended_sd_coef"] == pytest.approx(0.08) and saved["target"] == 0.2


def test_rows_without_candidate_counts_pool_their_shares_by_distilled_turns():
    """The v21 sweep's rows (code at 12a3ca6) log the candidate-sampled share but not its counts: the run's
    share is then the shares weighted by the step's distilled turns, steps with a NaN share left out."""
    def old(share, turns):
        row = _step(0.1, turns=turns)
        del row["sd/candidate_routed_turns"], row["sd/candidate_sampled_turns"]
        return {**row, "sd/candidate_sampled_share": share}
    _, _, share = lambda_pilot.run_strength([old(0.5, 10), old(0.25, 30), old(math.nan, 50)])
    assert share == pytest.approx((0.5 * 10 + 0.25 * 30) / 40)


def test_what_cannot_be_read_is_one_error(tmp_path, capsys):
    """Not a run folder, a run without an SD term, a run that measured no step: an error line, exit ≠ 0,
    and no lambda_pilot.json."""
    with pytest.raises(SystemExit, match="not a smrc.py run folder"):
        lambda_pilot.main([str(tmp_path)])
    grpo = _run_folder(tmp_path / "grpo", 0.0, [_step(math.nan, turns=0)])
    with pytest.raises(SystemExit, match="needs λ > 0"):
        lambda_pilot.main([str(grpo)])
    quiet = _run_folder(tmp_path / "quiet", 0.01, [_step(math.inf), _step(math.nan)])
    with pytest.raises(SystemExit) as stop:
        lambda_pilot.main([str(quiet)])
    assert stop.value.code == 1 and "0 of the 2 steps measured both terms" in capsys.readouterr().out
    assert not (quiet / "lambda_pilot.json").exists()
    few = _run_folder(tmp_path / "few", 0.01, [_step(0.02), _step(0.04), _step(math.nan), _step(math.nan)])
    with pytest.raises(SystemExit):  # too few measured steps for a λ: it says how many had both terms
        lambda_pilot.main([str(few)])
    assert "2 of the 4 steps measured both terms" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="sets --steps, --grpo.sd-coef itself"):
        lambda_pilot.main(["--", "--steps", "3", "--grpo.sd-coef=0.1"])


def test_a_real_pilot_runs_smrc_at_the_pilot_lambda_and_reads_it(tmp_path):
    """Two tiny SMRC-SD steps at λ₀ = 0.01 through the CLI: the run's config says so, nothing is validated,
    one checkpoint is kept, and the recommendation equals target / median(ratio / λ₀) of its own rows."""
    pytest.importorskip("alfworld")
    out = tmp_path / "pilot"
    proc = subprocess.run(
        [sys.executable, "analysis/lambda_pilot.py", "--steps", "2", "--out", str(out), "--target", "0.1",
         "--",
         "--preset", "tiny", "--model", "bench/results/learn_sweep_v21/warm_start",  # committed: no build
         "--rollout.tasks-per-step", "2", "--rollout.group-size", "3",
         "--alfworld.max-steps", "4"], cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((out / "config.json").read_text())["grpo"]["sd_coef"] == 0.01
    assert [r["step"] for r in rows] == [1, 2] and not any("val/success_rate" in r for r in rows)
    assert sorted(p.name for p in out.glob("step_*")) == ["step_000002"]
    unit = [r["actor/sd_grpo_grad_ratio"] / 0.01 for r in rows
            if r["sd/distilled_turns"] and math.isfinite(r["actor/sd_grpo_grad_ratio"])]
    if not unit:  # both tiny steps all-fail or all-win: the pilot must say so, not recommend
        assert proc.returncode == 1 and "measured both terms" in proc.stdout
        return
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    saved = json.loads((out / "lambda_pilot.json").read_text())
    assert saved["recommended_sd_coef"] == pytest.approx(0.1 / float(np.median(unit)))
    assert f"--grpo.sd-coef {saved['recommended_sd_coef']:.3g}" in proc.stdout
