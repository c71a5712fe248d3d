"""π_old (--grpo.old-logprobs): recomputed by the trainer before the first step, or the sampler's; the PPO
ratio of the first mini-batch is exactly 1 with the first (the vLLM case: tests/test_vllm.py). And the one
rendering of a ratio that was not measured.

Run: pytest tests/test_old_logprobs.py -q
"""
import copy
import math

import pytest
import torch

import grpo
import models
from fakes import first_mini_batch_ratios, sample


@pytest.mark.parametrize("mode", ["recompute", "sampler"])
def test_recomputed_old_logprobs_make_the_first_mini_batch_ratio_exactly_one(tiny, monkeypatch, mode):
    """Sampling log-probs 0.01 off the trainer's (a sampler's kernels and precision), two mini-batches
    (so π_old is not this forward's): recomputed by the trainer, the first mini-batch's ratio is exactly 1
    on every token; the sampler's give ratios of e^0.01. The gap is logged either way (lr 0: the weights
    stay the sampler's but for the offset)."""
    model, tok = tiny
    m = copy.deepcopy(model)
    prompts, responses = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]], [[20, 21], [22, 23, 24], [25], [26, 27]]
    true = [lp for lp in _plain_logprobs(m, prompts, responses, tok.pad_token_id)]
    advantages = (1.0, -1.0, 0.5, -0.5)
    samples = [sample(p, r, a, [x - 0.01 for x in lp])
               for p, r, a, lp in zip(prompts, responses, advantages, true)]
    cfg = grpo.GRPOConfig(kl_coef=0.0, mini_batch_size=2, old_logprobs=mode, sd_loss="reverse-kl",
                          sd_coef=1.0)
    out = {}
    ratios = first_mini_batch_ratios(monkeypatch, grpo, lambda: out.update(grpo.update(
        m, torch.optim.SGD(m.parameters(), lr=0.0), samples, cfg, pad_id=tok.pad_token_id)))
    ratios = torch.cat(ratios)
    assert ratios.numel() > 0
    if mode == "recompute":
        assert torch.equal(ratios, torch.ones_like(ratios))
    else:
        assert torch.allclose(ratios, torch.full_like(ratios, math.exp(0.01)), atol=1e-5)
    assert out["actor/rollout_logprob_gap"] == pytest.approx(0.01, abs=1e-5)


def _plain_logprobs(model, prompts, responses, pad_id):
    batch = models.collate(prompts, responses, pad_id)
    with torch.no_grad():
        logp, _ = models.token_logprobs(model, batch, 1.0)
    return [logp[i, :len(r)].tolist() for i, r in enumerate(responses)]


@pytest.mark.parametrize("ratio, shown", [(0.25, "grad sd/grpo 0.250"), (math.nan, "grad sd/grpo –"),
                                          (math.inf, "grad sd/grpo –")])
def test_an_unmeasured_sd_grpo_ratio_is_one_dash_everywhere(ratio, shown):
    """One rendering of "not measured" in the progress line (NaN under FSDP or without a GRPO signal; inf in
    rows of older runs): '–'."""
    from scale.monitor import _sd_text
    row = {"sd/distilled_turns": 3, "actor/sd_grpo_grad_ratio": ratio, "sd/teacher_minus_student_logp": -0.1,
           "sd/kl_per_turn": 1.0, "sd/candidate_sampled_share": 0.5}
    assert _sd_text(row).endswith(shown)
