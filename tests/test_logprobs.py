"""Bounded log-prob memory: `token_logprobs` computes the lm_head + log-softmax in chunks of response tokens
(each recomputed in backward), and gives the same log-probs, entropies and gradients as the plain
full-vocabulary formula on the model's own logits.

Run: pytest tests/test_logprobs.py -q
"""
import copy

import pytest
import torch

from models import (HFEngine, LogprobRecorder, SamplingConfig, chat_ids, collate, generation_autocast,
                    token_logprobs)


def _batch(tok, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(5, 3), (9, 6), (2, 1), (12, 7)]  # (prompt, response) lengths: padding on both sides
    prompts = [torch.randint(3, len(tok), (p,), generator=g).tolist() for p, _ in shapes]
    responses = [torch.randint(3, len(tok), (r,), generator=g).tolist() for _, r in shapes]
    return collate(prompts, responses, tok.pad_token_id)


def _allowed(batch, V):
    """Row 1 free; the others restricted to 4 ids per position, the sampled token among them."""
    out = []
    for b, (ids, m) in enumerate(zip(batch.response_ids.tolist(), batch.response_mask.tolist())):
        out.append(None if b == 1 else [[y, (y + 1) % V, (y + 7) % V, 3] for y, k in zip(ids, m) if k])
    return out


def _plain(model, batch, temperature, allowed):
    """The unchunked reference: the model's full logits, one log-softmax over (B, R, V)."""
    R = batch.response_ids.shape[1]
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=batch.position_ids,
                   use_cache=False).logits[:, -R - 1:-1].float() / temperature   # (B, R, V)
    if allowed is not None:
        keep = torch.ones_like(logits, dtype=torch.bool)
        for b, rows in enumerate(allowed):
            for t, ids in enumerate(rows or []):
                keep[b, t] = False
                keep[b, t, ids] = True
        logits = logits.masked_fill(~keep, float("-inf"))
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all.masked_fill(torch.isinf(logp_all), 0.0)).sum(-1)
    return logp, entropy


def test_chunked_logprobs_and_entropy_equal_the_full_vocabulary_formula(tiny):
    model, tok = tiny
    batch = _batch(tok)
    mask = batch.response_mask.bool()
    for allowed in (None, _allowed(batch, len(tok))):
        with torch.no_grad():
            ref_lp, ref_ent = _plain(model.eval(), batch, 0.7, allowed)
            for chunk in (1, 4, 10**6):
                lp, ent = token_logprobs(model, batch, 0.7, with_entropy=True, allowed=allowed,
                                         chunk_tokens=chunk)
                assert torch.allclose(lp[mask], ref_lp[mask], atol=1e-5, rtol=0)
                assert torch.allclose(ent[mask], ref_ent[mask], atol=1e-5, rtol=0)
                assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    restricted = mask.clone()
    restricted[1] = False  # row 1 is free
    assert (ent[restricted] < torch.tensor(4.0).log() + 1e-5).all()  # 4 allowed ids: at most log 4 nats
    assert (ent[mask & ~restricted] > 5.0).all()                     # the free row: near-uniform over V


def test_chunked_gradients_equal_the_full_vocabulary_gradients(tiny):
    base, tok = tiny
    batch = _batch(tok, seed=1)
    mask = batch.response_mask.float()
    allowed = _allowed(batch, len(tok))
    grads = []
    for chunk in (None, 3, 10**6):  # None: the plain formula
        model = copy.deepcopy(base).train()
        if chunk is None:
            lp, ent = _plain(model, batch, 1.0, allowed)
        else:
            lp, ent = token_logprobs(model, batch, 1.0, with_entropy=True, allowed=allowed,
                                     chunk_tokens=chunk)
        ((lp * torch.linspace(-1, 1, lp.shape[1]) - 0.1 * ent) * mask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    scale = grads[0].abs().max()
    assert scale > 1e-4  # a real gradient
    for g in grads[1:]:  # float32 sums in another order: equal up to a few ulps of the largest entry
        assert g.shape == grads[0].shape
        assert torch.allclose(g, grads[0], atol=1e-5 * scale.item(), rtol=1e-4)


def _engine_exactness(model, tok, sampling, n=6):
    """The engine's sampling log-probs vs the trainer's forward on the same prompts + responses (float32)."""
    torch.manual_seed(0)
    prompts = [chat_ids(tok, f"Your task is to: put a mug in coffeemachine. Turn {i}." + " look" * i)
               for i in range(n)]
    gens = HFEngine(model, tok, sampling, batch_size=4).generate(prompts)
    batch = collate(prompts, [g.response_ids for g in gens], tok.pad_token_id)
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch, sampling.temperature or 1.0)
    for i, g in enumerate(gens):
        assert len(g.logprobs) == len(g.response_ids) > 0
        assert torch.allclose(torch.tensor(g.logprobs), logp[i, :len(g.logprobs)], atol=1e-5, rtol=0), i
    return gens


def test_engine_sampling_logprobs_equal_the_trainer_forward(tiny):
    model, tok = tiny
    for temperature in (1.0, 0.7):
        gens = _engine_exactness(model.eval(), tok,
                                 SamplingConfig(max_new_tokens=12, temperature=temperature))
        assert len({tuple(g.response_ids) for g in gens}) > 1  # really sampled
    greedy = _engine_exactness(model, tok, SamplingConfig(max_new_tokens=12, temperature=0.0))
    static = _engine_exactness(model, tok,
                               SamplingConfig(max_new_tokens=12, temperature=0.0, static_cache=True))
    assert [g.response_ids for g in greedy] == [g.response_ids for g in static]


def test_a_static_cache_samples_in_float32_because_bf16_autocast_breaks_it(tiny):
    """transformers' static cache keeps a layer's keys and values in one dtype; under bf16 autocast Qwen3's
    normed keys are float32 and its values bfloat16, so the first cache write fails (here on CPU autocast; on
    CUDA the same, seen on an H200). So the engine samples in float32 with a static cache, bf16 otherwise."""
    model, tok = tiny
    ids = torch.tensor([chat_ids(tok, "Your task is to: put a mug in coffeemachine.")])
    with (torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad(),
          pytest.raises(RuntimeError, match="dtype")):
        model.eval().generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2,
                              cache_implementation="static", pad_token_id=tok.pad_token_id)
    cuda = torch.device("cuda")  # only the device's type is read: no GPU needed
    assert isinstance(generation_autocast(cuda, bf16=True, static_cache=False), torch.autocast)
    cases = ((cuda, True, True), (cuda, False, False), (torch.device("cpu"), True, False))
    for device, bf16, static in cases:
        assert not isinstance(generation_autocast(device, bf16, static), torch.autocast)


def test_recorder_gathers_each_step_at_the_token_taken_next():
    rec = LogprobRecorder(temperature=0.5)
    scores = [torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]]),
              torch.tensor([[1.0, 1.0, 0.0], [0.0, 2.0, 0.0]])]
    ids = torch.tensor([[7], [7]])
    for step, taken in zip(scores, ([2, 0], [1, 1])):
        assert torch.equal(rec(ids, step), step)  # scores pass through unchanged
        ids = torch.cat([ids, torch.tensor(taken)[:, None]], dim=1)
    expected = torch.stack([torch.log_softmax(scores[0] / 0.5, -1)[[0, 1], [2, 0]],
                            torch.log_softmax(scores[1] / 0.5, -1)[[0, 1], [1, 1]]], dim=1)
    assert torch.allclose(rec.logprobs(ids), expected)
