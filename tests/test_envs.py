"""Tests of envs.py and environments/{alfworld,planner}.py on the real ALFWorld engine (generated games, and
the official sample).

Covers: intro text and admissible actions, 'Nothing happens.', rewards and the step limit, state signatures
(equal for equal states reached by different paths, different when any documented field differs), the history
key, prompts, the action-parsing table, the clear DataError, the official sample (loads, planner solves it,
old `put X in/on Y` grammar). The env pool, the planner process and action normalisation's time:
test_envs_pool.py.
Run: .venv/bin/python -m pytest tests/test_envs.py -q   (official-sample tests use $ALFWORLD_DATA, else
../shared/alfworld_data, and are skipped when neither holds json_2.1.1/train)
"""
import importlib.util
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import envs
from environments import alfworld
from environments.alfworld import AlfworldConfig, AlfworldEnv
from environments.planner import Planner

pytestmark = pytest.mark.skipif(importlib.util.find_spec("alfworld") is None or
                                importlib.util.find_spec("textworld") is None,
                                reason="alfworld not installed")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFFICIAL = next((d for d in (alfworld.ALFWORLD_DATA, os.path.join(REPO, "..", "shared", "alfworld_data"))
                 if d and os.path.isdir(os.path.join(d, "json_2.1.1", "train"))), None)
needs_official = pytest.mark.skipif(OFFICIAL is None,
                                    reason="no official ALFWorld sample (set ALFWORLD_DATA)")


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return AlfworldConfig(num_train_games=6, num_eval_games=6, cache_dir=str(tmp_path_factory.mktemp("gen")),
                               num_workers=2)


@pytest.fixture(scope="module")
def tasks(cfg):
    return envs.load_tasks(cfg, "train")


@pytest.fixture(scope="module")
def env(cfg):
    e = envs.make_env(cfg)
    yield e
    e.close()


def sig(r):
    return dict(r.signature)


def run(env, task, actions):
    out = [env.reset(task)]
    out += [env.step(a) for a in actions]
    return out


# ---------------------------------------------------------------------------------------------- engine basics


def test_load_tasks_generated_is_pinned_and_typed(cfg, tasks):
    assert [t.task_id for t in tasks] == [f"alfworld/gen-train/{i:05d}" for i in range(6)]
    assert [t.task_type for t in tasks] == list(alfworld.TASK_TYPES)
    assert all(os.path.isabs(t.source) and t.task_type in t.source for t in tasks)
    assert envs.load_tasks(cfg, "train") == tasks
    assert not {t.source for t in tasks} & {t.source for t in envs.load_tasks(cfg, "eval")}


def test_intro_and_admissible(env, tasks):
    r = env.reset(tasks[0])
    head = ("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around "
            "you, you see ")
    assert r.observation.startswith(head) and r.observation.endswith(f"\n\nYour task is to: {r.goal}.")
    receptacles = r.observation[len(head):].split(".\n\n")[0].replace(", and ", ", ").split(", ")
    assert all(x.startswith("a ") for x in receptacles)
    assert r.admissible == sorted(["go to " + x[2:] for x in receptacles] + ["inventory", "look"])
    assert (r.reward, r.done, r.won, r.score) == (0.0, False, False, 0.0)
    assert r.info == {"gamefile": tasks[0].source, "step": 0, "truncated": False}
    assert sig(r)["location"] == ("middle of the room",) and sig(r)["task"] == tasks[0].task_id


def test_bad_action_nothing_happens(env, tasks):
    r0 = env.reset(tasks[0])
    r1 = env.step("fly to the moon")
    assert r1.observation == "Nothing happens."
    assert (r1.signature == r0.signature and r1.admissible == r0.admissible and r1.reward == 0.0
            and not r1.done)


def test_step_limit_truncates(tasks):
    short = AlfworldEnv(AlfworldConfig(max_steps=3))
    short.reset(tasks[0])
    rs = [short.step("look") for _ in range(3)]
    assert [r.done for r in rs] == [False, False, True] and rs[-1].info["truncated"] and not rs[-1].won
    with pytest.raises(envs.EnvError, match="finished episode"):
        short.step("look")


def test_normalise_action_both_grammars():
    new, old = ["move mug 1 to shelf 1", "look"], ["put mug 1 in/on shelf 1", "look"]
    assert alfworld.normalise_action("put mug 1 in shelf 1", new) == "move mug 1 to shelf 1"
    assert alfworld.normalise_action("put mug 1 on shelf 1", new) == "move mug 1 to shelf 1"
    assert alfworld.normalise_action("move mug 1 to shelf 1", old) == "put mug 1 in/on shelf 1"
    assert alfworld.normalise_action("put mug 1 in/on shelf 1", new) == "move mug 1 to shelf 1"
    # not admissible: as is
    assert alfworld.normalise_action("move mug 2 to shelf 1", new) == "move mug 2 to shelf 1"


# ---------------------------------------------------------------------------------------------- signatures


def _find_openable(env, tasks):
    for task in tasks:
        r = env.reset(task)
        for go in [a for a in r.admissible if a.startswith("go to ")]:
            r = env.step(go)
            if f"open {go[6:]}" in r.admissible:
                return task, go, go[6:]
    raise AssertionError("no generated game with an openable receptacle")


def test_signature_equal_for_equal_states_by_different_paths(env, tasks):
    task, go, recep = _find_openable(env, tasks)
    direct = run(env, task, [go])[-1]
    detour = run(env, task, [go, f"open {recep}", f"close {recep}"])
    assert detour[-1].signature == direct.signature
    assert sig(detour[1])["opened"] != sig(detour[2])["opened"] == (recep,)  # the open state itself differs
    # the history key tells the two paths apart
    keys = [envs.history_key("", "", detour[0].observation)]
    for a, r in zip([go, f"open {recep}", f"close {recep}"], detour[1:]):
        keys.append(envs.history_key(keys[-1], a, r.observation))
    assert keys[-1] != envs.history_key(keys[0], go, direct.observation) and len(set(keys)) == 4
    again = run(env, task, [go])[-1]
    assert again.signature == direct.signature and hash(again.signature) == hash(direct.signature)


def test_signature_differs_in_each_field(env, tasks):
    task = tasks[2]  # pick_clean_then_place_in_recep: walks through every field
    plan = envs.plan(env.cfg, task, [], 60).actions
    rs = run(env, task, plan)
    assert rs[-1].won and sig(rs[-1])["progress"][-1].startswith("clean ")
    take = next(i for i, a in enumerate(plan) if a.startswith("take ")) + 1
    clean = next(i for i, a in enumerate(plan) if a.startswith("clean ")) + 1
    pairs = {"location": (rs[0], rs[1]), "holding": (rs[take - 1], rs[take]),
             "placed": (rs[take - 1], rs[take]), "states": (rs[clean - 1], rs[clean]),
             "progress": (rs[clean - 1], rs[clean])}
    for field_name, (a, b) in pairs.items():
        assert sig(a)[field_name] != sig(b)[field_name] and a.signature != b.signature, field_name
    assert {k for k in sig(rs[clean]) if sig(rs[clean])[k] != sig(rs[clean - 1])[k]} == {"states", "progress"}
    other, go, recep = _find_openable(env, tasks)
    closed = run(env, other, [go])[-1]
    opened = env.step(f"open {recep}")
    assert {k for k in sig(opened) if sig(opened)[k] != sig(closed)[k]} == {"opened"}
    assert sig(env.reset(tasks[0]))["task"] != sig(env.reset(tasks[1]))["task"]
    assert ([k for k, _ in rs[0].signature]
            == ["task", "location", "holding", "opened", "placed", "states", "progress"])


# ------------------------------------------------------------------------------------------- prompts, parsing


def test_build_prompt_first_turn_and_history(env, tasks):
    r = env.reset(tasks[0])
    first = envs.build_prompt("alfworld", r.goal, [], 0, r.observation, r.admissible + ["help"], 2)
    assert (first.startswith("\nYou are an expert agent operating in the ALFRED Embodied Environment.\n"
                             "Your current observation is: -= Welcome")
            and "'help'" not in first and "Prior to this step" not in first)
    assert "[" + "\n ".join(f"'{a}'" for a in r.admissible) + "]." in first and "<think> </think>" in first
    history = [("o1", "a1"), ("o2", "a2"), ("o3", "a3")]
    later = envs.build_prompt("alfworld", "put a mug in shelf", history, 3, "o4", ["look"], 2,
                              require_think=False)
    assert ("Your task is to: put a mug in shelf.\n"
            "Prior to this step, you have already taken 3 step(s)." in later)
    assert ("[Observation 2: 'o2', Action 2: 'a2']\n[Observation 3: 'o3', Action 3: 'a3']\n"
            "You are now at step 4" in later)
    assert "<think>" not in later and later.endswith("present it within <action> </action> tags.\n")


PARSE_TABLE = [  # (text, require_think, valid, reason, expected action;
                 # None = the fallback: last 30 chars lowercased)
    ("<think>go</think><action>go to shelf 1</action>", True, True, "ok", "go to shelf 1"),
    ("<think>x</think> <action> Go To Shelf 1 </action>", True, True, "ok", "go to shelf 1"),
    ("<action>look</action>", False, True, "ok", "look"),
    ("<action>look</action>", True, False, "missing_think", None),
    ("<think>hmm</think> go to shelf 1", True, False, "missing_action_tags", None),
    ("<think>a</think><action>look", True, False, "missing_action_tags", None),
    ("</action>look<action>", False, False, "missing_action_tags", None),
    ("", True, False, "empty", None),
    ("   \n", False, False, "empty", None),
    ("<think>a</think><action>  </action>", True, False, "empty", None),
    # Qwen3-style outputs, projected as verl-agent does: the first block counts, later ones are ignored
    ("<action>look</action><action>inventory</action>", False, True, "ok", "look"),
    ("<think>answer as <action>go to X</action>; the fridge</think>\n<action>go to fridge 1</action>", True,
     True, "ok", "go to x"),
    ("<think>the fridge is closed</think>\n<action>open fridge 1</action>\n<action>take apple</action>", True,
     True, "ok", "open fridge 1"),
    ("<think>the fridge is closed, so I will op", True, False, "missing_action_tags", None),  # cut short
    ("<think>我想</think><action>look</action>", True, False, "cjk", None),
    ("<think>ok</think><action>look</action> 我", True, False, "cjk", None),
    ("X" * 40 + "<action>LOOK", False, False, "missing_action_tags", None),
    # over MAX_ACTION_CHARS
    ("<action>" + "go to shelf 1 " * 100 + "</action>", False, False, "too_long", None),
]


@pytest.mark.parametrize("text,think,valid,reason,action", PARSE_TABLE)
def test_parse_action_table(text, think, valid, reason, action):
    expected = envs.ParsedAction(text.lower()[-30:] if action is None else action, valid, reason)
    assert envs.parse_action(text, "alfworld", think) == expected


def test_parse_action_webshop_fallback_is_20_chars():
    text = "I would search for a red shirt please"
    assert envs.parse_action(text, "webshop", False) == envs.ParsedAction(text.lower()[-20:], False,
                                                                          "missing_action_tags")


# ---------------------------------------------------------------------------------------------- data errors


@pytest.mark.parametrize("data_dir", ["", "/nonexistent/alfworld", "EMPTY"])
def test_missing_official_data_is_one_clear_error(data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(alfworld, "ALFWORLD_DATA", "")  # an empty data_dir falls back to $ALFWORLD_DATA
    if data_dir == "EMPTY":
        (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
        data_dir = str(tmp_path)
    with pytest.raises(envs.DataError) as e:
        envs.load_tasks(AlfworldConfig(source="official", data_dir=data_dir), "train")
    assert all(s in str(e.value) for s in ("ALFWORLD_DATA", "alfworld-download",
                                           "--alfworld.source generated"))


def test_missing_alfworld_data_from_a_fresh_process():
    code = ("import envs; from environments.alfworld import AlfworldConfig; "
            "envs.load_tasks(AlfworldConfig(source='official'), 'train')")
    env = {k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"}
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1].startswith("envs.DataError: ")
    assert len(p.stderr.strip().splitlines()) < 12  # raised at the API boundary, not deep inside the engine


# -------------------------------------------------------------------------------------------- official sample


@needs_official
def test_official_sample_loads_and_planner_solves_every_game():
    official = envs.load_tasks(AlfworldConfig(source="official", data_dir=OFFICIAL), "train")
    assert len(official) == 12 and {t.task_type for t in official} == set(alfworld.TASK_TYPES)

    def solve(tasks_half):  # one planner process per thread: the 12 games take ~35 s of planning in total
        planner, out = Planner(AlfworldConfig(max_steps=10**9)), []
        for task in tasks_half:
            plan = planner.plan(task, [], 120)
            replay = planner.plan(task, plan.actions or [], 120)  # replays the plan from reset in the engine
            out.append((task.task_id, plan.status, replay.status, replay.message))
        planner.close()
        return out

    with ThreadPoolExecutor(2) as pool:
        results = [r for part in pool.map(solve, [official[0::2], official[1::2]]) for r in part]
    assert all(r[1:] == ("ok", "ok", "already won") for r in results), results


@needs_official
def test_official_data_dir_falls_back_to_alfworld_data(monkeypatch):
    """A run's saved config may predate $ALFWORLD_DATA (data_dir ""): the loader reads the variable,
    in one place."""
    monkeypatch.setattr(alfworld, "ALFWORLD_DATA", OFFICIAL)
    assert len(envs.load_tasks(AlfworldConfig(source="official", data_dir=""), "train")) == 12


@needs_official
def test_official_old_grammar_move_is_normalised():
    task = envs.load_tasks(AlfworldConfig(source="official", data_dir=OFFICIAL), "train")[2]
    assert "pick_and_place_simple" in task.source
    plan = envs.plan(AlfworldConfig(), task, [], 120).actions
    assert plan[-1].startswith("put ") and " in/on " in plan[-1]
    obj, recep = plan[-1][4:].split(" in/on ")
    env = AlfworldEnv(AlfworldConfig())
    r = env.reset(task)
    assert r.observation.startswith("-= Welcome to TextWorld, ALFRED! =-") and "help" not in r.admissible
    for a in plan[:-1]:
        env.step(a)
    r = env.step(f"move {obj} to {recep}")
    assert r.won and r.info["action"] == plan[-1] and r.observation == f"You put the {obj} in/on the {recep}."
