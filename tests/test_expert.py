"""The observation-feasible expert, the warm-start examples built from it, and the memoised text grammar.

Run: pytest tests/test_expert.py -q
"""
import random

import pytest

import envs
import router
from embedded import warmstart
from environments import alfworld, alfworld_expert
from environments.alfworld import AlfworldConfig

CFG = AlfworldConfig(source="generated", room_size="small", num_train_games=12, max_steps=60, require_think=False)


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
    """Its first move depends only on what the prompt shows: two games with the same visible start and goal type
    get the same first action, whatever is hidden inside the receptacles."""
    env, tasks = games
    res = env.reset(tasks[0])
    first = alfworld_expert.Expert(alfworld_expert.goal_of(tasks[0])).act(res.admissible)
    shuffled = alfworld_expert.Expert(alfworld_expert.goal_of(tasks[0])).act(list(reversed(res.admissible)))
    assert first == shuffled and first.startswith("go to ")


def test_warm_start_examples_are_demonstrations_and_matched_contexts(games):
    env, tasks = games
    recipe = warmstart.Recipe(games=1, epochs=1, context_share=1.0)
    examples = warmstart.game_examples(env, tasks[2], recipe, seed=0)
    plain = [(p, a) for p, a in examples if not p.startswith("[Privileged")]
    conditioned = [(p, a) for p, a in examples if p.startswith("[Privileged")]
    assert plain and conditioned
    for prompt, action in conditioned:  # the label is the candidate of the structured match the context shows
        assert router.CLOSING_TEMPLATE in prompt and "Your admissible actions" in prompt
        assert f"'{action}'" in prompt.split("Your admissible actions", 1)[1]


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


def _observations(env, task) -> list[str]:
    steps, res = alfworld_expert.play(env, task, random.Random(0), explore=0.5)
    return [r.observation for r, _, _ in steps] + [res.observation]


def test_tiny_tokenizer_gives_every_object_and_receptacle_name_one_token(tiny, games):
    """The warm start copies the goal's object into "take X from Y": each name must be one token (a name split into
    five byte pairs made the tiny agent take whatever it saw)."""
    from environments.alfworld_games import CAN_CONTAIN
    _, tok = tiny
    names = sorted({n.lower() for r, objs in CAN_CONTAIN.items() for n in (r, *objs)})
    split = [n for n in names if len(tok(" " + n, add_special_tokens=False)["input_ids"]) != 1]
    assert not split, f"names split into several tokens: {split}"
    _, tasks = games
    for task in tasks:  # the names as the games' own goals write them
        goal = alfworld_expert.goal_of(task)
        assert len(tok(" " + goal.obj, add_special_tokens=False)["input_ids"]) == 1, goal.obj
