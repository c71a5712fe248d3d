"""The SD term's Δ on one numeric path (issue 63): with the null context (`--router.context none`) the teacher
sees exactly the student's prompt, so Δ = log π_T − log π_θ must be 0 on every token of the first mini-batch,
whatever micro-batches the teacher and the update pack. Float32: within 1e-6. bf16 autocast (on CPU here, the
CUDA path's precision): within BF16_BOUND, a stated bound, not 0: the teacher's and the update's micro-batches
differ in width, and bf16 matmuls round differently per shape. The vLLM backend's case is in
tests/test_vllm.py.

Run: pytest tests/test_sd_delta.py -q
"""
import copy

import pytest
import torch

import grpo
import models
import router
import teacher
from fakes import turn
from models import HFEngine, SamplingConfig, chat_ids
from records import WITHOUT_REFERENCE, Step

BF16_BOUND = 0.01  # nat a token, bf16 autocast, null context: 5x the max measured on tiny on CPU (0.00195)
TEXTS = ["Your task is to: put a mug in fridge.", "go", "You see a cabinet 1, a drawer 2, a fridge 1. " * 3,
         "Your task is to: heat some egg and put it in garbagecan.", "look around the room", "x y z"]


def _turns(model, tok):
    """Six turns with sampled responses of varied lengths; every other one distilled (a match without a
    reference: the null context needs none)."""
    prompts = [chat_ids(tok, t) for t in TEXTS]
    torch.manual_seed(0)
    gens = HFEngine(model, tok, SamplingConfig(max_new_tokens=6)).generate(prompts)
    turns = [turn("t", f"traj{i}", 0, Step((), "", "", ""), user_text=text, prompt_ids=p,
                  response_ids=g.response_ids, sample_logprobs=g.logprobs, advantage=(-1.0) ** i)
             for i, (text, p, g) in enumerate(zip(TEXTS, prompts, gens))]
    for t in turns[::2] + turns[1:2]:
        t.match = WITHOUT_REFERENCE
    return turns


def _null_context_deltas(model, tok, monkeypatch, bf16_on_cpu=False, device="cpu"):
    """|Δ| of every distilled token the update's first mini-batch sees, and its actor/ metrics, after the hf
    teacher scored the turns with the null context (micro-batches of different widths on each side)."""
    if bf16_on_cpu:
        monkeypatch.setattr(models, "precision", lambda *_: torch.autocast("cpu", dtype=torch.bfloat16))
    m = copy.deepcopy(model).to(device)
    turns = _turns(m, tok)
    assert teacher.teacher_prompts(turns[:1], "none", tok) == [turns[0].prompt_ids]
    assert router.teacher_context("none", None, None, ()).around("abc") == "abc"
    cfg = teacher.TeacherConfig(backend="hf", micro_batch_tokens=64)
    stats = teacher.teacher_signal(turns, "none", tok, cfg, teacher.hf_logprob_fn(m, tok.pad_token_id, 64))
    deltas = []
    real = grpo.loss_terms

    def terms(x, c, sd_scale=1.0):
        loss, t = real(x, c, sd_scale)
        deltas.append(t["gap"][x.sd_mask > 0].abs())
        return loss, t
    monkeypatch.setattr(grpo, "loss_terms", terms)
    gcfg = grpo.GRPOConfig(kl_coef=0.0, sd_loss="reverse-kl", sd_coef=1.0, micro_batch_tokens=160,
                           term_grad_norms="on")
    actor = grpo.update(m, torch.optim.SGD(m.parameters(), lr=0.0), turns, gcfg, pad_id=tok.pad_token_id)
    return torch.cat(deltas), stats, actor


def test_null_context_delta_is_zero_in_float32(tiny, monkeypatch):
    """Float32: |Δ| ≤ 1e-6 on every distilled token; the SD gradient (measured apart) ≈ 0 against GRPO's;
    the logged teacher−sampler gap per token (sd/gap_sum, the hf sampler being the same module) ≈ 0."""
    model, tok = tiny
    deltas, stats, actor = _null_context_deltas(model, tok, monkeypatch)
    assert stats["sd/distilled_turns"] == 4 and deltas.numel() == stats["sd/distilled_tokens"]
    assert deltas.max().item() <= 1e-6
    assert actor["actor/grad_norm_sd"] <= 1e-6 * actor["actor/grad_norm_grpo"]
    assert abs(stats["sd/gap_sum"]) / stats["sd/distilled_tokens"] <= 1e-5


def test_null_context_delta_under_bf16_autocast_is_within_the_stated_bound(tiny, monkeypatch):
    """bf16 autocast (the CUDA path's precision, run on CPU): |Δ| ≤ BF16_BOUND on every distilled token,
    and its mean far below it."""
    model, tok = tiny
    deltas, stats, _ = _null_context_deltas(model, tok, monkeypatch, bf16_on_cpu=True)
    print(f"bf16 null-context |Δ|: max {deltas.max().item():.3g}, mean {deltas.mean().item():.3g} "
          f"over {deltas.numel()} tokens")
    assert deltas.max().item() <= BF16_BOUND
    assert deltas.mean().item() <= BF16_BOUND / 10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only (bench/gpu_check.sh runs it)")
def test_null_context_delta_on_cuda_in_bf16_autocast(tiny, monkeypatch):
    """The CUDA path as it runs (models.precision: bf16 autocast on the device): |Δ| ≤ BF16_BOUND."""
    model, tok = tiny
    deltas, stats, actor = _null_context_deltas(model, tok, monkeypatch, device="cuda")
    print(f"CUDA bf16 null-context |Δ|: max {deltas.max().item():.3g}, mean {deltas.mean().item():.3g} over "
          f"{deltas.numel()} tokens; grad_norm_sd {actor['actor/grad_norm_sd']:.3g}, grpo "
          f"{actor['actor/grad_norm_grpo']:.3g}; sd/gap_sum per token "
          f"{stats['sd/gap_sum'] / stats['sd/distilled_tokens']:.3g}")
    assert deltas.max().item() <= BF16_BOUND


@pytest.mark.parametrize("context", ["none", "smrc"])
def test_the_null_context_is_a_choice_of_the_command_line(context):
    from config import parse_config
    cfg = parse_config(["--router.context", context, "--algo", "smrc-sd"])
    assert cfg.router.context == context
