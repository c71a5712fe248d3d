"""The records a training step passes from stage to stage (pure data: no torch, no environment code).

- `Turn`: one turn of an episode, the one record that flows rollout -> router -> teacher -> update -> archive.
  The rollout writes what the policy saw and did (`step`, the prompt, the sampled response) and the env's
  answer; the router adds `match`, the teacher `teacher_logprobs`, the trainer `advantage`. No stage rebuilds
  it as another class.
- `Step`: the state a turn acted in and the action it took, the part of a turn a reference trajectory keeps.
- `Trajectory`: a successful episode as the router's reference bank keeps it (a list of Steps).
- `Match`: the router's decision for a distilled turn: the reference, the matched position j and the candidate
  action. `turn.match is None` is the one "no match" (GRPO only); `WITHOUT_REFERENCE` marks a turn distilled
  with no reference at all (matcher every-turn: the skill contexts need none).
- `StepRecord`: what a finished training step hands to the run's record (scale/lifecycle.Lifecycle.end_step).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from envs import Signature, Task


@dataclass(frozen=True)
class Step:
    """One position of a trajectory: the state before acting and the action taken there."""
    signature: Signature  # state before acting (envs.py contract)
    history_key: str      # history key before acting (envs.history_key chain)
    observation: str      # observation shown at this turn
    action: str           # the parsed (or fallback) action sent to the env
    observation_key: str = ""  # envs.signature_key of the state's envs.observation_signature


@dataclass
class Trajectory:
    task_id: str
    traj_id: str          # unique over the whole run (the bank's archive relies on it)
    steps: list[Step]
    success: bool
    final_observation: str = ""  # observation after the last action


@dataclass(frozen=True)
class Match:
    ref: Trajectory | None  # None: matcher every-turn on a task without one (skill contexts need none)
    position: int           # index j into ref.steps (-1 without a reference)
    candidate: str          # ref.steps[position].action ("" without a reference)


WITHOUT_REFERENCE = Match(None, -1, "")  # distilled, with no reference (not a "no match": that is None)


@dataclass
class Turn:
    """One turn-sample: what the policy saw and did, the env's answer, and what the later stages add."""
    task: Task
    traj_id: str
    index: int                # position in its episode
    step: Step                # the state it acted in and the action taken
    group: int = 0            # task group of the step (GRPO statistics are per group)
    user_text: str = ""       # the ordinary prompt (no privileged text, ever)
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    sample_logprobs: list[float] = field(default_factory=list)  # log-probs under the sampling policy
    response: str = ""
    valid: bool = True
    parse_reason: str = "ok"
    reward: float = 0.0       # env reward of this step
    allowed: list[list[int]] | None = None  # restricted decoding: the allowed ids at each response position
    admissible: list[str] | None = None     # restricted decoding: the commands the trie was built from
    # added by the later stages
    match: Match | None = None                   # router: the reference position to distil (None: GRPO only)
    teacher_logprobs: list[float] | None = None  # teacher: on distilled turns only
    teacher_base_logprobs: list[float] | None = None  # teacher on vLLM: the student's prompt, scored there
    advantage: float = 0.0                       # GRPO advantage of the turn's score

    @property
    def task_id(self) -> str:
        return self.task.task_id


@dataclass
class StepRecord:
    """A finished training step, as this rank saw it: the run's record gathers every rank's (metrics row,
    turn archive, trackers)."""
    episodes: list               # this rank's rollout.Episode of the step
    env_counters: dict           # rollout's counts (prompts over the limit, turns, ...)
    teacher_counts: dict         # teacher.teacher_signal's summable sd/ counts
    measured_counts: dict        # measure.step_readings' summable sd/ counts (measurement only)
    audited_matches: dict        # {audited matcher: its matches} for the rollout archive ({} without one)
    times: dict                  # step_s, update_s
    actor_metrics: dict          # grpo.update's actor/ metrics
