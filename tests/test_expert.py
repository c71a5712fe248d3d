"""The observation-feasible expert, the warm-start examples built from it, and the memoised text grammar.

Run: pytest tests/test_expert.py -q
"""
import random
from collections import Counter

import pytest
import torch

import envs
import router
from embedded import warmstart
from environments import alfworld, alfworld_expert
from environments.alfworld import AlfworldConfig

CFG = AlfworldConfig(source="generated", room_size="small", num_train_games=12, max_steps=60,
                     require_think=False)


@pytest.fixture(scope="module")
def games():
    env = envs.make_env(CFG)
    yield env, envs.load_tasks(CFG, "train")
    env.close()


def test_expert_wins_every_small_game_with_admissible_actions_only(games):
    env, tasks = games
    for task in tasks:  # all six task types, twice
        expert = alfworld_expert.Expert(alfworld_expert.goal_of(task))
        res, steps = env.reset(task), 0
        while not res.done:
            action = expert.act(res.admissible)
            assert action in res.admissible, (task.task_id, action)  # it never guesses a hidden command
            res, steps = env.step(action), steps + 1
        assert res.won and steps <= 20, (task.task_id, steps)  # 20 = the learn preset's step limit


def test_expert_uses_no_hidden_state(games):
    """Its first move depends only on what the prompt shows: two games with the same visible start and goal
    type get the same first action, whatever is hidden inside the receptacles."""
    env, tasks = games
    res = env.reset(tasks[0])
    first = alfworld_expert.Expert(alfworld_expert.goal_of(tasks[0])).act(res.admissible)
    shuffled = alfworld_expert.Expert(alfworld_expert.goal_of(tasks[0])).act(list(reversed(res.admissible)))
    assert first == shuffled and first.startswith("go to ")


def test_expert_follow_and_label_track_a_reference_without_acting(games):
    """Along the planner's path the expert's label is its own choice in that state (not the plan's), and
    `label` never changes its state: only `follow` does."""
    env, tasks = games
    task = tasks[2]  # clean task: the planner walks straight to the sink basin, the expert searches first
    plan = envs.plan(CFG, task, [], 60).actions
    expert = alfworld_expert.Expert(alfworld_expert.goal_of(task))
    res, labels = env.reset(task), []
    for action in plan:
        labels.append(expert.label(res.admissible))
        assert expert.label(res.admissible) == labels[-1]  # label is pure
        expert.follow(action)
        res = env.step(action)
    assert res.won and labels[0] != plan[0] and labels[0].startswith("go to ")
    took = next(i for i, a in enumerate(plan) if a.startswith("take "))
    assert labels[took + 1] == plan[took + 1]  # it knows it holds the object (followed): it cleans it there


def test_reverse_order_expert_wins_and_differs(games):
    env, tasks = games
    differs = 0
    for task in tasks:
        ep, labels = warmstart.labelled_episode(env, task, lambda adm, label, e=alfworld_expert.Expert(
            alfworld_expert.goal_of(task), reverse=True): e.act(adm))
        assert ep.won, task.task_id
        differs += any(t.step.action != label for t, label in zip(ep.turns, labels))
    assert differs >= len(tasks) // 2  # another search order: other choices than the default expert's


def test_warm_start_context_examples_target_the_reference_at_matched_states(games):
    """Every context example is a matched state -> the reference's next action (its candidate); the same state
    also has a plain example with the expert's own label, which differs from the target for some states."""
    env, tasks = games
    recipe = warmstart.Recipe(games=1, epochs=1, context_formats=4)
    task = tasks[2]
    examples = warmstart.game_examples(env, task, recipe, seed=0, plan=envs.plan(CFG, task, [], 60).actions)
    plain = {e.user_text: e.action for e in examples if not e.format}
    context = [e for e in examples if e.format]
    assert context and {e.format for e in context} == set(warmstart.CONTEXTS)
    for e in context:
        # the teacher's message holds the ordinary prompt
        ordinary = next(p for p in plain if p in e.user_text)
        # the plain example of the same state keeps the expert's label
        assert plain[ordinary] == e.plain_label
        assert f"'{e.action}'" in ordinary.split("Your admissible actions", 1)[1]
        if "candidate" in router.context_blocks(e.format):  # the candidate and smrc formats
            assert f": <action>{e.action}</action>" in e.user_text  # the candidate, spelled as the response
    assert any(e.action != e.plain_label for e in context)  # reading is the only way to be right there
    again = warmstart.game_examples(env, task, recipe, seed=0, plan=envs.plan(CFG, task, [], 60).actions)
    assert again == examples  # deterministic: the build's examples do not depend on the run
    stats = warmstart.context_stats(examples)
    assert stats["context"] == len(context) and 0 < stats["target_differs"] < 1
    assert ({k for k in stats if k.startswith("phase=")}
            <= {"phase=search", "phase=transform", "phase=deliver"})


def test_identical_examples_train_once_with_their_count_as_weight():
    """Copies of an example become one example weighing their count (a differing context example `repeats`
    times more); batches pack the counted copies up to the budget, and every example lands in exactly one
    batch."""
    E = warmstart.Example
    plain, ctx_same = E("s1", "go to a"), E("s1 ctx", "go to a", "summary", "search", "go to a")
    ctx_diff = E("s1 ctx2", "go to b", "trajectory", "search", "go to a")
    examples, weights = warmstart.weighted([plain, ctx_diff, plain, ctx_same, plain, ctx_diff],
                                           differing_repeats=3)
    assert examples == [plain, ctx_diff, ctx_same] and weights == [3, 2 * 3, 1]
    lengths, weights = [10, 10, 20, 20, 30, 40], [1, 2, 3, 1, 1, 4]
    batches = warmstart._batches(list(range(6)), lengths, weights, budget=60, rng=random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(6))
    for b in batches:  # within budget, counting copies at the batch's longest length (or a single example)
        assert len(b) == 1 or sum(weights[i] for i in b) * max(lengths[i] for i in b) <= 60


def test_training_plan_visits_each_example_its_own_number_of_epochs():
    """Context examples at 1 epoch and plain ones at 1.8, over 2 passes: each context example is in exactly
    one pass (half of them in each), each plain one in one or two (1.8 on average, 90% of them in each
    pass)."""
    n = 2000
    epochs = [1.0 if i % 2 else 1.8 for i in range(n)]
    plan = warmstart.training_plan([10] * n, [1] * n, epochs, budget=100, rng=random.Random(0))
    visits = Counter(i for b in plan for i in b)
    assert all(visits[i] == 1 for i in range(1, n, 2))
    plain = [visits[i] for i in range(0, n, 2)]
    assert set(plain) == {1, 2} and abs(sum(plain) / len(plain) - 1.8) < 0.05
    first_pass = {i for b in plan[:len(plan) // 2] for i in b}  # every batch holds 10 examples here
    assert abs(sum(i % 2 for i in first_pass) / (n / 2) - 0.5) < 0.06


def test_build_logprobs_equal_the_trainers(tiny):
    """The build's [prompt | response | padding] layout (causal attention, no padding mask) gives the response
    tokens the log-probs of the trainer's left-padded batch, and 0 at padding."""
    from models import collate, token_logprobs
    model, tok = tiny
    rng = random.Random(0)
    rows = [([rng.randrange(5, 900) for _ in range(n)], [rng.randrange(5, 900) for _ in range(m)])
            for n, m in ((30, 4), (11, 7), (23, 1))]
    with torch.no_grad():
        logp, mask = warmstart.response_logprobs(model, rows, tok.pad_token_id)
        expected, _ = token_logprobs(model, collate([p for p, _ in rows], [r for _, r in rows],
                                                    tok.pad_token_id))
    assert mask.tolist() == [[1] * m + [0] * (7 - m) for m in (4, 7, 1)]
    torch.testing.assert_close(logp, expected, atol=1e-5, rtol=1e-5)
    assert (logp[mask == 0] == 0).all() and (logp[mask == 1] < 0).all()


def test_memoised_grammar_gives_the_same_observations(games, monkeypatch):
    env, tasks = games
    expert_env = envs.make_env(CFG)
    with_memo = [o for o in _observations(expert_env, tasks[5])]
    expert_env.close()
    from textworld.envs.pddl import textgen
    assert getattr(textgen._parse_and_convert, "memoized", False)
    monkeypatch.setattr(textgen, "_parse_and_convert", textgen._parse_and_convert.original)
    monkeypatch.setattr(alfworld, "memoize_text_grammar", lambda: None)
    plain_env = envs.make_env(CFG)
    assert _observations(plain_env, tasks[5]) == with_memo
    plain_env.close()


def test_memoised_translation_gives_the_same_observations(games, monkeypatch):
    """A game's second reset reuses its PDDL translation, and plays exactly as without the memo."""
    import fast_downward
    env, tasks = games
    memo_env = envs.make_env(CFG)
    with_memo = [_observations(memo_env, tasks[3]) for _ in range(2)]
    memo_env.close()
    assert (getattr(fast_downward.pddl2sas, "memoized", False)
            and fast_downward.pddl2sas.cache_info().hits >= 2)
    monkeypatch.setattr(fast_downward, "pddl2sas", fast_downward.pddl2sas.original)
    monkeypatch.setattr(alfworld, "memoize_pddl_translation", lambda: None)
    plain_env = envs.make_env(CFG)
    assert [_observations(plain_env, tasks[3]) for _ in range(2)] == with_memo
    plain_env.close()


def _observations(env, task) -> list[str]:
    steps, res = alfworld_expert.play(env, task, random.Random(0), explore=0.5)
    return [r.observation for r, _, _ in steps] + [res.observation]


def test_tiny_tokenizer_gives_every_object_and_receptacle_name_one_token(tiny, games):
    """The warm start copies the goal's object into "take X from Y": each name must be one token (a name split
    into five byte pairs made the tiny agent take whatever it saw)."""
    from environments.alfworld_games import CAN_CONTAIN
    _, tok = tiny
    names = sorted({n.lower() for r, objs in CAN_CONTAIN.items() for n in (r, *objs)})
    split = [n for n in names if len(tok(" " + n, add_special_tokens=False)["input_ids"]) != 1]
    assert not split, f"names split into several tokens: {split}"
    _, tasks = games
    for task in tasks:  # the names as the games' own goals write them
        goal = alfworld_expert.goal_of(task)
        assert len(tok(" " + goal.obj, add_special_tokens=False)["input_ids"]) == 1, goal.obj


@pytest.mark.parametrize("name", ["tiny", "tiny-agent-quick"])
def test_concurrent_resolvers_build_a_cache_entry_once(tmp_path, monkeypatch, name):
    """Resolvers of one embedded model at the same time (pytest workers, sweep children) wait for one build:
    the tiny model (tiny.model_dir) and a warm-start recipe (warmstart.resolve) both go through
    tiny.build_once."""
    import os
    import threading
    import time
    from embedded import tiny, warmstart
    monkeypatch.setenv("SMRC_CACHE", str(tmp_path))
    built = []

    # stands in for the build (seconds to minutes): the lock is what is tested
    def build(path, *recipe, seed=0):
        built.append(path)
        time.sleep(0.5)
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")

    monkeypatch.setattr(tiny, "build", build)
    monkeypatch.setattr(warmstart, "build_tiny_agent", build)
    paths = []
    resolve = lambda: paths.append(warmstart.resolve(name))  # noqa: E731
    threads = [threading.Thread(target=resolve) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and len(paths) == 3 and len(set(paths)) == 1
    assert os.path.exists(os.path.join(paths[0], "config.json"))
