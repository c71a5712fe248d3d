"""The self-distillation teacher: the policy's own weights re-score the student's sampled tokens under a
privileged prompt, for the turns the router matched.

For a distilled turn the teacher prompt is the chat template over one user message,
    [trajectory or skills]  the student's ordinary user message  [state summary]  [candidate]  closing line
(router.teacher_context; blocks joined by a blank line), so the privileged text sits inside the conversation
(SDAR instead pastes it before `<|im_start|>`). The state's own blocks come after the prompt, nearest to the
response: the candidate is then the most recent copy of the action before the response. The student's response
token ids are appended unchanged and scored in one prefill, with the weights that sampled the rollout (scoring
happens before the update).

`teacher_signal` builds the teacher prompts of the turns the router matched (turn.match) and scores them
through `score_turns`, the one function both backends go through: it applies the length budget and counts the
stats; the backend only turns (prompt ids, response ids) pairs into log-probs:
- hf (`hf_logprob_fn`): a transformers forward on the policy module under `torch.no_grad()`, packed by length.
  Alignment: `models.collate` puts every response at the same column P after a left-padded prefix, so the
  log-prob of the first response token comes from the last teacher-prefix position whatever the prefix length
  (the off-by-one trap of verl's on-policy distillation recipe; tested against a hand-sliced forward).
- vllm (`vllm_logprob_fn`): prompt log-probs on the (synced) vLLM rollout engine
  (`VLLMEngine.score_logprobs`). Its numbers differ from the trainer's (bf16 weights, other kernels), so the
  student's own prompt is scored there too (`base_logprobs`) and Δ is composed from differences taken within
  one engine (grpo.py); sd/gap_sum is then log π_T − log π_old on vLLM's path.
- Null context (`--router.context none`): the teacher prompt is the student's own prompt ids, so Δ must be 0
  on every token (tests/test_sd_delta.py).

Length budget: a teacher prompt longer than `max_prompt_tokens` is never truncated (SDAR left-truncates
silently). That turn falls back to GRPO only and is counted (`sd/over_length_turns`).

Oracle-teacher control (`--teacher.oracle α`, α in (0, 1]): no teacher forward; the teacher is the
sequence-level mixture p_T = (1−α)·π_s + α·δ_c, c = the matched candidate's response tokens (`candidate_ids`:
what restricted decoding samples for that action). On the student's tokens y (`oracle_logprobs`, in log
space):
    p_T(y_t | y_<t) = [(1−α)·π_s(y_≤t) + α·1[y_≤t = c_≤t]] / [(1−α)·π_s(y_<t) + α·1[y_<t = c_<t]],
π_s = the turn's sampling log-probs. Once y has left c it is the student's own conditional; at α = 1 the token
where y leaves c has p_T = 0, floored at ORACLE_FLOOR = log 1e-6. Same routing (same over-length rule), same
loss.

What the SD term does around the matched candidate is measured beside the teacher, not in it:
measure/candidate_share.py (how often the student sampled the candidate; the gaps on and off it) and
measure/candidate_gain.py (log π_T(c) − log π_θ(c), two extra scoring passes, off for a large model).
"""

import math
import time
from dataclasses import dataclass
from typing import Callable, Literal

import torch

import envs
import router
from models import chat_ids, micro_batches, score_rows
from records import Turn

# (prompts, responses, allowed ids per response position or None) -> log-probs
LogprobFn = Callable[[list[list[int]], list[list[int]], list | None], list[list[float]]]
ORACLE_FLOOR = math.log(1e-6)  # the oracle's log-prob where it is 0 (α = 1, the token where y leaves c)


@dataclass
class TeacherConfig:
    backend: Literal["auto", "hf", "vllm"] = "auto"
    """hf: a transformers forward on the policy module; vllm: prompt_logprobs on the (synced) vLLM rollout
    engine; auto = hf (measured cheaper per distilled turn: bench/results/teacher_scale), vllm under FSDP with
    a vLLM engine (every FSDP forward is a collective)"""
    max_prompt_tokens: int = 8192
    """teacher prompt budget (context + student prompt); longer prompts route the turn to GRPO, never
    truncate"""
    micro_batch_tokens: int = 16384
    """padded tokens per teacher forward"""
    oracle: float = 0.0
    """oracle-teacher control: α > 0 replaces the model teacher (no forward) by (1−α)·π_student +
    α·δ_candidate on the same routed turns (teacher.py); needs a matcher whose matches carry a candidate (not
    `every`)"""
    candidate_gain: Literal["auto", "on", "off"] = "auto"
    """log sd/candidate_gain (teacher − student log-prob of the matched candidate's response on distilled
    turns): two extra scoring passes over those turns' candidates (one with the oracle); auto = on for a small
    model, where the teacher's cost does not matter (config.resolve_for_model; measure/candidate_gain.py)"""


def teacher_user_text(context: router.TeacherContext, user_text: str) -> str:
    """The teacher's user message: the student's ordinary message inside its context
    (router.teacher_context)."""
    return context.around(user_text)


def teacher_prompt_ids(tokenizer, context: router.TeacherContext, user_text: str) -> list[int]:
    return chat_ids(tokenizer, teacher_user_text(context, user_text))


def hf_logprob_fn(model, pad_id: int, micro_batch_tokens: int, temperature: float = 1.0,
                  bf16: bool = True) -> LogprobFn:
    """Log-probs of each response after its prompt from a transformers forward (no autograd, eval mode), in
    the update's precision: bf16 autocast on CUDA when `bf16` (GRPOConfig.bf16), so the teacher−student gap
    carries no precision difference; float32 on CPU."""
    @torch.no_grad()
    def logprob_fn(prompts: list[list[int]], responses: list[list[int]], allowed=None) -> list[list[float]]:
        was_training = model.training
        model.eval()
        chunks = micro_batches([len(p) + len(r) for p, r in zip(prompts, responses)], micro_batch_tokens)
        out = score_rows(model, prompts, responses, chunks, pad_id, temperature, allowed, bf16)
        model.train(was_training)
        return out
    return logprob_fn


def vllm_logprob_fn(engine, temperature: float = 1.0) -> LogprobFn:
    """Log-probs of each response after its prompt from vLLM's prompt log-probs (one prefill per pair)."""
    def logprob_fn(prompts: list[list[int]], responses: list[list[int]], allowed=None) -> list[list[float]]:
        assert allowed is None, "restricted decoding runs on the hf engine and teacher only"
        return engine.score_logprobs(prompts, responses, temperature)
    return logprob_fn


def candidate_ids(tokenizer, action: str) -> list[int]:
    """The candidate action's response tokens, EOS included: what restricted decoding samples for that
    action."""
    ids = tokenizer(envs.action_response(action), add_special_tokens=False)["input_ids"]
    return ids + [tokenizer.eos_token_id]


def oracle_logprobs(sample_logprobs: list[float], response_ids: list[int], candidate: list[int],
                    alpha: float) -> list[float]:
    """log p_T(y_t | y_<t) of the oracle teacher (1−α)·π_s + α·δ_c on the student's tokens y (module
    docstring)."""
    lp = torch.tensor(sample_logprobs, dtype=torch.float64)                       # (R,) log π_s(y_t | y_<t)
    R = len(response_ids)
    c = torch.tensor((candidate + [-1] * R)[:R])                                  # (R,) c, padded
    same = torch.cumprod((torch.tensor(response_ids) == c).long(), 0).bool()     # (R,) y_≤t = c_≤t
    same_before = torch.cat([torch.ones(1, dtype=torch.bool), same[:-1]])        # (R,) y_<t = c_<t
    S = torch.cumsum(lp, 0)                                                       # (R,) log π_s(y_≤t)
    S_before = torch.cat([torch.zeros(1, dtype=torch.float64), S[:-1]])          # (R,) log π_s(y_<t)
    log_a = math.log(alpha) if alpha > 0 else -math.inf                           # log α
    log_1a = math.log1p(-alpha) if alpha < 1 else -math.inf                       # log(1 − α)
    num = torch.logaddexp(log_1a + S, torch.zeros_like(S).masked_fill(~same, -math.inf) + log_a)
    den = torch.logaddexp(log_1a + S_before, torch.zeros_like(S).masked_fill(~same_before, -math.inf) + log_a)
    out = torch.where(same_before, num - den, lp)                                 # y left c: the student
    out = torch.where(torch.isfinite(out), out, torch.full_like(out, ORACLE_FLOOR))  # α = 1 where y leaves c
    return out.tolist()


def score_turns(prompts: list[list[int]], turns: list[Turn], cfg: TeacherConfig, logprob_fn: LogprobFn,
                candidates: list[list[int]] | None = None):
    """Teacher log-probs of each turn's response tokens after its teacher prompt (None where the prompt is
    over the budget) and stats. With cfg.oracle > 0 nothing is scored: the oracle's log-probs of the turns'
    `candidates`."""
    t0 = time.perf_counter()
    ok = [i for i, p in enumerate(prompts) if len(p) <= cfg.max_prompt_tokens]
    out: list[list[float] | None] = [None] * len(turns)
    if ok and cfg.oracle > 0:
        for i in ok:
            out[i] = oracle_logprobs(turns[i].sample_logprobs, turns[i].response_ids, candidates[i],
                                     cfg.oracle)
    elif ok:
        restricted = [turns[i].allowed for i in ok] if any(t.allowed is not None for t in turns) else None
        scored = logprob_fn([prompts[i] for i in ok], [turns[i].response_ids for i in ok], restricted)
        for i, lp in zip(ok, scored):
            out[i] = lp
    scored = ok if cfg.oracle == 0 else []
    stats = {"sd/over_length_turns": len(turns) - len(ok),
             "sd/teacher_tokens": sum(len(prompts[i]) + len(turns[i].response_ids) for i in scored),
             "sd/teacher_time_s": time.perf_counter() - t0}
    return out, stats


def teacher_signal(turns: list[Turn], context: str, tokenizer, cfg: TeacherConfig,
                   logprob_fn: LogprobFn) -> dict:
    """Sets `teacher_logprobs` on the matched turns (turn.match; None stays elsewhere and on over-length
    prompts) and returns summable sd/ counts. `context` is the teacher-context variant
    (router.CONTEXT_BLOCKS)."""
    picked = [t for t in turns if t.match is not None]
    prompts = teacher_prompts(picked, context, tokenizer)
    candidates = [candidate_ids(tokenizer, t.match.candidate) for t in picked] if cfg.oracle > 0 else None
    scored, stats = score_turns(prompts, picked, cfg, logprob_fn, candidates)
    for t, lp in zip(picked, scored):
        t.teacher_logprobs = lp
    distilled = [t for t in picked if t.teacher_logprobs is not None]
    if cfg.backend == "vllm" and cfg.oracle == 0:  # Δ on one numeric path: the student's prompt on vLLM too
        gap_sum = base_logprobs(distilled, logprob_fn)
    else:
        gap_sum = sum(sum(a - b for a, b in zip(t.teacher_logprobs, t.sample_logprobs)) for t in distilled)
    stats.update({"sd/distilled_turns": len(distilled), "sd/gap_sum": gap_sum,
                  "sd/distilled_tokens": sum(len(t.response_ids) for t in distilled)})
    return stats


def base_logprobs(turns: list[Turn], logprob_fn: LogprobFn) -> float:
    """A teacher on another engine than the trainer (vLLM): log π_old of each scored turn's response under
    the student's own prompt, on that same engine (turn.teacher_base_logprobs; grpo.py composes Δ from it).
    Returns Σ log π_T − log π_old on that one path, the distilled tokens' gap."""
    for t, lp in zip(turns, logprob_fn([t.prompt_ids for t in turns], [t.response_ids for t in turns], None)):
        t.teacher_base_logprobs = lp
    return sum(a - b for t in turns for a, b in zip(t.teacher_logprobs, t.teacher_base_logprobs))


def teacher_prompts(turns: list[Turn], context: str, tokenizer) -> list[list[int]]:
    """The teacher prompt ids of matched turns (turn.match) under the teacher-context variant `context`."""
    if context == "none":  # the null-context control: exactly the student's prompt ids
        return [list(t.prompt_ids) for t in turns]
    with_skills = "skills" in router.context_blocks(context)  # skill text: by the turn's env and task type
    return [teacher_prompt_ids(tokenizer, router.teacher_context(
        context, t.match.ref, t.match, t.step.signature,
        router.skill_text(t.task.env, t.task.task_type) if with_skills else ""), t.user_text) for t in turns]
