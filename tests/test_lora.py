"""LoRA through peft (scale/lora.py): the method unchanged under adapters, and everything around the loop.

- In process, on the embedded tiny model: the KL reference is the policy with its adapters off (no second
  model: equal log-probs at step 0, the base's after the adapters move); the optimizer's parameters are the
  adapters; merged weights score as the policy; bad input is one error line.
- The memory plan of the LoRA config files (24 GB and 80 GB cards).
- One short smrc.py run (tiny preset, --lora.rank 8, 2 steps) and its resume: adapter checkpoints in peft's
  format, the merged folder, the KL of 0 at the first update, a resume equal to the uninterrupted run,
  `evaluate.py`'s loading.
Skips (with a reason) where peft is not installed (pip install -r requirements-lora.txt).
"""
import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft", reason="LoRA needs peft (pip install -r requirements-lora.txt)")

import models  # noqa: E402
from scale import lora  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _batch(tok):
    prompts = [models.chat_ids(tok, "Your task is to: put a clean mug in coffeemachine."),
               models.chat_ids(tok, "go to fridge 1")]
    responses = [tok.encode(text, add_special_tokens=False) for text in ("open fridge 1", "look")]
    return models.collate(prompts, responses, tok.pad_token_id)


def _moved(policy, seed: int = 1):
    """The adapters after some training: B (0 at the start) set to small random values."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    return policy


def test_kl_reference_is_the_policy_with_adapters_off_and_no_second_model(tiny):
    model, tok = tiny
    base = copy.deepcopy(model)
    policy = lora.add_adapters(copy.deepcopy(model), lora.LoraConfig(rank=8))
    ref = lora.AdaptersOff(policy)
    assert list(ref.parameters()) == [] and ref.module is policy  # a view of the policy, not a copy
    batch = _batch(tok)
    with torch.no_grad():
        at_start = models.token_logprobs(policy, batch)[0]
        assert torch.equal(at_start, models.token_logprobs(ref, batch)[0])  # step 0: B = 0
        _moved(policy)
        moved, off = models.token_logprobs(policy, batch)[0], models.token_logprobs(ref, batch)[0]
        assert torch.equal(off, models.token_logprobs(base, batch)[0])  # adapters off = the initial weights
        assert (moved - off).abs().max() > 1e-3                          # and the adapters do move the policy
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)  # the optimizer holds the adapters only
    assert len(lora.trainable(policy)) == len(names) and sum(p.numel() for p in lora.trainable(policy)) < \
        sum(p.numel() for p in base.parameters()) / 5


def test_a_bf16_base_keeps_float32_adapters_and_the_reference_equal_at_step_0(tiny):
    """Under LoRA the frozen base takes --grpo.ref-dtype (bf16 on CUDA, smrc.setup): the adapters stay float32
    (the optimizer's only tensors), the reference (adapters off) equals the policy at step 0, the gradients
    reach the adapters only, and the merged weights at B = 0 are the bf16 base's own."""
    model, tok = tiny
    base = copy.deepcopy(model).to(torch.bfloat16)
    policy = lora.add_adapters(copy.deepcopy(base), lora.LoraConfig(rank=8))
    dtypes = {("lora_" in n): {p.dtype} for n, p in policy.named_parameters()}
    assert dtypes == {True: {torch.float32}, False: {torch.bfloat16}}
    batch = _batch(tok)
    logp = models.token_logprobs(policy, batch)[0]
    with torch.no_grad():
        assert torch.equal(logp, models.token_logprobs(lora.AdaptersOff(policy), batch)[0])
    logp.sum().backward()
    grads = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
    assert grads and all("lora_" in n and g.dtype == torch.float32 for n, g in grads.items())
    assert any(g.abs().sum() > 0 for g in grads.values()) and all(g.isfinite().all() for g in grads.values())
    merged = dict(lora.merged_weights(policy, torch.bfloat16))
    assert all(torch.equal(merged[k], v) for k, v in base.state_dict().items())


def test_merged_folder_loads_with_from_pretrained_and_scores_as_the_policy(tiny, tmp_path):
    from transformers import AutoModelForCausalLM
    model, tok = tiny
    policy = _moved(lora.add_adapters(copy.deepcopy(model), lora.LoraConfig(rank=4, alpha=8)))
    lora.save_merged(policy, tok, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert set(merged.state_dict()) == set(model.state_dict())  # the base's own names, no lora_ keys
    batch = _batch(tok)
    with torch.no_grad():
        a, b = models.token_logprobs(policy, batch)[0], models.token_logprobs(merged, batch)[0]
    assert torch.allclose(a, b, atol=1e-5)  # W + α/r·B·A = W·x + α/r·B·A·x, up to float summation order


def test_bad_input_is_one_error_line(tiny, tmp_path, monkeypatch):
    import smrc
    model, _ = tiny

    def error(call):
        with pytest.raises(SystemExit) as e:
            call()
        text = str(e.value.code)
        assert text.startswith("error: ") and "\n" not in text, text
        return text

    assert "positive rank" in error(lambda: smrc.parse_config(["--lora.rank", "-1"]))
    assert "without --lora.rank" in error(lambda: smrc.parse_config(["--lora.alpha", "32"]))
    assert "fsdp" in error(lambda: smrc.parse_config(["--lora.rank", "8", "--dist.strategy", "fsdp"]))
    no_layer = lora.LoraConfig(rank=8, target_modules=("qq",))
    assert "match no layer" in error(lambda: lora.add_adapters(copy.deepcopy(model), no_layer))
    (tmp_path / "config.json").write_text("{}")  # a full fine-tuning checkpoint: no adapter_config.json
    assert "trained without adapters" in error(lambda: lora.check_resume(lora.LoraConfig(rank=8), tmp_path))
    (tmp_path / lora.ADAPTER_CONFIG).write_text(json.dumps({"r": 8, "lora_alpha": 16, "lora_dropout": 0.0}))
    assert "holds LoRA adapters" in error(lambda: lora.check_resume(lora.LoraConfig(rank=0), tmp_path))
    assert "holds LoRA adapters" in error(lambda: lora.check_resume(lora.LoraConfig(rank=16), tmp_path))
    lora.check_resume(lora.LoraConfig(rank=8), tmp_path)  # the same adapters: fine
    run_config = {"lora": {"target_modules": ["q_proj", "v_proj"]}}  # as the run gave them (smrc_config.json)
    (tmp_path / "smrc_config.json").write_text(json.dumps(run_config))
    other = lora.LoraConfig(rank=8, target_modules=("all-linear",))
    said = error(lambda: lora.check_resume(other, tmp_path))
    assert "target-modules ['q_proj', 'v_proj']" in said
    lora.check_resume(lora.LoraConfig(rank=8, target_modules=("v_proj", "q_proj")), tmp_path)  # any order
    monkeypatch.setitem(sys.modules, "peft", None)  # peft not installed
    assert lora.INSTALL in error(lambda: lora.add_adapters(model, lora.LoraConfig(rank=8)))


def _peak(config: str, gib: float, *flags) -> float:
    from config import parse_config
    from scale.memory_plan import load_arch, plan
    cfg = parse_config(["--config", str(ROOT / config), *flags])
    phases = plan(cfg, load_arch(cfg.model), True, gib)["phases"]
    return max(sum(parts.values()) for parts in phases.values())


def test_memory_plan_of_the_lora_configs():
    """Qwen3-1.7B on one 24 GB card plans <= 22 GiB (full fine-tuning: far over); Qwen2.5-3B on one 80 GB
    card leaves room; the adapters, their gradients and optimizer state are counted."""
    small = "configs/alfworld/smrc_sd_lora_qwen3_1.7b_24gb.yaml"
    full = "configs/alfworld/smrc_sd_qwen3_1.7b.yaml"  # the same run, full fine-tuning, vLLM at 0.3
    assert _peak(small, 24) <= 22 < _peak(full, 24, "--rollout.vllm-gpu-memory", "0.3")
    assert _peak("configs/alfworld/smrc_sd_lora_qwen2.5_3b_80gb.yaml", 80) <= 0.75 * 80
    assert _peak(small, 24, "--lora.rank", "128") > _peak(small, 24)  # the adapters' own memory counts
    base_fp32 = _peak(small, 24, "--grpo.ref-dtype", "float32") - _peak(small, 24)  # the frozen base's dtype
    assert base_fp32 > 2 * 1.7e9 / 2**30  # counts (2 B a parameter more, and autocast's head copy)


def _run(*args, check=True):
    proc = subprocess.run([sys.executable, str(ROOT / "smrc.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=900)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


FAST = ["--preset", "tiny", "--rollout.tasks-per-step", "2", "--rollout.group-size", "3",
        "--alfworld.max-steps", "4", "--lora.rank", "8"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.usefixtures("quick_agent")
def test_lora_run_checkpoints_resumes_and_evaluates(tmp_path):
    pytest.importorskip("alfworld", reason="the training loop runs on the real ALFWorld engine")
    import evaluate
    from scale.checkpoint import verify
    full = tmp_path / "full"
    _run(*FAST, "--steps", "2", "--save-every", "1", "--lora.save-merged", "--output-dir", str(full))
    rows = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["actor/kl"] == 0.0 and rows[1]["actor/kl"] > 0  # step 1 updates from B = 0: policy = ref
    from analysis import lambda_pilot  # the λ pilot reads the run: the term gradients over the adapters
    assert lambda_pilot.measure(full).steps == 2 and rows[0]["actor/grad_norm_sd"] > 0
    ckpt = full / "step_000002"
    assert verify(ckpt) is None and (ckpt / "adapter_model.safetensors").is_file()
    assert not (ckpt / "model.safetensors").exists()  # peft's format: the adapters only
    config = json.loads((full / "config.json").read_text())
    assert config["lora"]["rank"] == 8  # --config and the trackers get the same dict
    from embedded.warmstart import resolve
    base = Path(resolve("tiny-agent-quick")) / "model.safetensors"  # what a resume's initial-weights check
    assert config["resolved"]["initial_weights"]["sha256"] == {base.name: _sha(base)}  # compares: the base
    # evaluate.py loads the checkpoint (its base + adapters, merged) = the merged folder of the same step
    model, tok = evaluate.load_any(str(ckpt))
    merged, _ = evaluate.load_any(str(full / lora.MERGED))
    batch = _batch(tok)
    with torch.no_grad():
        assert torch.equal(models.token_logprobs(model, batch)[0], models.token_logprobs(merged, batch)[0])
    assert evaluate.check_checkpoints(evaluate.EvalArgs(checkpoint=(str(ckpt),))) == {str(ckpt): "verified"}
    # --resume from step 1 (in the same folder: step 2 is set aside): the same adapters and numbers at step 2
    _run(*FAST, "--steps", "2", "--save-every", "1", "--output-dir", str(full),
         "--resume-from", "step_000001")
    assert _sha(ckpt / "adapter_model.safetensors") == \
        _sha(full / "step_000002.after_step_1" / "adapter_model.safetensors")
    resumed = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()][1]
    for k, v in rows[1].items():
        if not k.startswith(("time/", "mem/")) and not k.endswith("_time_s"):
            assert resumed[k] == pytest.approx(v, rel=1e-5, abs=1e-7, nan_ok=True), k


@pytest.mark.usefixtures("quick_agent")
def test_a_run_holds_the_frozen_base_in_the_reference_dtype(tmp_path):
    """smrc.setup casts the base to --grpo.ref-dtype under LoRA (auto: bf16 on CUDA; forced here on CPU): the
    run says so, trains the float32 adapters (a finite, non-zero gradient) and starts from KL 0."""
    pytest.importorskip("alfworld", reason="the training loop runs on the real ALFWorld engine")
    out = tmp_path / "bf16"
    proc = _run(*FAST, "--steps", "1", "--grpo.ref-dtype", "bfloat16", "--output-dir", str(out))
    assert "the base frozen in bfloat16" in proc.stdout
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["actor/kl"] == 0.0 and 0 < row["actor/grad_norm"] < float("inf")


def test_the_memory_table_puts_lora_beside_full_per_phase_at_step_1_and_over_all_steps(tmp_path):
    """bench/lora_memory.py's table, from a record written by hand: step 1's peaks, the steps' largest, the
    ratios, the plan kept in the record, and the count of step 1's equal responses."""
    import gzip
    from bench import lora_memory
    for mode, (one, two) in {"full": (3.0, 4.0), "lora": (1.5, 1.0)}.items():
        rows = [{"step": s, "phase": "update", "peak_gib": g} for s, g in ((1, one), (2, two))]
        (tmp_path / f"{mode}.json").write_text(json.dumps({"phases": rows, "wall_s": 60.0,
                                                           "plan_gib": {"update": 2 * one}}))
        (tmp_path / f"{mode}-run").mkdir()
        turns = [{"step": 1, "traj_id": "t", "turn": i, "response": f"{mode if i else ''}"} for i in range(2)]
        (tmp_path / f"{mode}-run" / "rollouts.jsonl.gz").write_bytes(
            gzip.compress("\n".join(json.dumps(t) for t in turns).encode()))
    lines = lora_memory.table(tmp_path, {"full": [], "lora": []})
    update = lines[2].split()
    assert update[0] == "update"
    assert [float(x) for x in update[1:]] == [3.0, 1.5, 0.5, 4.0, 1.5, 0.38, 6.0, 3.0]
    assert lines[3] == "step 1: 1 of 2 turns' responses equal"
    assert lines[4] == "wall time: full 1.0 min, lora 1.0 min"
