"""GRPO math and the combined update, checked against naive reference implementations.

Run: pytest tests/test_grpo.py -q
"""
import copy
import dataclasses
import math

import pytest
import torch

import grpo
import models
from fakes import GradRecorder, sample
from config import ALGOS
from grpo import TokenTerms, grpo_advantages, loss_terms

ANCHOR_SD_COEF = {row.sd_loss: row.sd_coef for row in ALGOS.values()}  # λ of each form's anchor


def GRPOConfig(**fields) -> grpo.GRPOConfig:
    """A resolved GRPOConfig, as config.resolve gives the update:
    the reverse-kl form at λ = 1 unless given."""
    return grpo.GRPOConfig(**{"sd_loss": "reverse-kl", "sd_coef": 1.0, **fields})


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
    return loss_terms(TokenTerms(logp, old, z + logp.detach(), z, z, torch.tensor(A), z), cfg)


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
    """A context-free 'language model': one logit vector shared by every position
    (enough for gradient signs)."""

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
    return [sample([1, 2], [y], 0.0, [math.log(1 / V)], [float(teacher[y])])
            for y in [0, 1, 2, 3, 4] * 2 + [0, 4]]


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
    samples = [sample([1, 2, 3], [4, 1], a, [-1.6, -1.6], tl) for a, tl in
               [(1.0, [-0.1, -3.0]), (-0.5, None), (0.3, [-2.0, -0.2]), (-1.0, None)]]
    plain = [sample(s.prompt_ids, s.response_ids, s.advantage, s.sample_logprobs, None) for s in samples]
    base = ToyLM()
    base.logits.data = torch.randn(5)
    models = [copy.deepcopy(base) for _ in range(2)]
    # 2 mini-batches: ratio ≠ 1
    cfg = GRPOConfig(kl_coef=0.0, entropy_coef=0.001, sd_coef=0.0, mini_batch_size=2)
    for m, data in zip(models, (samples, plain)):
        grpo.update(m, torch.optim.AdamW(m.parameters(), lr=0.1), data, cfg, pad_id=0)
    assert torch.equal(models[0].logits, models[1].logits)
    assert not torch.equal(models[0].logits, base.logits)


def test_micro_batch_accumulation_equals_one_big_batch(tiny):
    """Peak memory is set by micro_batch_tokens, the result is not: same gradients either way."""
    model, tok = tiny
    torch.manual_seed(1)
    samples = [sample(torch.randint(3, 500, (n,)).tolist(), torch.randint(3, 500, (r,)).tolist(), a,
                      [-7.0] * r, [-6.0] * r if a > 0 else None)
               for n, r, a in [(5, 3, 1.0), (9, 6, -1.0), (17, 2, 0.5), (4, 8, -0.2), (12, 5, 2.0)]]
    grads = []
    for budget in (10_000, 20):
        m = copy.deepcopy(model)
        opt = GradRecorder(m.parameters())  # lr 0: compare the accumulated gradients only
        grpo.update(m, opt, samples, GRPOConfig(kl_coef=0.0, micro_batch_tokens=budget, max_grad_norm=1e9),
                    pad_id=tok.pad_token_id)
        grads.append(torch.cat([p.last_grad.flatten() for p in m.parameters() if p.last_grad is not None]))
    # the small budget really splits
    assert models.micro_batches([8, 15, 19, 12, 17], 20) != [[0, 1, 2, 3, 4]]
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_single_minibatch_is_exactly_on_policy(tiny):
    model, tok = tiny
    m = copy.deepcopy(model)
    # bogus sample lps
    samples = [sample([5, 6, 7], [8, 9], 1.0, [0.0, 0.0]), sample([5, 6], [10], -1.0, [0.0])]
    out = grpo.update(m, torch.optim.AdamW(m.parameters(), lr=1e-3), samples, GRPOConfig(kl_coef=0.0),
                      pad_id=tok.pad_token_id)
    assert out["actor/ratio"] == pytest.approx(1.0) and out["actor/clipfrac"] == 0.0
    assert out["actor/optimizer_steps"] == 1


def _nan_batch(n_bad: int):
    """Two mini-batches of one sample each; the first `n_bad` have a NaN advantage (a NaN loss)."""
    return [sample([5, 6, 7], [8, 9], float("nan") if i < n_bad else 1.0, [-1.0, -1.0]) for i in range(2)]


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
    assert (out["actor/nonfinite_skips"], out["actor/optimizer_steps"],
            out["actor/nonfinite_streak"]) == (1, 1, 0)
    assert all(torch.isfinite(p).all() for p in m.parameters()) and math.isfinite(out["actor/grad_norm"])
    assert not all(torch.equal(p, q) for p, q in zip(m.parameters(), before))  # the finite mini-batch stepped


def test_nonfinite_steps_in_a_row_stop_the_run(tiny):
    model, tok = tiny
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    cfg = GRPOConfig(kl_coef=0.0, mini_batch_size=1, max_nonfinite_steps=3)
    with pytest.raises(SystemExit,
                       match=r"^error: 3 optimizer steps in a row .*--grpo.max-nonfinite-steps 3"):
        grpo.update(m, opt, _nan_batch(2), cfg, pad_id=tok.pad_token_id, nonfinite_streak=1)  # carried over
    assert all(torch.isfinite(p).all() for p in m.parameters())


def test_every_size_auto_is_decided_once_by_the_model_size_and_the_device():
    """config.resolve_for_model: from 100M parameters the update recomputes activations (on CPU too) and the
    measurements are off; below, the reverse; a flag given stays; the KL reference is bf16 on CUDA only."""
    from config import Config, resolve_for_model
    large, small = resolve_for_model(Config(), 100_000_000, "cpu"), resolve_for_model(Config(), 10**6, "cuda")
    assert (large.grpo.grad_checkpointing, large.grpo.term_grad_norms, large.teacher.candidate_gain,
            large.grpo.ref_dtype) == ("on", "off", "off", "float32")
    assert (small.grpo.grad_checkpointing, small.grpo.term_grad_norms, small.teacher.candidate_gain,
            small.grpo.ref_dtype) == ("off", "on", "on", "bfloat16")
    given = Config(grpo=GRPOConfig(grad_checkpointing="on", term_grad_norms="off", ref_dtype="float32"))
    kept = resolve_for_model(given, 10**6, "cuda")
    assert (kept.grpo.grad_checkpointing, kept.grpo.term_grad_norms, kept.grpo.ref_dtype) == ("on", "off",
                                                                                             "float32")
    assert given.teacher.candidate_gain == "auto"  # a copy: the run's own config is left as given


# ------------------------------------------------------------------------------------------------------------
# The four L_SD forms against hand-computed values and gradients (anchors.md §2.2, §10.5-10.6)

def _one_token(form, p_student, p_teacher, p_old, beta=5.0):
    """ℓ and dℓ/dlog π_θ of one distilled token with the given probabilities."""
    logp = torch.tensor([[math.log(p_student)]], requires_grad=True)
    sd, gate = grpo.sd_losses(logp, torch.tensor([[math.log(p_old)]]), torch.tensor([[math.log(p_teacher)]]),
                              torch.ones(1, 1), form, beta)
    sd.sum().backward()
    return float(sd.detach()), float(logp.grad), float(gate)


# the teacher endorses the sampled token (Δ > 0), or not (Δ < 0)
@pytest.mark.parametrize("p_teacher", [0.5, 0.05])
def test_sd_forms_match_hand_computed_values_and_gradients(p_teacher):
    p, old = 0.2, 0.25                         # student prob of its sampled token; the sampling policy's
    d = math.log(p_teacher) - math.log(p)      # Δ = log π_T − log π_θ
    u, rho = -d, p / old                       # u = log π_θ − log π_T; ρ = π_θ / π_old = 0.8
    # reverse-kl: ℓ = sg(−Δ)·log π_θ, gradient −Δ
    val, grad, _ = _one_token("reverse-kl", p, p_teacher, old)
    assert (val, grad) == pytest.approx((u * math.log(p), u), rel=1e-5)
    # skill-sd: ℓ = ρ·k3, k3 = e^{−u} − 1 + u, ρ not detached: gradient ρ·k3 + ρ·(1 − e^{−u}) = ρ·u
    val, grad, _ = _one_token("skill-sd", p, p_teacher, old)
    assert (val, grad) == pytest.approx((rho * (math.exp(-u) - 1 + u), rho * u), rel=1e-5)
    # sdar: ℓ = g·(log π_T − log π_θ), g = σ(5Δ) detached: gradient −g
    g = 1 / (1 + math.exp(-5 * d))
    val, grad, gate = _one_token("sdar", p, p_teacher, old)
    assert (val, grad, gate) == pytest.approx((g * d, -g, g), rel=1e-5)
    # grpo-opsd: the sdar form with g = 0.5
    val, grad, gate = _one_token("grpo-opsd", p, p_teacher, old)
    assert (val, grad, gate) == pytest.approx((0.5 * d, -0.5, 0.5), rel=1e-5)
    # signs, as descent moves log π_θ by −grad: the KL forms follow the teacher,
    # the likelihood forms always push up
    for form in ("reverse-kl", "skill-sd"):
        assert (_one_token(form, p, p_teacher, old)[1] < 0) == (d > 0)
    for form in ("sdar", "grpo-opsd"):
        assert _one_token(form, p, p_teacher, old)[1] < 0


def test_skill_sd_importance_weight_is_capped_at_e10_and_its_gradient_then_stops():
    val, grad, _ = _one_token("skill-sd", 0.9, 0.5, 1e-6)   # log π_θ − log π_old = 13.7 > 10
    u = math.log(0.9 / 0.5)
    k3 = math.exp(-u) - 1 + u
    assert (val, grad) == pytest.approx((math.exp(10) * k3, math.exp(10) * (1 - math.exp(-u))), rel=1e-4)


@pytest.mark.parametrize("form", ["reverse-kl", "skill-sd", "sdar", "grpo-opsd"])
def test_sd_forms_in_the_loss_use_the_anchor_lambda_and_ignore_undistilled_tokens(form):
    """Through loss_terms: the resolved λ (the form's anchor value, or --grpo.sd-coef) scales the term, and a
    token that is not distilled (teacher log-prob padded with 0, a padding-like student log-prob) has no loss,
    no gradient, no NaN."""
    logp = torch.tensor([[math.log(0.2), -60.0]], requires_grad=True)
    z = torch.zeros(1, 2)
    teacher, mask = torch.tensor([[math.log(0.5), 0.0]]), torch.tensor([[1.0, 0.0]])
    grads = []
    for coef in (ANCHOR_SD_COEF[form], 0.5):
        logp.grad = None
        cfg = GRPOConfig(kl_coef=0.0, entropy_coef=0.0, sd_loss=form, sd_coef=coef)
        x = TokenTerms(logp, logp.detach(), logp.detach(), teacher, mask, torch.zeros(1), z)
        loss, terms = loss_terms(x, cfg)
        loss.sum().backward()
        assert (torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0
                and float(terms["sd_loss"][0, 1].detach()) == 0)
        grads.append(float(logp.grad[0, 0]))
    one = _one_token(form, 0.2, 0.5, 0.2)[1]  # on-policy: ρ = 1
    assert grads == pytest.approx([ANCHOR_SD_COEF[form] * one, 0.5 * one], rel=1e-5)


def test_sd_norm_distilled_divides_by_distilled_tokens_instead_of_all():
    """Advantages 0, no KL, no entropy: only L_SD moves the weights. One distilled turn of 2 tokens, one
    GRPO-only turn of 3: `distilled` gives the gradient of `all` times 5/2, and leaves GRPO-only batches
    alone."""
    teacher = [math.log(0.6), math.log(0.1)]
    samples = [sample([1, 2], [0, 3], 0.0, [math.log(0.2)] * 2, teacher),
               sample([1], [1, 2, 4], 0.0, [-1.6] * 3)]
    grads = {}
    for norm in ("all", "distilled"):
        m = ToyLM()
        cfg = GRPOConfig(kl_coef=0.0, entropy_coef=0.0, sd_coef=1.0, max_grad_norm=1e9, sd_norm=norm)
        grpo.update(m, GradRecorder(m.parameters()), samples, cfg, pad_id=0)
        grads[norm] = m.logits.last_grad.clone()
    assert grads["all"].abs().sum() > 0
    assert torch.allclose(grads["distilled"], grads["all"] * 5 / 2, rtol=1e-5)
    # by hand for `all`: Σ over the 2 distilled tokens of (log π_θ − log π_T)·∇log π_θ(y) / 5,
    # uniform π_θ = 1/5
    p = torch.full((5,), 0.2)
    expected = sum((math.log(0.2) - t) * (torch.nn.functional.one_hot(torch.tensor(y), 5) - p)
                   for y, t in zip([0, 3], teacher)) / 5
    assert torch.allclose(grads["all"], expected.float(), atol=1e-6)


# ------------------------------------------------------------------------------------------------------------
# The oracle teacher through the reverse-kl loss, the importance ratio of later mini-batches,
# the term gradient norms

def _onehot(y, V=5):
    return torch.nn.functional.one_hot(torch.tensor(y), V).float()


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_reverse_kl_gradient_with_oracle_teacher_logprobs_by_hand(alpha):
    """ToyLM at uniform π = 1/5; the student sampled y = (0, 3), the candidate is c = (0, 1). The oracle's
    conditionals: y_1 = c_1, p_T = 0.2(1−α) + α; y_2 leaves c, p_T = 0.04(1−α) / (0.2(1−α) + α) (0 at α = 1:
    floored). Gradient = Σ_t (log π_θ(y_t) − log p_T(y_t))·(e_{y_t} − π) / 2 tokens;
    0 at α = 0 (teacher = student)."""
    import teacher
    T = teacher.oracle_logprobs([math.log(0.2)] * 2, [0, 3], [0, 1], alpha)
    p1 = 0.2 * (1 - alpha) + alpha
    p2 = 0.04 * (1 - alpha) / p1 if alpha < 1 else 1e-6
    assert T == pytest.approx([math.log(p1), math.log(p2)])
    m = ToyLM()
    cfg = GRPOConfig(kl_coef=0.0, entropy_coef=0.0, sd_coef=1.0, max_grad_norm=1e9)
    grpo.update(m, GradRecorder(m.parameters()), [sample([1], [0, 3], 0.0, [math.log(0.2)] * 2, T)], cfg,
                pad_id=0)
    pi = torch.full((5,), 0.2)
    expected = ((math.log(0.2) - math.log(p1)) * (_onehot(0) - pi)
                + (math.log(0.2) - math.log(p2)) * (_onehot(3) - pi)) / 2
    assert torch.allclose(m.logits.last_grad, expected, atol=1e-6)
    assert (m.logits.last_grad.abs().max() < 1e-6) == (alpha == 0.0)


@pytest.mark.parametrize("cap", [math.inf, 1.2])  # untruncated, and truncated at 1.2
def test_later_minibatch_sd_gradient_is_rho_times_minus_delta_with_the_teacher_frozen(cap):
    """Two mini-batches of one distilled token y = 0 each, sampled at uniform weights w0
    (log π_old = log 0.2), the teacher's log-probs fixed before the update (log 0.5: the teacher does not
    move within the step). SGD, lr 1:
    mini-batch 1: g1 = (log π_w0(0) − log 0.5)·(e_0 − π_w0), ρ = 1; mini-batch 2 at w1 = w0 − g1:
    g2 = ρ·(log π_w1(0) − log 0.5)·(e_0 − π_w1), ρ = min(π_w1(0) / 0.2, cap) > 1."""
    old, T = math.log(0.2), math.log(0.5)
    m = ToyLM()
    cfg = GRPOConfig(kl_coef=0.0, entropy_coef=0.0, sd_coef=1.0, max_grad_norm=1e9, mini_batch_size=1,
                     sd_is_cap=cap, term_grad_norms="off")
    out = grpo.update(m, torch.optim.SGD(m.parameters(), lr=1.0), [sample([1], [0], 0.0, [old], [T])] * 2,
                      cfg, pad_id=0)
    w = torch.zeros(5)
    pi = torch.softmax(w, -1)
    w = w - (math.log(pi[0]) - T) * (_onehot(0) - pi)                         # mini-batch 1: ρ = 1 exactly
    pi = torch.softmax(w, -1)
    rho = min(float(pi[0]) / 0.2, cap)
    assert float(pi[0]) / 0.2 > 1.5                                           # really off-policy
    w = w - rho * (math.log(pi[0]) - T) * (_onehot(0) - pi)                   # mini-batch 2: ρ·(−Δ)·∇log π_θ
    assert torch.allclose(m.logits.detach(), w, atol=1e-5)
    assert out["actor/sd_is_ratio"] == pytest.approx((1 + rho) / 2, rel=1e-5)


# one micro-batch, or one per sample (norms of the summed gradients)
@pytest.mark.parametrize("budget", [8192, 3])
def test_term_gradient_norms_are_each_terms_norm_and_change_nothing(budget):
    """‖∇L_GRPO‖ equals the gradient norm of the same update without teacher log-probs, ‖∇λL_SD‖ that of the
    same update with advantages 0; turning the measurement off leaves the weights bit for bit the same."""
    samples = [sample([1], [0, 3], 1.0, [math.log(0.2)] * 2, [math.log(0.6), math.log(0.1)]),
               sample([1], [2], -1.0, [math.log(0.2)])]
    cfg = GRPOConfig(kl_coef=0.0, entropy_coef=0.0, sd_coef=0.7, max_grad_norm=1e9, micro_batch_tokens=budget,
                     term_grad_norms="on")

    def run(data, measure=True):
        m = ToyLM()
        m.logits.data = torch.tensor([0.3, -0.2, 0.1, 0.0, 0.5])
        out = grpo.update(m, torch.optim.SGD(m.parameters(), lr=0.1), data,
                          dataclasses.replace(cfg, term_grad_norms="on" if measure else "off"), pad_id=0)
        return out, m.logits.detach()
    both, w = run(samples)
    grpo_only, _ = run([dataclasses.replace(s, teacher_logprobs=None) for s in samples])
    sd_only, _ = run([dataclasses.replace(s, advantage=0.0) for s in samples])
    assert both["actor/grad_norm_grpo"] == pytest.approx(grpo_only["actor/grad_norm"], rel=1e-5)
    assert both["actor/grad_norm_sd"] == pytest.approx(sd_only["actor/grad_norm"], rel=1e-5)
    assert (both["actor/sd_grpo_grad_ratio"]
            == pytest.approx(sd_only["actor/grad_norm"] / grpo_only["actor/grad_norm"]))
    off, w_off = run(samples, measure=False)
    assert torch.equal(w, w_off) and math.isnan(off["actor/grad_norm_sd"])


def test_sd_gradient_is_linear_in_lambda_and_absent_without_a_term():
    """The pilot's premise (analysis/lambda_pilot.py): on the same batch, ‖∇(λ·L_SD)‖ scales exactly with λ
    and ‖∇L_GRPO‖ does not move, so the ratio per unit λ is one number; a batch without distilled turns logs
    the ratio as NaN (no SD term), not 0."""
    samples = [sample([1], [0, 3], 1.0, [math.log(0.2)] * 2, [math.log(0.6), math.log(0.1)]),
               sample([1], [2], -1.0, [math.log(0.2)])]

    def run(data, lam):
        m = ToyLM()
        m.logits.data = torch.tensor([0.3, -0.2, 0.1, 0.0, 0.5])
        cfg = GRPOConfig(kl_coef=0.0, entropy_coef=0.0, sd_coef=lam, max_grad_norm=1e9, term_grad_norms="on")
        return grpo.update(m, torch.optim.SGD(m.parameters(), lr=0.1), data, cfg, pad_id=0)
    strong, weak = run(samples, 0.2), run(samples, 0.03)
    assert weak["actor/grad_norm_grpo"] == pytest.approx(strong["actor/grad_norm_grpo"], rel=1e-6)
    assert weak["actor/sd_grpo_grad_ratio"] / 0.03 == pytest.approx(strong["actor/sd_grpo_grad_ratio"] / 0.2,
                                                                    rel=1e-5)
    assert strong["actor/sd_grpo_grad_ratio"] > 0
    no_sd = run([dataclasses.replace(s, teacher_logprobs=None) for s in samples], 0.2)
    assert no_sd["actor/grad_norm_grpo"] > 0 and math.isnan(no_sd["actor/sd_grpo_grad_ratio"])


def test_term_gradient_norms_skip_a_mini_batch_with_nothing_to_measure():
    """A first mini-batch of an all-fail group without a teacher (both terms zero) is not measured; the next
    one is, and its norms are the gradient norms of that mini-batch's own terms."""
    lp = torch.log_softmax(torch.tensor([0.3, -0.2, 0.1, 0.0, 0.5]), -1).tolist()  # ToyLM's: the ratio is 1
    quiet = sample([1], [2], 0.0, [lp[2]])
    busy = sample([1], [0, 3], 1.0, [lp[0], lp[3]], [math.log(0.6), math.log(0.1)])
    cfg = GRPOConfig(kl_coef=0.0, entropy_coef=0.0, sd_coef=0.7, max_grad_norm=1e9, mini_batch_size=1,
                     term_grad_norms="on")

    def run(data):
        m = ToyLM()
        m.logits.data = torch.tensor([0.3, -0.2, 0.1, 0.0, 0.5])
        return grpo.update(m, torch.optim.SGD(m.parameters(), lr=0.0), data, cfg, pad_id=0)
    both = run([quiet, busy])
    alone_pg = run([dataclasses.replace(busy, teacher_logprobs=None)])
    alone_sd = run([dataclasses.replace(busy, advantage=0.0)])
    assert both["actor/grad_norm_grpo"] == pytest.approx(alone_pg["actor/grad_norm"], rel=1e-5)
    assert both["actor/grad_norm_sd"] == pytest.approx(alone_sd["actor/grad_norm"], rel=1e-5)
    assert both["actor/grad_norm_grpo"] > 0 and both["actor/grad_norm_sd"] > 0


def test_the_update_frees_every_gradient_after_its_steps(tiny):
    """No gradient outlives the update (it would sit through the next rollout, a parameter-sized buffer):
    after each optimizer step the gradients are set to None, also after a step skipped as non-finite."""
    model, tok = tiny
    m = copy.deepcopy(model)
    samples = [sample([5, 6, 7], [8, 9], a, [-7.0, -7.0]) for a in (1.0, -1.0, 0.5, -0.5)]
    grpo.update(m, torch.optim.AdamW(m.parameters(), lr=1e-3), samples,
                GRPOConfig(kl_coef=0.0, mini_batch_size=2), pad_id=tok.pad_token_id)
    assert all(p.grad is None for p in m.parameters())


def test_equal_scores_give_exactly_zero_advantages_and_no_grad_ratio(tiny):
    """A group whose scores are all equal (a real model's first step: every turn invalid, all −0.1) gets
    advantages of exactly 0, not ±1e-11; the update's GRPO gradient is then exactly 0 and the SD/GRPO ratio
    is not measured (NaN, printed '–'), so a λ pilot leaves the step out instead of reading 7.6e8."""
    assert grpo.grpo_advantages([-0.1] * 6, [0, 0, 0, 1, 1, 1]) == [0.0] * 6
    assert grpo.grpo_advantages([5.0], ["solo"]) == [pytest.approx(5.0)]  # one sample: μ 0, σ 1, as before
    model, tok = tiny
    m = copy.deepcopy(model)
    samples = [sample([5, 6, 7], [8, 9], 0.0, [-7.0, -7.0], [-6.0, -6.5]) for _ in range(4)]
    out = grpo.update(m, GradRecorder(m.parameters()), samples, GRPOConfig(kl_coef=0.0, term_grad_norms="on"),
                      pad_id=tok.pad_token_id)
    assert out["actor/grad_norm_grpo"] == 0.0 and out["actor/grad_norm_sd"] > 0
    assert math.isnan(out["actor/sd_grpo_grad_ratio"])
