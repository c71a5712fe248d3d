"""The self-distillation teacher: the policy's own weights re-score the student's sampled tokens under a privileged
prompt, for the turns the router matched.

For a distilled turn the teacher prompt is the chat template over one user message
    teacher_context + "\\n\\n" + the student's ordinary user message,
so the privileged block sits inside the conversation (SDAR instead pastes it before `<|im_start|>`). The student's
response token ids are appended unchanged and scored in one prefill, with the weights that sampled the rollout
(scoring happens before the update).

`teacher_signal` builds the requests from the router's matches and scores them through `score`, the one function
both backends go through: it applies the length budget and counts the stats; the backend only turns (prompt ids,
response ids) pairs into log-probs:
- hf (`hf_scorer`): a transformers forward on the policy module under `torch.no_grad()`, packed by length.
  Alignment: `models.collate` puts every response at the same column P after a left-padded prefix, so the log-prob of
  the first response token comes from the last teacher-prefix position whatever the prefix length (the off-by-one
  trap of verl's on-policy distillation recipe; tested against a hand-sliced forward).
- vllm (`vllm_scorer`): prompt log-probs on the (synced) vLLM rollout engine (`VLLMEngine.score_logprobs`).

Length budget: a teacher prompt longer than `max_prompt_tokens` is never truncated (SDAR left-truncates silently).
That turn falls back to GRPO only and is counted (`sd/over_length_turns`).
"""

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Literal

import torch

import router
from models import chat_ids, collate, micro_batches, token_logprobs

# (prompts, responses, allowed ids per response position or None) -> log-probs
Scorer = Callable[[list[list[int]], list[list[int]], list | None], list[list[float]]]


@dataclass
class TeacherConfig:
    backend: Literal["hf", "vllm"] = "hf"
    """hf: a transformers forward on the policy module; vllm: prompt_logprobs on the (synced) vLLM rollout engine"""
    max_prompt_tokens: int = 8192
    """teacher prompt budget (context + student prompt); longer prompts route the turn to GRPO, never truncate"""
    micro_batch_tokens: int = 16384
    """padded tokens per teacher forward"""


@dataclass
class TeacherRequest:
    user_text: str          # the student's ordinary user message for this turn
    context: str            # the privileged block from router.teacher_context
    response_ids: list[int]  # the student's sampled tokens
    allowed: list[list[int]] | None = None  # restricted decoding: the allowed ids per response position (same mask)


def teacher_user_text(context: str, user_text: str) -> str:
    """The teacher's user message: the privileged block, a blank line, the student's ordinary message."""
    return context + "\n\n" + user_text


def teacher_prompt_ids(tokenizer, req: TeacherRequest) -> list[int]:
    return chat_ids(tokenizer, teacher_user_text(req.context, req.user_text))


def hf_scorer(model, pad_id: int, micro_batch_tokens: int, temperature: float = 1.0, bf16: bool = True) -> Scorer:
    """Log-probs of each response after its prompt from a transformers forward (no autograd, eval mode), in the
    update's precision: bf16 autocast on CUDA when `bf16` (GRPOConfig.bf16), so the teacher−student gap carries no
    precision difference; float32 on CPU."""
    @torch.no_grad()
    def scorer(prompts: list[list[int]], responses: list[list[int]], allowed=None) -> list[list[float]]:
        out: list[list[float]] = [[] for _ in prompts]
        device = next(model.parameters()).device
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and device.type == "cuda" else nullcontext()
        was_training = model.training
        model.eval()
        for idx in micro_batches([len(p) + len(r) for p, r in zip(prompts, responses)], micro_batch_tokens):
            batch = collate([prompts[i] for i in idx], [responses[i] for i in idx], pad_id).to(device)
            rows = [allowed[i] for i in idx] if allowed is not None else None
            with autocast:
                logp, _ = token_logprobs(model, batch, temperature, allowed=rows)  # (B, R)
            for row, i in enumerate(idx):
                out[i] = logp[row, :len(responses[i])].float().cpu().tolist()
        model.train(was_training)
        return out
    return scorer


def vllm_scorer(engine, temperature: float = 1.0) -> Scorer:
    """Log-probs of each response after its prompt from vLLM's prompt log-probs (one prefill per pair)."""
    def scorer(prompts: list[list[int]], responses: list[list[int]], allowed=None) -> list[list[float]]:
        assert allowed is None, "restricted decoding runs on the hf engine and teacher only"
        return engine.score_logprobs(prompts, responses, temperature)
    return scorer


def score(tokenizer, requests: list[TeacherRequest], cfg: TeacherConfig, scorer: Scorer):
    """Teacher log-probs of each request's response tokens (None for over-length prompts) and stats."""
    t0 = time.perf_counter()
    prompts = [teacher_prompt_ids(tokenizer, r) for r in requests]
    ok = [i for i, p in enumerate(prompts) if len(p) <= cfg.max_prompt_tokens]
    out: list[list[float] | None] = [None] * len(requests)
    if ok:
        restricted = [requests[i].allowed for i in ok] if any(r.allowed is not None for r in requests) else None
        for i, lp in zip(ok, scorer([prompts[i] for i in ok], [requests[i].response_ids for i in ok], restricted)):
            out[i] = lp
    stats = {"sd/over_length_turns": len(requests) - len(ok),
             "sd/teacher_tokens": sum(len(prompts[i]) + len(requests[i].response_ids) for i in ok),
             "sd/teacher_time_s": time.perf_counter() - t0}
    return out, stats


def teacher_signal(turns: list, matches: list, context: str, tokenizer, cfg: TeacherConfig, scorer: Scorer):
    """Teacher log-probs for matched turns (None elsewhere and for over-length prompts) and summable sd/ counts.
    `turns` are rollout.Turns (user_text, signature, response_ids, sample_logprobs), `context` the variant."""
    picked = [i for i, m in enumerate(matches) if m is not None]
    with_skills = "skills" in router.CONTEXT_BLOCKS[context]  # skill text: by the turn's env and task type
    requests = [TeacherRequest(turns[i].user_text,
                               router.teacher_context(context, matches[i].ref, matches[i], turns[i].signature,
                                                      router.skill_text(turns[i].task.env, turns[i].task.task_type)
                                                      if with_skills else ""),
                               turns[i].response_ids, turns[i].allowed) for i in picked]
    scored, stats = score(tokenizer, requests, cfg, scorer)
    teacher_lp: list[list[float] | None] = [None] * len(turns)
    gap_sum = 0.0
    for i, lp in zip(picked, scored):
        teacher_lp[i] = lp
        if lp is not None:
            gap_sum += sum(a - b for a, b in zip(lp, turns[i].sample_logprobs))
    distilled = [i for i in picked if teacher_lp[i] is not None]
    stats.update({"sd/distilled_turns": len(distilled), "sd/gap_sum": gap_sum,
                  "sd/distilled_tokens": sum(len(turns[i].response_ids) for i in distilled)})
    return teacher_lp, stats
