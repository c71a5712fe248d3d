"""bench/step.py and bench/decode.py at their smallest settings, on CPU.

- `--arch tiny` (a random model built in memory), GRPO and SMRC-SD through the project's loop: the passes per
  trained token come out as the method says (update: one forward and one backward per token; reference KL:
  one forward; teacher: matched turns only, none under GRPO; generation: about one forward), every model phase
  has a finite positive floor, and memory sits beside the plan.
- `--model tiny` (loaded as smrc.py loads it) from the command line: every phase in the table.
- a floor's pass leaves the model as it found it; the decode profile times every variant.

Run: pytest tests/test_bench_step.py -q
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import torch

from bench import decode, step

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--rollout.tasks-per-step", "2", "--rollout.group-size", "2", "--alfworld.num-train-games", "2",
         "--alfworld.max-steps", "2"]


def test_arch_tiny_passes_floors_and_memory(tmp_path, capsys):
    summary = step.main(["--arch", "tiny", "--device", "cpu", "--steps", "1", "--json",
                         str(tmp_path / "s.json"), "--", *SMALL, "--alfworld.room-size", "small",
                         "--rollout.sampling.max-new-tokens", "6"])
    out = capsys.readouterr().out
    assert "step time ratio smrc-sd/grpo" in out and "per trained token" in out and "beside the plan" in out
    assert json.loads((tmp_path / "s.json").read_text())["args"]["arch"] == "tiny"
    for algo in ("grpo", "smrc-sd"):
        s, p = summary[algo], summary[algo]["phases"]
        assert s["trained_tokens"] > 0 and s["peak_mem_gib"] > 0 and s["logged"]["time/tokens_per_s"] > 0
        assert set(s["mem_vs_plan"]) == {"rollout", "teacher", "update"}
        assert all(got > 0 and plan > 0 for got, plan in s["mem_vs_plan"].values())
        assert all(p[n]["seconds"] > 0 for n in ("generation", "update", "reference KL"))
        # the phases are disjoint parts of the step's wall time (the reference's KL forward is in the update)
        assert sum(p[n]["seconds"] for n in step.PHASES if n not in ("other", "reference KL")) <= s["step_s"]
        assert p["update"]["passes"] == (1.0, 1.0)        # one forward + one backward of every trained token
        assert p["reference KL"]["passes"] == (1.0, 0.0)  # the KL anchor (kl_coef > 0 by default)
        assert p["other"]["passes"] == (0.0, 0.0)         # the floors' passes are not the step's
        gen_f, gen_b = p["generation"]["passes"]
        assert 0.8 < gen_f < 1.1 and gen_b == 0.0         # each prompt once, each sampled token but the last
        assert p["update"]["tokens"] == p["generation"]["tokens"] == s["trained_tokens"]
        for name in ("generation", "update", "env"):
            assert math.isfinite(p[name]["floor_s"]) and p[name]["floor_s"] > 0, (algo, name, p[name])
    grpo, smrc = summary["grpo"]["phases"], summary["smrc-sd"]["phases"]
    assert grpo["teacher"]["passes"] == (0.0, 0.0) and summary["grpo"]["logged"]["sd/distilled_turns"] == 0
    assert summary["smrc-sd"]["logged"]["sd/distilled_turns"] > 0
    assert smrc["teacher"]["passes"][0] > 0 and smrc["teacher"]["passes"][1] == 0.0
    assert smrc["teacher"]["floor_s"] > 0 and smrc["teacher"]["tokens"] > 0


def test_model_from_the_command_line_has_every_phase(tmp_path):
    out = tmp_path / "step.json"
    cmd = [sys.executable, str(ROOT / "bench" / "step.py"), "--model", "tiny", "--algos", "smrc-sd",
           "--steps", "1", "--threads", "1", "--json", str(out), "--", *SMALL, "--router.seed-with-planner"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("smrc-sd "))
    assert header.split()[:5] == ["smrc-sd", "seconds", "floor", "s", "ratio"]
    for name in (*step.PHASES, "step"):
        assert any(line.startswith(name) for line in lines), name
    res = json.loads(out.read_text())
    s = res["summary"]["smrc-sd"]
    assert list(s["phases"]) == list(step.PHASES) and res["threads"] == 1
    assert s["logged"]["sd/distilled_turns"] > 0 and s["phases"]["teacher"]["floor_s"] > 0


def test_floor_leaves_the_model_unchanged(tiny):
    model, tok = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    prompts, responses = [[5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15]]
    for backward in (False, True):
        assert step.forward_floor(model, prompts, responses, tok.pad_token_id, 64, 1.0, backward=backward) > 0
        assert not model.training  # the mode is restored
        assert all(p.grad is None for p in model.parameters())  # gradients dropped, nothing stepped
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert step.forward_floor(model, [], [], tok.pad_token_id, 64, 1.0) == 0.0


def test_decode_profile_runs_every_variant_on_cpu(capsys):
    out = decode.main(["--arch", "tiny", "--device", "cpu", "--batch", "2", "--prompt", "16", "--new", "4",
                       "--repeats", "1"])
    assert len(out) == 4 and all(math.isfinite(ms) for ms in out.values())
    assert "ms per decode step" in capsys.readouterr().out
