"""An environment of your own (environments/external.py, docs/environments.md) and the generic signature.

Covers: the documented example trains through `--env key_door:KeyDoor` with distilled turns; bad input (a
module that does not import, a class without `step`, a non-string observation, an admissible list of the wrong
type) is one `error:` line with nothing written; the generic signature (envs.observation_signature) on
hand-built states: holding an apple or not in the same room, WebShop-like hidden options, normalisation; the
adapter's episode conventions.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import envs
from environments.external import ExternalConfig, TextEnvAdapter, load_class

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "environments.md"


def example_source() -> str:
    """The complete example's code block in docs/environments.md."""
    text = DOC.read_text()
    return re.search(r"## A complete example.*?```python\n(.*?)```", text, re.S).group(1)


def smrc(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "smrc.py"), *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=900)


@pytest.mark.usefixtures("quick_agent")
def test_the_documented_example_trains_with_distilled_turns(tmp_path):
    assert len(example_source().splitlines()) <= 60
    (tmp_path / "key_door.py").write_text(example_source())
    out = tmp_path / "run"
    proc = smrc(tmp_path, "--env", "key_door:KeyDoor", "--preset", "tiny", "--steps", "2",
                "--save-every", "2", "--rollout.tasks-per-step", "2", "--rollout.group-size", "3",
                "--external.max-steps", "8", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert sum(r["sd/distilled_turns"] for r in rows) > 0  # walkthrough references, generic signature
    assert (out / "step_000002" / "model.safetensors").exists()


BAD = {
    "missing_module": ("no_such_module_xyz:Env", None, "module 'no_such_module_xyz' does not import"),
    "no_step": ("bad_env:NoStep", "class NoStep:\n    def reset(self, seed=None, options=None):\n"
                "        return 'obs', {}\n", "NoStep has no step method"),
    "not_a_string": ("bad_env:Numbers", "class Numbers:\n    def reset(self, seed=None, options=None):\n"
                     "        return 42, {}\n    def step(self, action):\n"
                     "        return 42, 0.0, True, False, {}\n",
                     "the observation is a int, not a str"),
    "bad_admissible": ("bad_env:Listless", "class Listless:\n    def reset(self, seed=None, options=None):\n"
                       "        return 'obs', {'admissible_commands': 'go north'}\n"
                       "    def step(self, action):\n        return 'obs', 0.0, True, False, {}\n",
                       "info['admissible_commands'] is not a list of str"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_environments_are_one_error_line_and_nothing_is_written(tmp_path, case):
    spec, source, said = BAD[case]
    if source:
        (tmp_path / "bad_env.py").write_text(source)
    out = tmp_path / "run"
    proc = smrc(tmp_path, "--env", spec, "--preset", "tiny", "--output-dir", str(out))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], \
        proc.stderr[-2000:]
    assert not out.exists()


def test_load_class_names_what_is_missing():
    with pytest.raises(SystemExit, match="neither alfworld, webshop, textworld nor package.module:Class"):
        load_class("alfworl")
    with pytest.raises(SystemExit, match="module 'envs' has no 'Nope'"):
        load_class("envs:Nope")
    assert load_class("environments.textworld:TextWorldConfig").__name__ == "TextWorldConfig"


# ---------------------------------------------------------------------------------------------- the signature


def test_the_same_room_with_or_without_an_apple_in_hand_does_not_match():
    """The observation is the same; what can be done there is not."""
    room = "You arrive at countertop 1. On the countertop 1, you see a bread 1."
    free = ["go to fridge 1", "take bread 1 from countertop 1"]
    holding = free + ["put apple 1 in/on countertop 1"]
    a = envs.observation_signature("t", room, free, ())
    b = envs.observation_signature("t", room, holding, ())
    assert a != b
    assert a == envs.observation_signature("t", "  you arrive at Countertop 1.  On the countertop 1, you see "
                                                "a bread 1.", list(reversed(free)), ())  # normalised, a set
    assert a != envs.observation_signature("other task", room, free, ())


def test_a_clean_or_a_dirty_soapbar_in_hand_at_the_bathtub_does_not_match():
    """The text and the admissible actions are the same; cleaning it at the sink, which cannot be done here,
    is in one path only (the case the ALFWorld audit found)."""
    here = "You arrive at bathtubbasin 1. On the bathtubbasin 1, you see nothing."
    admissible = ["go to sinkbasin 1", "go to shelf 1", "move soapbar 1 to bathtubbasin 1"]
    dirty = ("go to sinkbasin 1", "take soapbar 1 from sinkbasin 1", "go to bathtubbasin 1")
    clean = dirty[:2] + ("clean soapbar 1 with sinkbasin 1",) + dirty[2:]
    sig = {k: envs.observation_signature("t", here, admissible, (), k) for k in (dirty, clean)}
    assert sig[dirty] != sig[clean]
    assert dict(sig[clean])["spent"] == ("clean soapbar 1 with sinkbasin 1", "go to bathtubbasin 1",
                                         "take soapbar 1 from sinkbasin 1")
    detour = ("go to shelf 1", "go to sinkbasin 1") + dirty[1:]  # moving stays admissible: no split
    assert envs.observation_signature("t", here, admissible, (), detour) == sig[dirty]


def test_hidden_state_without_admissible_actions_is_told_by_the_actions_that_left_the_text_unchanged():
    """An option clicked on an item page leaves its text as it was: the click tells the states apart."""
    page = "Item: red or blue shirt [SEP] Buy Now"
    after_red = envs.unchanged_by((), page, "click[red]", page)
    after_blue = envs.unchanged_by((), page, "click[blue]", page)
    assert after_red == ("click[red]",) and after_blue == ("click[blue]",)
    assert (envs.observation_signature("t", page, None, after_red)
            != envs.observation_signature("t", page, None, after_blue)
            != envs.observation_signature("t", page, None, ()))
    assert envs.unchanged_by(after_red, page, "click[back]", "Results page") == ()  # the text changed
    same = envs.observation_signature("t", page, None, ("click[red]", "click[red]"))
    assert same == envs.observation_signature("t", page, None, after_red)  # a set: repeats are one


def test_the_adapter_follows_the_built_in_conventions(tmp_path):
    sys.path.insert(0, str(tmp_path))
    try:
        (tmp_path / "key_door_adapter.py").write_text(example_source())
        cfg = ExternalConfig(spec="key_door_adapter:KeyDoor", max_steps=5, num_train_tasks=5)
        tasks = cfg.load_tasks("train")
        assert [t.task_id for t in tasks] == [f"keydoor/train/{i}" for i in range(5)]
        assert cfg.load_tasks("eval")[0].source == "1000000"
        env = cfg.make_env()
        assert isinstance(env, TextEnvAdapter)
        first = env.reset(tasks[0])
        plan = cfg.plan(tasks[0], [], 10.0)
        assert plan.status == "ok" and first.goal == "open the door" and first.signature == ()
        results = envs.replay(env, tasks[0], plan.actions)
        won = results[-1]
        assert won.won and won.reward == 10.0 and won.done and won.score == 1.0
        env.reset(tasks[0])
        lost = envs.replay(env, tasks[0], ["go to hall"] * 5)
        assert lost[-1].done and lost[-1].info["truncated"] and not lost[-1].won
    finally:
        sys.path.remove(str(tmp_path))


def test_bad_kwargs_and_a_split_the_env_lacks_are_one_error_line(tmp_path, monkeypatch):
    """--external.kwargs that is not a JSON object stops in validate_config, before the class is built;
    evaluate's --split is checked against train/eval for environments other than ALFWorld (TextWorld, your
    own)."""
    from config import parse_config
    from scale.preflight import check_split, validate_config
    (tmp_path / "ok_env.py").write_text("class Ok:\n    def reset(self, seed=None, options=None):\n"
                                        "        return 'obs', {}\n    def step(self, action):\n"
                                        "        return 'obs', 0.0, True, False, {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for kwargs, said in (("not json", "is not a JSON object ("), ("[1]", "[1] is not a JSON object")):
        with pytest.raises(SystemExit, match=re.escape(f"error: --external.kwargs {said}")):
            validate_config(parse_config(["--env", "ok_env:Ok", "--external.kwargs", kwargs]))
    for env in ("textworld", "ok_env:Ok"):
        said = f"'valid_seen' is not a split of --env {env}; allowed: train, eval"
        with pytest.raises(SystemExit, match=re.escape(said)):
            check_split(parse_config(["--env", env]), "valid_seen")


def test_without_an_admissible_list_the_same_room_by_two_paths_matches():
    """An environment that gives no admissible list (the adapter's []) has no `spent`: the path taken does not
    split the room's signature (with a list, actions that cannot be taken here would)."""
    from rollout import Episode, observe

    def key(path: list[tuple[str, str]]) -> str:  # (action, the observation it leads to)
        ep = Episode(envs.Task("t", "t", "keydoor", ""), 0, "traj", 0)
        observe(ep, envs.StepResult("hall", [], 0.0, False, False, 0.0, "", (), {}), first=True)
        for action, obs in path:
            ep.memory.append((ep.observation, action))
            observe(ep, envs.StepResult(obs, [], 0.0, False, False, 0.0, "", (), {}), False, action)
        return ep.observation_key
    assert key([("go cellar", "cellar")]) == key([("go kitchen", "kitchen"), ("go hall", "hall"),
                                                  ("go cellar", "cellar")])
