"""Tests of the ALFWorld game generator (environments/alfworld_games.py) against the real engine and its
planner.

Every generated task type is solved by the engine's Fast Downward planner and the replayed plan wins; one
real-size game too. Generation is deterministic, idempotent, and train/eval seeds are disjoint.
Run: .venv/bin/python -m pytest tests/test_alfworld_games.py -q
"""
import importlib.util
import json
import os
import re

import pytest

import envs
from environments import alfworld_games

pytestmark = pytest.mark.skipif(importlib.util.find_spec("alfworld") is None or
                                importlib.util.find_spec("textworld") is None,
                                reason="alfworld not installed")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("alfworld_gen"))


@pytest.fixture(scope="module")
def small_train(cache_dir):
    return alfworld_games.generate("train", 6, "small", seed=0, cache_dir=cache_dir)


def _counts(problem: str) -> tuple[int, int]:
    objects = problem.split("(:init", 1)[0]  # declarations only (the goal also says "?o - object")
    return len(re.findall(r"\w - receptacle\n", objects)), len(re.findall(r"\w - object\n", objects))


def test_generate_is_deterministic_and_idempotent(cache_dir, small_train):
    stamps = [os.stat(p).st_mtime_ns for p in small_train]
    again = alfworld_games.generate("train", 6, "small", seed=0, cache_dir=cache_dir)
    assert again == small_train
    assert [os.stat(p).st_mtime_ns for p in again] == stamps  # same content hash -> not rewritten
    game, traj = alfworld_games.make_game(123, "pick_two_obj_and_place", "small")
    assert (game, traj) == alfworld_games.make_game(123, "pick_two_obj_and_place", "small")
    assert (game["pddl_problem"]
            != alfworld_games.make_game(124, "pick_two_obj_and_place", "small")[0]["pddl_problem"])


def test_every_task_type_and_game_file_fields(small_train):
    assert [p.split(os.sep)[-2].split("-")[0] for p in small_train] == list(alfworld_games.TASK_TYPES)
    for path in small_train:
        with open(path) as f:
            game = json.load(f)
        with open(os.path.join(os.path.dirname(path), "traj_data.json")) as f:
            traj = json.load(f)
        assert (set(game) == {"pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"}
                and game["solvable"])
        assert "UNKNOWN GOAL" not in game["grammar"]
        assert f"Your task is to: {traj['turk_annotations']['anns'][0]['task_desc']}." in game["grammar"]
        assert os.path.basename(os.path.dirname(path)).startswith(
            f"{traj['task_type']}-{traj['pddl_params']['object_target']}-None-")
        n_recep, n_obj = _counts(game["pddl_problem"])
        assert 4 <= n_recep <= 8 and 2 <= n_obj <= 8, (path, n_recep, n_obj)


def test_train_and_eval_are_disjoint():
    train = {alfworld_games.game_seed(0, "train", i) for i in range(1000)}
    assert not train & {alfworld_games.game_seed(0, "eval", i) for i in range(1000)}
    problems = {alfworld_games.make_problem(s, "pick_and_place_simple", "small")[0].split("\n", 1)[1]
                for s in list(train)[:30]}
    evals = {alfworld_games.make_problem(alfworld_games.game_seed(0, "eval", i), "pick_and_place_simple",
                                         "small")[0].split("\n", 1)[1] for i in range(30)}
    assert not problems & evals


def _solve(env, task, planner_timeout_s=60.0):
    first = env.reset(task)
    assert not first.won and not first.done
    result = envs.plan(env.cfg, task, [], planner_timeout_s)
    assert result.status == "ok" and result.actions, result
    for action in result.actions:
        r = env.step(action)
    return r, result


def test_planner_solves_every_small_task_type(small_train):
    from environments.alfworld import AlfworldConfig
    env = envs.make_env(AlfworldConfig())
    for i, path in enumerate(small_train):
        task = envs.Task(f"alfworld/gen-train/{i:05d}", alfworld_games.TASK_TYPES[i], "alfworld", path)
        r, plan = _solve(env, task)
        assert r.won and r.done and r.reward == 10.0, (task, plan.actions, r.observation)


def test_real_size_game_is_in_range_and_solvable(cache_dir):
    from environments.alfworld import AlfworldConfig
    paths = alfworld_games.generate("eval", 4, "real", seed=0, cache_dir=cache_dir)
    with open(paths[3]) as f:
        n_recep, n_obj = _counts(json.load(f)["pddl_problem"])
    assert 15 <= n_recep <= 25 and 20 <= n_obj <= 40, (n_recep, n_obj)
    task = envs.Task("alfworld/gen-eval/00003", alfworld_games.TASK_TYPES[3], "alfworld", paths[3])
    r, _ = _solve(envs.make_env(AlfworldConfig()), task)
    assert r.won
