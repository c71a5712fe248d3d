"""Why a turn was not matched: the nearest reference state and the signature fields that differ.

A leaf module (it imports nothing from the project): the rollout archive (scale/run_logs.archive_rows) calls
`nearest_state` on every turn the router left unmatched, with the references the router had for it
(router.audited_matches' `references`: the bank's, in the router's preference order), and `evaluate.py view`
shows the answer. The distance is the number of signature fields (envs.Signature: (name, value) pairs) whose
values differ, a field present on one side only counting as differing. Ties go to the earlier reference in the
router's order and, within one, to the later position (router choices 1 and 2).
"""


def differing_fields(a, b) -> list[str]:
    """The names of the fields whose values differ between signatures `a` and `b`, in a's order then b's."""
    da, db = dict(a), dict(b)
    return [k for k in [*da, *(k for k in db if k not in da)] if da.get(k, _MISSING) != db.get(k, _MISSING)]


_MISSING = object()


def nearest_state(signature, refs) -> dict:
    """The reference position nearest to `signature` among `refs` (records.Trajectory, preference order):
    {"ref": traj_id, "position": j, "differ": [field names], "ref_signature": its signature there}, or
    {"ref": None, ...} when no reference has a step (the task has no successful trajectory in the bank)."""
    best = None
    for ref in refs:
        for j, step in enumerate(ref.steps):
            differ = differing_fields(signature, step.signature)
            if best is None or len(differ) < len(best[2]) or (len(differ) == len(best[2]) and ref is best[0]):
                best = (ref, j, differ)
    if best is None:
        return {"ref": None, "position": None, "differ": [], "ref_signature": None}
    ref, j, differ = best
    return {"ref": ref.traj_id, "position": j, "differ": differ, "ref_signature": ref.steps[j].signature}
