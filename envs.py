"""The contract every environment implements, and what the trainer needs of any environment.

The contract. An environment MUST give tasks by split (`load_tasks("train" | "eval")`, each a `Task`) and an
env whose reset(task) and step(action) answer a `StepResult`: observation (str), reward, done, won, score,
goal. It MAY give the admissible actions (`StepResult.admissible`: shown in the prompt, needed by restricted
decoding), a structured signature (`StepResult.signature`; else the generic `observation_signature` is
used), a planner (`plan`: references for --router.seed-with-planner; else the policy's own successes) and
the state summary's fields (the signature's). Built in: ALFWorld, WebShop, TextWorld (environments/); one of
yours in one file, gymnasium-style or as an `EpisodeConfig` subclass: `--env package.module:Class`
(environments/external.py; docs/environments.md).

What it holds (a leaf: it imports nothing from the project; the implementations live in environments/):
- `Task`, `StepResult`, `Signature`, `ParsedAction`, `PlanResult`, `DataError`, `EnvError`.
- `EpisodeConfig`: the settings every environment's config shares. An environment's config subclasses it and
  implements `load_tasks(split)`, `make_env()` and `plan(task, actions, timeout_s)`, so the config a run was
  started with is what builds its envs, its task list and its expert plans.
- `load_tasks(cfg, split)`, `make_env(cfg)`, `plan(cfg, task, actions)`: the one dispatcher, on the config.
  An env has reset(task) -> StepResult, step(action) -> StepResult, close().
- `replay(env, task, actions)`: the one loop that steps a list of actions through an env (rollout.replay
  builds the trainer's episodes on it; the planners restore states with it).
- `alfworld_signature(...)`, `webshop_signature(...)`: each environment's state signature, its fields in one
  place (the environment files read them from their engines and call these).
- `history_key(prev, action, observation)`: running sha1 chain over the (action, observation) history.
- `build_prompt(...)` / `parse_action(...)`: verl-agent's ALFWorld and WebShop prompts (and ALFWorld's wording
  without its world for any other environment) and action projection.

Naming: the *memory* of an episode is the list of its earlier (observation, action) pairs shown in the prompt;
its *history key* is the sha1 chain above, which the `history` matcher compares.

Deviations from verl-agent (numbered; its projection takes the text between the first `<action>` and the
first `</action>` and marks the turn invalid only for missing tags, a missing `<think>` block or CJK; like
it, a second `<action>` block after the first is ignored, and a `<think>` block that quotes a tag yields the
quoted text):
1. Any invalid output is sent to the env as the last 30 (ALFWorld) / 20 (WebShop) characters of the lowercased
   response; verl-agent keeps the extracted action when only <think> is missing.
2. 'help' is dropped from the ALFWorld admissible list shown in the prompt.
3. An empty action (`<action> </action>`) is invalid ("empty"): verl-agent sends "" to the env as a valid
   action; an empty command is no action, and the penalty says so.
4. An action over MAX_ACTION_CHARS is invalid ("too_long"), so no env parses an unbounded string.
5. The closing tag is looked for after the opening one: verl-agent's search from the start takes a stray
   `</action>` before `<action>` as the end (an empty slice, "valid").
"""
import hashlib
import random
import re
from dataclasses import dataclass
from typing import Hashable

Signature = tuple[tuple[str, Hashable], ...]


class DataError(RuntimeError):
    """The requested task data is missing or empty (raised once, with what to do about it)."""


class EnvError(RuntimeError):
    """An environment call failed (names the task and the action)."""


@dataclass(frozen=True)
class Task:
    task_id: str    # stable unique id, e.g. "alfworld/gen-train/00012", "alfworld/train/<type-dir>/<trial>"
    task_type: str  # ALFWorld: one of its six task types; WebShop: "webshop"
    env: str        # "alfworld" | "webshop"
    source: str     # ALFWorld: absolute path of game.tw-pddl; WebShop: goal index as str


@dataclass
class StepResult:
    observation: str       # text after reset (the full intro) or after a step
    admissible: list[str]  # actions available now
    reward: float          # 10.0 on the winning step, else 0
    done: bool             # won, or max_steps reached (or WebShop: bought)
    won: bool
    score: float           # ALFWorld: float(won); WebShop: the raw reward in [0, 1]
    goal: str              # the task sentence
    signature: Signature   # structured signature of the state AFTER this step
    info: dict             # JSON-able extras (step, truncated, ...)


@dataclass(frozen=True)
class ParsedAction:
    action: str  # text sent to the env
    valid: bool  # well-formed per the verl-agent projection (admissibility is not checked, as in verl-agent)
    # "ok" | "missing_action_tags" | "missing_think" | "empty" | "cjk" | "too_long"
    reason: str


MAX_ACTION_CHARS = 1000  # longer than any ALFWorld command or WebShop click; longer is invalid ("too_long")


@dataclass
class PlanResult:
    actions: list[str] | None  # the plan from the replayed state (None unless status is "ok")
    status: str                # "ok" | "timeout" | "error" | "unsolvable"
    seconds: float             # wall time of the request (replay + planning), excluding a process start
    message: str


@dataclass
class EpisodeConfig:
    """Episode and infrastructure settings every environment's config shares (the trainer reads them by
    name)."""
    # Episode
    max_steps: int = 50
    """episode step limit (verl-agent env.max_steps); reaching it ends the episode with info['truncated']"""
    history_length: int = 2
    """number of previous (observation, action) pairs shown in the prompt (verl-agent env.history_length)"""
    require_think: bool = True
    """an output without <think>...</think> is invalid (set False for tiny models that cannot think)"""
    invalid_action_penalty: float = 0.1
    """subtracted by the trainer from the score of every invalid turn (verl-agent
    invalid_action_penalty_coef)"""
    # Infrastructure
    num_workers: int = -1
    """env worker processes in EnvPool (0 = step envs in-process; -1 = auto: the cores this process may use,
    shared among the torchrun ranks of the node, less one for the trainer; at least 2, at most 32 and one per
    episode)"""
    step_timeout_s: float = 300.0
    """EnvPool: a reset/step batch taking longer than this is an error (never a hang)"""
    max_error_share: float = 0.5
    """an env call that raises (or answers no StepResult) loses its episode only (reward 0, kept in its GRPO
    group as a failure); a step whose lost episodes, over every rank, exceed this share stops the run with one
    line (environments/pool.py)"""
    planner_timeout_s: float = 60.0
    """planner expert: hard time limit per plan (the planner process is killed). The trainer plans a step's
    tasks in the background during the rollout, and the next step's meanwhile"""

    def load_tasks(self, split: str) -> list[Task]:
        raise NotImplementedError(f"{type(self).__name__} does not implement load_tasks")

    def make_env(self):
        raise NotImplementedError(f"{type(self).__name__} does not implement make_env")

    def plan(self, task: Task, actions: list[str], timeout_s: float) -> PlanResult:
        raise NotImplementedError(f"{type(self).__name__} does not implement plan")

    def prefetch_plan(self, task: Task, actions: list[str]) -> None:
        """Optional: start `plan(task, actions, planner_timeout_s)` in the background (here: nothing to
        start)."""


def load_tasks(cfg: EpisodeConfig, split: str) -> list[Task]:
    """Tasks of a split of the environment `cfg` configures, in a sorted, pinned order."""
    return cfg.load_tasks(split)


def stratified_subset(tasks: list[Task], n: int, seed: int) -> list[Task]:
    """n of `tasks` spread over the task types: round-robin over the types (sorted by name; the first types
    get one more when n is not a multiple), each type's tasks taken in a shuffle seeded by `seed`; returned in
    the given (pinned) order. All of them when n <= 0 or n >= len(tasks)."""
    if n <= 0 or n >= len(tasks):
        return list(tasks)
    rng = random.Random(seed)
    by_type: dict[str, list[Task]] = {}
    for t in tasks:
        by_type.setdefault(t.task_type, []).append(t)
    queues = [rng.sample(group, len(group)) for _, group in sorted(by_type.items())]
    picked: set[str] = set()
    while len(picked) < n:
        for q in (q for q in queues if q):
            if len(picked) < n:
                picked.add(q.pop().task_id)
    return [t for t in tasks if t.task_id in picked]


def make_env(cfg: EpisodeConfig):
    """An env of the environment `cfg` configures: reset(task) -> StepResult, step(action) -> StepResult,
    close()."""
    return cfg.make_env()


def plan(cfg: EpisodeConfig, task: Task, actions: list[str], timeout_s: float | None = None) -> PlanResult:
    """The expert's plan from the state reached by replaying `actions` from reset, built with the run's config
    (`timeout_s` defaults to cfg.planner_timeout_s)."""
    return cfg.plan(task, actions, cfg.planner_timeout_s if timeout_s is None else timeout_s)


def prefetch_plan(cfg: EpisodeConfig, task: Task, actions: list[str]) -> None:
    """Start planning in the background where the environment can, so a later `plan` of it waits less or not
    at all."""
    cfg.prefetch_plan(task, actions)


def replay(env, task: Task | None, actions: list[str], start: StepResult | None = None) -> list[StepResult]:
    """Step `actions` through `env` from reset(task), or on from `start` (the env's current state), stopping
    when the episode ends: the result before the first action, then one result per action taken."""
    results = [start if start is not None else env.reset(task)]
    for action in actions:
        if results[-1].done:
            break
        results.append(env.step(action))
    return results


# ---------------------------------------------------------------------------------------------- signatures
# A state signature is what the structured matcher compares: two states are "the same" for routing iff their
# signatures are equal. Each field is a piece of state that changes which next action is right; everything
# else is left out on purpose (it would split equal states). The fields are named pairs in a fixed order; the
# state summary (router.state_summary) renders one line per field. The environment files read the fields
# from their engines and build the signature here, so this section is the whole list.


def alfworld_signature(task_id: str, location: tuple, holding: tuple, opened: tuple, placed: tuple,
                       states: tuple, progress: tuple) -> Signature:
    """ALFWorld (environments/alfworld.py reads the fields from the engine's PDDL facts; sorted tuples):
      task      the task id: states of different tasks are never the same.
      location  the receptacles at the agent's location (several can share one in official scenes), or
                ("middle of the room",) at the start: which take/open/put actions exist.
      holding   the objects in hand, the inventory (0 or 1): searching or delivering.
      opened    the open receptacles: taking from / putting into a closed one fails ("Nothing happens.").
      placed    (object, receptacle) for the task-relevant objects (of the goal's object or light type) in a
                receptacle: where the target is, and whether it was delivered. Other objects are left out.
      states    (object, flag), flag in clean/hot/cool/on, for task-relevant objects: the state-change part
                of clean/heat/cool/look tasks.
      progress  the goal's conditions already met, as short text ("clean mug", "1 book in shelf", "holding
                book", "desklamp on here"): redundant with the fields above by design, it makes the summary
                readable for the teacher.
    Left out: visited or examined receptacles, the step count and the text history (`history_key`)."""
    return (("task", task_id), ("location", location), ("holding", holding), ("opened", opened),
            ("placed", placed), ("states", states), ("progress", progress))


def webshop_signature(task_id: str, page: str, keywords: tuple, results_page: int | None, item: str | None,
                      options: tuple) -> Signature:
    """WebShop (environments/webshop.py reads the fields from the page URL and the shop session):
      task          the task id (the goal).
      page          the current page: "search" | "results" | "item" | "sub:description" | "sub:features" |
                    "sub:reviews" | "sub:attributes" | "done".
      keywords      the search's keywords (tuple).
      results_page  the results page number (None off the results).
      item          the product open (ASIN, or None).
      options       the options clicked on it (sorted (name, value) pairs): the item page's text does not
                    change when an option is clicked, but the reward does, so the text alone is not enough."""
    return (("task", task_id), ("page", page), ("keywords", keywords), ("results_page", results_page),
            ("item", item), ("options", options))


def observation_signature(task_id: str, observation: str, admissible: list[str] | None,
                          unchanged_by: tuple[str, ...], taken: tuple[str, ...] = ()) -> Signature:
    """The state signature nobody writes by hand, from what every text environment gives (the `observation`
    matcher's, and the signature of an environment that gives none):
      task          the task id.
      observation   the current observation, normalised (lowercase, whitespace collapsed).
      admissible    the admissible actions as a sorted set, or None where the environment has none. Two
                    states with the same observation can differ in hidden state (an apple in hand in the same
                    room); what can be done there usually differs with it ("put apple 1 in/on ...").
      unchanged_by  the actions taken since the observation last changed, as a sorted set (`unchanged_by`):
                    hidden state that neither the text nor the actions show (WebShop's options: the item
                    page's text does not change when one is clicked) is told apart by the clicks that set it.
      spent         the episode's earlier actions (`taken`) that cannot be taken here, as a sorted set (with
                    an admissible list only): what the path did rather than where it is. Moving stays
                    admissible, so a detour does not split equal states; cleaning the soapbar at the sink
                    cannot be done at the bathtub, so holding a clean soapbar there differs from holding a
                    dirty one (the case the ALFWorld audit found).
    States these cannot tell apart match; `evaluate.py audit` measures what that costs (docs/results.md, the
    audit table)."""
    here = None if admissible is None else {normalise(a) for a in admissible}
    spent = () if here is None else tuple(sorted({normalise(a) for a in taken} - here))
    return (("task", task_id), ("observation", normalise(observation)),
            ("admissible", None if admissible is None else tuple(sorted(set(admissible)))),
            ("unchanged_by", tuple(sorted(set(unchanged_by)))), ("spent", spent))


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


def unchanged_by(before: tuple[str, ...], old_observation: str, action: str, observation: str) -> tuple:
    """The actions since the observation last changed, after `action` turned `old_observation` into
    `observation`."""
    return (*before, action) if normalise(observation) == normalise(old_observation) else ()


def signature_key(signature: Signature) -> str:
    """A short stable key of a signature (what a matcher indexes and the archive keeps)."""
    return hashlib.sha1(repr(signature).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------- history key


def history_key(prev: str, action: str, observation: str) -> str:
    """Running sha1 chain over (action, observation); the initial state's key is history_key('', '',
    intro)."""
    return hashlib.sha1("\x1f".join((prev, action, observation)).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------- prompts

# The verl-agent templates (agent_system/environments/prompts/{alfworld,webshop}.py), reproduced in wording;
# ALFWorld's "observaitons" (sic) and WebShop's U+2011 hyphen in "e‑commerce" and trailing spaces are kept so
# prompts match the baseline's exactly. The instruction is split off so that require_think=False asks for the
# action only.
_ALFWORLD_NO_HIS = """
You are an expert agent operating in the ALFRED Embodied Environment.
Your current observation is: {observation}
Your admissible actions of the current situation are: [{admissible}].

Now it's your turn to take an action.
{instruction}"""
_ALFWORLD_HIS = """
You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {goal}.
Prior to this step, you have already taken {step} step(s). Below are the most recent {n} observaitons and \
the corresponding actions you took: {history}
You are now at step {current} and your current observation is: {observation}
Your admissible actions of the current situation are: [{admissible}].

Now it's your turn to take an action.
{instruction}"""
_WEBSHOP_NO_HIS = """
You are an expert autonomous agent operating in the WebShop e\u2011commerce environment. \nYour task is to: \
{goal}.
Your current observation is: {observation}.
Your admissible actions of the current situation are: \n[
{admissible}
].

Now it's your turn to take one action for the current step.
{instruction}"""
_WEBSHOP_HIS = """
You are an expert autonomous agent operating in the WebShop e\u2011commerce environment.
Your task is to: {goal}.
Prior to this step, you have already taken {step} step(s). Below are the most recent {n} \
observations and the corresponding actions you took: {history}
You are now at step {current} and your current observation is: {observation}.
Your admissible actions of the current situation are: \n[
{admissible}
].

Now it's your turn to take one action for the current step.
{instruction}"""
# Any other environment (TextWorld, one of your own): ALFWorld's wording without its world; the admissible
# line only where the environment lists actions.
_TEXT_NO_HIS = """
You are an expert agent operating in a text-based environment. Your task is to: {goal}.
Your current observation is: {observation}
{admissible_line}
Now it's your turn to take an action.
{instruction}"""
_TEXT_HIS = """
You are an expert agent operating in a text-based environment. Your task is to: {goal}.
Prior to this step, you have already taken {step} step(s). Below are the most recent {n} observations and \
the corresponding actions you took: {history}
You are now at step {current} and your current observation is: {observation}
{admissible_line}
Now it's your turn to take an action.
{instruction}"""
_TEMPLATES = {"webshop": (_WEBSHOP_NO_HIS, _WEBSHOP_HIS), "alfworld": (_ALFWORLD_NO_HIS, _ALFWORLD_HIS)}
THINK_INSTRUCTION = ("You should first reason step-by-step about the current situation. This reasoning "
                     "process MUST be enclosed within <think> </think> tags. \nOnce you've finished your "
                     "reasoning, you should choose an admissible action for current step and present it "
                     "within <action> </action> tags.\n")
WEBSHOP_THINK_INSTRUCTION = (
    "You should first reason step-by-step about the current situation, then think carefully which admissible "
    "action best advances the shopping goal. This reasoning process MUST be enclosed within <think> </think> "
    "tags. \nOnce you've finished your reasoning, you should choose an admissible action for current step "
    "and present it within <action> </action> tags.\n")
ACTION_INSTRUCTION = ("You should choose an admissible action for current step and present it within "
                      "<action> </action> tags.\n")
WEBSHOP_MAX_PROMPT_CHARS = 13000  # verl-agent falls back to the no-history WebShop template above this


def format_history(memory: list[tuple[str, str]], step: int, history_length: int) -> tuple[str, int]:
    """The last `history_length` (observation, action) pairs as verl-agent's one-line-per-step text, and their
    count."""
    recent = memory[-history_length:] if history_length > 0 else []
    first = step - len(recent) + 1
    lines = [f"[Observation {first + j}: '{obs}', Action {first + j}: '{act}']"
             for j, (obs, act) in enumerate(recent)]
    return "\n".join(lines), len(recent)


def build_prompt(env_name: str, goal: str, memory: list[tuple[str, str]], step: int, observation: str,
                 admissible: list[str], history_length: int, require_think: bool = True) -> str:
    """The user message of one turn (no chat template). `memory` = (observation, action) of previous turns,
    `step` = number of steps already taken; the first turn (step 0) uses the no-history template."""
    webshop = env_name == "webshop"
    think = WEBSHOP_THINK_INSTRUCTION if webshop else THINK_INSTRUCTION
    listed = "\n ".join(f"'{a}'" for a in admissible if a != "help")
    fields = dict(goal=goal, observation=observation,
                  instruction=think if require_think else ACTION_INSTRUCTION,
                  admissible="\n".join(f"'{a}'," for a in admissible) if webshop else listed,
                  admissible_line=f"Your admissible actions of the current situation are: [{listed}].\n"
                  if admissible else "")
    no_his_t, his_t = _TEMPLATES.get(env_name, (_TEXT_NO_HIS, _TEXT_HIS))
    no_his = no_his_t.format(**fields)
    if step == 0 or history_length <= 0 or not memory:
        return no_his
    text, n = format_history(memory, step, history_length)
    prompt = his_t.format(step=step, n=n, history=text, current=step + 1, **fields)
    return no_his if webshop and len(prompt) > WEBSHOP_MAX_PROMPT_CHARS else prompt


# --------------------------------------------------------------------------------------------- action parsing

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def action_response(action: str) -> str:
    """The response that takes `action` when no reasoning is asked for (require_think=False): what the
    restricted action space decodes and the warm start imitates; `parse_action` reads `action` back from
    it."""
    return f"<action>{action}</action>"


def parse_action(text: str, env_name: str, require_think: bool) -> ParsedAction:
    """verl-agent projection: lowercase, the text inside the first <action>...</action> (later blocks are
    ignored). Invalid outputs are sent as the last 30 (ALFWorld) / 20 (WebShop) characters of the lowercased
    response (deviations 1, 3-5: the module docstring)."""
    lower = text.lower()
    fallback = lower[-(20 if env_name == "webshop" else 30):]
    start = lower.find("<action>")
    end = lower.find("</action>", start + 1) if start >= 0 else -1
    if not text.strip():
        return ParsedAction(fallback, False, "empty")
    if start < 0 or end < 0:
        return ParsedAction(fallback, False, "missing_action_tags")
    action = lower[start + len("<action>"):end].strip()
    if not action:
        return ParsedAction(fallback, False, "empty")
    if len(action) > MAX_ACTION_CHARS:  # bounded before any env parses it (its regexes see short strings)
        return ParsedAction(fallback, False, "too_long")
    if require_think and ("<think>" not in lower or "</think>" not in lower):
        return ParsedAction(fallback, False, "missing_think")
    if _CJK.search(text):
        return ParsedAction(fallback, False, "cjk")
    return ParsedAction(action, True, "ok")
