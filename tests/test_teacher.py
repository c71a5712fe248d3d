"""teacher.py: exact response alignment after a longer privileged prefix, no autograd, same weights, length budget,
and teacher_signal building requests from matches only.

Run: pytest tests/test_teacher.py -q
"""
import copy

import torch

import teacher
from models import chat_ids
from teacher import TeacherConfig, TeacherRequest


def _requests(tok):
    return [TeacherRequest("Your task is to: put a mug in fridge.", "Reference: go to fridge 1 then open it.",
                           tok("<action>go to fridge 1</action>")["input_ids"]),
            TeacherRequest("short", "A much longer privileged block. " * 6, tok("<action>look</action>")["input_ids"]),
            TeacherRequest("x", "", [5, 6, 7, 8, 9, 10, 11])]


def _score(model, tok, reqs, cfg=TeacherConfig(), temperature=1.0):
    return teacher.score(tok, reqs, cfg, teacher.hf_scorer(model, tok.pad_token_id, cfg.micro_batch_tokens,
                                                          temperature))


def test_teacher_logprobs_equal_a_hand_sliced_forward(tiny):
    model, tok = tiny
    reqs = _requests(tok)
    scored, stats = _score(model, tok, reqs)
    for req, lp in zip(reqs, scored):
        prompt = chat_ids(tok, req.context + "\n\n" + req.user_text)
        ids = torch.tensor([prompt + req.response_ids])
        with torch.no_grad():
            logits = model(ids).logits[0]                             # (T, V), no padding, no batching
        P, R = len(prompt), len(req.response_ids)
        # the first response token is predicted by the LAST prefix position P-1 (the off-by-one trap)
        expected = torch.log_softmax(logits[P - 1:P + R - 1], -1).gather(-1, torch.tensor(req.response_ids)[:, None])
        assert len(lp) == R
        assert torch.allclose(torch.tensor(lp), expected[:, 0], atol=1e-4)
    assert stats["sd/over_length_turns"] == 0
    assert stats["sd/teacher_tokens"] == sum(len(chat_ids(tok, r.context + "\n\n" + r.user_text)) + len(r.response_ids)
                                             for r in reqs)


def test_teacher_builds_no_graph_and_uses_the_policy_weights(tiny):
    model, tok = tiny
    m = copy.deepcopy(model)
    grad_modes = []
    hook = m.register_forward_hook(lambda *_: grad_modes.append(torch.is_grad_enabled()))
    reqs = _requests(tok)[:1]
    before, _ = _score(m, tok, reqs)
    assert grad_modes == [False] and all(p.grad is None for p in m.parameters())
    with torch.no_grad():  # change the policy's weights: the teacher must see the change (same weights, no copy)
        m.lm_head.weight.mul_(2.0) if not m.config.tie_word_embeddings else m.model.embed_tokens.weight.mul_(2.0)
    after, _ = _score(m, tok, reqs)
    hook.remove()
    assert not torch.allclose(torch.tensor(before[0]), torch.tensor(after[0]))


def test_over_length_teacher_prompt_is_routed_to_grpo_and_counted(tiny):
    model, tok = tiny
    reqs = _requests(tok)
    lengths = [len(chat_ids(tok, r.context + "\n\n" + r.user_text)) for r in reqs]
    budget = sorted(lengths)[1]  # the longest prompt is over the budget
    scored, stats = _score(model, tok, reqs, TeacherConfig(max_prompt_tokens=budget))
    over = [i for i, n in enumerate(lengths) if n > budget]
    assert stats["sd/over_length_turns"] == len(over) == 1
    assert all((lp is None) == (i in over) for i, lp in enumerate(scored))


def test_skill_context_reaches_the_teacher_by_task_type_without_a_reference(tiny):
    """teacher_signal with the skill context: each turn's teacher prompt holds its own task type's skill file (and the
    environment's general one), a turn matched without a reference (matcher `every`) is distilled, None is not."""
    from types import SimpleNamespace

    import envs
    import router
    model, tok = tiny
    seen = []

    def scorer(prompts, responses, allowed=None):
        seen.extend(tok.decode(p) for p in prompts)
        return [[-1.0] * len(r) for r in responses]
    types = ["pick_heat_then_place_in_recep", "look_at_obj_in_light", "pick_two_obj_and_place"]
    turns = [SimpleNamespace(task=envs.Task(f"t{i}", tt, "alfworld", ""), user_text=f"student prompt {i}",
                             signature=(), response_ids=[5, 6], sample_logprobs=[-2.0, -2.0], allowed=None)
             for i, tt in enumerate(types)]
    matches = [router.Match(None, -1, ""), router.Match(None, -1, ""), None]
    lp, stats = teacher.teacher_signal(turns, matches, "skill", tok, TeacherConfig(), scorer)
    assert lp == [[-1.0, -1.0], [-1.0, -1.0], None] and stats["sd/distilled_turns"] == 2
    assert len(seen) == 2
    for text, tt, other in zip(seen, types, types[1:]):
        assert router.skill_text("alfworld", tt) in text and router.skill_text("alfworld", other) not in text
        assert text.index(router.SKILL_TEMPLATE.split("\n")[0]) < text.index("student prompt")
