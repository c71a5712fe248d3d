"""State-matched routing for SMRC-SD: reference bank, matchers, state summary, teacher-context text.

What it does (paper "State-matched routing" and "State-contextualized teacher context"):
- `ReferenceBank` holds, per task, successful trajectories (per-position state signatures, history keys,
  observations, actions). Sources: the successful rollouts of the current group, a bounded archive of earlier
  successes, and (flag, off by default) planner solutions. A trajectory is never its own reference.
- Matchers decide per student turn whether a reference applies: `structured` (signature equality, SMRC-SD),
  `history` (the prompt's view: the last h (observation, action) pairs and the current observation),
  `history-full` (the whole action/observation prefix), `random` (control), `all` (FullPath-SD), `every`
  (every turn, with or without a reference: the skill-context baselines), `none` (GRPO).
  `route` runs one over a batch of turns and returns a `Match` (reference, position j, candidate action =
  the reference's action at j) or None per turn; None means the turn gets the GRPO signal only.
- `teacher_context` builds the privileged text put before the student's ordinary prompt; the text of every
  variant is in the module-level templates below (fullpath, summary, candidate, full = SMRC-SD, skill = the
  Skill-SD / SDAR skill text, read from the plain-text files under skills/ by `skill_text`).

Pure data: no torch, no transformers, no environment import (the skill files are text). Signatures are the
envs.py contract type, re-declared here as a type alias. Evaluation prompts never go through this module.

Deviations and choices the paper leaves open (numbered, referenced in the code):
1. Several references for a task: they are tried in a fixed preference order, current group first (same
   policy snapshot, as SDPO's sibling demonstrations), then the archive, then planner solutions; within a
   source the shortest trajectory first (the most direct plan), ties by traj_id. A matcher returns the
   first reference that matches, so a later reference can cover a state the preferred one never visited.
2. A reference that passes the same state twice is matched at its LAST occurrence: the suffix from there
   is the shortest successful continuation (the detour before it is not something to imitate).
3. The archive keeps, per task, the `archive_size` most recent successes of EARLIER steps (FIFO; a group's
   successes enter it when the next group is added, sorted by traj_id). traj_ids must be unique over a run.
4. `seed_with_planner` (off by default) lets the trainer add the engine planner's solution of a task as a
   reference. The paper uses only the policy's own successes; this exists to bootstrap tiny models with no
   successes yet and for tests.
5. `all` and `random` turns are not state-matched, so their position is index-aligned:
   j = min(turn_index, len(reference) - 1), candidate = the reference's action at j (what a FullPath teacher
   reading the reference "at the same step" would see).
6. The paper does not publish its teacher text; ours is the templates below. Nothing is truncated here:
   teacher.py enforces the teacher length budget (over-long prompts fall back to GRPO and are counted).
7. The windowed `history` matcher keys on what the prompt shows of the past (envs.build_prompt: the last
   `history_length` pairs and the current observation), without the step counter the prompt also prints. So
   two states reached by different paths that end in the same h pairs look alike to it, and it can disagree
   with `structured` in both directions (what the audit measures); `history-full` cannot, in a deterministic
   environment, since the whole prefix fixes the state.
8. `references = first` restricts every matcher to the one reference FullPath-SD shows (the first in the
   deviation-1 order), so SMRC-SD's routing is compared with FullPath-SD at equal reference access.
"""
from __future__ import annotations

import functools
import random
from collections.abc import Hashable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal

Signature = tuple[tuple[str, Hashable], ...]  # same type as envs.Signature: ordered (field, value) pairs


@dataclass(frozen=True)
class Step:
    """One turn of a trajectory, as the router sees it."""
    signature: Signature  # state before acting at this turn
    history_key: str  # history key before acting at this turn (envs.history_key chain)
    observation: str  # observation shown at this turn
    action: str  # action taken (the parsed action text sent to the env)


@dataclass
class Trajectory:
    task_id: str
    traj_id: str  # unique over the whole run (deviation 3)
    steps: list[Step]
    success: bool
    final_observation: str = ""  # observation after the last action


@dataclass(frozen=True)
class Match:
    ref: Trajectory | None  # None: matcher `every` on a task without a reference (skill contexts need none)
    position: int  # index j into ref.steps (-1 without a reference)
    candidate: str  # ref.steps[position].action ("" without a reference)


@dataclass(frozen=True)
class Turn:
    """One student turn to route: which task and trajectory it belongs to, its index, and its step."""
    task_id: str
    traj_id: str
    turn_index: int
    step: Step


@dataclass
class RouterConfig:
    matcher: Literal["structured", "history", "history-full", "random", "all", "every", "none"] | None = None
    """turns to distil: structured (SMRC-SD), history (last h pairs + observation), history-full (same prefix),
    random (control), all (FullPath-SD), every (all turns, reference or not), none; None = set by --algo (grpo: none,
    fullpath-sd: all, smrc-sd: structured, skill-sd/sdar/grpo-opsd: every, or all with a trajectory context)"""
    context: Literal["fullpath", "summary", "candidate", "full", "skill"] | None = None
    """teacher context: fullpath (trajectory), summary (+state), candidate (+candidate action), full (SMRC-SD),
    skill (skill files); None = set by --algo (fullpath-sd: fullpath, smrc-sd: full, skill-sd/sdar/grpo-opsd: skill)"""
    history_window: int | None = None
    """h of the `history` matcher: (observation, action) pairs compared; None = the env's prompt history_length"""
    references: Literal["all", "first"] = "all"
    """references a matcher may use per task: all (in preference order) or first (the one FullPath-SD shows)"""
    archive_size: int = 4
    """earlier successful trajectories kept per task: the most recent ones, the oldest dropped first (0 = none:
    the references are this step's successes only, the paper's setting, which mentions no archive)"""
    seed_with_planner: bool = False
    """also use the planner's solution of each task as a reference (not in the paper; for bootstrapping)"""


# ----------------------------------------------------------------------------------------------------------
# Reference bank

_SOURCE_RANK = {"group": 0, "archive": 1, "planner": 2}  # deviation 1


class ReferenceBank:
    """Per task: the current group's successes, an archive of earlier successes, planner solutions."""

    def __init__(self, archive_size: int):
        assert archive_size >= 0, archive_size
        self.archive_size = archive_size
        self.group: dict[str, list[Trajectory]] = {}  # this step's successes
        self.archive: dict[str, list[Trajectory]] = {}  # earlier steps' successes, oldest first
        self.planner: dict[str, Trajectory] = {}  # one planner solution per task

    def add_group(self, trajectories: list[Trajectory]) -> None:
        """Start a new step: the previous group's successes enter the archive, this step's become the group."""
        for task_id in sorted(self.group):
            kept = self.archive.setdefault(task_id, []) + self.group[task_id]
            self.archive[task_id] = kept[max(0, len(kept) - self.archive_size):]  # deviation 3: FIFO
        self.archive = {t: refs for t, refs in self.archive.items() if refs}
        self.group = {}
        for traj in sorted((t for t in trajectories if t.success), key=lambda t: t.traj_id):
            self.group.setdefault(traj.task_id, []).append(traj)

    def add_planner(self, traj: Trajectory) -> None:
        """Deviation 4: the planner's solution of a task (replaces an earlier one of the same task)."""
        assert traj.success, f"planner trajectory {traj.traj_id} is not a success"
        self.planner[traj.task_id] = traj

    def references(self, task_id: str, exclude_traj_id: str) -> list[Trajectory]:
        """The task's references in preference order (deviation 1), never the student's own trajectory."""
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
    steps = [Step(as_signature(s["signature"]), s["history_key"], s["observation"], s["action"]) for s in d["steps"]]
    return Trajectory(d["task_id"], d["traj_id"], steps, d["success"], d["final_observation"])


# ----------------------------------------------------------------------------------------------------------
# Matchers: same interface, (student turn, references in preference order) -> Match | None

def _usable(turn: Turn, refs: list[Trajectory]) -> list[Trajectory]:
    # Guard here too, not only in the bank: a self-reference would distil the student towards itself.
    return [r for r in refs if r.traj_id != turn.traj_id and r.task_id == turn.task_id and r.steps]


Key = Callable[[list[Step], int], Hashable]  # (steps of a trajectory, position j) -> what a matcher compares


def _match_on(turn: Turn, refs: list[Trajectory], value: Hashable, key: Key) -> Match | None:
    """The first reference holding the student's `value` at some position j (its last such one, deviation 2)."""
    for ref in _usable(turn, refs):
        positions = [j for j in range(len(ref.steps)) if key(ref.steps, j) == value]
        if positions:
            return Match(ref, positions[-1], ref.steps[positions[-1]].action)
    return None


def window_key(steps: list[Step], j: int, h: int) -> tuple:
    """What the prompt at position j shows of the past: the last h (observation, action) pairs and the current
    observation (deviation 7)."""
    return tuple((s.observation, s.action) for s in steps[max(0, j - h):j]), steps[j].observation


def match_structured(turn: Turn, refs: list[Trajectory]) -> Match | None:
    """SMRC-SD: the student's state signature equals the reference's signature at position j."""
    return _match_on(turn, refs, turn.step.signature, lambda steps, j: steps[j].signature)


def match_history(turn: Turn, refs: list[Trajectory], earlier: list[Step], h: int) -> Match | None:
    """The prompt's view (`window_key`) of the student's turn, given its `earlier` steps, equals the reference's
    at position j."""
    mine = window_key([*earlier, turn.step], len(earlier), h)
    return _match_on(turn, refs, mine, lambda steps, j: window_key(steps, j, h))


def match_history_full(turn: Turn, refs: list[Trajectory]) -> Match | None:
    """The student's history key (whole action/observation prefix) equals the reference's at position j."""
    return _match_on(turn, refs, turn.step.history_key, lambda steps, j: steps[j].history_key)


def match_all(turn: Turn, refs: list[Trajectory]) -> Match | None:
    """FullPath-SD: every turn of a task with a reference, index-aligned (deviation 5)."""
    usable = _usable(turn, refs)
    if not usable:
        return None
    ref = usable[0]
    j = min(turn.turn_index, len(ref.steps) - 1)
    return Match(ref, j, ref.steps[j].action)


def match_every(turn: Turn, refs: list[Trajectory]) -> Match:
    """Skill-SD / SDAR: every turn; the index-aligned reference position where the task has one (deviation 5)."""
    return match_all(turn, refs) or Match(None, -1, "")


def match_none(turn: Turn, refs: list[Trajectory]) -> Match | None:
    """Plain GRPO: no turn is distilled."""
    return None


MATCHERS: dict[str, Callable[[Turn, list[Trajectory]], Match | None]] = {
    "structured": match_structured, "history-full": match_history_full, "all": match_all, "every": match_every,
    "none": match_none,
}


_KEYS: dict[str, Callable[[Step], object]] = {"structured": lambda s: s.signature,
                                              "history-full": lambda s: s.history_key}


def _references(turns: list[Turn], bank: ReferenceBank) -> list[list[Trajectory]]:
    """bank.references of every turn, sorted once per task (the order does not depend on the excluded trajectory)."""
    by_task = {t.task_id: bank.references(t.task_id, exclude_traj_id="") for t in turns}
    return [[r for r in by_task[t.task_id] if r.traj_id != t.traj_id] for t in turns]


def _match_indexed(turns: list[Turn], refs: list[list[Trajectory]], key: Callable[[Step], object]) -> list:
    """`_match_on` for every turn, with each reference's positions indexed once ({key: last position}), so a turn
    costs one look-up per reference instead of a scan of every position (same result: deviations 1 and 2)."""
    index: dict[int, dict] = {}  # id(reference) -> {key value: last position}; the references outlive this call
    out = []
    for turn, rs in zip(turns, refs):
        match, value = None, key(turn.step)
        for ref in _usable(turn, rs):
            if id(ref) not in index:
                index[id(ref)] = {key(s): j for j, s in enumerate(ref.steps)}  # later positions overwrite earlier
            j = index[id(ref)].get(value)
            if j is not None:
                match = Match(ref, j, ref.steps[j].action)
                break
        out.append(match)
    return out


def route(turns: list[Turn], bank: ReferenceBank, matcher: str, rng: random.Random, *, window: int = 2,
          references: str = "all") -> list[Match | None]:
    """One Match or None per turn, in the order given.

    `random` is the paper's control: exactly as many turns as `structured` selects on this batch, drawn
    uniformly (rng.sample) among the turns whose task has a reference, each given the index-aligned match
    of `match_all` (deviation 5). rng is used only by `random`; seed it per step for an exact resume.
    `history` reads a turn's earlier steps from the turns of its trajectory in this batch (every turn of an
    episode is in it), with `window` = h. `references = first`: only the first reference (deviation 8).
    """
    refs = _references(turns, bank)
    refs = [r[:1] for r in refs] if references == "first" else refs
    if matcher in _KEYS:
        return _match_indexed(turns, refs, _KEYS[matcher])
    if matcher == "history":
        paths: dict[str, dict[int, Step]] = {}
        for t in turns:
            paths.setdefault(t.traj_id, {})[t.turn_index] = t.step
        earlier = [[paths[t.traj_id][i] for i in range(t.turn_index)] for t in turns]
        return [match_history(t, r, e, window) for t, r, e in zip(turns, refs, earlier)]
    if matcher in MATCHERS:
        return [MATCHERS[matcher](t, r) for t, r in zip(turns, refs)]
    assert matcher == "random", f"unknown matcher {matcher!r}"
    n_structured = sum(m is not None for m in _match_indexed(turns, refs, _KEYS["structured"]))
    eligible = [i for i, t in enumerate(turns) if _usable(t, refs[i])]
    chosen = set(rng.sample(eligible, n_structured))  # n_structured <= len(eligible): a match needs a ref
    return [match_all(t, r) if i in chosen else None for i, (t, r) in enumerate(zip(turns, refs))]


def route_metrics(turns: list[Turn], matches: list[Match | None], bank: ReferenceBank) -> dict[str, float]:
    """Matched turns, turns with a reference, and the matched turns by the source of their reference (group,
    archive, planner; `none` for matcher `every` without one): the coverage each source gives."""
    with_ref = sum(bool(_usable(t, r)) for t, r in zip(turns, _references(turns, bank)))
    by_source = dict.fromkeys(("group", "archive", "planner", "none"), 0.0)
    for m in (m for m in matches if m is not None):
        by_source[bank.source(m.ref)] += 1
    return {"router/matched_turns": float(sum(m is not None for m in matches)),
            "router/turns_with_reference": float(with_ref),
            **{f"router/matched_turns/{k}": v for k, v in by_source.items()}}


# ----------------------------------------------------------------------------------------------------------
# State summary: natural language from the signature fields (environments/alfworld.py, environments/webshop.py)

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
    """One line per signature field, in signature order; unknown fields rendered generically, never dropped."""
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
CANDIDATE_TEMPLATE = "[Privileged: candidate next action]\nThe successful trajectory's action at its step {k}: " \
                     "<action>{candidate}</action>"
SKILL_TEMPLATE = "[Privileged: skills for this kind of task]\n{skills}"
CLOSING_TEMPLATE = "Use this information to choose the best next action for the current situation above."
PROMPT_SLOT = "[[student prompt]]"  # where the student's ordinary prompt goes in the teacher's message
CONTEXT_BLOCKS = {  # which blocks each ablation variant shows, in this order, joined by a blank line
    "fullpath": ("trajectory",), "summary": ("trajectory", "summary"), "candidate": ("trajectory", "candidate"),
    "full": ("trajectory", "summary", "candidate"), "skill": ("skills",),
}
SKILLS_DIR = Path(__file__).resolve().parent / "skills"  # skills/<env>/general.md and skills/<env>/<task_type>.md


@functools.cache
def skill_text(env: str, task_type: str) -> str:
    """The skill text of a task: the environment's general skills, then its task type's (one file each)."""
    files = [SKILLS_DIR / env / "general.md", SKILLS_DIR / env / f"{task_type}.md"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"no skill file {missing} for env {env!r}, task type {task_type!r}")
    return "\n\n".join(f.read_text().strip() for f in files)


def render_trajectory(ref: Trajectory) -> str:
    steps = "\n".join(STEP_TEMPLATE.format(k=k + 1, observation=s.observation, action=s.action)
                      for k, s in enumerate(ref.steps))
    return TRAJECTORY_TEMPLATE.format(steps=steps, final_observation=ref.final_observation)


def teacher_context(variant: str, ref: Trajectory | None, match: Match | None, signature: Signature,
                    skills: str = "") -> str:
    """The privileged text around the student's prompt, which goes where PROMPT_SLOT stands (teacher.py): the static
    blocks (trajectory, skills) before it; the state's own blocks (summary, candidate) and the closing line after it,
    nearest to the response.

    `signature` is the student's own current state (what the summary describes); `match` is required by the
    variants that show the candidate action, `ref` by those that show the trajectory, `skills` (skill_text) by skill.
    """
    blocks = []
    for block in CONTEXT_BLOCKS[variant]:
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
    static = sum(b in ("trajectory", "skills") for b in CONTEXT_BLOCKS[variant])  # they come first in every variant
    return "\n\n".join(blocks[:static] + [PROMPT_SLOT] + blocks[static:] + [CLOSING_TEMPLATE])
