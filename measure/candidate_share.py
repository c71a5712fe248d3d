"""The oracle control's reading (measurement only: nothing here enters the loss): on the distilled turns whose
match has a candidate action, how many sampled the candidate itself, and the turn gap Σ_t log π_T(y_t) −
log π_θ(y_t) summed apart over those turns and the others. A teacher sharp on the candidate pulls the first
kind up a little and pushes the second kind down hard; the oracle teacher (--teacher.oracle α) is exactly
that, so these counts are what its runs are read by (scale/monitor.sd_diagnostics: sd/candidate_sampled_share,
sd/gap_on_candidate, sd/gap_off_candidate).

A leaf: the turns (records.Turn) are duck-typed. step_readings.py calls `counts` once a step, after the
teacher; candidate_gain.py reads the same turns (`with_candidate`).
"""


def with_candidate(turns: list) -> list:
    """The distilled turns (a match, teacher log-probs) whose match has a candidate."""
    return [t for t in turns if t.match is not None and t.teacher_logprobs is not None
            and t.match.ref is not None]


def counts(turns: list) -> dict:
    """Summable counts over the distilled turns whose match has a candidate (`with_candidate`)."""
    routed = with_candidate(turns)
    on = [t.step.action.strip().lower() == t.match.candidate.strip().lower() for t in routed]
    gaps = [sum(a - b for a, b in zip(t.teacher_logprobs, t.sample_logprobs)) for t in routed]
    return {"sd/candidate_routed_turns": len(routed), "sd/candidate_sampled_turns": sum(on),
            "sd/gap_on_candidate_sum": sum(g for g, o in zip(gaps, on) if o),
            "sd/gap_off_candidate_sum": sum(g for g, o in zip(gaps, on) if not o)}
