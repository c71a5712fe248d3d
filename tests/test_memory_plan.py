"""bench/memory_plan.py (scale/memory_plan.py) held to measured peaks: the plan of a recorded run's settings
never below the peak that run logged and at most 20% above it, its parts against the memory each fix frees,
and its one-line errors.

- SmolLM2-135M on CPU (bench/results/memory_smollm2: its config.json; mem/update_peak_gb 6.80 at step 1,
  before the optimizer state exists, 8.12 at step 2): resident memory, the process included.
- Qwen3-1.7B (random weights) on an H200 (bench/results/gpu_h200, bench/gpu.py's settings of that day: 4 × 4
  episodes, 192 new tokens, 4096-token prompts, 16,384-token micro-batches, the transformers engine, a float32
  KL reference and the term-gradient measurement, both the defaults then; peak allocated 62.8 / 75.7 GiB, the
  step's maximum over its phases: the log does not say which phase).
- The tiny preset on 2 gloo ranks (bench/results/torchrun_rehearsal.tar.gz): the largest update peak.
The errors are printed with -s.

Run: pytest tests/test_memory_plan.py -q -s
"""
import dataclasses
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import memory_plan as cli  # noqa: E402  (bench/memory_plan.py, the CLI)
from scale import memory_plan as mp  # noqa: E402
from config import Config, config_from_run, resolve  # noqa: E402
import grpo  # noqa: E402
import rollout  # noqa: E402
from models import SamplingConfig  # noqa: E402


def _update(cfg, arch, cuda, gpu_gib=80.0):
    return mp.plan(cfg, arch, cuda, gpu_gib)["phases"]["update"]


def _check(name, planned, measured):
    """The plan never plans low: at or above the measured peak, and at most 20% above it."""
    error = planned / measured - 1
    print(f"{name}: plan {planned:.2f} GiB, measured {measured:.2f} GiB, error {error:+.1%}")
    assert 0 <= error <= 0.20, f"{name}: {error:+.1%}"


def test_the_smollm2_cpu_run():
    cfg = config_from_run(ROOT / "bench/results/memory_smollm2", "none")
    assert cfg.grpo.term_grad_norms == "on"  # the record's `true`, read as on
    update = _update(cfg, mp.arch_of(mp.PUBLIC["HuggingFaceTB/SmolLM2-135M-Instruct"], "smollm2"), cuda=False)
    _check("SmolLM2-135M CPU update, step 2", sum(update.values()), 8.12)
    first = sum(update.values()) - update["optimizer"]
    _check("SmolLM2-135M CPU update, step 1 (no optimizer state yet)", first, 6.80)


def _h200_cfg() -> Config:
    return resolve(Config(
        model="Qwen/Qwen3-1.7B", rollout=rollout.RolloutConfig(
            tasks_per_step=4, group_size=4, gen_batch_size=64, max_prompt_tokens=4096, engine="hf",
            sampling=SamplingConfig(max_new_tokens=192)),
        grpo=grpo.GRPOConfig(micro_batch_tokens=16384, term_grad_norms="on", ref_dtype="float32")))


def test_the_h200_record():
    """Both steps: the record's peak is the step's maximum over its phases (allocated), the plan's largest
    phase against it. Step 1 has no AdamW state yet (nor its unmodelled share)."""
    phases = mp.plan(_h200_cfg(), mp.load_arch("Qwen/Qwen3-1.7B"), True, 139.8)["phases"]
    peak = max(phases.values(), key=lambda parts: sum(parts.values()))
    _check("Qwen3-1.7B H200, step 2", sum(peak.values()), 75.7)
    first = sum(peak.values()) - peak["optimizer"] * (1 + mp.UNMODELLED_SHARE)
    _check("Qwen3-1.7B H200, step 1 (no optimizer state yet)", first, 62.8)


def test_the_two_rank_tiny_run():
    """The tiny preset on 2 gloo ranks (bench/results/torchrun_rehearsal.tar.gz): the largest
    mem/update_peak_gb of its 10 steps against the plan's update (GB as logged: GiB)."""
    import json
    import tarfile
    with tarfile.open(ROOT / "bench/results/torchrun_rehearsal.tar.gz") as tar:
        jsonl = tar.extractfile("torchrun_rehearsal/2ranks_smrc_sd.metrics.jsonl")
        lines = jsonl.read().decode().splitlines()
    measured = max(json.loads(x)["mem/update_peak_gb"] for x in lines)
    cfg = resolve(Config(preset="tiny", model="tiny-agent-quick", rollout=dataclasses.replace(
        _tiny().rollout, tasks_per_step=2, group_size=4), grpo=_tiny().grpo, router=_tiny().router))
    update = mp.plan(cfg, mp.load_arch("tiny-agent-quick"), False, 80.0, 2)["phases"]["update"]
    _check("tiny preset, 2 gloo ranks, update", sum(update.values()), measured)


def _tiny():
    from config import tiny_preset
    return tiny_preset()


def test_the_fixes_show_in_the_plan_and_the_paper_configs_fit(capsys, monkeypatch):
    """At the H200 record's settings the bf16 reference and the measurement's auto (off at 1.7B) free what
    the plan says they hold. The paper's Qwen3-1.7B config fits one 80 GB card; on 8 ranks with DDP its
    teacher phase adds DDP's buckets (4P, with their unmodelled share) and NCCL, and the plan refuses it
    past 80 GiB (the line names the teacher phase and --rollout.vllm-gpu-memory); the Qwen2.5-3B one fits 8 ×
    80 GB under FSDP."""
    old, arch = _h200_cfg(), mp.load_arch("Qwen/Qwen3-1.7B")
    new = dataclasses.replace(old, grpo=dataclasses.replace(old.grpo, term_grad_norms="auto",
                                                            ref_dtype="auto"))
    before, after = _update(old, arch, True), _update(new, arch, True)
    P = arch.params / mp.GIB
    assert before["term-grad buffers"] == pytest.approx(16 * P) and "term-grad buffers" not in after
    assert before["reference"] - after["reference"] == pytest.approx(2 * P)
    monkeypatch.chdir(ROOT)
    peaks = {}
    for config, gpus, strategy in (("configs/alfworld/smrc_sd_qwen3_1.7b.yaml", 1, "ddp"),
                                   ("configs/alfworld/smrc_sd_qwen3_1.7b.yaml", 8, "ddp"),
                                   ("configs/alfworld/smrc_sd_qwen2.5_3b.yaml", 8, "fsdp")):
        cli.main(["--gpu-gib", "80", "--nproc", str(gpus), "--config", config, "--dist.strategy", strategy])
        out = capsys.readouterr().out.strip().splitlines()
        with capsys.disabled():
            print(f"{config} x{gpus} {strategy}: {out[-1]}")
        assert out[-1].startswith("peak ") and " GiB of 80 GiB (" in out[-1], out
        assert "moved by --" in out[-2]
        peaks[gpus, strategy, config] = float(out[-1].split()[1])
    one, eight, fsdp = peaks.values()
    assert one <= 80 and fsdp <= 80
    assert eight - one == pytest.approx(4 * P * (1 + mp.UNMODELLED_SHARE) + mp.NCCL_GIB, abs=0.1)
    from config import parse_config
    cfg = parse_config(["--config", "configs/alfworld/smrc_sd_qwen3_1.7b.yaml"])
    line = mp.over_device(cfg, arch, 80.0, 8)
    assert (line is not None) == (eight > 80)
    assert line is None or ("teacher peak" in line and "--rollout.vllm-gpu-memory" in line)


@pytest.mark.parametrize("args, says", [
    (["--model", "{tmp}"], "has no config.json"),
    (["--gpu-gib", "5", "--model", "Qwen/Qwen3-1.7B"], "holds no more than the fp32 weights alone"),
    (["--model", "{tmp}/bert"], "is not a decoder-only transformer config the plan knows")])
def test_bad_input_is_one_line(args, says, tmp_path):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert", "vocab_size": 30522}')
    with pytest.raises(SystemExit) as e:
        cli.main([a.replace("{tmp}", str(tmp_path)) for a in args])
    assert str(e.value.code).startswith("error: ") and says in str(e.value.code), e.value.code


def test_a_plan_over_the_gpu_is_one_line_naming_phase_plan_and_flags():
    """smrc.py's preflight on CUDA (scale/memory_plan.check_fits) for a card that is too small: the line names
    the phase, the plan, the largest part's flag and the flag that starts anyway; a card that fits: None."""
    cfg = resolve(Config(model="Qwen/Qwen3-1.7B", rollout=rollout.RolloutConfig(engine="vllm"),
                         teacher=teacher_cfg(backend="vllm")))
    arch = mp.load_arch("Qwen/Qwen3-1.7B")
    line = mp.over_device(cfg, arch, 40.0, 1)
    assert line.startswith("error: the memory plan's teacher peak is ")
    assert "more than this GPU's 40.0 GiB" in line
    assert "moved by --rollout.vllm-gpu-memory" in line and "--no-memory-check" in line
    assert mp.over_device(cfg, arch, 80.0, 1) is None


def teacher_cfg(**kw):
    from teacher import TeacherConfig
    return TeacherConfig(**kw)
