"""Tests of the fixed-state teacher intervention (analysis/intervention.py, analysis/intervention_states.py),
CPU only.

- the cached scorer equals a plain forward (free) and the trainer's own teacher scorer under the admissible
  mask (restricted), so the intervention measures what the trainer's teacher computes;
- policy references: a task the policy solves gets a reference that is a real success (it replays to a win
  through a fresh env, with the same signatures); a task it never solves falls back to the planner (counted)
  or is skipped (counted);
- end to end on the tiny model: finite numbers, CIs containing the mean, every task accounted for,
  deterministic;
- WebShop (`env="webshop"`, the embedded shop and its oracle): matched states' correct action is the
  reference's next action, mismatched states are off the reference and their correct action is the oracle's
  first action from there (Back to Search where the page has no search bar), never what the reference does
  from the most similar points; every candidate is kept or counted, the policy's success is the reference and
  the oracle the counted fallback, and the whole report runs on the untrained tiny model.

Run: .venv/bin/python -m pytest tests/test_intervention.py -q
"""
import dataclasses
import math
import re

import pytest
import torch

import envs
import rollout
import teacher
from analysis import intervention, intervention_states
from models import Generation, action_trie, allowed_per_position


def test_cached_scores_equal_a_plain_forward_and_the_trainers_teacher(tiny):
    model, tok = tiny
    prompt = tok.encode("You are at cabinet 1. Your admissible actions", add_special_tokens=False)
    admissible = ["go to fridge 1", "take mug 2 from cabinet 1", "look"]
    responses = [intervention.fixed_response(tok, a) for a in admissible]
    trie = action_trie(tok, [envs.action_response(a) for a in admissible])
    allowed = [allowed_per_position(trie, r) for r in responses]
    free, restricted = intervention.response_logprobs(model.eval(), prompt, responses, allowed, chunk=2)
    scorer = teacher.hf_logprob_fn(model, tok.pad_token_id, micro_batch_tokens=4096)
    trainer = scorer([prompt] * len(responses), responses, allowed)
    for r, f, lp, ref in zip(responses, free, restricted, trainer):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + r])).logits[0].float()
        plain = (torch.log_softmax(logits, -1)[len(prompt) - 1:-1]
                 .gather(-1, torch.tensor(r)[:, None]).squeeze(-1))
        assert f == pytest.approx(plain.tolist(), abs=1e-4)
        assert lp == pytest.approx(ref, abs=1e-4)
    assert math.exp(sum(sum(lp) for lp in restricted[:1])) < 1  # three responses share the mass
    # a distribution over them
    assert sum(math.exp(sum(lp)) for lp in restricted) == pytest.approx(1.0, abs=1e-4)


class PlanEngine:
    """A stand-in policy: plays the planner's solution of the task whose goal is in the prompt,
    'look' otherwise."""

    def __init__(self, tokenizer, plans: dict[str, list[str]]):
        self.tokenizer, self.plans = tokenizer, plans

    def generate(self, prompts, tries=None):
        out = []
        for ids in prompts:
            text = self.tokenizer.decode(ids)
            taken = re.search(r"already taken (\d+) step", text)
            step = int(taken.group(1)) if taken else 0
            plan = next((p for goal, p in self.plans.items() if goal in text), [])
            action = plan[step] if step < len(plan) else "look"
            response = intervention.fixed_response(self.tokenizer, action)
            out.append(Generation(response, [0.0] * len(response), envs.action_response(action), False))
        return out


def test_policy_references_are_real_successes_and_the_fallback_is_counted(tiny):
    _, tok = tiny
    args = intervention.InterveneArgs(model="tiny", num_tasks=2, attempts=2)
    cfg = intervention.run_config(args)
    games = intervention_states.env_config(args, cfg)
    tasks = envs.load_tasks(games, "train")[:2]
    env = envs.make_env(dataclasses.replace(games, max_steps=10_000))
    solved = tasks[0]
    planned = envs.plan(games, solved, [], 120.0)
    assert planned.status == "ok", (planned.status, planned.message)
    plan = planned.actions
    engine = PlanEngine(tok, {env.reset(solved).goal: plan})
    policy = intervention_states.policy_references(None, tok, tasks, dataclasses.replace(cfg, alfworld=games),
                                                   attempts=2, seed=0, engine=engine)
    assert set(policy) == {solved.task_id}  # the other task's attempts only 'look'
    ref = policy[solved.task_id]
    assert ref.success and intervention_states.reference_source(ref) == "policy"
    assert [s.action for s in ref.steps] == plan
    replayed = rollout.replay(env, solved, [s.action for s in ref.steps])
    assert replayed.won and [t.step.signature for t in replayed.turns] == [s.signature for s in ref.steps]

    refs, counts = intervention_states.task_references(policy, env, tasks, args)
    assert refs[solved.task_id] is ref
    assert intervention_states.reference_source(refs[tasks[1].task_id]) == "planner"
    assert (counts["policy"], counts["planner"], counts["planner_fallback"],
            counts["skipped_no_success"]) == (1, 1, 1, 0)
    refs, counts = intervention_states.task_references(policy, env, tasks,
                                                       dataclasses.replace(args, no_success="skip"))
    assert (set(refs) == {solved.task_id}
            and (counts["planner_fallback"], counts["skipped_no_success"]) == (0, 1))
    refs, counts = intervention_states.task_references(policy, env, tasks,
                                                       dataclasses.replace(args, references="planner"))
    assert all(intervention_states.reference_source(r) == "planner" for r in refs.values())
    assert (counts["policy"], counts["planner"], counts["planner_fallback"]) == (0, 2, 0)
    env.close()


def test_intervention_on_tiny_is_finite_with_cis_and_deterministic(tiny, tmp_path):
    model, tok = tiny
    args = intervention.InterveneArgs(num_tasks=2, attempts=2, matched_per_task=2, mismatched_per_task=1,
                                      tries_per_task=8, bootstrap=200, output=str(tmp_path / "iv.json"))
    first = intervention.run_intervention(model, tok, args)
    r = first["references"]
    assert r["policy"] + r["planner"] + r["skipped_no_success"] + r["no_reference"] == 2
    # with policy references every planner reference is a fallback
    assert r["planner_fallback"] == r["planner"]
    assert (first["primary"] == "restricted" and first["states"]["matched"] == 4
            and first["states"]["mismatched"] >= 1)
    assert (first["mismatch_candidates_tried"]
            == first["states"]["mismatched"] + sum(first["rejected"].values()))
    for name, row in first["conditions"].items():
        if not row["states"]:
            continue
        for key in ("delta_logp", "delta_logp_free"):
            b = row[key]
            assert math.isfinite(b["mean"]), (name, key)
            assert b["ci_states"][0] <= b["mean"] <= b["ci_states"][1], (name, key, b)
            assert b["ci_tasks"][0] <= b["ci_tasks"][1]
        assert 1 <= row["rank_context"] <= row["admissible"]
    assert set(first["differences"]["A - C: fullpath_matched - fullpath_mismatched"]) == {"logp", "logp_free"}
    for st in first["state_list"]:
        assert st["reference"] == first["reference_steps"][st["task_id"]][0]
        assert st["scores"]["none"]["logp"] <= 0.0 and st["scores"]["none"]["logp_restricted"] >= \
            st["scores"]["none"]["logp_free"]  # renormalising over fewer tokens never lowers a log-prob
        if st["kind"] == "mismatched":
            # the reference is wrong from the similar points
            assert st["correct"] not in st["reference_similar"]
    second = intervention.run_intervention(model, tok, args)
    assert second["conditions"] == first["conditions"] and second["differences"] == first["differences"]


WEBSHOP = dict(env="webshop", preset="tiny", split="train")


def most_similar_actions(ref, signature) -> set[str]:
    """The reference's actions at the positions sharing the most non-task signature fields (a naive loop)."""
    shared = [sum(a == b for (n, a), (_, b) in zip(signature, s.signature) if n != "task") for s in ref.steps]
    return {s.action for s, k in zip(ref.steps, shared) if k == max(shared)}


def test_webshop_states_follow_the_reference_and_the_oracle():
    args = intervention.InterveneArgs(**WEBSHOP, references="planner", num_tasks=3, matched_per_task=50,
                                      mismatched_per_task=50, tries_per_task=12)
    cfg = intervention.run_config(args)
    states, rejected, refs, counts = intervention_states.build_states(None, None, args, cfg)
    # as build_states
    env_cfg = dataclasses.replace(intervention_states.env_config(args, cfg), max_steps=10_000)
    assert cfg.env == "webshop" and len(refs) == 3 and counts["planner"] == 3
    assert {st.task.env for st in states} == {"webshop"}
    # every position of a reference but its typed search
    # (not admissible: only the placeholder is) is a matched state
    matched = [st for st in states if st.kind == "matched"]
    assert counts["matched_not_admissible"] == 3 and len(matched) == sum(len(r.steps) - 1 for r in refs)
    env = envs.make_env(env_cfg)
    for st in matched:
        j = st.note["position"]
        assert st.correct == st.ref.steps[j].action and st.correct in st.admissible and j > 0
        assert st.signature == st.ref.steps[j].signature == rollout.replay(env, st.task, st.actions).signature
        assert st.user_text.startswith("\nYou are an expert autonomous agent operating in the WebShop")
    # mismatched: off the path, the oracle's first action, wrong for the reference at its most similar points
    mismatched = [st for st in states if st.kind == "mismatched"]
    assert mismatched and len(mismatched) + sum(rejected.values()) == 3 * args.tries_per_task
    assert rejected.get("on_reference_path", 0) > 0 and rejected.get("reference_action_correct", 0) > 0
    for st in mismatched:
        assert st.signature not in {s.signature for s in st.ref.steps}
        first = envs.plan(env_cfg, st.task, st.actions, 30.0).actions[0]
        assert st.correct == (first if first in st.admissible else "click[back to search]")
        assert st.correct in st.admissible and st.correct not in most_similar_actions(st.ref, st.signature)
    other_products = [st for st in mismatched if dict(st.signature)["page"] == "item"
                      and dict(st.signature)["item"] not in {dict(s.signature)["item"] for s in st.ref.steps}]
    # the paper's example
    assert other_products and {st.correct for st in other_products} == {"click[back to search]"}
    env.close()


def test_webshop_policy_references_and_the_oracle_fallback(tiny):
    _, tok = tiny
    args = intervention.InterveneArgs(**WEBSHOP, num_tasks=2, attempts=2)
    cfg = intervention.run_config(args)
    env_cfg = intervention_states.env_config(args, cfg)
    tasks = envs.load_tasks(env_cfg, "train")[:2]
    env = envs.make_env(dataclasses.replace(env_cfg, max_steps=10_000))
    solved = tasks[1]
    plan = envs.plan(env_cfg, solved, [], 30.0).actions
    engine = PlanEngine(tok, {env.reset(solved).goal: plan})
    policy = intervention_states.policy_references(None, tok, tasks,
                                                   dataclasses.replace(cfg, webshop=env_cfg), attempts=2,
                                                   seed=0, engine=engine)
    assert set(policy) == {solved.task_id} and [s.action for s in policy[solved.task_id].steps] == plan
    refs, counts = intervention_states.task_references(policy, env, tasks, args)
    assert intervention_states.reference_source(refs[solved.task_id]) == "policy"
    assert (intervention_states.reference_source(refs[tasks[0].task_id]) == "planner"
            and refs[tasks[0].task_id].success)
    assert (counts["policy"], counts["planner"], counts["planner_fallback"]) == (1, 1, 1)
    env.close()
    with pytest.raises(SystemExit, match="--preset tiny"):  # the learn preset's WebShop asks for reasoning
        intervention.run_config(dataclasses.replace(args, preset="learn"))


def test_intervention_runs_end_to_end_on_webshop(tiny, tmp_path):
    model, tok = tiny
    args = intervention.InterveneArgs(**WEBSHOP, model="tiny", num_tasks=2, attempts=1, matched_per_task=2,
                                      mismatched_per_task=2, tries_per_task=6, bootstrap=100,
                                      output=str(tmp_path / "ws.json"))
    result = intervention.run_intervention(model, tok, args)
    r = result["references"]
    assert result["settings"]["env"] == "webshop" and result["primary"] == "restricted"
    assert r["policy"] + r["planner"] == 2 and r["planner_fallback"] == r["planner"]
    assert result["states"]["matched"] == 4 and result["states"]["mismatched"] >= 1
    assert (result["mismatch_candidates_tried"]
            == result["states"]["mismatched"] + sum(result["rejected"].values()))
    for name in ("fullpath_matched", "smrc_matched", "fullpath_mismatched"):
        row = result["conditions"][name]
        assert row["states"] > 0 and math.isfinite(row["delta_logp"]["mean"])
    for st in result["state_list"]:
        assert st["task_id"].startswith("webshop/") and math.isfinite(st["scores"]["none"]["logp"])
        if st["kind"] == "mismatched":
            assert st["correct"] not in st["reference_similar"]
    assert "embedded WebShop `train`" in (tmp_path / "ws.md").read_text()


def test_missing_official_data_is_one_error_line_before_the_model_loads(tmp_path):
    """`intervene --source official` without ALFWORLD_DATA: one `error:` line naming the variable, no
    traceback, and nothing loaded (the embedded model would be built first otherwise)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = ({k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"}
           | {"SMRC_CACHE": str(tmp_path / "cache")})
    proc = subprocess.run([sys.executable, "evaluate.py", "intervene", "--model", "tiny", "--source",
                           "official", "--split", "train", "--num-tasks", "2"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "ALFWORLD_DATA" in proc.stderr
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("tiny-*"))  # no model built
