"""Multi-turn rollouts, and the one replay of a fixed action list through an env.

Every turn's prompt is rebuilt from the task, the last `history_length` (observation, action) pairs of the
episode's memory, the current observation and the admissible actions (verl-agent's step-independent multi-turn
format), so the context stays flat over 50 turns. The prompt is always the ordinary one: privileged text
exists only in the teacher.

Env time overlaps model time: the episodes are split in two halves that alternate, so while the env workers
step one half, the engine generates for the other (`collect_rollouts`). An over-long prompt falls back to the
no-history prompt, then ends the episode; a response cut by max_new_tokens is kept and counted. Nothing is
dropped silently.

Every turn is a `records.Turn`, the record the later stages read and add to. `replay(env, task, actions)`
plays a fixed action list (a planner's solution, a student's prefix) into the same records, so references,
audits and warm-start demonstrations see exactly the states, history keys and prompts a rollout would.
"""
import time
from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np
from tqdm import tqdm

import envs
from models import SamplingConfig, action_trie, chat_ids
from records import Step, Trajectory, Turn


@dataclass
class RolloutConfig:
    engine: Literal["auto", "hf", "vllm"] = "auto"
    """generation engine: transformers generate (hf) or vLLM (vllm); auto = vllm where CUDA and vllm are
    present and decoding is free (restricted decoding runs on hf only), else hf (config.resolve; the banner
    says which and why). vLLM logs warnings only; VLLM_LOGGING_LEVEL=INFO brings its INFO lines back"""
    tasks_per_step: int = 16
    """task groups per step (verl-agent: 16)"""
    group_size: int = 8
    """rollouts per task; GRPO statistics are per group (verl-agent: 8)"""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_prompt_tokens: int = 4096
    """student prompt budget; an over-long prompt falls back to the no-history prompt, then ends the episode
    (counted)"""
    gen_batch_size: int = 64
    """prompts per generate call (hf engine)"""
    action_space: Literal["free", "admissible"] = "free"
    """free: the model writes its response (the paper); admissible: token-level decoding restricted to
    `<action>{one admissible command}</action>` (a prefix trie, the same mask in sampling, teacher and
    update): a CPU-scale choice for tiny models, hf engine and require_think=False only"""
    vllm_gpu_memory: float = 0.5
    """vllm engine: share of GPU memory for weights + KV cache (it sleeps during the update)"""
    vllm_sleep_level: Literal[1, 2] = 2
    """vllm engine on CUDA: sleep level during the update: 2 drops the weights (reloaded at the sync), 1 keeps
    them in host memory (avoids level-2's reload issues: scale/vllm_engine.sync_warning)"""


@dataclass
class Episode:
    task: envs.Task
    group: int
    traj_id: str
    slot: int
    goal: str = ""
    observation: str = ""
    admissible: list[str] = field(default_factory=list)
    signature: envs.Signature = ()
    history_key: str = ""
    observation_key: str = ""  # envs.signature_key of the generic signature (envs.observation_signature)
    unchanged_by: tuple[str, ...] = ()  # actions since the observation last changed
    memory: list[tuple[str, str]] = field(default_factory=list)  # (observation, action) of earlier turns
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    won: bool = False
    score: float = 0.0
    stop_reason: str = ""     # won | env_done | max_steps | prompt_too_long | env_error (a lost episode)
    result: envs.StepResult | None = None  # the env's latest answer

    @property
    def ret(self) -> float:
        return sum(t.reward for t in self.turns)


def observe(ep: Episode, res: envs.StepResult, first: bool, action: str = "") -> None:
    """Take the env's answer (to reset if `first`, else to `action`) into the episode's state."""
    ep.history_key = envs.history_key("" if first else ep.history_key, action, res.observation)
    ep.unchanged_by = () if first else envs.unchanged_by(ep.unchanged_by, ep.observation, action,
                                                         res.observation)
    listed = res.admissible or None  # an environment without an admissible list gives []
    generic = envs.observation_signature(ep.task.task_id, res.observation, listed, ep.unchanged_by,
                                         taken=tuple(a for _, a in ep.memory))
    ep.observation_key = envs.signature_key(generic)
    ep.observation, ep.admissible = res.observation, res.admissible
    ep.signature = res.signature or generic  # an environment without a signature of its own: the generic one
    ep.result = res
    ep.goal = res.goal if first else ep.goal
    ep.won, ep.score = res.won, res.score
    if res.done:
        ep.done = True
        ep.stop_reason = "won" if res.won else ("env_error" if "env_error" in res.info else
                                                ("max_steps" if res.info.get("truncated") else "env_done"))


def advance(ep: Episode, turn: Turn, res: envs.StepResult) -> None:
    """The env answered `turn`: its reward, the memory, the new state."""
    turn.reward = res.reward
    ep.memory.append((ep.observation, turn.step.action))
    observe(ep, res, first=False, action=turn.step.action)


def turn_prompt(ep: Episode, env_name: str, history_length: int, require_think: bool) -> str:
    """The ordinary user message of the episode's next turn."""
    return envs.build_prompt(env_name, ep.goal, ep.memory, len(ep.turns), ep.observation, ep.admissible,
                             history_length, require_think=require_think)


# ------------------------------------------------------------------------------------------------------------
# Rollouts


def _prompt(ep: Episode, env_cfg: envs.EpisodeConfig, max_tokens: int, tokenizer,
            counters: dict) -> tuple[str, list[int]] | None:
    """The turn's ordinary prompt; over the budget: the no-history prompt (a fallback, counted once), then
    None (the episode ends; counted as prompt_too_long)."""
    for fallback, h in enumerate((env_cfg.history_length, 0) if env_cfg.history_length else (0,)):
        text = turn_prompt(ep, ep.task.env, h, env_cfg.require_think)
        ids = chat_ids(tokenizer, text)
        if len(ids) <= max_tokens:
            counters["prompt_no_history"] += fallback
            return text, ids
    counters["prompt_too_long"] += 1
    return None


def collect_rollouts(engine, pool, tokenizer, tasks: list[envs.Task], cfg: RolloutConfig,
                     env_cfg: envs.EpisodeConfig, *, tag: str, show_progress: bool = True
                     ) -> tuple[list[Episode], dict]:
    """Play `cfg.group_size` episodes of every task. The episodes are split in two halves that alternate:
    while the env workers step one half, the model generates for the other, so env time overlaps model
    time."""
    G, max_steps = cfg.group_size, env_cfg.max_steps
    eps = [Episode(task, g, f"{tag}-{g}-{k}", slot=g * G + k)
           for g, task in enumerate(tasks) for k in range(G)]
    counters = dict(prompt_no_history=0, prompt_too_long=0, truncated_responses=0, gen_s=0.0, env_s=0.0)
    t0 = time.perf_counter()
    for ep, res in zip(eps, pool.reset([e.slot for e in eps], [e.task for e in eps])):
        observe(ep, res, first=True)
    counters["env_s"] += time.perf_counter() - t0
    halves, pending = [eps[0::2], eps[1::2]], None
    bar = tqdm(total=len(eps) * max_steps, desc=f"rollout {tag}", leave=False, disable=not show_progress)
    for it in range(2 * max_steps + 1):
        half = [e for e in halves[it % 2] if not e.done and len(e.turns) < max_steps]
        sent = _act(half, engine, tokenizer, cfg, env_cfg, counters)  # generates while `pending` is stepped
        if pending is not None:
            t = time.perf_counter()
            for ep, turn, res in zip(*pending, pool.step_wait()):
                advance(ep, turn, res)
            counters["env_s"] += time.perf_counter() - t
            bar.update(len(pending[0]))
        pending = None
        if sent[0]:
            pool.step_async([ep.slot for ep in sent[0]], [t.step.action for t in sent[1]])
            pending = sent
    bar.close()
    for ep in eps:
        if not ep.done:
            ep.done, ep.stop_reason = True, "max_steps"
    return eps, counters


def _act(half: list[Episode], engine, tokenizer, cfg: RolloutConfig, env_cfg: envs.EpisodeConfig,
         counters: dict) -> tuple[list, list]:
    """Generate one turn for every episode of `half` and parse the actions: (episodes, turns)."""
    prompted = []
    for ep in half:
        p = _prompt(ep, env_cfg, cfg.max_prompt_tokens, tokenizer, counters)
        if p is None:
            ep.done, ep.stop_reason = True, "prompt_too_long"
        else:
            prompted.append((ep, *p))
    if not prompted:
        return [], []
    t = time.perf_counter()
    tries = None
    if cfg.action_space == "admissible":  # decoding restricted to `<action>{admissible}</action>`
        tries = [action_trie(tokenizer, [envs.action_response(a) for a in ep.admissible])
                 for ep, _, _ in prompted]
    gens = engine.generate([ids for _, _, ids in prompted], tries) if tries else \
        engine.generate([ids for _, _, ids in prompted])
    counters["gen_s"] += time.perf_counter() - t
    turns = []
    for (ep, text, ids), gen in zip(prompted, gens):
        parsed = envs.parse_action(gen.text, ep.task.env, env_cfg.require_think)
        counters["truncated_responses"] += gen.truncated
        turns.append(Turn(ep.task, ep.traj_id, len(ep.turns), _step(ep, parsed.action), group=ep.group,
                          user_text=text, prompt_ids=ids, response_ids=gen.response_ids,
                          sample_logprobs=gen.logprobs, response=gen.text, valid=parsed.valid,
                          parse_reason=parsed.reason, allowed=gen.allowed,
                          admissible=list(ep.admissible) if tries else None))
        ep.turns.append(turns[-1])
    return [ep for ep, _, _ in prompted], turns


# ------------------------------------------------------------------------------------------------------------
# Replay: a fixed action list through an env


def replay(env, task: envs.Task, actions: list[str], episode: Episode | None = None,
           prompt: Callable[[Episode], str] | None = None) -> Episode:
    """Play `actions` from reset (or on from `episode`'s state) until the episode ends, one Turn per action
    taken, each with the state, history key and (if `prompt` is given) ordinary prompt it was taken in."""
    ep = episode or Episode(task, 0, f"replay-{task.task_id}", slot=-1)
    results = envs.replay(env, task, actions, start=ep.result)
    if episode is None:
        observe(ep, results[0], first=True)
    for action, res in zip(actions, results[1:]):
        turn = Turn(task, ep.traj_id, len(ep.turns), _step(ep, action), group=ep.group,
                    user_text=prompt(ep) if prompt else "")
        ep.turns.append(turn)
        advance(ep, turn, res)
    return ep


def _step(ep: Episode, action: str) -> Step:
    """The episode's current state and the action taken in it."""
    return Step(ep.signature, ep.history_key, ep.observation, action, ep.observation_key)


def to_trajectory(ep: Episode, traj_id: str | None = None) -> Trajectory:
    """The episode as a reference: its turns' steps (shared, not copied) and its outcome."""
    return Trajectory(ep.task.task_id, traj_id or ep.traj_id, [t.step for t in ep.turns], success=ep.won,
                      final_observation=ep.observation)


def reference(env, task: envs.Task, actions: list[str]) -> Trajectory | None:
    """A planner solution replayed through an env without a step limit, so every position carries its real
    signature and history key; None unless it wins."""
    ep = replay(env, task, actions)
    return to_trajectory(ep, f"planner-{task.task_id}") if ep.won else None


# ------------------------------------------------------------------------------------------------------------
# Metrics


@dataclass
class TurnStats:
    valid: bool
    response_tokens: int
    parse_reason: str


@dataclass
class EpisodeStats:
    """What the metrics need of one episode, small enough to gather from every rank under torchrun."""
    ret: float
    won: bool
    score: float
    task_type: str
    turns: list[TurnStats]


def episode_stats(eps: list[Episode]) -> list[EpisodeStats]:
    return [EpisodeStats(ret=e.ret, won=e.won, score=e.score, task_type=e.task.task_type,
                         turns=[TurnStats(t.valid, len(t.response_ids), t.parse_reason) for t in e.turns])
            for e in eps]


def rollout_metrics(stats: list[EpisodeStats], counters: dict) -> dict:
    """Episode-level means over every episode of the step (all ranks), turn-level means over every turn."""
    turns = [t for s in stats for t in s.turns]
    m = {
        "rollout/reward": float(np.mean([s.ret for s in stats])),
        "rollout/success_rate": float(np.mean([s.won for s in stats])),
        "rollout/score": float(np.mean([s.score for s in stats])),
        "rollout/valid_action_ratio": float(np.mean([t.valid for t in turns])) if turns else float("nan"),
        "rollout/turns": float(np.mean([len(s.turns) for s in stats])),
        "rollout/response_tokens": float(np.mean([t.response_tokens for t in turns])) if turns else 0.0,
        **{f"rollout/{k}": float(counters[k])
           for k in ("truncated_responses", "prompt_no_history", "prompt_too_long")},
    }
    for tt in sorted({s.task_type for s in stats}):
        m[f"rollout/success/{tt}"] = float(np.mean([s.won for s in stats if s.task_type == tt]))
    for reason in sorted({t.parse_reason for t in turns} - {"ok"}):
        m[f"rollout/invalid/{reason}"] = float(sum(t.parse_reason == reason for t in turns))
    return m
