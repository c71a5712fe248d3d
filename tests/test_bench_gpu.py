"""bench/gpu.py runs on CPU with the tiny architecture: both algorithms train through the project's loop, and
the passes per trained token come out as the method says (update: exactly one forward and one backward per
token; reference KL: one forward; teacher: matched turns only, none under GRPO;
generation: about one forward).

Run: pytest tests/test_bench_gpu.py -q
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import gpu  # noqa: E402


def test_gpu_benchmark_runs_on_cpu_with_the_tiny_architecture(tmp_path, capsys):
    summary = gpu.main(["--arch", "tiny", "--device", "cpu", "--tasks", "2", "--group", "2", "--turns", "2",
                        "--new-tokens", "6", "--room", "small", "--steps", "1",
                        "--json", str(tmp_path / "s.json")])
    out = capsys.readouterr().out
    assert "step time ratio smrc-sd/grpo" in out and "passes per trained token" in out
    assert "beside the plan" in out
    assert (tmp_path / "s.json").exists()
    for algo in ("grpo", "smrc-sd"):
        s = summary[algo]
        assert s["trained_tokens"] > 0 and s["peak_mem_gib"] > 0 and s["tokens_per_s"] > 0
        assert set(s["mem_vs_plan"]) == {"rollout", "teacher", "update"}  # measured mem/* beside the plan
        assert all(got > 0 and plan > 0 for got, plan in s["mem_vs_plan"].values())
        t = s["times"]  # the phases are disjoint parts of the step's wall time
        assert t["generate"] > 0 and t["update"] > 0 and t["reference"] > 0
        assert t["generate"] + t["teacher"] + t["update"] <= t["step"]
        assert s["passes"]["update"] == (1.0, 1.0)       # one forward + one backward over every trained token
        assert s["passes"]["reference"] == (1.0, 0.0)    # the KL anchor (kl_coef > 0 by default), no backward
        gen_f, gen_b = s["passes"]["generate"]
        assert 0.8 < gen_f < 1.1 and gen_b == 0.0        # each prompt once, each sampled token but the last
    assert summary["grpo"]["passes"]["teacher"] == (0.0, 0.0) and summary["grpo"]["distilled_turns"] == 0
    assert summary["grpo"]["times"]["teacher"] < summary["smrc-sd"]["times"]["teacher"]  # no turn to score
    teacher_f, teacher_b = summary["smrc-sd"]["passes"]["teacher"]
    assert summary["smrc-sd"]["distilled_turns"] > 0 and teacher_f > 0 and teacher_b == 0.0


def test_decode_profile_runs_every_variant_on_cpu(capsys):
    summary = gpu.main(["--arch", "tiny", "--device", "cpu", "--steps", "0", "--decode-profile",
                        "--profile-batch", "2", "--profile-prompt", "16", "--profile-new", "4",
                        "--profile-repeats", "1"])
    assert set(summary) == {"decode_ms_per_step"} and len(summary["decode_ms_per_step"]) == 4
    assert "ms per decode step" in capsys.readouterr().out
