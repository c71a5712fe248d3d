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
pytestmark = pytest.mark.skipif(not DATA, reason="needs the official ALFWorld sample (ALFWORLD_DATA)")


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
