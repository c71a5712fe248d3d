"""Bounded log-prob memory: `token_logprobs` computes the lm_head + log-softmax in chunks of response tokens (each
recomputed in backward), and gives the same log-probs, entropies and gradients as the plain full-vocabulary formula
on the model's own logits.

Run: pytest tests/test_logprobs.py -q
"""
import copy

import torch

from models import collate, token_logprobs


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
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
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
                lp, ent = token_logprobs(model, batch, 0.7, with_entropy=True, allowed=allowed, chunk_tokens=chunk)
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
            lp, ent = token_logprobs(model, batch, 1.0, with_entropy=True, allowed=allowed, chunk_tokens=chunk)
        ((lp * torch.linspace(-1, 1, lp.shape[1]) - 0.1 * ent) * mask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert grads[0].abs().max() > 1e-4  # a real gradient
    for g in grads[1:]:
        assert g.shape == grads[0].shape
        assert torch.allclose(g, grads[0], atol=1e-6, rtol=1e-4)
