"""A training step's readings beside the method (measurement only: nothing here enters the loss). The loop
calls `step_readings` once a step, after the teacher: the candidate's share and gaps (candidate_share.py), the
candidate gain (candidate_gain.py), and the audited matchers' picks for the rollout archive (router.py's own
matchers on the same bank: the audits of evaluate.py read them).
"""
import router
import teacher
from measure import candidate_gain, candidate_share


def step_readings(turns: list, bank: router.ReferenceBank, router_cfg: router.RouterConfig,
                  teacher_cfg: teacher.TeacherConfig, tokenizer, logprob_fn: teacher.LogprobFn,
                  audit: bool) -> tuple[dict, dict]:
    """(summable sd/ counts, {audited matcher: its matches} or {} without `audit`) of the step's turns after
    the teacher has scored them (`logprob_fn`: the teacher's scorer)."""
    audited = router.audited_matches(turns, bank, router_cfg) if audit else {}
    counts = candidate_share.counts(turns)
    counts |= candidate_gain.measure(turns, router_cfg.context, tokenizer, teacher_cfg, logprob_fn)
    return counts, audited
