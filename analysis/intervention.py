"""Fixed-state teacher intervention (paper, "The problem: state-reference mismatch": "fix state, prompt and
response, change only the teacher context"; FullPath raises the correct action's log-prob in matched states
and lowers it in mismatched ones, A−C = +0.070, 95% CI [+0.012, +0.153]).

For every state (analysis/intervention_states.py: the task's reference, the policy's own first success by
default, its matched and its mismatched states) the student's prompt and a fixed response are held constant
and only the teacher context changes; the measure is the change in the teacher's log-probability of the
response relative to no context. Run through
`python evaluate.py intervene --model tiny-agent --split eval --num-tasks 24` (ALFWorld) or
`python evaluate.py intervene --env webshop --preset tiny --model tiny --num-tasks 4 --attempts 2` (embedded
WebShop).

Conditions (teacher prompt = router.teacher_context(...) + "\\n\\n" + the student's prompt, as in teacher.py):
  none                 the student's prompt only (the baseline every delta is taken against)
  fullpath_matched     FullPath context (the reference trajectory) in matched states             (paper: A)
  smrc_matched         SMRC-SD context (trajectory + state summary + candidate) in matched states
  placebo_matched      a successful trajectory of a different task, matched states
  fullpath_mismatched  FullPath context in mismatched states                                     (paper: C)
  placebo_mismatched   a successful trajectory of a different task, mismatched states
Reported: the mean delta per condition with percentile-bootstrap 95% CIs over states and over tasks (tasks
resampled with all their states), A − C (fullpath_matched − fullpath_mismatched, two independent groups of
states), the paired SMRC − FullPath on the matched states, and the correct response's rank (1 = best) among
the state's admissible ones.

Choices (numbered):
1. The fixed response. The paper's teacher re-scores the tokens the student sampled; here the student's
   response in a state is fixed to the one that takes the correct action, `<action>{correct}</action>` + EOS
   (envs.action_response). Under `--rollout.action-space admissible` (the learn and tiny presets) this is
   exactly the token sequence a student samples when it takes that action (the decoding trie is built from
   those tokens), so no sampling is needed. With require_think (free text with reasoning) a faithful fixed
   response would be a sampled reasoning that ends in the correct action; that is not implemented and such a
   config is refused.
2. The score is the summed log-probability of the fixed response's tokens at the run's sampling temperature,
   as the trainer's teacher computes it (teacher.hf_logprob_fn, tested equal): renormalised over the
   admissible responses' tokens at each position under the admissible action space (`restricted`, the primary
   measure there; the forced `<action>` tags contribute 0), and over the whole vocabulary (`free`, always
   reported).
3. The prompt is the training prompt: rollout.turn_prompt with the run's history length and require_think
   (False for tiny-agent: the learn preset asks for the action only). The run's settings are those of
   `--preset` (learn by default; WebShop: --preset tiny, the learn preset has no WebShop settings), or the
   checkpoint's own smrc_config.json when --model is a checkpoint folder. `--env` picks the environment
   (default: the run's).
4. The placebo for the i-th task is the reference of the next task in the list (a different game).
"""
import copy
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import envs
import router
from config import Config, config_from_run
# InterveneArgs is re-exported: evaluate.py imports it from here
from analysis.intervention_states import InterveneArgs, State, build_states, reference_source  # noqa: F401
from models import action_trie, allowed_per_position, chat_ids
from teacher import teacher_prompt_ids


def run_config(args: InterveneArgs) -> Config:
    """The run's settings (choice 3) in the environment `args.env`; a config asking for reasoning is refused
    (choice 1)."""
    ckpt = Path(args.model)
    cfg = config_from_run(ckpt if (ckpt / "smrc_config.json").is_file() else None, args.preset)
    cfg.env = args.env or cfg.env
    if cfg.env_cfg.require_think:
        raise SystemExit("error: intervene fixes the response to `<action>...</action>`; a config with "
                         "require_think (a reasoning text) is not supported "
                         "(analysis/intervention.py, choice 1)"
                         + ("; for WebShop use --preset tiny" if cfg.env == "webshop" else ""))
    return cfg


# ------------------------------------------------------------------------------------------------------------
# Scoring


def fixed_response(tokenizer, action: str) -> list[int]:
    """The tokens of the response that takes `action` (choice 1): what restricted decoding samples,
    EOS included."""
    return (tokenizer(envs.action_response(action), add_special_tokens=False)["input_ids"]
            + [tokenizer.eos_token_id])


@torch.no_grad()
def response_logprobs(model, prompt_ids: list[int], responses: list[list[int]],
                      allowed: list[list[list[int]]], temperature: float = 1.0,
                      chunk: int = 8) -> tuple[list[list[float]], list[list[float]]]:
    """Per-token log-probs of each response right after `prompt_ids` at `temperature`: over the whole
    vocabulary (free) and renormalised over `allowed[b][t]`, the allowed ids at each position (restricted), as
    models.token_logprobs computes them. The prompt is run once; its KV cache is repeated over a chunk of
    responses (right padding: a pad after a response's end never affects its positions)."""
    device = next(model.parameters()).device
    out = model(torch.tensor([prompt_ids], device=device), use_cache=True)
    first = out.logits[0, -1:].float() / temperature                                 # (1, V) predicts token 0
    free, restricted = [], []
    for i in range(0, len(responses), chunk):
        group = responses[i:i + chunk]
        width = max(len(r) for r in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)
        for b, r in enumerate(group):
            ids[b, :len(r)] = torch.tensor(r)
        cache = copy.deepcopy(out.past_key_values)
        cache.batch_repeat_interleave(len(group))
        logits = model(ids.to(device), past_key_values=cache, use_cache=True).logits.float() / temperature
        for b, r in enumerate(group):                                        # logits: (B, width, V)
            row = torch.cat([first, logits[b, :len(r) - 1]])                   # (len(r), V) predicts r
            target = torch.tensor(r, device=device)[:, None]
            free.append(torch.log_softmax(row, -1).gather(-1, target).squeeze(-1).tolist())
            keep = torch.zeros_like(row, dtype=torch.bool)
            for t, ok in enumerate(allowed[i + b]):
                keep[t, ok] = True
            masked = torch.log_softmax(row.masked_fill(~keep, float("-inf")), -1)
            restricted.append(masked.gather(-1, target).squeeze(-1).tolist())
    return free, restricted


def score_state(model, tokenizer, st: State, context: str | None, cfg: Config,
                args: InterveneArgs) -> dict | None:
    """Log-prob of the fixed response of the correct action (choice 2), free and restricted, and its rank by
    the primary measure among the admissible responses (None if the prompt is too long)."""
    prompt = (chat_ids(tokenizer, st.user_text) if context is None
              else teacher_prompt_ids(tokenizer, context, st.user_text))
    if len(prompt) > args.max_prompt_tokens:
        return None
    actions = st.admissible if args.rank else [st.correct]
    responses = [fixed_response(tokenizer, a) for a in actions]
    trie = action_trie(tokenizer, [envs.action_response(a) for a in st.admissible])  # the rollout's trie
    allowed = [allowed_per_position(trie, r) for r in responses]
    free, restricted = response_logprobs(model, prompt, responses, allowed,
                                         cfg.rollout.sampling.temperature or 1.0)
    primary = [sum(lp) for lp in (restricted if cfg.rollout.action_space == "admissible" else free)]
    c = actions.index(st.correct)
    return {"logp": primary[c], "logp_free": sum(free[c]), "logp_restricted": sum(restricted[c]),
            "tokens": len(responses[c]),
            "rank": 1 + sum(s > primary[c] for s in primary) if args.rank else None,
            "prompt_tokens": len(prompt)}


CONDITIONS = {  # name -> (state kind, teacher context of a state given the placebo trajectory)
    "fullpath_matched": ("matched", lambda st, other: router.teacher_context("trajectory", st.ref, None,
                                                                             st.signature)),
    "smrc_matched": ("matched", lambda st, other: router.teacher_context("smrc", st.ref, st.match,
                                                                         st.signature)),
    "placebo_matched": ("matched", lambda st, other: router.teacher_context("trajectory", other, None,
                                                                            st.signature)),
    "fullpath_mismatched": ("mismatched",
                            lambda st, other: router.teacher_context("trajectory", st.ref, None,
                                                                     st.signature)),
    "placebo_mismatched": ("mismatched",
                           lambda st, other: router.teacher_context("trajectory", other, None, st.signature)),
}
# the primary measure (restricted under the admissible action space) and free
MEASURES = ("logp", "logp_free")


# ------------------------------------------------------------------------------------------------------------
# Statistics and the report


def _ci(draws: list[float]) -> list[float]:
    return ([float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))] if draws
            else [float("nan")] * 2)


def bootstrap(a: np.ndarray, a_tasks: list[str], n: int, rng: np.random.Generator,
              c: np.ndarray | None = None, c_tasks: list[str] | None = None) -> dict:
    """Mean of `a` (or of a minus c, two independent groups of states) with percentile 95% CIs from resampling
    states, and from resampling tasks with all their states (a draw with no state of a group is skipped)."""
    stat = lambda x, y: x.mean() - (y.mean() if y is not None else 0.0)  # noqa: E731
    mean = float(stat(a, c))
    over_states = [stat(a[rng.integers(0, len(a), len(a))],
                        None if c is None else c[rng.integers(0, len(c), len(c))])
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
    return {"mean": mean, "ci_states": _ci(over_states), "ci_tasks": _ci(over_tasks),
            "task_draws_skipped": skipped}


def condition_row(states: list[State], scores: dict, name: str, idx: list[int], args: InterveneArgs,
                  rng: np.random.Generator) -> tuple[dict, dict]:
    """One condition's numbers over the states `idx`, and its per-state deltas by measure
    (for the differences)."""
    tasks = [states[i].task.task_id for i in idx]
    row, deltas = {"states": len(idx), "tasks": len(set(tasks))}, {}
    for m in MEASURES:
        deltas[m] = np.array([scores[(i, name)][m] - scores[(i, "none")][m] for i in idx])
        row[f"delta_{m}"] = bootstrap(deltas[m], tasks, args.bootstrap, rng)
        row[f"{m}_none"] = float(np.mean([scores[(i, "none")][m] for i in idx]))
        row[f"{m}_context"] = float(np.mean([scores[(i, name)][m] for i in idx]))
    if args.rank:
        for key, cond in (("none", "none"), ("context", name)):
            row[f"rank_{key}"] = float(np.mean([scores[(i, cond)]["rank"] for i in idx]))
            row[f"top1_{key}"] = float(np.mean([scores[(i, cond)]["rank"] == 1 for i in idx]))
        row["admissible"] = float(np.mean([len(states[i].admissible) for i in idx]))
    return row, deltas


def summarise(states: list[State], scores: dict, args: InterveneArgs, only: set[int] | None = None) -> dict:
    """Every condition over the states (those in `only` if given), A − C and the paired SMRC − FullPath."""
    rng = np.random.default_rng(args.seed)
    out, deltas = {}, {}
    for name, (kind, _) in CONDITIONS.items():
        of_kind = [i for i, st in enumerate(states) if st.kind == kind and (only is None or i in only)]
        idx = [i for i in of_kind if scores.get((i, name)) and scores.get((i, "none"))]
        if not idx:
            out[name] = {"states": 0, "over_length_skipped": len(of_kind)}
            continue
        out[name], d = condition_row(states, scores, name, idx, args, rng)
        out[name]["over_length_skipped"] = len(of_kind) - len(idx)
        deltas[name] = (d, [states[i].task.task_id for i in idx], idx)
    diffs = {}
    for m in MEASURES:
        if "fullpath_matched" in deltas and "fullpath_mismatched" in deltas:  # the paper's A - C
            (a, at, _), (c, ct, _) = deltas["fullpath_matched"], deltas["fullpath_mismatched"]
            diffs.setdefault("A - C: fullpath_matched - fullpath_mismatched", {})[m] = bootstrap(
                a[m], at, args.bootstrap, rng, c[m], ct)
        if "smrc_matched" in deltas and "fullpath_matched" in deltas:  # same states: paired
            (s, _, si), (f, _, fi) = deltas["smrc_matched"], deltas["fullpath_matched"]
            common = sorted(set(si) & set(fi))
            sd = np.array([s[m][si.index(i)] - f[m][fi.index(i)] for i in common])
            diffs.setdefault("smrc_matched - fullpath_matched (paired)", {})[m] = bootstrap(
                sd, [states[i].task.task_id for i in common], args.bootstrap, rng)
    return {"conditions": out, "differences": diffs}


def markdown(summary: dict, primary: str) -> str:
    f = lambda b: f"{b['mean']:+.3f} [{b['ci_states'][0]:+.3f}, {b['ci_states'][1]:+.3f}] / " \
                  f"[{b['ci_tasks'][0]:+.3f}, {b['ci_tasks'][1]:+.3f}]"  # noqa: E731
    lines = [f"| condition | states | tasks | Δ log p {primary} (CI states / CI tasks) | Δ log p free | "
             "rank none → ctx | top-1 none → ctx |", "|---|---|---|---|---|---|---|"]
    for name, r in summary["conditions"].items():
        if not r["states"]:
            lines.append(f"| {name} | 0 | - | - | - | - | - |")
            continue
        rank = f"{r['rank_none']:.2f} → {r['rank_context']:.2f}" if "rank_none" in r else "-"
        top1 = f"{r['top1_none']:.2f} → {r['top1_context']:.2f}" if "top1_none" in r else "-"
        lines.append(f"| {name} | {r['states']} | {r['tasks']} | {f(r['delta_logp'])} | "
                     f"{f(r['delta_logp_free'])} | {rank} | {top1} |")
    for name, b in summary["differences"].items():
        lines.append(f"| {name} | | | {f(b['logp'])} | {f(b['logp_free'])} | | |")
    return "\n".join(lines)


def score_all(model, tokenizer, states: list[State], refs: list[router.Trajectory], cfg: Config,
              args: InterveneArgs) -> dict:
    """{(state index, condition): score} for the `none` baseline and every condition of the state's kind."""
    placebo = {ref.task_id: refs[(i + 1) % len(refs)] for i, ref in enumerate(refs)}  # choice 4
    model.eval()
    scores = {}
    for i, st in enumerate(tqdm(states, desc="score")):
        scores[(i, "none")] = score_state(model, tokenizer, st, None, cfg, args)
        for name, (kind, context) in CONDITIONS.items():
            if st.kind == kind:
                scores[(i, name)] = score_state(model, tokenizer, st, context(st, placebo[st.task.task_id]),
                                                cfg, args)
    return scores


def report(result: dict) -> str:
    """The markdown report: what was run, the references, the states, the table(s)."""
    r, a, s = result["references"], result["args"], result["settings"]
    lines = [f"Fixed-state teacher intervention: model `{a['model']}`, {s['tasks_from']} `{a['split']}`, "
             f"{a['num_tasks']} tasks; settings of `{s['from']}` (action space {s['action_space']}, "
             f"require_think {s['require_think']}, history {s['history_length']}, T = {s['temperature']}).",
             f"References `{a['references']}`" + (f" ({a['attempts']} attempts, "
                                                  f"no success -> {a['no_success']})"
                                                  if a["references"] == "policy" else "") +
             f": {r['policy']} policy successes, {r['planner']} planner ({r['planner_fallback']} of them "
             f"fallbacks), {r['skipped_no_success']} skipped, {r['no_reference']} without any reference.",
             f"States: {result['states']['matched']} matched ({r['matched_not_admissible']} reference "
             f"positions replaced: next action not admissible), {result['states']['mismatched']} mismatched "
             f"({result['mismatch_candidates_tried']} mismatch candidates tried; rejected: "
             f"{result['rejected']}).",
             f"Δ = log p(fixed response of the correct action | teacher context + prompt) "
             f"− log p(· | prompt); primary measure `{result['primary']}`; "
             f"95% percentile-bootstrap CIs over states / over tasks.", "",
             result["table"]]
    if "table_policy_references" in result:
        lines += ["", "Only the states of tasks whose reference is a policy success:", "",
                  result["table_policy_references"]]
    return "\n".join(lines) + "\n"


def run_intervention(model, tokenizer, args: InterveneArgs) -> dict:
    t0 = time.perf_counter()
    cfg = run_config(args)
    states, rejected, refs, counts = build_states(model, tokenizer, args, cfg)
    if len(refs) < 2:
        raise SystemExit(f"error: the placebo needs references of at least two tasks, and {len(refs)} of "
                         f"--num-tasks {args.num_tasks} have one; use --num-tasks >= 2")
    t_states = time.perf_counter() - t0
    print(f"[intervene] references {counts}; {sum(s.kind == 'matched' for s in states)} matched and "
          f"{sum(s.kind == 'mismatched' for s in states)} mismatched states in {t_states:.0f}s; rejected "
          f"mismatch candidates: {rejected}", flush=True)
    scores = score_all(model, tokenizer, states, refs, cfg, args)
    primary = "restricted" if cfg.rollout.action_space == "admissible" else "free"
    summary = summarise(states, scores, args)
    counts_states = {k: sum(st.kind == k for st in states) for k in ("matched", "mismatched")}
    counts_states["mismatched_correct_elsewhere_in_reference"] = sum(
        st.note.get("correct_elsewhere_in_reference", False) for st in states)
    result = {"args": asdict(args), "primary": primary,
              "settings": {"from": args.model if Path(args.model, "smrc_config.json").is_file() else
                           f"--preset {args.preset}", "env": cfg.env, "tasks_from": f"{args.source} ALFWorld"
                           if cfg.env == "alfworld" else f"{cfg.webshop.backend} WebShop",
                           "action_space": cfg.rollout.action_space,
                           "require_think": cfg.env_cfg.require_think,
                           "history_length": cfg.env_cfg.history_length, "max_steps": cfg.env_cfg.max_steps,
                           "temperature": cfg.rollout.sampling.temperature},
              "references": counts, "reference_steps": {r.task_id: [reference_source(r), len(r.steps)]
                                                        for r in refs},
              "states": counts_states, "tasks": len(refs), "rejected": rejected,
              "mismatch_candidates_tried": counts_states["mismatched"] + sum(rejected.values()),
              **summary, "table": markdown(summary, primary)}
    policy_only = {i for i, st in enumerate(states) if reference_source(st.ref) == "policy"}
    if policy_only and len(policy_only) < len(states):  # a mix of policy and planner references
        result["policy_references_only"] = summarise(states, scores, args, only=policy_only)
        result["table_policy_references"] = markdown(result["policy_references_only"], primary)
    result.update(seconds_states=t_states, seconds_total=time.perf_counter() - t0, state_list=[
        {"task_id": st.task.task_id, "kind": st.kind, "reference": reference_source(st.ref),
         "actions": st.actions, "correct": st.correct, "admissible": len(st.admissible), **st.note,
         "scores": {n: scores.get((i, n)) for n in ["none", *CONDITIONS] if (i, n) in scores}}
        for i, st in enumerate(states)])
    text = report(result)
    print(text, flush=True)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1, default=str))
    Path(args.output).with_suffix(".md").write_text(text)
    print(f"[intervene] wrote {args.output}", flush=True)
    return result
