"""Truncated importance sampling of the sampler-trainer mismatch (--grpo.tis-cap, issue 63): L_GRPO's
per-token loss is weighted by the detached w = min(π_old / π_sampler, C). Sampler log-probs offset from the
trainer's by known amounts give exactly the expected weights, mean weight and capped share; the resolved
default is on under vLLM (verl's threshold, grpo.TIS_CAP) and off under the transformers engine.

Run: pytest tests/test_tis.py -q
"""
import copy
import math

import pytest
import torch

import grpo
import models
from fakes import sample

OFFSETS = (0.1, 1.0, -0.5, 0.0)  # log π_old − log π_sampler of each sample's tokens: w = e^δ, capped at 2


def _update(model, tok, monkeypatch, tis_cap):
    prompts, responses = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]], [[20, 21], [22, 23, 24], [25], [26, 27]]
    batch = models.collate(prompts, responses, tok.pad_token_id)
    with torch.no_grad():
        logp, _ = models.token_logprobs(model, batch, 1.0)
    true = [logp[i, :len(r)].tolist() for i, r in enumerate(responses)]
    samples = [sample(p, r, a, [x - d for x in lp])
               for p, r, a, lp, d in zip(prompts, responses, (1.0, -1.0, 0.5, -0.5), true, OFFSETS)]
    weights, real = [], grpo.loss_terms

    def terms(x, cfg, sd_scale=1.0):
        loss, t = real(x, cfg, sd_scale)
        weights.append((t["tis_weight"], x.old_logp != 0))
        return loss, t
    monkeypatch.setattr(grpo, "loss_terms", terms)
    cfg = grpo.GRPOConfig(kl_coef=0.0, sd_loss="reverse-kl", sd_coef=0.0, tis_cap=tis_cap)
    actor = grpo.update(model, torch.optim.SGD(model.parameters(), lr=0.0), samples, cfg,
                        pad_id=tok.pad_token_id)
    expected = [min(math.exp(d), tis_cap) if tis_cap else 1.0 for d, r in zip(OFFSETS, responses) for _ in r]
    return weights, actor, expected, responses


def test_known_offsets_give_the_expected_weights(tiny, monkeypatch):
    model, tok = tiny
    weights, actor, expected, responses = _update(copy.deepcopy(model), tok, monkeypatch, tis_cap=2.0)
    got = sorted(torch.cat([w[real] for w, real in weights]).tolist())
    assert got == pytest.approx(sorted(expected), abs=1e-5)
    n = len(expected)
    assert actor["actor/tis_weight"] == pytest.approx(sum(expected) / n, abs=1e-5)
    assert actor["actor/tis_capped_share"] == pytest.approx(len(responses[1]) / n)  # δ = 1: e > 2


def test_off_means_weight_one_and_nothing_capped(tiny, monkeypatch):
    model, tok = tiny
    _, actor, _, _ = _update(copy.deepcopy(model), tok, monkeypatch, tis_cap=0.0)
    assert actor["actor/tis_weight"] == 1.0 and actor["actor/tis_capped_share"] == 0.0


def test_the_weight_multiplies_the_ppo_term_and_nothing_else():
    """loss_terms with w: pg_loss is w times the unweighted one; the SD, KL and entropy terms unchanged."""
    g = torch.Generator().manual_seed(0)
    B, R = 2, 3
    logp = -torch.rand(B, R, generator=g)
    w = torch.tensor([[0.5, 1.0, 2.0], [1.5, 0.25, 2.0]])
    x = grpo.TokenTerms(logp, logp - 0.1, logp - 0.2, logp + 0.3, torch.ones(B, R),
                        torch.tensor([1.0, -2.0]), torch.rand(B, R, generator=g))
    cfg = grpo.GRPOConfig(sd_loss="reverse-kl", sd_coef=0.5, tis_cap=2.0)
    _, plain = grpo.loss_terms(x, cfg)
    x.tis = w
    _, weighted = grpo.loss_terms(x, cfg)
    assert torch.allclose(weighted["pg_loss"], w * plain["pg_loss"])
    for k in ("sd_loss", "kl", "entropy"):
        assert torch.equal(weighted[k], plain[k])
    assert torch.equal(weighted["tis_capped_share"], (w >= 2.0).float())


@pytest.mark.parametrize("engine, cap", [("vllm", grpo.TIS_CAP), ("hf", 0.0)])
def test_on_by_default_under_vllm_only(engine, cap):
    import config
    cfg = config.Config()
    cfg.rollout.engine = engine
    assert config.resolve(cfg).grpo.tis_cap == cap
    cfg.grpo.tis_cap = 3.0
    assert config.resolve(cfg).grpo.tis_cap == 3.0
