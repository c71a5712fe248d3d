"""The candidate-gain diagnostic (measurement only: nothing here enters the loss): sd/candidate_gain =
log π_T(c) − log π_θ(c), the matched candidate's response c scored under the teacher prompt and under the
student's ordinary prompt, on the distilled turns. How much more the privileged context makes the teacher
expect the candidate: the part of the signal the candidate block adds.

It costs two extra scoring passes over the distilled turns' candidates (the teacher's is skipped with the
oracle, whose conditionals summed over c give log((1−α)·π_θ(c) + α)), timed apart as sd/candidate_gain_time_s.
`--teacher.candidate-gain auto` keeps it on for a small model (config.resolve_for_model), where the
teacher's cost does not matter; at scale the teacher then makes one pass per distilled turn.
measure/step_readings.py calls `measure` once a step, after the teacher.
"""
import time

import envs
import teacher
from measure.candidate_share import with_candidate
from models import action_trie, allowed_per_position


def measure(turns: list, context: str, tokenizer, cfg: teacher.TeacherConfig,
            logprob_fn: teacher.LogprobFn) -> dict:
    """Summable sd/candidate_gain counts ({} when the diagnostic is off): over the distilled turns whose match
    has a candidate c (under restricted decoding: an admissible one, else it has probability 0), Σ_t
    log π_T(c_t) − log π_θ(c_t) over c's tokens, the teacher on the turn's teacher prompt (`context`), the
    student on its ordinary prompt, both through `logprob_fn` with the allowed ids the turn's trie gives c (as
    rollout builds it)."""
    if cfg.candidate_gain != "on":
        return {}
    t0 = time.perf_counter()
    rows = [t for t in with_candidate(turns) if t.allowed is None or t.match.candidate in t.admissible]
    cands = [teacher.candidate_ids(tokenizer, t.match.candidate) for t in rows]
    allowed = [None if t.allowed is None else allowed_per_position(
        action_trie(tokenizer, [envs.action_response(a) for a in t.admissible]), c)
        for t, c in zip(rows, cands)]
    allowed = allowed if any(a is not None for a in allowed) else None
    student = logprob_fn([t.prompt_ids for t in rows], cands, allowed) if rows else []
    if cfg.oracle > 0:
        scored = [teacher.oracle_logprobs(lp, c, c, cfg.oracle) for lp, c in zip(student, cands)]
    else:
        prompts = teacher.teacher_prompts(rows, context, tokenizer)
        scored = logprob_fn(prompts, cands, allowed) if rows else []
    return {"sd/candidate_gain_sum": sum(sum(t) - sum(s) for t, s in zip(scored, student)),
            "sd/candidate_turns": len(rows), "sd/candidate_gain_time_s": time.perf_counter() - t0}
