"""teacher.py: exact response alignment after a longer privileged prefix, no autograd, same weights, length
budget, and teacher_signal building requests from matches only.

Run: pytest tests/test_teacher.py -q
"""
import copy
import math

import pytest
import torch

import envs
import router
import teacher
from fakes import teacher_requests, turn
from measure import candidate_gain, candidate_share
from models import action_trie, allowed_per_position, chat_ids
from records import Step
from router import TeacherContext
from teacher import TeacherConfig, teacher_user_text


def _requests(tok):
    """(user text, context, response ids) triples."""
    return [("Your task is to: put a mug in fridge.", "Reference: go to fridge 1 then open it.",
             tok("<action>go to fridge 1</action>")["input_ids"]),
            ("short", "A much longer privileged block. " * 6, tok("<action>look</action>")["input_ids"]),
            ("x", "", [5, 6, 7, 8, 9, 10, 11])]


def _score(model, tok, reqs, cfg=TeacherConfig(), temperature=1.0):
    prompts, turns = teacher_requests(tok, reqs)
    logprob_fn = teacher.hf_logprob_fn(model, tok.pad_token_id, cfg.micro_batch_tokens, temperature)
    return teacher.score_turns(prompts, turns, cfg, logprob_fn)


def _signal(turns, matches, context, tok, cfg, scorer):
    """teacher_signal on turns the router matched with `matches`: (each turn's teacher log-probs, stats)."""
    for t, m in zip(turns, matches):
        t.match, t.teacher_logprobs = m, None
    stats = teacher.teacher_signal(turns, context, tok, cfg, scorer)  # then the measurements, as in smrc
    stats |= candidate_share.counts(turns) | candidate_gain.measure(turns, context, tok, cfg, scorer)
    return [t.teacher_logprobs for t in turns], stats


def test_teacher_logprobs_equal_a_hand_sliced_forward(tiny):
    model, tok = tiny
    reqs = _requests(tok)
    scored, stats = _score(model, tok, reqs)
    for (user_text, context, response), lp in zip(reqs, scored):
        prompt = chat_ids(tok, context + "\n\n" + user_text)  # a block without a slot: before the prompt
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logits = model(ids).logits[0]                             # (T, V), no padding, no batching
        P, R = len(prompt), len(response)
        # the first response token is predicted by the LAST prefix position P-1 (the off-by-one trap)
        expected = torch.log_softmax(logits[P - 1:P + R - 1], -1).gather(-1, torch.tensor(response)[:, None])
        assert len(lp) == R
        assert torch.allclose(torch.tensor(lp), expected[:, 0], atol=1e-4)
    assert stats["sd/over_length_turns"] == 0
    assert stats["sd/teacher_tokens"] == sum(
        len(chat_ids(tok, teacher_user_text(TeacherContext((context,), ()), user_text)))
        + len(response)
        for user_text, context, response in reqs)


def test_teacher_builds_no_graph_and_uses_the_policy_weights(tiny):
    model, tok = tiny
    m = copy.deepcopy(model)
    grad_modes = []
    hook = m.register_forward_hook(lambda *_: grad_modes.append(torch.is_grad_enabled()))
    reqs = _requests(tok)[:1]
    before, _ = _score(m, tok, reqs)
    assert grad_modes == [False] and all(p.grad is None for p in m.parameters())
    # change the policy's weights: the teacher must see the change (same weights, no copy)
    with torch.no_grad():
        (m.lm_head.weight.mul_(2.0) if not m.config.tie_word_embeddings
         else m.model.embed_tokens.weight.mul_(2.0))
    after, _ = _score(m, tok, reqs)
    hook.remove()
    assert not torch.allclose(torch.tensor(before[0]), torch.tensor(after[0]))


def test_over_length_teacher_prompt_is_routed_to_grpo_and_counted(tiny):
    model, tok = tiny
    reqs = _requests(tok)
    lengths = [len(chat_ids(tok, teacher_user_text(TeacherContext((context,), ()), user_text)))
               for user_text, context, _ in reqs]
    budget = sorted(lengths)[1]  # the longest prompt is over the budget
    scored, stats = _score(model, tok, reqs, TeacherConfig(max_prompt_tokens=budget))
    over = [i for i, n in enumerate(lengths) if n > budget]
    assert stats["sd/over_length_turns"] == len(over) == 1
    assert all((lp is None) == (i in over) for i, lp in enumerate(scored))


def test_skill_context_reaches_the_teacher_by_task_type_without_a_reference(tiny):
    """teacher_signal with the skill context: each turn's teacher prompt holds its own task type's skill file
    (and the environment's general one), a turn matched without a reference (matcher `every`) is distilled,
    None is not."""
    model, tok = tiny
    seen = []

    def scorer(prompts, responses, allowed=None):
        seen.extend(tok.decode(p) for p in prompts)
        return [[-1.0] * len(r) for r in responses]
    types = ["pick_heat_then_place_in_recep", "look_at_obj_in_light", "pick_two_obj_and_place"]
    turns = [turn(f"t{i}", "s", 0, Step((), "", "", ""), task_type=tt, user_text=f"student prompt {i}",
                  response_ids=[5, 6], sample_logprobs=[-2.0, -2.0]) for i, tt in enumerate(types)]
    matches = [router.Match(None, -1, ""), router.Match(None, -1, ""), None]
    lp, stats = _signal(turns, matches, "skill", tok, TeacherConfig(), scorer)
    assert lp == [[-1.0, -1.0], [-1.0, -1.0], None] and stats["sd/distilled_turns"] == 2
    assert len(seen) == 2
    for text, tt, other in zip(seen, types, types[1:]):
        assert router.skill_text("alfworld", tt) in text and router.skill_text("alfworld", other) not in text
        assert text.index(router.SKILL_TEMPLATE.split("\n")[0]) < text.index("student prompt")


# ------------------------------------------------------------------------------------------------------------
# The oracle teacher (1−α)·π_s + α·δ_c and the candidate-gain diagnostic

P = [0.5, 0.4, 0.8]  # the student's conditionals of y_1, y_2, y_3; π_s(y_≤t) = 0.5, 0.2, 0.16


@pytest.mark.parametrize("alpha,y,expected", [
    # y = c: [(1−α)·π_s(y_≤t) + α] / [(1−α)·π_s(y_<t) + α] = 0.75/1, 0.6/0.75, 0.58/0.6
    (0.5, [5, 6, 7], [0.75, 0.8, 0.58 / 0.6]),
    # y leaves c at t = 2: 0.75, then (0.5·0.2)/0.75 (no δ term above), then the student's own 0.8
    (0.5, [5, 9, 7], [0.75, 0.1 / 0.75, 0.8]),
    (0.5, [9, 6, 7], [0.25, 0.4, 0.8]),       # leaves at once: (0.5·0.5)/1, then the student
    (0.0, [5, 6, 7], P), (0.0, [5, 9, 7], P),  # α = 0: the student
    (1.0, [5, 6, 7], [1.0, 1.0, 1.0]),        # α = 1 on c: log-prob 0 per token
    (1.0, [5, 9, 7], [1.0, 1e-6, 0.8]),       # α = 1: 0 where y leaves c (floored at 1e-6), then the student
])
def test_oracle_logprobs_equal_a_hand_computation(alpha, y, expected):
    got = teacher.oracle_logprobs([math.log(p) for p in P], y, [5, 6, 7, 2], alpha)  # c ends with EOS (2)
    assert got == pytest.approx([math.log(e) for e in expected], abs=1e-9)


def test_oracle_on_a_truncated_or_longer_response_and_its_sequence_probability():
    lp = [math.log(p) for p in P]
    assert (teacher.oracle_logprobs(lp[:2], [5, 6], [5, 6, 7], 0.5)
            == pytest.approx([math.log(0.75), math.log(0.8)]))
    # y goes on after c ended: the student from there
    longer = teacher.oracle_logprobs(lp, [5, 6, 7], [5, 6], 0.5)
    assert longer == pytest.approx([math.log(0.75), math.log(0.8), math.log(0.5 * 0.16 / 0.6)])
    # on c itself the conditionals multiply to (1−α)·π_s(c) + α (what candidate_gain uses)
    assert (sum(teacher.oracle_logprobs(lp, [5, 6, 7], [5, 6, 7], 0.3))
            == pytest.approx(math.log(0.7 * 0.16 + 0.3)))


def _routed(tok):
    """Two turns of one task under restricted decoding, matched to a reference whose candidates are
    'go to fridge 1' (admissible at turn 0) and 'open fridge 1' (not admissible at turn 1), and one unmatched
    turn."""
    ref = router.Trajectory("t", "ref", [router.Step(("s0",), "", "o0", "go to fridge 1"),
                                         router.Step(("s1",), "", "o1", "open fridge 1")], True)
    admissible = [["go to fridge 1", "go to table 1", "look"], ["look", "go to table 1"], ["look"]]
    turns = []
    for i, adm in enumerate(admissible):
        resp = teacher.candidate_ids(tok, adm[-1])
        turns.append(turn(
            "t", "student", i, Step((f"s{i}",), "", f"o{i}", adm[-1]), task_type="pick_and_place_simple",
            user_text=f"student prompt {i}", prompt_ids=chat_ids(tok, f"student prompt {i}"),
            response_ids=resp, sample_logprobs=[-0.5] * len(resp), admissible=adm,
            allowed=allowed_per_position(action_trie(tok, [envs.action_response(a) for a in adm]), resp)))
    return turns, [router.Match(ref, 0, "go to fridge 1"), router.Match(ref, 1, "open fridge 1"), None]


def _recording(value):
    """A scorer that records its calls and gives every token the log-prob `value(calls so far)`."""
    calls = []

    def scorer(prompts, responses, allowed=None):
        calls.append((prompts, responses, allowed))
        return [[value(calls)] * len(r) for r in responses]
    return calls, scorer


def test_oracle_teacher_scores_nothing_and_its_candidate_gain_needs_the_student_only(tiny):
    _, tok = tiny
    turns, matches = _routed(tok)
    calls, scorer = _recording(lambda calls: -0.25)
    lp, stats = _signal(turns, matches, "smrc", tok, TeacherConfig(oracle=0.5, candidate_gain="on"), scorer)
    assert lp[2] is None and stats["sd/distilled_turns"] == 2 and stats["sd/teacher_tokens"] == 0
    for i in (0, 1):  # each turn's own sampled tokens against its candidate's tokens
        c = teacher.candidate_ids(tok, matches[i].candidate)
        assert lp[i] == teacher.oracle_logprobs(turns[i].sample_logprobs, turns[i].response_ids, c, 0.5)
    # candidate gain: one student pass over the admissible candidate only, with the allowed ids its trie gives
    (prompts, responses, allowed), = calls
    c = teacher.candidate_ids(tok, "go to fridge 1")
    assert prompts == [turns[0].prompt_ids] and responses == [c] and stats["sd/candidate_turns"] == 1
    assert allowed == [allowed_per_position(
        action_trie(tok, [envs.action_response(a) for a in turns[0].admissible]), c)]
    s = -0.25 * len(c)  # log π_θ(c); the oracle's log π_T(c) = log(0.5·π_θ(c) + 0.5)
    assert stats["sd/candidate_gain_sum"] == pytest.approx(math.log(0.5 * math.exp(s) + 0.5) - s)


def test_candidate_gain_scores_the_candidate_under_both_prompts_with_one_mask(tiny):
    _, tok = tiny
    turns, matches = _routed(tok)
    calls, scorer = _recording(lambda calls: -1.0 if len(calls) == 3 else -3.0)  # the teacher pass of c: -1
    lp, stats = _signal(turns, matches, "smrc", tok, TeacherConfig(candidate_gain="on"), scorer)
    assert [len(x) for x in calls[0][:2]] == [2, 2]  # the distillation pass: both matched turns
    student, cand_teacher = calls[1], calls[2]
    c = teacher.candidate_ids(tok, "go to fridge 1")
    # ordinary vs teacher prompt
    assert student[0] == [turns[0].prompt_ids] and cand_teacher[0] == [calls[0][0][0]]
    assert student[1] == cand_teacher[1] == [c] and student[2] == cand_teacher[2]
    assert stats["sd/candidate_gain_sum"] == pytest.approx(2.0 * len(c)) and stats["sd/candidate_turns"] == 1
    _, off = _signal(turns, matches, "smrc", tok, TeacherConfig(candidate_gain="off"), scorer)
    assert "sd/candidate_turns" not in off


def test_teacher_message_puts_the_prompt_between_the_static_and_the_state_blocks():
    """router.teacher_context: trajectory, then the student's prompt,
    then the state's blocks and the closing line."""
    import router
    ref = router.Trajectory("t", "r", [router.Step((("task", "t"),), "", "o1", "go to desk 1")], True, "done")
    match = router.Match(ref, 0, "go to desk 1")
    text = teacher_user_text(router.teacher_context("smrc", ref, match, ref.steps[0].signature), "PROMPT")
    order = [text.index(x) for x in ("[Privileged: a successful trajectory", "PROMPT",
                                     "[Privileged: summary", "<action>go to desk 1</action>",
                                     router.CLOSING_TEMPLATE)]
    assert order == sorted(order)


def test_candidate_split_and_its_logged_diagnostics_on_a_hand_built_batch():
    """Three distilled turns with a candidate (two sampled it, one did not) and one without a reference: the
    counts candidate_share adds, and the per-turn numbers log_step derives from them (scale/monitor.py)."""
    from records import Match, Trajectory
    from scale.monitor import _sd_text, sd_diagnostics
    ref = Trajectory("t", "ref", [], True)

    def distilled(action, candidate, sample, teach):
        return turn("t", "x", 0, Step((), "", "", action), sample_logprobs=sample, teacher_logprobs=teach,
                    match=Match(ref if candidate else None, 0 if candidate else -1, candidate))
    turns = [distilled("go to desk 1", "go to desk 1", [-1.0, 0.0], [-0.5, 0.0]),     # on: gap +0.5
             distilled("Open Drawer 2 ", "open drawer 2", [-2.0], [-1.0]),           # on (case, spaces): +1.0
             distilled("go to bed 1", "go to desk 1", [-0.5, -0.5, 0.0], [-4.0, -3.0, 0.0]),  # off: -6.0
             distilled("look", "", [-1.0], [-1.5])]                                   # no candidate: -0.5
    split = candidate_share.counts(turns)
    assert split == {"sd/candidate_routed_turns": 3, "sd/candidate_sampled_turns": 2,
                     "sd/gap_on_candidate_sum": 1.5, "sd/gap_off_candidate_sum": -6.0}
    gap_sum = 0.5 + 1.0 - 6.0 - 0.5
    sd = {"sd/distilled_turns": 4, "sd/distilled_tokens": 7, "sd/gap_sum": gap_sum, **split}
    half = {k: v / 2 if isinstance(v, float) else v for k, v in sd.items()}  # two ranks, same counts
    for everyone in ([{"sd": sd}], [{"sd": half}, {"sd": half}]):
        m = sd_diagnostics(everyone)
        n = len(everyone)
        assert m["sd/kl_per_turn"] == pytest.approx(-gap_sum / 4 * (1 if n == 1 else 0.5))
        assert m["sd/kl_student_teacher"] == pytest.approx(-gap_sum / 7 * (1 if n == 1 else 0.5))
        assert m["sd/candidate_sampled_share"] == pytest.approx(2 / 3)
        assert (m["sd/candidate_routed_turns"], m["sd/candidate_sampled_turns"]) == (3 * n, 2 * n)  # logged
        assert m["sd/gap_on_candidate"] == pytest.approx(0.75 * (1 if n == 1 else 0.5))
        assert m["sd/gap_off_candidate"] == pytest.approx(-6.0 * (1 if n == 1 else 0.5))
    none = sd_diagnostics([{"sd": {"sd/distilled_turns": 0, "sd/distilled_tokens": 0, "sd/gap_sum": 0.0,
                                   **candidate_share.counts([])}}])
    assert all(math.isnan(none[k]) for k in ("sd/kl_per_turn", "sd/candidate_sampled_share",
                                             "sd/gap_on_candidate", "sd/gap_off_candidate"))
    row = {**sd_diagnostics([{"sd": sd}]), "sd/distilled_turns": 4, "sd/teacher_minus_student_logp": -0.7}
    assert _sd_text({**row, "actor/sd_grpo_grad_ratio": math.inf}).endswith("grad sd/grpo –")
    assert _sd_text({**row, "actor/sd_grpo_grad_ratio": 1.1704}).endswith("grad sd/grpo 1.170")
    assert "KL/turn 1.25 | cand share 0.67" in _sd_text(row)
    assert _sd_text({**row, "sd/distilled_turns": 0}) == "no turn distilled"  # GRPO: no SD numbers at all
