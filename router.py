"""State-matched routing for SMRC-SD: reference bank, matchers, state summary, teacher-context text.

What it does (paper "State-matched routing" and "State-contextualized teacher context"):
- `ReferenceBank` holds, per task, successful trajectories (records.Trajectory). Sources: the successful
  rollouts of the current group, a bounded archive of earlier successes, and (flag, off by default) planner
  solutions. A trajectory is never its own reference.
- `route(turns, bank, cfg, rng)` runs the configured matcher (MATCHERS) over a batch of turns and sets, on
  each turn, `turn.match`: a `Match` (reference, position j, candidate action = the reference's action at j)
  or None (GRPO signal only): `structured` (signature equality, SMRC-SD), `observation` (equality of the
  generic signature, envs.observation_signature: any environment, no hand-written fields), `history` (the
  prompt's view: the last h (observation, action) pairs and the current observation), `history-full` (the
  whole action/observation prefix), `random` (control), `with-reference` (FullPath-SD: every turn of a task
  with a reference), `every-turn` (with or without a reference: the skill-context baselines), `none` (GRPO).
- `teacher_context` builds the privileged text around the student's ordinary prompt; every word of it is in
  the module-level templates below (`skill_text` reads the Skill-SD / SDAR skill files under skills/).

Pure data: no torch, no environment code (records and envs' contract types only). Evaluation prompts never go
through this module.

Choices the paper leaves open (numbered, referenced in the code):
1. Several references for a task are tried in a fixed preference order: current group first (same policy
   snapshot), then the archive, then planner solutions; within a source the shortest first, ties by traj_id. A
   matcher returns the first reference that matches, so a later reference can cover a state the preferred one
   never visited.
2. A reference that passes the same state twice is matched at its LAST occurrence: the suffix from there is
   the shortest successful continuation.
3. The archive keeps, per task, the `archive_size` most recent successes of EARLIER steps (FIFO; a group's
   successes enter it when the next group is added, sorted by traj_id).
4. `seed_with_planner` (off by default) adds the planner's solution of a task as a reference (the paper uses
   only the policy's own successes; this bootstraps tiny models with no successes yet).
5. `with-reference`, `every-turn` and `random` turns are not state-matched, so their position is
   index-aligned: j = min(turn index, len(reference) - 1).
6. The teacher text is ours (the paper publishes none). Nothing is truncated here: teacher.py enforces the
   length budget.
7. The windowed `history` matcher keys on what the prompt shows of the past (the last h pairs and the current
   observation, without the step counter), so it can disagree with `structured` in both directions;
   `history-full` cannot in a deterministic environment, since the whole prefix fixes the state.
8. `references = first` restricts every matcher to the one reference FullPath-SD shows (the first in choice
   1's order), so SMRC-SD's routing is compared with FullPath-SD at equal reference access.
"""
from __future__ import annotations

import functools
import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Literal

from envs import Signature
from records import WITHOUT_REFERENCE, Match, Step, Trajectory, Turn


@dataclass
class RouterConfig:
    matcher: Literal["structured", "observation", "history", "history-full", "random", "with-reference",
                     "every-turn", "none"] | None = None
    """turns to distil: structured (SMRC-SD: the environment's signature), observation (the generic signature
    of envs.observation_signature, for any environment), history (last h pairs + observation), history-full
    (same prefix), random (control), with-reference (FullPath-SD: every turn of a task with a reference),
    every-turn (reference or not), none; None = set by --algo"""
    context: Literal["trajectory", "summary", "candidate", "smrc", "skill", "none"] | None = None
    """teacher context: trajectory (FullPath-SD), summary (+state), candidate (+candidate action), smrc
    (trajectory + state + candidate: SMRC-SD), skill (skill files), none (control: exactly the student's
    prompt, so Δ = 0); None = set by --algo"""
    history_window: int | None = None
    """h of the `history` matcher: (observation, action) pairs compared; None = the env's prompt
    history_length"""
    references: Literal["all", "first"] = "all"
    """references a matcher may use per task: all (in preference order) or first (the one FullPath-SD
    shows)"""
    archive_size: int = 4
    """earlier successful trajectories kept per task: the most recent ones, the oldest dropped first (0 =
    none: the references are this step's successes only, the paper's setting, which mentions no archive)"""
    seed_with_planner: bool = False
    """also use the planner's solution of each task as a reference (not in the paper; for bootstrapping)"""


# ----------------------------------------------------------------------------------------------------------
# Reference bank

_SOURCE_RANK = {"group": 0, "archive": 1, "planner": 2}  # choice 1


class ReferenceBank:
    """Per task: the current group's successes, an archive of earlier successes, planner solutions."""

    def __init__(self, archive_size: int):
        assert archive_size >= 0, archive_size
        self.archive_size = archive_size
        self.group: dict[str, list[Trajectory]] = {}  # this step's successes
        self.archive: dict[str, list[Trajectory]] = {}  # earlier steps' successes, oldest first
        self.planner: dict[str, Trajectory] = {}  # one planner solution per task

    def add_group(self, trajectories: list[Trajectory]) -> None:
        """Start a new step: the previous group's successes enter the archive, this step's become the
        group."""
        for task_id in sorted(self.group):
            kept = self.archive.setdefault(task_id, []) + self.group[task_id]
            self.archive[task_id] = kept[max(0, len(kept) - self.archive_size):]  # choice 3: FIFO
        self.archive = {t: refs for t, refs in self.archive.items() if refs}
        self.group = {}
        for traj in sorted((t for t in trajectories if t.success), key=lambda t: t.traj_id):
            self.group.setdefault(traj.task_id, []).append(traj)

    def add_planner(self, traj: Trajectory) -> None:
        """Choice 4: the planner's solution of a task (replaces an earlier one of the same task)."""
        assert traj.success, f"planner trajectory {traj.traj_id} is not a success"
        self.planner[traj.task_id] = traj

    def references(self, task_id: str, exclude_traj_id: str) -> list[Trajectory]:
        """The task's references in preference order (choice 1), never the student's own trajectory."""
        sourced = [("group", t) for t in self.group.get(task_id, [])]
        sourced += [("archive", t) for t in self.archive.get(task_id, [])]
        sourced += [("planner", self.planner[task_id])] if task_id in self.planner else []
        sourced.sort(key=lambda st: (_SOURCE_RANK[st[0]], len(st[1].steps), st[1].traj_id))
        return [t for _, t in sourced if t.traj_id != exclude_traj_id]

    def source(self, traj: Trajectory | None) -> str:
        """Where a reference comes from: group, archive, planner (none for no reference)."""
        if traj is None:
            return "none"
        if any(t is traj for t in self.group.get(traj.task_id, [])):
            return "group"
        return "planner" if self.planner.get(traj.task_id) is traj else "archive"

    def metrics(self) -> dict[str, float]:
        tasks = set(self.group) | set(self.archive) | set(self.planner)
        return {
            "router/bank_tasks": float(len(tasks)),
            "router/bank_group_refs": float(sum(len(v) for v in self.group.values())),
            "router/bank_archive_refs": float(sum(len(v) for v in self.archive.values())),
            "router/bank_planner_refs": float(len(self.planner)),
        }

    def state_dict(self) -> dict:
        """JSON-able snapshot; `load_state_dict` of it restores the bank exactly (for checkpoint/resume)."""
        return {
            "archive_size": self.archive_size,
            "group": {k: [asdict(t) for t in v] for k, v in sorted(self.group.items())},
            "archive": {k: [asdict(t) for t in v] for k, v in sorted(self.archive.items())},
            "planner": {k: asdict(t) for k, t in sorted(self.planner.items())},
        }

    def load_state_dict(self, state: dict) -> None:
        self.archive_size = state["archive_size"]
        self.group = {k: [_trajectory_from_json(t) for t in v] for k, v in state["group"].items()}
        self.archive = {k: [_trajectory_from_json(t) for t in v] for k, v in state["archive"].items()}
        self.planner = {k: _trajectory_from_json(t) for k, t in state["planner"].items()}


def as_signature(x):
    """JSON turns tuples into lists; signatures must come back as (hashable) tuples."""
    return tuple(as_signature(v) for v in x) if isinstance(x, (list, tuple)) else x


def _trajectory_from_json(d: dict) -> Trajectory:
    steps = [Step(as_signature(s["signature"]), s["history_key"], s["observation"], s["action"],
                  s.get("observation_key", "")) for s in d["steps"]]
    return Trajectory(d["task_id"], d["traj_id"], steps, d["success"], d["final_observation"])


# ----------------------------------------------------------------------------------------------------------
# Matchers: (turns, their references in preference order, config, rng) -> one Match or None per turn

def _usable(turn: Turn, refs: list[Trajectory]) -> list[Trajectory]:
    # Guard here too, not only in the bank: a self-reference would distil the student towards itself.
    return [r for r in refs if r.traj_id != turn.traj_id and r.task_id == turn.task_id and r.steps]


# What a state matcher compares at position j of a path (a reference's steps, or a student's {index: step})
Key = Callable[[Sequence[Step] | Mapping[int, Step], int], Hashable]


def signature_at(steps, j: int) -> Hashable:
    return steps[j].signature


def observation_at(steps, j: int) -> Hashable:
    return steps[j].observation_key or None  # None: no key (a bank entry from before it), never matched


def prefix_at(steps, j: int) -> Hashable:
    return steps[j].history_key


def window_at(steps, j: int, h: int) -> tuple:
    """What the prompt at position j shows of the past: the last h (observation, action) pairs and the current
    observation (choice 7)."""
    past = tuple((steps[i].observation, steps[i].action) for i in range(max(0, j - h), j))
    return past, steps[j].observation


def match_state(turns: list[Turn], refs: list[list[Trajectory]], key: Key) -> list[Match | None]:
    """Per turn, the first of its references holding the turn's `key` value at some position j, at the last
    such j (choices 1 and 2). The student's own path is read from the turns of its trajectory in the batch;
    each reference's positions are indexed once ({key: last position})."""
    paths: dict[str, dict[int, Step]] = {}
    for t in turns:
        paths.setdefault(t.traj_id, {})[t.index] = t.step
    index: dict[int, dict] = {}  # id(reference) -> {key value: last position}; references outlive this call
    out = []
    for turn, rs in zip(turns, refs):
        match, value = None, key(paths[turn.traj_id], turn.index)
        for ref in _usable(turn, rs) if value is not None else []:  # a state without a key matches nothing
            if id(ref) not in index:
                index[id(ref)] = {key(ref.steps, j): j for j in range(len(ref.steps))}  # later positions win
            j = index[id(ref)].get(value)
            if j is not None:
                match = Match(ref, j, ref.steps[j].action)
                break
        out.append(match)
    return out


def match_structured(turn: Turn, refs: list[Trajectory]) -> Match | None:
    """SMRC-SD on one turn: the student's state signature equals the reference's signature at position j."""
    return match_state([turn], [refs], signature_at)[0]


def match_by_index(turn: Turn, refs: list[Trajectory]) -> Match | None:
    """FullPath-SD: every turn of a task with a reference, index-aligned (choice 5)."""
    usable = _usable(turn, refs)
    if not usable:
        return None
    ref = usable[0]
    j = min(turn.index, len(ref.steps) - 1)
    return Match(ref, j, ref.steps[j].action)


def _random(turns: list[Turn], refs: list[list[Trajectory]], cfg: RouterConfig, rng: random.Random) -> list:
    """The paper's control: exactly as many turns as `structured` selects on this batch, drawn uniformly
    (rng.sample) among the turns whose task has a reference, each given `match_by_index`'s match."""
    n_structured = sum(m is not None for m in match_state(turns, refs, signature_at))
    eligible = [i for i, t in enumerate(turns) if _usable(t, refs[i])]
    chosen = set(rng.sample(eligible, n_structured))  # n_structured <= len(eligible): a match needs a ref
    return [match_by_index(t, r) if i in chosen else None for i, (t, r) in enumerate(zip(turns, refs))]


MATCHERS: dict[str, Callable[[list[Turn], list[list[Trajectory]], RouterConfig, random.Random], list]] = {
    "structured": lambda turns, refs, cfg, rng: match_state(turns, refs, signature_at),
    "history": lambda turns, refs, cfg, rng: match_state(
        turns, refs, functools.partial(window_at, h=cfg.history_window)),
    "history-full": lambda turns, refs, cfg, rng: match_state(turns, refs, prefix_at),
    "observation": lambda turns, refs, cfg, rng: match_state(turns, refs, observation_at),
    "random": _random,
    "with-reference": lambda turns, refs, cfg, rng: [match_by_index(t, r) for t, r in zip(turns, refs)],
    "every-turn": lambda turns, refs, cfg, rng: [match_by_index(t, r) or WITHOUT_REFERENCE
                                                 for t, r in zip(turns, refs)],
    "none": lambda turns, refs, cfg, rng: [None] * len(turns),
}


def _references(turns: list[Turn], bank: ReferenceBank, first_only: bool = False) -> list[list[Trajectory]]:
    """bank.references of every turn, sorted once per task (the order does not depend on the excluded
    trajectory); `first_only`: the first reference alone (choice 8)."""
    by_task = {t.task_id: bank.references(t.task_id, exclude_traj_id="") for t in turns}
    refs = [[r for r in by_task[t.task_id] if r.traj_id != t.traj_id] for t in turns]
    return [r[:1] for r in refs] if first_only else refs


def matches(turns: list[Turn], bank: ReferenceBank, cfg: RouterConfig,
            rng: random.Random) -> list[Match | None]:
    """One Match or None per turn, in the order given, by the matcher `cfg.matcher` (a resolved name:
    config.resolve). rng is used only by `random`; seed it per step for an exact resume. `history` reads a
    turn's earlier steps from the turns of its trajectory in this batch (every turn of an episode is in
    it)."""
    return MATCHERS[cfg.matcher](turns, _references(turns, bank, cfg.references == "first"), cfg, rng)


def route(turns: list[Turn], bank: ReferenceBank, cfg: RouterConfig, rng: random.Random) -> None:
    """The router's stage of a training step: sets `turn.match` on every turn (`matches`)."""
    for turn, match in zip(turns, matches(turns, bank, cfg, rng)):
        turn.match = match


AUDITED = ("structured", "history", "observation")  # the matchers the archive keeps for `evaluate.py audit`


def audited_matches(turns: list[Turn], bank: ReferenceBank, cfg: RouterConfig) -> dict[str, list]:
    """Each audited matcher's matches of `turns` on the same bank (the step's own `turn.match` where the run
    routes with it: the same deterministic function), for the rollout archive
    (scale/run_logs.archive_rows); also each turn's references, for the archive's nearest state."""
    return {**{name: [t.match for t in turns] if cfg.matcher == name else
               matches(turns, bank, replace(cfg, matcher=name), random.Random(0)) for name in AUDITED},
            "references": _references(turns, bank, cfg.references == "first")}


def route_metrics(turns: list[Turn], bank: ReferenceBank) -> dict[str, float]:
    """Matched turns (turn.match), turns with a reference, and the matched turns by the source of their
    reference (group, archive, planner; `none` for matcher `every-turn` without one): the coverage each source
    gives."""
    with_ref = sum(bool(_usable(t, r)) for t, r in zip(turns, _references(turns, bank)))
    by_source = dict.fromkeys(("group", "archive", "planner", "none"), 0.0)
    for t in (t for t in turns if t.match is not None):
        by_source[bank.source(t.match.ref)] += 1
    return {"router/matched_turns": float(sum(t.match is not None for t in turns)),
            "router/turns_with_reference": float(with_ref),
            **{f"router/matched_turns/{k}": v for k, v in by_source.items()}}


# ----------------------------------------------------------------------------------------------------------
# State summary: natural language from the signature fields (environments/alfworld.py and webshop.py)

def _items(values: tuple) -> str:
    return ", ".join(_plain(v) for v in values)


def _plain(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return "(" + _items(value) + ")"
    return str(value)


def _location(v: tuple) -> str:
    if v == ("middle of the room",):
        return "You are in the middle of the room."
    return f"You are at {' and '.join(map(str, v))}."


def _page(v: str) -> str:
    if v.startswith("sub:"):
        return f"You are on the '{v[4:]}' section of an item page."
    return f"You are on the {v} page."


_FIELD_TEXT: dict[str, Callable[[object], str]] = {
    "task": lambda v: f"Task: {v}.",
    # ALFWorld
    "location": _location,
    "holding": lambda v: f"You are holding {_items(v)}." if v else "You are holding nothing.",
    "opened": lambda v: f"Open receptacles: {_items(v)}." if v else "No receptacle is open.",
    "placed": lambda v: ("Task objects placed: " + ", ".join(f"{o} in/on {r}" for o, r in v) + ".")
    if v else "No task object is placed yet.",
    "states": lambda v: ("Task object states: " + ", ".join(f"{o} is {f}" for o, f in v) + ".")
    if v else "No task object is cleaned, heated, cooled or turned on yet.",
    "progress": lambda v: f"Goal conditions already satisfied: {_items(v)}." if v
    else "No goal condition is satisfied yet.",
    # WebShop
    "page": _page,
    "keywords": lambda v: f"Search keywords: {_items(v)}." if v else "No search made yet.",
    "results_page": lambda v: f"Results page number: {v}." if v is not None else "No results page open.",
    "item": lambda v: f"Item opened: {v}." if v is not None else "No item opened.",
    "options": lambda v: ("Options selected: " + ", ".join(f"{n} = {x}" for n, x in v) + ".")
    if v else "No options selected.",
}


def state_summary(signature: Signature) -> str:
    """One line per signature field, in signature order; unknown fields rendered generically, never
    dropped."""
    return "\n".join(_FIELD_TEXT[name](value) if name in _FIELD_TEXT else f"{name}: {_plain(value)}"
                     for name, value in signature)


# ----------------------------------------------------------------------------------------------------------
# Teacher context: every word the teacher sees beyond the student's prompt is in these templates.

STEP_TEMPLATE = "Observation {k}: {observation}\nAction {k}: {action}"
TRAJECTORY_TEMPLATE = (
    "[Privileged: a successful trajectory for this same task]\n"
    "{steps}\n"
    "Final observation: {final_observation}\n"
    "Outcome: the task was completed successfully."
)
SUMMARY_TEMPLATE = "[Privileged: summary of your current state]\n{summary}"
# the candidate spelled as the response spells it, so copying it reuses the response's tokens
CANDIDATE_TEMPLATE = ("[Privileged: candidate next action]\n"
                      "The successful trajectory's action at its step {k}: <action>{candidate}</action>")
SKILL_TEMPLATE = "[Privileged: skills for this kind of task]\n{skills}"
CLOSING_TEMPLATE = "Use this information to choose the best next action for the current situation above."
CONTEXT_BLOCKS = {  # which blocks each ablation variant shows, in this order, joined by a blank line
    "trajectory": ("trajectory",),
    "summary": ("trajectory", "summary"),
    "candidate": ("trajectory", "candidate"),
    "smrc": ("trajectory", "summary", "candidate"),
    "skill": ("skills",),
    "none": (),  # the null-context control: the teacher sees exactly the student's prompt (no closing line)
}
SKILLS_DIR = Path(__file__).resolve().parent / "skills"  # <env>/general.md and <env>/<task_type>.md


@functools.cache
def skill_text(env: str, task_type: str) -> str:
    """The skill text of a task: the environment's general skills, then its task type's (one file each)."""
    files = [SKILLS_DIR / env / "general.md", SKILLS_DIR / env / f"{task_type}.md"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"no skill file {missing} for env {env!r}, task type {task_type!r}")
    return "\n\n".join(f.read_text().strip() for f in files)


def context_blocks(variant: str) -> tuple[str, ...]:
    """The blocks a teacher-context variant shows (a resolved name: config.resolve)."""
    return CONTEXT_BLOCKS[variant]


@dataclass(frozen=True)
class TeacherContext:
    """The privileged text of a teacher prompt, around the student's ordinary prompt: the static blocks
    (trajectory, skills) before it; the state's own blocks (summary, candidate) and the closing line after
    it, nearest to the response."""
    before: tuple[str, ...]
    after: tuple[str, ...]

    def around(self, user_text: str) -> str:
        """The teacher's user message: the blocks and the student's prompt, joined by a blank line."""
        return "\n\n".join((*self.before, user_text, *self.after))


def render_trajectory(ref: Trajectory) -> str:
    steps = "\n".join(STEP_TEMPLATE.format(k=k + 1, observation=s.observation, action=s.action)
                      for k, s in enumerate(ref.steps))
    return TRAJECTORY_TEMPLATE.format(steps=steps, final_observation=ref.final_observation)


def teacher_context(variant: str, ref: Trajectory | None, match: Match | None, signature: Signature,
                    skills: str = "") -> TeacherContext:
    """The privileged text around the student's prompt (TeacherContext): the static blocks (trajectory,
    skills) before it; the state's own blocks (summary, candidate) and the closing line after it, nearest to
    the response.

    `signature` is the student's own current state (what the summary describes); `match` is required by the
    variants that show the candidate action, `ref` by those that show the trajectory, `skills` (skill_text) by
    skill.
    """
    if variant == "none":
        return TeacherContext((), ())
    blocks = []
    for block in context_blocks(variant):
        if block == "skills":
            assert skills, f"context {variant!r} needs the skill text"
            blocks.append(SKILL_TEMPLATE.format(skills=skills))
        elif block == "trajectory":
            assert ref is not None, f"context {variant!r} needs a reference trajectory"
            blocks.append(render_trajectory(ref))
        elif block == "summary":
            blocks.append(SUMMARY_TEMPLATE.format(summary=state_summary(signature)))
        else:
            assert match is not None and match.ref is ref, f"context {variant!r} needs the match on this ref"
            blocks.append(CANDIDATE_TEMPLATE.format(k=match.position + 1, candidate=match.candidate))
    static = sum(b in ("trajectory", "skills") for b in context_blocks(variant))  # first in every variant
    return TeacherContext(tuple(blocks[:static]), (*blocks[static:], CLOSING_TEMPLATE))
