"""Damaged official ALFWorld games (environments/alfworld._official_tasks): a traj_data.json that is not JSON,
or has no task_type, and an empty game.tw-pddl are skipped, counted (`damaged`) and named on one line; the
intact games load as before.

Run: pytest tests/test_damaged_data.py -q
"""
import os
import shutil
from pathlib import Path

import pytest

from environments.alfworld import AlfworldConfig

DATA = os.environ.get("ALFWORLD_DATA", "")
pytestmark = [pytest.mark.skipif(not DATA, reason="needs the official ALFWorld sample (ALFWORLD_DATA)"),
              pytest.mark.usefixtures("quick_agent")]  # build it on every core first (conftest)


def test_damaged_games_are_skipped_counted_and_named(tmp_path, capsys):
    shutil.copytree(Path(DATA) / "json_2.1.1", tmp_path / "json_2.1.1")
    intact = AlfworldConfig(source="official", data_dir=str(tmp_path)).load_tasks("train")
    games = sorted({Path(t.source).parent for t in intact})
    assert len(games) >= 3
    (games[0] / "traj_data.json").write_text("{not json")
    (games[1] / "traj_data.json").write_text('{"foo": 1}')
    (games[2] / "game.tw-pddl").write_text("")
    capsys.readouterr()
    tasks = AlfworldConfig(source="official", data_dir=str(tmp_path)).load_tasks("train")
    assert [t.task_id for t in tasks] == [t.task_id for t in intact if Path(t.source).parent not in games[:3]]
    out = capsys.readouterr().out
    assert "'damaged': 3" in out
    (line,) = [x for x in out.splitlines() if x.startswith("[alfworld] 3 damaged files skipped")]
    for name in (games[0] / "traj_data.json", games[1] / "traj_data.json", games[2] / "game.tw-pddl"):
        assert str(name) in line


def test_a_prompt_limit_that_fits_no_prompt_stops_the_run_with_one_line(tmp_path):
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "smrc.py"), "--preset", "tiny", "--steps", "2",
                           "--rollout.tasks-per-step", "2", "--rollout.group-size", "2",
                           "--rollout.max-prompt-tokens", "1", "--output-dir", str(tmp_path / "run")],
                          cwd=root, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert last == ("error: --rollout.max-prompt-tokens 1 fits no prompt: all 4 episodes of step 1 ended "
                    "before their first turn, so there is nothing to train on; raise it")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("history, budget, no_history, too_long", [
    (2, 10, 0, 0), (2, 7, 1, 0), (2, 3, 0, 1), (0, 7, 0, 0), (0, 3, 0, 1)])
def test_the_no_history_fallback_is_counted_once_and_only_when_it_happens(monkeypatch, history, budget,
                                                                          no_history, too_long):
    """A prompt with history is 10 tokens, without 5: the fallback counts once, never when there was no
    history to drop, and a prompt that fits neither counts as too long only."""
    import rollout
    from types import SimpleNamespace
    monkeypatch.setattr(rollout, "turn_prompt", lambda ep, env, h, think: "x" * (10 if h else 5))
    monkeypatch.setattr(rollout, "chat_ids", lambda tok, text: list(text))
    counters = {"prompt_no_history": 0, "prompt_too_long": 0}
    ep = SimpleNamespace(task=SimpleNamespace(env="alfworld"))
    env_cfg = SimpleNamespace(history_length=history, require_think=False)
    got = rollout._prompt(ep, env_cfg, budget, None, counters)
    assert (got is None) == bool(too_long)
    assert counters == {"prompt_no_history": no_history, "prompt_too_long": too_long}
