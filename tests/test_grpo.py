"""GRPO math and the combined update, checked against naive reference implementations.

Run: pytest tests/test_grpo.py -q
"""
import copy
import math

import pytest
import torch

import grpo
import models
from grpo import GRPOConfig, Sample, grpo_advantages, loss_terms


def naive_advantages(scores, groups, norm_by_std=True, eps=1e-6):
    out = []
    for s, g in zip(scores, groups):
        members = [x for x, gg in zip(scores, groups) if gg == g]
        if len(members) == 1:
            mu, sd = 0.0, 1.0
        else:
            mu = sum(members) / len(members)
            sd = math.sqrt(sum((x - mu) ** 2 for x in members) / (len(members) - 1))
        out.append((s - mu) / (sd + eps) if norm_by_std else s - mu)
    return out


def test_advantages_match_naive_loop_including_singletons():
    scores = [10, 0, 9.9, 0, -0.1, 10, 3.0, 5.0]
    groups = [0, 0, 0, 1, 1, 1, 2, 3]  # groups 2 and 3 are singletons: mean 0, std 1
    assert grpo_advantages(scores, groups) == pytest.approx(naive_advantages(scores, groups))
    assert grpo_advantages(scores, groups, norm_by_std=False) == pytest.approx(
        naive_advantages(scores, groups, norm_by_std=False))
    assert grpo_advantages([3.0], ["a"]) == pytest.approx([3.0])


def naive_pg(logp, old, A, eps_lo, eps_hi, c):
    r = math.exp(logp - old)
    loss = max(-A * r, -A * min(max(r, 1 - eps_lo), 1 + eps_hi))
    return min(loss, -A * c) if A < 0 else loss


def _terms(logp, old, A, cfg):
    z = torch.zeros_like(logp)
    return loss_terms(logp, old, z + logp.detach(), z, z, torch.tensor(A), z, cfg)


def test_clipped_surrogate_matches_naive_and_boundaries():
    cfg = GRPOConfig(kl_coef=0.0, entropy_coef=0.0, sd_coef=0.0)
    ratios = [0.5, 0.8, 0.81, 1.0, 1.19, 1.2, 1.5, 2.9, 3.5, 5.0]
    for A in (1.0, -1.0, 0.3, -2.0):
        old = torch.zeros(1, len(ratios))
        logp = torch.log(torch.tensor([ratios])).requires_grad_(True)
        loss, _ = _terms(logp, old, [A], cfg)
        naive = [naive_pg(math.log(r), 0.0, A, 0.2, 0.2, 3.0) for r in ratios]
        assert loss[0].tolist() == pytest.approx(naive, rel=1e-5)
        loss.sum().backward()
        g = logp.grad[0]
        for r, gi in zip(ratios, g.tolist()):
            clipped = (A > 0 and r > 1.2) or (A < 0 and r < 0.8) or (A < 0 and r > 3.0)
            inside = (0.8 < r < 1.2) or (A > 0 and r < 0.8) or (A < 0 and 1.2 < r < 3.0)
            if clipped:
                assert gi == 0.0, (A, r)         # no gradient past the clip (and past the dual clip)
            elif inside:
                assert gi == pytest.approx(-A * r, rel=1e-5), (A, r)  # d(-A·r)/dlogp = -A·r


class ToyLM(torch.nn.Module):
    """A context-free 'language model': one logit vector shared by every position (enough for gradient signs)."""

    def __init__(self, V=5):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(V))

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0, use_cache=False):
        B, T = input_ids.shape
        n = logits_to_keep or T
        return type("Out", (), {"logits": self.logits.expand(B, n, -1)})()


def _toy_samples(V=5):
    # 12 sampled single-token responses; the teacher prefers token 0 strongly, token 4 is disliked
    teacher = torch.log_softmax(torch.tensor([3.0, 0.0, 0.0, 0.0, -3.0]), -1)
    return [Sample([1, 2], [y], 0.0, [math.log(1 / V)], [float(teacher[y])]) for y in [0, 1, 2, 3, 4] * 2 + [0, 4]]


def test_sd_gradient_raises_teacher_preferred_tokens_and_lowers_others():
    model = ToyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = torch.softmax(model.logits.detach(), -1).clone()
    cfg = GRPOConfig(kl_coef=0.0, entropy_coef=0.0, sd_coef=1.0, max_grad_norm=1e9, mini_batch_size=64)
    grpo.update(model, opt, _toy_samples(), cfg, pad_id=0)  # advantages are 0: only L_SD moves the weights
    after = torch.softmax(model.logits.detach(), -1)
    assert after[0] > before[0]   # teacher log-prob above the student's: pushed up
    assert after[4] < before[4]   # teacher log-prob below: pushed down


def test_lambda_zero_reproduces_grpo_exactly():
    torch.manual_seed(0)
    samples = [Sample([1, 2, 3], [4, 1], a, [-1.6, -1.6], tl) for a, tl in
               [(1.0, [-0.1, -3.0]), (-0.5, None), (0.3, [-2.0, -0.2]), (-1.0, None)]]
    plain = [Sample(s.prompt_ids, s.response_ids, s.advantage, s.sample_logprobs, None) for s in samples]
    base = ToyLM()
    base.logits.data = torch.randn(5)
    models = [copy.deepcopy(base) for _ in range(2)]
    cfg = GRPOConfig(kl_coef=0.0, entropy_coef=0.001, sd_coef=0.0, mini_batch_size=2)  # 2 mini-batches: ratio ≠ 1
    for m, data in zip(models, (samples, plain)):
        grpo.update(m, torch.optim.AdamW(m.parameters(), lr=0.1), data, cfg, pad_id=0)
    assert torch.equal(models[0].logits, models[1].logits)
    assert not torch.equal(models[0].logits, base.logits)


def test_micro_batch_accumulation_equals_one_big_batch(tiny):
    """Peak memory is set by micro_batch_tokens, the result is not: same gradients either way."""
    model, tok = tiny
    torch.manual_seed(1)
    samples = [Sample(torch.randint(3, 500, (n,)).tolist(), torch.randint(3, 500, (r,)).tolist(), a,
                      [-7.0] * r, [-6.0] * r if a > 0 else None)
               for n, r, a in [(5, 3, 1.0), (9, 6, -1.0), (17, 2, 0.5), (4, 8, -0.2), (12, 5, 2.0)]]
    grads = []
    for budget in (10_000, 20):
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=0.0)  # lr 0: compare the accumulated gradients only
        grpo.update(m, opt, samples, GRPOConfig(kl_coef=0.0, micro_batch_tokens=budget, max_grad_norm=1e9),
                    pad_id=tok.pad_token_id)
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]))
    assert models.micro_batches([8, 15, 19, 12, 17], 20) != [[0, 1, 2, 3, 4]]  # the small budget really splits
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_single_minibatch_is_exactly_on_policy(tiny):
    model, tok = tiny
    m = copy.deepcopy(model)
    samples = [Sample([5, 6, 7], [8, 9], 1.0, [0.0, 0.0]), Sample([5, 6], [10], -1.0, [0.0])]  # bogus sample lps
    out = grpo.update(m, torch.optim.AdamW(m.parameters(), lr=1e-3), samples, GRPOConfig(kl_coef=0.0),
                      pad_id=tok.pad_token_id)
    assert out["actor/ratio"] == pytest.approx(1.0) and out["actor/clipfrac"] == 0.0
    assert out["actor/optimizer_steps"] == 1


def _nan_batch(n_bad: int):
    """Two mini-batches of one sample each; the first `n_bad` have a NaN advantage (a NaN loss)."""
    return [Sample([5, 6, 7], [8, 9], float("nan") if i < n_bad else 1.0, [-1.0, -1.0]) for i in range(2)]


def test_nonfinite_loss_skips_the_step_and_is_counted(tiny):
    model, tok = tiny
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in m.parameters()]
    cfg = GRPOConfig(kl_coef=0.0, mini_batch_size=1, max_nonfinite_steps=3)
    out = grpo.update(m, opt, _nan_batch(2), cfg, pad_id=tok.pad_token_id)
    assert out["actor/nonfinite_skips"] == 2 and out["actor/optimizer_steps"] == 0
    assert out["actor/nonfinite_streak"] == 2 and math.isnan(out["actor/grad_norm"])
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), before)) and not opt.state  # nothing moved
    out = grpo.update(m, opt, _nan_batch(1), cfg, pad_id=tok.pad_token_id, nonfinite_streak=1)
    assert (out["actor/nonfinite_skips"], out["actor/optimizer_steps"], out["actor/nonfinite_streak"]) == (1, 1, 0)
    assert all(torch.isfinite(p).all() for p in m.parameters()) and math.isfinite(out["actor/grad_norm"])
    assert not all(torch.equal(p, q) for p, q in zip(m.parameters(), before))  # the finite mini-batch stepped


def test_nonfinite_steps_in_a_row_stop_the_run(tiny):
    model, tok = tiny
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    cfg = GRPOConfig(kl_coef=0.0, mini_batch_size=1, max_nonfinite_steps=3)
    with pytest.raises(SystemExit, match=r"^error: 3 optimizer steps in a row .*--grpo.max-nonfinite-steps 3"):
        grpo.update(m, opt, _nan_batch(2), cfg, pad_id=tok.pad_token_id, nonfinite_streak=1)  # carried over
    assert all(torch.isfinite(p).all() for p in m.parameters())


def test_grad_checkpointing_auto_is_on_for_large_models_on_cuda_only():
    small, large = ToyLM(), torch.nn.Linear(1, 1)
    large.weight = torch.nn.Parameter(torch.empty(100_000_000, 1, device="meta"))  # 100M parameters, no memory
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert grpo.grad_checkpointing_on(GRPOConfig(), large, cuda)
    assert not grpo.grad_checkpointing_on(GRPOConfig(), small, cuda)
    assert not grpo.grad_checkpointing_on(GRPOConfig(), large, cpu)
    assert grpo.grad_checkpointing_on(GRPOConfig(grad_checkpointing="on"), small, cpu)
    assert not grpo.grad_checkpointing_on(GRPOConfig(grad_checkpointing="off"), large, cuda)
    assert grpo.grad_checkpointing_on(GRPOConfig(grad_checkpointing=True), small, cpu)  # an older config.json
