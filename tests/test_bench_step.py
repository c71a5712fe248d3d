"""bench/step.py end to end at its smallest settings (the untrained `tiny` model, planner references so the
teacher has turns to score): one real training step of smrc.py, every phase in the table, each model phase and
the env with a finite positive floor measured on the tokens it processed; and a floor's pass leaves the model
as it found it.

Run: pytest tests/test_bench_step.py -q
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["--model", "tiny", "--algo", "smrc-sd", "--steps", "1", "--tasks-per-step", "1", "--group-size", "2",
         "--max-steps", "2", "--train-games", "2", "--planner-references", "--threads", "1"]


def test_step_table_has_every_phase_with_its_floor(tmp_path):
    out = tmp_path / "step.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "step.py"), *SMOKE, "--output", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from bench import step
    header = next(line for line in proc.stdout.splitlines() if line.startswith("phase"))
    assert header.split() == ["phase", "seconds", "floor", "s", "ratio", "tokens"]
    for name in step.PHASES:
        assert any(line.startswith(name) for line in proc.stdout.splitlines()), name
    res = json.loads(out.read_text())
    phases = res["summary"]["phases"]
    assert list(phases) == list(step.PHASES)
    logged = res["steps"][0]["logged"]
    for name in step.FLOORED:
        if name == "candidate gain" and "sd/candidate_gain_time_s" not in logged:
            continue  # a teacher without the diagnostic (--teacher.no-candidate-gain) has no such phase
        p = phases[name]
        assert math.isfinite(p["floor_s"]) and p["floor_s"] > 0, (name, p)
        assert math.isfinite(p["ratio"]) and p["ratio"] > 0, (name, p)
        assert p["seconds"] > 0, (name, p)
        assert name == "env" or p["tokens"] > 0, (name, p)
    turns = res["summary"]["turn_samples"]
    assert turns >= 2 and res["summary"]["mean_prompt_tokens"] > 0
    # the update trains on every turn-sample: the same tokens as the generation floor's
    assert phases["update"]["tokens"] == phases["generation"]["tokens"]
    assert phases["teacher"]["tokens"] > 0 and logged["sd/distilled_turns"] > 0
    assert res["summary"]["step_s"] >= sum(phases[n]["seconds"] for n in step.PHASES if n != "other") - 1e-6
    assert res["threads"] == 1


def test_floor_leaves_the_model_unchanged(tiny):
    from bench.step import forward_floor
    model, tok = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    prompts, responses = [[5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15]]
    for backward in (False, True):
        assert forward_floor(model, prompts, responses, tok.pad_token_id, 64, 1.0, backward=backward) > 0
        assert not model.training  # the mode is restored
        assert all(p.grad is None for p in model.parameters())  # gradients dropped, nothing stepped
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert forward_floor(model, [], [], tok.pad_token_id, 64, 1.0) == 0.0
