"""The router's stage of a training step: `router.route` writes each turn's match itself, and the rollout
archive's audited matchers are the step's own matches where the run routes with one of them; a state without
a key matches nothing.

Run: pytest tests/test_route_stage.py -q
"""
import random

from router import RouterConfig, audited_matches, route
from test_router import DETOUR, REF, bank_with, routed, turns_of


def test_route_sets_each_turns_match():
    turns, bank = turns_of(DETOUR), bank_with(REF, DETOUR)
    route(turns, bank, RouterConfig(matcher="structured", history_window=2), random.Random(0))
    expected = routed(turns_of(DETOUR), bank, "structured")
    assert [t.match for t in turns] == expected and any(m is not None for m in expected)


def test_the_archive_keeps_both_audited_matchers_reusing_the_runs_own():
    bank = bank_with(REF, DETOUR)
    for matcher in ("structured", "history", "none"):
        turns = turns_of(DETOUR)
        cfg = RouterConfig(matcher=matcher, history_window=2)
        route(turns, bank, cfg, random.Random(0))
        audited = audited_matches(turns, bank, cfg)
        assert audited["structured"] == routed(turns_of(DETOUR), bank, "structured")
        assert audited["history"] == routed(turns_of(DETOUR), bank, "history", window=2)
        if matcher != "none":  # the run's own matches, the very objects on the turns
            assert all(a is t.match for a, t in zip(audited[matcher], turns))


def test_a_state_without_a_key_matches_nothing():
    """Steps built without an observation key (bank entries from before it, hand-built steps) have no key:
    the observation matcher matches none of them, not one keyless state to another."""
    assert REF.steps[0].observation_key == "" and DETOUR.steps[0].observation_key == ""
    assert routed(turns_of(DETOUR), bank_with(REF, DETOUR), "observation") == [None] * len(DETOUR.steps)
