"""Restricted decoding (--rollout.action-space admissible): every response is one of the allowed responses,
and the same mask gives the same log-probs in sampling, in the update (PPO ratio exactly 1 on-policy) and in
the teacher.

Run: pytest tests/test_restricted.py -q
"""
import copy

import torch

import envs
import grpo
import teacher
from fakes import sample
from models import (HFEngine, SamplingConfig, action_trie, allowed_ids, chat_ids, collate, token_logprobs)

ADMISSIBLE = [["go to cabinet 1", "go to cabinet 2", "open drawer 1", "take mug 1 from countertop 1", "look"],
              ["go to fridge 1", "inventory", "put mug 1 in/on coffeemachine 1"]]


def _sample(tiny, n=8, temperature=1.0):
    model, tok = tiny
    torch.manual_seed(0)
    prompts = [chat_ids(tok, f"Your task is to: put a mug in coffeemachine. Turn {i}.") for i in range(n)]
    tries = [action_trie(tok, [envs.action_response(a) for a in ADMISSIBLE[i % 2]]) for i in range(n)]
    engine = HFEngine(model, tok, SamplingConfig(max_new_tokens=24, temperature=temperature), batch_size=4)
    return prompts, engine.generate(prompts, tries)


def test_trie_allows_exactly_the_continuations(tiny):
    _, tok = tiny
    trie = action_trie(tok, ["<action>look</action>", "<action>go to cabinet 1</action>"])
    look = tok("<action>look</action>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert allowed_ids(trie, look[:-1]) == [tok.eos_token_id]       # after the whole response: only EOS
    assert allowed_ids(trie, look) == []                             # ended
    assert allowed_ids(trie, [look[0] + 1] if look[0] + 1 not in trie else [10**6]) == []  # off the trie
    first = sorted({ids[0] for ids in (tok(r, add_special_tokens=False)["input_ids"]
                                        for r in ["<action>look</action>",
                                                  "<action>go to cabinet 1</action>"])})
    assert sorted(allowed_ids(trie, [])) == first  # at the start: exactly the responses' first tokens


def test_every_response_is_an_admissible_action(tiny):
    _, gens = _sample(tiny, n=16)
    for i, g in enumerate(gens):  # the untrained tiny model would write garbage without the mask
        parsed = envs.parse_action(g.text, "alfworld", require_think=False)
        assert parsed.valid and parsed.action in ADMISSIBLE[i % 2], g.text
        assert not g.truncated and len(g.allowed) == len(g.response_ids)


def test_sampling_update_and_teacher_logprobs_agree_under_the_mask(tiny):
    model, tok = tiny
    prompts, gens = _sample(tiny)
    batch = collate(prompts, [g.response_ids for g in gens], tok.pad_token_id)
    mask = batch.response_mask.bool()
    sampled = torch.tensor([g.logprobs + [0.0] * (batch.response_ids.shape[1] - len(g.logprobs))
                            for g in gens])
    with torch.no_grad():
        masked, _ = token_logprobs(model, batch, allowed=[g.allowed for g in gens])
        free, _ = token_logprobs(model, batch)
    assert torch.allclose(masked[mask], sampled[mask], atol=1e-5)
    assert (free[mask] < masked[mask] - 1e-3).any()  # the mask matters: without it the numbers differ
    # the teacher with an empty context and the same mask scores exactly what was sampled
    scorer = teacher.hf_logprob_fn(model, tok.pad_token_id, 16384)
    scored = scorer(prompts, [g.response_ids for g in gens], [g.allowed for g in gens])
    for g, lp in zip(gens, scored):
        assert torch.allclose(torch.tensor(lp), torch.tensor(g.logprobs), atol=1e-5)


def test_update_ratio_is_exactly_one_on_policy(tiny):
    model, tok = tiny
    model = copy.deepcopy(model)
    prompts, gens = _sample(tiny)
    samples = [sample(p, g.response_ids, (-1.0) ** i, g.logprobs, None, g.allowed)
               for i, (p, g) in enumerate(zip(prompts, gens))]
    cfg = grpo.GRPOConfig(lr=1e-3, mini_batch_size=1024, kl_coef=0.0, sd_loss="reverse-kl", sd_coef=1.0)
    out = grpo.update(model, torch.optim.AdamW(model.parameters(), lr=1e-3), samples, cfg,
                      pad_id=tok.pad_token_id)
    assert out["actor/ratio"] == 1.0 and out["actor/clipfrac"] == 0.0
    # the update's masked forward equals the sampling log-probs
    assert out["actor/rollout_logprob_gap"] < 1e-5


def _counting_forwards(model):
    calls = []
    return calls, model.register_forward_hook(lambda *_: calls.append(1))


def test_forced_tokens_cost_no_decode_step(tiny):
    """Only tokens where the trie leaves a choice are decoded: a single allowed action needs no forward at
    all, and a batch needs fewer forwards than token-by-token decoding; every forced token has log-prob
    exactly 0."""
    model, tok = tiny
    engine = HFEngine(model, tok, SamplingConfig(max_new_tokens=24), batch_size=4)
    prompts = [chat_ids(tok, f"Turn {i}.") for i in range(4)]
    calls, hook = _counting_forwards(model)
    try:
        only = engine.generate(prompts, [action_trie(tok, [envs.action_response("look")])] * 4)
        assert calls == []
        prompts, gens = _sample(tiny)  # 8 prompts in batches of 4
    finally:
        hook.remove()
    assert all(g.text == "<action>look</action>" and g.logprobs == [0.0] * len(g.response_ids) for g in only)
    stepwise = sum(max(len(g.response_ids) for g in gens[i:i + 4]) for i in (0, 4))  # a forward per token
    assert 0 < len(calls) < stepwise
    for g in gens:
        assert all(lp == 0.0 for lp, allowed in zip(g.logprobs, g.allowed) if len(allowed) == 1)
        assert any(lp < 0.0 for lp in g.logprobs)  # the choices were sampled
