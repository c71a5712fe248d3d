"""Tests of router.py on hand-built trajectories: matchers, reference bank, state summary, teacher-context
text.

Run: .venv/bin/python -m pytest tests/test_router.py -q
"""
import functools
import json
import random
import typing

import pytest

from fakes import turn
from records import WITHOUT_REFERENCE, Match, Step, Trajectory
from router import matches as match_turns
from router import (
    CONTEXT_BLOCKS, MATCHERS, ReferenceBank, RouterConfig, match_by_index, match_state, match_structured,
    prefix_at, route_metrics, skill_text, state_summary, teacher_context, window_at,
)


def alf(loc, holding=(), opened=(), placed=(), states=(), progress=(), task="t0"):
    """An ALFWorld signature in the envs.py field order."""
    return (("task", task), ("location", loc), ("holding", holding), ("opened", opened), ("placed", placed),
            ("states", states), ("progress", progress))


def trajectory(traj_id, path, task="t0", success=True, final="done"):
    """path = [(signature, observation, action), ...]; the history key is the readable prefix."""
    steps, prefix = [], []
    for sig, obs, act in path:
        steps.append(Step(sig, "|".join(prefix + [obs]), obs, act))
        prefix += [obs, act]
    return Trajectory(task, traj_id, steps, success, final)


def turns_of(traj):
    return [turn(traj.task_id, traj.traj_id, i, s) for i, s in enumerate(traj.steps)]


def routed(turns, bank, matcher, rng=None, window=2, references="all"):
    """router.matches with a RouterConfig of `matcher`, history window `window` and `references`."""
    cfg = RouterConfig(matcher=matcher, history_window=window, references=references)
    return match_turns(turns, bank, cfg, rng or random.Random(0))


def metrics_of(turns, matches, bank):
    """route_metrics of `turns` routed with `matches` (the trainer records them on the turns)."""
    for t, m in zip(turns, matches):
        t.match = m
    return route_metrics(turns, bank)


def positions(matches):
    return [None if m is None else (m.ref.traj_id, m.position, m.candidate) for m in matches]


MIDDLE, CAB, DRAWER, COFFEE = ("middle of the room",), ("cabinet 1",), ("drawer 1",), ("coffeemachine 1",)
S0 = alf(MIDDLE)
S1 = alf(CAB)
S2 = alf(CAB, holding=("mug 1",))
S3 = alf(COFFEE, holding=("mug 1",))
D = alf(DRAWER)
REF = trajectory("ref", [(S0, "o:middle", "go to cabinet 1"), (S1, "o:cabinet", "take mug 1 from cabinet 1"),
                         (S2, "o:took", "go to coffeemachine 1"),
                         (S3, "o:coffee", "put mug 1 in/on coffeemachine 1")])
# The student detours to the drawer, then reaches cabinet 1 by another path and continues like the reference.
DETOUR = trajectory("stu", [(S0, "o:middle", "go to drawer 1"), (D, "o:drawer", "go to cabinet 1"),
                            (S1, "o:cabinet", "take mug 1 from cabinet 1"),
                            (S2, "o:took", "go to coffeemachine 1")],
                    success=False)


def bank_with(*trajs, archive_size=4):
    bank = ReferenceBank(archive_size)
    bank.add_group(list(trajs))
    return bank


# ---------------------------------------------------------------------------------------------- matchers

def test_structured_rematches_after_divergence_at_the_right_position():
    matches = routed(turns_of(DETOUR), bank_with(REF, DETOUR), "structured", random.Random(0))
    assert positions(matches) == [
        ("ref", 0, "go to cabinet 1"), None,
        ("ref", 1, "take mug 1 from cabinet 1"), ("ref", 2, "go to coffeemachine 1")]


def test_history_full_misses_a_state_reached_by_another_path_that_structured_finds():
    matches = routed(turns_of(DETOUR), bank_with(REF, DETOUR), "history-full", random.Random(0))
    assert positions(matches) == [("ref", 0, "go to cabinet 1"), None, None, None]
    # Following the reference's exact prefix is matched by history too, at the same positions as structured.
    follower = trajectory("f", [(S0, "o:middle", "go to cabinet 1"), (S1, "o:cabinet", "look")],
                          success=False)
    both = [positions(routed(turns_of(follower), bank_with(REF), m, random.Random(0)))
            for m in ("history-full", "history", "structured")]
    assert (both[0] == both[1] == both[2]
            == [("ref", 0, "go to cabinet 1"), ("ref", 1, "take mug 1 from cabinet 1")])


def test_repeated_reference_state_matches_its_last_occurrence():
    loop = trajectory("loop", [(S0, "a", "go to cabinet 1"), (S1, "b", "go to drawer 1"),
                               (D, "c", "go to cabinet 1"), (S1, "b", "take mug 1 from cabinet 1")])
    student = turn("t0", "stu", 5, Step(S1, "x", "o", "a"))
    assert match_structured(student, [loop]) == Match(loop, 3, "take mug 1 from cabinet 1")


def test_subgoals_in_another_order_are_not_matched_where_the_state_differs():
    mug_done = dict(placed=(("mug 1", "coffeemachine 1"),), progress=("mug 1 in coffeemachine 1",))
    ref = trajectory("ref2", [
        (S0, "", "go to cabinet 1"), (S1, "", "take mug 1 from cabinet 1"), (S2, "", "go to coffeemachine 1"),
        (S3, "", "put mug 1 in/on coffeemachine 1"), (alf(COFFEE, **mug_done), "", "go to countertop 1"),
        (alf(("countertop 1",), **mug_done), "", "take apple 1 from countertop 1"),
        (alf(("countertop 1",), holding=("apple 1",), **mug_done), "", "go to fridge 1"),
        (alf(("fridge 1",), holding=("apple 1",), **mug_done), "", "put apple 1 in/on fridge 1")])
    apple_done = dict(placed=(("apple 1", "fridge 1"),), progress=("apple 1 in fridge 1",))
    student = trajectory("stu2", [
        (S0, "", "go to countertop 1"), (alf(("countertop 1",)), "", "take apple 1 from countertop 1"),
        (alf(("countertop 1",), holding=("apple 1",)), "", "go to fridge 1"),
        (alf(("fridge 1",), holding=("apple 1",)), "", "put apple 1 in/on fridge 1"),
        (alf(("fridge 1",), **apple_done), "", "go to cabinet 1"), (alf(CAB, **apple_done), "", "look")],
        success=False)
    bank = bank_with(ref, student)
    # Same locations and holdings as the reference, but other goal conditions hold: only the start matches.
    assert positions(routed(turns_of(student), bank, "structured", random.Random(0))) == [
        ("ref2", 0, "go to cabinet 1"), None, None, None, None, None]
    assert all(m is not None for m in routed(turns_of(student), bank, "with-reference", random.Random(0)))


def test_random_selects_as_many_turns_as_structured_among_tasks_with_a_reference():
    other_task = trajectory("u", [(alf(MIDDLE, task="t1"), "", "look")] * 3, task="t1", success=False)
    batch = [DETOUR, trajectory("stu3", [(S1, "", "x"), (D, "", "y"), (S3, "", "z")], success=False),
             other_task]
    bank = bank_with(REF, *batch)
    turns = [t for traj in batch for t in turns_of(traj)]
    n_structured = sum(m is not None for m in routed(turns, bank, "structured", random.Random(0)))
    assert n_structured == 5
    picks = set()
    for seed in range(20):
        matches = routed(turns, bank, "random", random.Random(seed))
        assert matches == routed(turns, bank, "random", random.Random(seed))  # deterministic given the seed
        chosen = [i for i, m in enumerate(matches) if m is not None]
        assert len(chosen) == n_structured
        assert all(turns[i].task_id == "t0" for i in chosen)
        for i in chosen:  # deviation 5: index-aligned candidate
            j = min(turns[i].index, len(REF.steps) - 1)
            assert matches[i] == Match(REF, j, REF.steps[j].action)
        picks.add(tuple(chosen))
    assert len(picks) > 1  # really random, not the structured turns


def test_all_and_none():
    matches = routed(turns_of(DETOUR), bank_with(REF, DETOUR), "with-reference", random.Random(0))
    assert positions(matches) == [("ref", i, REF.steps[i].action) for i in range(4)]
    long_turn = turn("t0", "stu", 9, DETOUR.steps[0])
    assert match_by_index(long_turn, [REF]).position == 3  # beyond the reference's end: its last step
    assert routed(turns_of(DETOUR), bank_with(REF, DETOUR), "none", random.Random(0)) == [None] * 4


def test_every_matcher_the_flag_allows_has_one_entry_in_the_dispatch_table():
    literal = typing.get_args(typing.get_type_hints(RouterConfig)["matcher"])[0]
    from config import MATCHER_ALIASES  # the old names: config.py's alias maps only, never a flag's choice
    assert set(typing.get_args(literal)) == set(MATCHERS)
    assert set(MATCHER_ALIASES.values()) <= set(MATCHERS)


def test_never_self_reference():
    bank = bank_with(REF)
    for matcher in ("structured", "history", "history-full", "with-reference", "random", "none"):
        assert routed(turns_of(REF), bank, matcher, random.Random(0)) == [None] * 4
    # Even when handed directly to a matcher.
    own = turns_of(REF)[:2]
    assert (match_structured(own[1], [REF]) is None
            and match_state(own, [[REF]] * 2, prefix_at) == [None, None])
    assert match_state(own, [[REF]] * 2, functools.partial(window_at, h=2)) == [None, None]
    twin = Trajectory("t0", "twin", REF.steps, True, REF.final_observation)
    matches = routed(turns_of(REF), bank_with(REF, twin), "structured", random.Random(0))
    assert [m.ref.traj_id for m in matches] == ["twin"] * 4


# The prompt's view: the student opens a drawer first, then does what the reference does. From the coffee
# machine on, its last two (observation, action) pairs and its observation are the reference's at position 3,
# so the windowed history matcher (h = 2) matches there; the state differs (drawer 1 is open), so structured
# does not, and the full prefix differs, so history-full cannot either.
OPEN = ("drawer 1",)
LOOKALIKE = trajectory("look", [
    (S0, "o:middle", "go to drawer 1"), (D, "o:drawer", "open drawer 1"),
    (alf(DRAWER, opened=OPEN), "o:opened", "go to cabinet 1"),
    (alf(CAB, opened=OPEN), "o:cabinet", "take mug 1 from cabinet 1"),
    (alf(CAB, holding=("mug 1",), opened=OPEN), "o:took", "go to coffeemachine 1"),
    (alf(COFFEE, holding=("mug 1",), opened=OPEN), "o:coffee", "put mug 1 in/on coffeemachine 1")],
                       success=False)


def test_windowed_history_can_disagree_with_structured_where_the_full_prefix_cannot():
    bank = bank_with(REF, LOOKALIKE)
    turns = turns_of(LOOKALIKE)
    got = {m: positions(routed(turns, bank, m, random.Random(0), window=2))
           for m in ("history", "history-full", "structured")}
    start = [("ref", 0, "go to cabinet 1")]
    assert got["history"] == start + [None] * 4 + [("ref", 3, "put mug 1 in/on coffeemachine 1")]
    assert got["structured"] == got["history-full"] == start + [None] * 5
    # h = 1 sees even less of the past: the take-mug turn looks like the reference's too
    assert positions(routed(turns, bank, "history", random.Random(0), window=1)) == \
        start + [None] * 3 + [("ref", 2, "go to coffeemachine 1"),
                              ("ref", 3, "put mug 1 in/on coffeemachine 1")]
    # a window reaching back to the drawer sees the difference
    assert positions(routed(turns, bank, "history", random.Random(0), window=4)) == start + [None] * 5
    # and the other direction (test above): a state reached by another path is found by structured,
    # not by history
    assert positions(routed(turns_of(DETOUR), bank_with(REF, DETOUR), "history", random.Random(0),
                            window=2))[2] is None
    # the window is the student's own earlier turns, read from the batch whatever their order
    assert routed(turns[::-1], bank, "history", random.Random(0), window=2)[::-1] == \
        routed(turns, bank, "history", random.Random(0), window=2)


def test_every_distils_each_turn_with_or_without_a_reference_and_first_restricts_references():
    other = trajectory("u", [(alf(MIDDLE, task="t1"), "", "look")] * 2, task="t1", success=False)
    bank = bank_with(REF, DETOUR, other)
    turns = turns_of(DETOUR) + turns_of(other)
    matches = routed(turns, bank, "every-turn", random.Random(0))
    assert positions(matches[:4]) == positions(routed(turns_of(DETOUR), bank, "with-reference",
                                                      random.Random(0)))
    assert matches[4:] == [WITHOUT_REFERENCE] * 2
    metrics = metrics_of(turns, matches, bank)
    assert (metrics["router/matched_turns"], metrics["router/matched_turns/group"],
            metrics["router/matched_turns/none"]) == (6.0, 4.0, 2.0)
    # references = first: only the one FullPath-SD shows (c, the shortest),
    # so states only `a` holds go unmatched
    a = trajectory("a", [(S0, "", "go to cabinet 1"), (S2, "", "go to coffeemachine 1")])
    c = trajectory("c", [(S0, "", "go to drawer 1")])
    student = trajectory("s", [(S0, "", "x"), (S2, "", "y")], success=False)
    bank = bank_with(a, c, student)
    assert positions(routed(turns_of(student), bank, "structured", random.Random(0))) == [
        ("c", 0, "go to drawer 1"), ("a", 1, "go to coffeemachine 1")]
    assert positions(routed(turns_of(student), bank, "structured", random.Random(0), references="first")) == [
        ("c", 0, "go to drawer 1"), None]


def test_route_metrics_count_matches_by_reference_source():
    bank = ReferenceBank(archive_size=4)
    bank.add_group([trajectory("old", REF_PATH_ALF_SHORT)])
    bank.add_group([])  # "old" moves to the archive
    bank.add_planner(trajectory("plan", REF_PATH_ALF_SHORT, task="t2"))
    turns = [turn("t0", "s", 0, Step(S0, "", "", "")), turn("t2", "s2", 0, Step(S0, "", "", ""))]
    m = metrics_of(turns, routed(turns, bank, "structured", random.Random(0)), bank)
    assert (m["router/matched_turns/archive"], m["router/matched_turns/planner"],
            m["router/matched_turns/group"]) == (1.0, 1.0, 0.0)


REF_PATH_ALF_SHORT = [(S0, "o:middle", "go to cabinet 1")]


# ---------------------------------------------------------------------------------------------- bank

def short(traj_id, n, task="t0", success=True):
    return trajectory(traj_id, [(alf(CAB, task=task), "", f"a{k}") for k in range(n)], task=task,
                      success=success)


def test_bank_archive_is_bounded_fifo_of_earlier_steps():
    bank = ReferenceBank(archive_size=2)
    for step in range(4):
        bank.add_group([short(f"s{step}", 3), short(f"fail{step}", 1, success=False)])
    # Group = this step; archive = the two most recent earlier steps; failures are never references.
    assert [t.traj_id for t in bank.references("t0", "none")] == ["s3", "s1", "s2"]
    assert bank.metrics() == {"router/bank_tasks": 1.0, "router/bank_group_refs": 1.0,
                              "router/bank_archive_refs": 2.0, "router/bank_planner_refs": 0.0}
    empty = ReferenceBank(archive_size=0)
    empty.add_group([short("a", 2)])
    empty.add_group([])
    assert empty.references("t0", "x") == [] and empty.archive == {}


def test_bank_selection_order_is_group_then_archive_then_planner_shortest_then_id():
    bank = ReferenceBank(archive_size=4)
    bank.add_group([short("old-long", 5), short("old-short", 1)])
    bank.add_group([short("b", 4), short("a", 4), short("c", 2), short("other", 1, task="t1")])
    bank.add_planner(short("plan", 1))
    assert [t.traj_id for t in bank.references("t0", "x")] == ["c", "a", "b", "old-short", "old-long", "plan"]
    assert [t.traj_id for t in bank.references("t0", "a")] == ["c", "b", "old-short", "old-long", "plan"]
    # The first reference that matches wins (deviation 1): "c" lacks the state, "a" has it.
    a = trajectory("a", [(S0, "", "go to cabinet 1"), (S2, "", "go to coffeemachine 1")])
    c = trajectory("c", [(S0, "", "go to drawer 1")])
    assert (match_structured(turn("t0", "stu", 0, Step(S2, "", "", "")), [c, a])
            == Match(a, 1, "go to coffeemachine 1"))


def test_bank_state_dict_round_trip_through_json():
    bank = ReferenceBank(archive_size=3)
    bank.add_group([REF, short("x", 2)])
    bank.add_group([trajectory("y", REF_PATH_WS, task="ws")])
    bank.add_planner(short("plan", 1, task="t9"))
    state = json.loads(json.dumps(bank.state_dict()))
    restored = ReferenceBank(archive_size=1)
    restored.load_state_dict(state)
    assert json.dumps(restored.state_dict()) == json.dumps(bank.state_dict())
    for task in ("t0", "ws", "t9"):
        assert restored.references(task, "") == bank.references(task, "")
    assert restored.references("ws", "")[0].steps[0].signature == WS_SIG  # tuples again, hashable
    hash(restored.references("ws", "")[0].steps[0].signature)
    turns = turns_of(DETOUR)
    assert (routed(turns, restored, "structured", random.Random(0))
            == routed(turns, bank, "structured", random.Random(0)))


def test_route_metrics():
    bank = bank_with(REF, DETOUR)
    turns = turns_of(DETOUR) + turns_of(short("q", 2, task="t1"))
    metrics = metrics_of(turns, routed(turns, bank, "structured", random.Random(0)), bank)
    assert metrics == {"router/matched_turns": 3.0, "router/turns_with_reference": 4.0,  # the rate: log_step
                       "router/matched_turns/group": 3.0, "router/matched_turns/archive": 0.0,
                       "router/matched_turns/planner": 0.0, "router/matched_turns/none": 0.0}


# ---------------------------------------------------------------------------------------------- text

FULL_ALF = (("task", "alfworld/gen-train/00012"), ("location", ("cabinet 1", "cabinet 2")),
            ("holding", ("mug 2",)), ("opened", ("cabinet 1", "drawer 3")),
            ("placed", (("apple 1", "fridge 1"),)), ("states", (("mug 2", "clean"), ("apple 1", "cool"))),
            ("progress", ("apple 1 in fridge 1", "mug 2 clean")))
WS_SIG = (("task", "webshop/00123"), ("page", "item"), ("keywords", ("red", "shoes")), ("results_page", 2),
          ("item", "B07X"), ("options", (("color", "red"), ("size", "9"))))
REF_PATH_WS = [(WS_SIG, "item page", "click[buy now]")]


def test_summary_renders_every_alfworld_field():
    assert state_summary(FULL_ALF) == (
        "Task: alfworld/gen-train/00012.\n"
        "You are at cabinet 1 and cabinet 2.\n"
        "You are holding mug 2.\n"
        "Open receptacles: cabinet 1, drawer 3.\n"
        "Task objects placed: apple 1 in/on fridge 1.\n"
        "Task object states: mug 2 is clean, apple 1 is cool.\n"
        "Goal conditions already satisfied: apple 1 in fridge 1, mug 2 clean.")
    assert state_summary(alf(MIDDLE)) == (
        "Task: t0.\nYou are in the middle of the room.\nYou are holding nothing.\nNo receptacle is open.\n"
        "No task object is placed yet.\nNo task object is cleaned, heated, cooled or turned on yet.\n"
        "No goal condition is satisfied yet.")


def test_summary_renders_every_webshop_field_and_unknown_fields():
    assert state_summary(WS_SIG + (("extra", ("a", ("b", 1), None)),)) == (
        "Task: webshop/00123.\nYou are on the item page.\nSearch keywords: red, shoes.\n"
        "Results page number: 2.\nItem opened: B07X.\nOptions selected: color = red, size = 9.\n"
        "extra: (a, (b, 1), none)")
    start = (("task", "webshop/1"), ("page", "sub:description"), ("keywords", ()), ("results_page", None),
             ("item", None), ("options", ()))
    assert state_summary(start) == (
        "Task: webshop/1.\nYou are on the 'description' section of an item page.\nNo search made yet.\n"
        "No results page open.\nNo item opened.\nNo options selected.")


TRAJ_TEXT = (
    "[Privileged: a successful trajectory for this same task]\n"
    "Observation 1: o:middle\nAction 1: go to cabinet 1\n"
    "Observation 2: o:cabinet\nAction 2: take mug 1 from cabinet 1\n"
    "Observation 3: o:took\nAction 3: go to coffeemachine 1\n"
    "Observation 4: o:coffee\nAction 4: put mug 1 in/on coffeemachine 1\n"
    "Final observation: done\n"
    "Outcome: the task was completed successfully.")
SUMMARY_TEXT = ("[Privileged: summary of your current state]\n"
                "Task: t0.\nYou are at cabinet 1.\nYou are holding mug 1.\nNo receptacle is open.\n"
                "No task object is placed yet.\nNo task object is cleaned, heated, cooled or turned on yet.\n"
                "No goal condition is satisfied yet.")
CANDIDATE_TEXT = ("[Privileged: candidate next action]\n"
                  "The successful trajectory's action at its step 3: <action>go to coffeemachine 1</action>")
SLOT = "[[student prompt]]"  # stands for the student's ordinary prompt
CLOSING = "Use this information to choose the best next action for the current situation above."


@pytest.mark.parametrize("variant,blocks", [
    ("trajectory", [TRAJ_TEXT, SLOT]), ("summary", [TRAJ_TEXT, SLOT, SUMMARY_TEXT]),
    ("candidate", [TRAJ_TEXT, SLOT, CANDIDATE_TEXT]),
    ("smrc", [TRAJ_TEXT, SLOT, SUMMARY_TEXT, CANDIDATE_TEXT])])
def test_teacher_context_exact_text(variant, blocks):
    match = Match(REF, 2, REF.steps[2].action)
    assert teacher_context(variant, REF, match, S2).around(SLOT) == "\n\n".join(blocks + [CLOSING])


def test_teacher_context_needs_the_match_for_the_candidate():
    assert set(CONTEXT_BLOCKS) == {"trajectory", "summary", "candidate", "smrc", "skill", "none"}
    assert teacher_context("trajectory", REF, None, S2).before == (TRAJ_TEXT,)
    with pytest.raises(AssertionError):
        teacher_context("smrc", REF, None, S2)



def _random_batch(seed: int):
    """Random walks over a few states per task, so references revisit states (last occurrence), students match
    at varied positions, some tasks have no reference, and the students' own successes are in the bank
    (self-match)."""
    rng = random.Random(seed)
    sigs = [alf(MIDDLE), alf(CAB), alf(DRAWER), alf(CAB, holding=("mug 1",)), alf(COFFEE, holding=("mug 1",))]

    def walk(task, traj_id, n, success):
        return trajectory(traj_id, [(rng.choice(sigs), f"o{rng.randrange(3)}", f"a{rng.randrange(4)}")
                                    for _ in range(n)], task=task, success=success)
    bank = ReferenceBank(archive_size=2)
    bank.add_group([walk(f"t{k}", f"old{k}-{i}", rng.randint(1, 8), True) for k in range(3)
                    for i in range(3)])
    students = [walk(f"t{k}", f"s{k}-{i}", rng.randint(1, 10), rng.random() < 0.4) for k in range(5)
                for i in range(4)]
    bank.add_group(students)
    planned = walk("t1", "planner-t1", 6, True)
    bank.add_planner(planned)
    return [t for s in students for t in turns_of(s)], bank


def test_route_equals_the_matchers_applied_turn_by_turn():
    """`route` indexes every reference once and sorts the references once per task: the same matches as each
    matcher applied to each turn with bank.references (the definition), on random batches."""
    naive = {"structured": match_structured, "history-full": lambda t, r: match_state([t], [r], prefix_at)[0],
             "with-reference": match_by_index}
    for seed in range(20):
        turns, bank = _random_batch(seed)
        refs = [bank.references(t.task_id, exclude_traj_id=t.traj_id) for t in turns]
        for name, matcher in naive.items():
            expected = [matcher(t, r) for t, r in zip(turns, refs)]
            got = routed(turns, bank, name, random.Random(0))
            assert positions(got) == positions(expected), (seed, name)
            assert all(a is None or a.ref is b.ref for a, b in zip(got, expected))
        n_structured = sum(match_structured(t, r) is not None for t, r in zip(turns, refs))
        assert sum(m is not None for m in routed(turns, bank, "random", random.Random(seed))) == n_structured
        with_ref = sum(any(r.traj_id != t.traj_id and r.steps for r in rs) for t, rs in zip(turns, refs))
        assert metrics_of(turns, [None] * len(turns), bank)["router/turns_with_reference"] == with_ref
    assert any(m is not None for m in routed(turns, bank, "structured", random.Random(0)))


ALF_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
             "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")


def test_skill_context_is_general_then_task_type_skill_for_every_type():
    general = skill_text("alfworld", ALF_TYPES[0]).split("\n\n")[0]
    texts = {t: skill_text("alfworld", t) for t in ALF_TYPES}
    assert len(set(texts.values())) == 6 and all(x.startswith(general + "\n\n") for x in texts.values())
    assert ("sinkbasin" in texts["pick_clean_then_place_in_recep"]
            and "fridge" in texts["pick_cool_then_place_in_recep"])
    assert skill_text("webshop", "webshop").startswith("General skills for web shopping")
    ctx = teacher_context("skill", None, WITHOUT_REFERENCE, S2, texts[ALF_TYPES[1]]).around(SLOT)
    assert (ctx == "[Privileged: skills for this kind of task]\n" + texts[ALF_TYPES[1]] + "\n\n" + SLOT
            + "\n\n" + CLOSING)
    with pytest.raises(FileNotFoundError):
        skill_text("alfworld", "no_such_type")
    with pytest.raises(AssertionError):  # a trajectory context without a reference
        teacher_context("trajectory", None, None, S2)
