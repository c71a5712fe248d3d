"""ALFWorld on the real engine: the config, task lists (official data or generated games), the env, its
signature.

- `AlfworldConfig` (an `envs.EpisodeConfig`): `load_tasks(split)`, `make_env()` and
  `plan(task, actions, timeout_s)` (the engine's Fast Downward planner, run by `planner.Planner` in its own
  process) for the trainer's dispatcher.
- `AlfworldEnv`: the stock engine built directly, `textworld.envs.PddlEnv(EnvInfos(won, admissible_commands,
  facts, extras=["gamefile"]))` -> `AlfredDemangler(shuffle=False)` -> `AlfredInfos`, as ALFWorld's own
  `AlfredTWEnv` builds it (alfworld/agents/environment/alfred_tw_env.py). A game is loaded (grammar compiled)
  once per env instance and reused across resets (a small LRU of loaded games). Two pure functions of the
  engine are memoised for speed (`memoize_text_grammar`, `memoize_pddl_translation`: a reset 0.06-0.11 s
  -> 0.02-0.04 s).
- `alfworld_signature(...)`: the state's `envs.alfworld_signature` (where its fields are listed, with why each
  is there), read from the engine's PDDL facts.

Deviations from verl-agent (numbered):
1. `put X in/on Y` and `move X to Y` are mapped onto whichever of the two the game's grammar admits (official
   json_2.1.1 games use the old one); verl-agent relies on the model to copy the admissible text.
2. 'help' is dropped from the admissible list we return, not only from the prompt.
"""
import atexit
import copy
import functools
import json
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

import envs
from envs import MAX_ACTION_CHARS, DataError, EnvError, EpisodeConfig, PlanResult, Signature, StepResult, Task
from environments import alfworld_games
from environments.planner import Planner

# Read before anything imports alfworld: `import alfworld` sets $ALFWORLD_DATA to
# ~/.cache/alfworld when unset.
ALFWORLD_DATA = os.environ.get("ALFWORLD_DATA", "")
TASK_TYPES = alfworld_games.TASK_TYPES
OFFICIAL_SPLITS = ("train", "valid_seen", "valid_unseen")


@dataclass
class AlfworldConfig(EpisodeConfig):
    # Data
    source: Literal["generated", "official"] = "generated"
    """'generated': games written by environments/alfworld_games.py (no download); 'official':
    $ALFWORLD_DATA"""
    data_dir: str = ALFWORLD_DATA
    """root of the official data (holds json_2.1.1/); defaults to $ALFWORLD_DATA (also when empty)"""
    official_eval_split: Literal["valid_seen", "valid_unseen"] = "valid_unseen"
    """official split that load_tasks(split='eval') means (valid_seen = in-distribution,
    valid_unseen = OOD)"""
    task_types: tuple[str, ...] = TASK_TYPES
    """task types kept (ALFWorld's own task-type filter)"""
    room_size: Literal["small", "medium", "real"] = "small"
    """generated games: room size (small: 4-8 receptacles; real: 15-25 receptacles, 20-40 objects)"""
    num_train_games: int = 120
    """generated games: number of training games"""
    num_eval_games: int = 36
    """generated games: number of evaluation games (seeds disjoint from training)"""
    gen_seed: int = 0
    """generated games: generator seed"""
    cache_dir: str = alfworld_games.DEFAULT_CACHE_DIR
    """generated games: where they are written (deterministic; rewritten only if content changes)"""
    game_cache_size: int = 4
    """loaded games kept per env instance (loading compiles the game's grammar)"""

    def load_tasks(self, split: str) -> list[Task]:
        """Splits: 'train', 'eval' (generated: its own eval seeds; official: official_eval_split),
        'valid_seen', 'valid_unseen' (official only)."""
        assert set(self.task_types) <= set(TASK_TYPES), \
            f"unknown task types {set(self.task_types) - set(TASK_TYPES)}"
        if self.source == "generated":
            assert split in alfworld_games.SPLITS, \
                f"generated ALFWorld games have splits {alfworld_games.SPLITS}"
            return _generated_tasks(self, split)
        split = self.official_eval_split if split == "eval" else split
        assert split in OFFICIAL_SPLITS, f"official ALFWorld splits are {OFFICIAL_SPLITS} (or 'eval')"
        return _official_tasks(self, split)

    def make_env(self) -> "AlfworldEnv":
        return AlfworldEnv(self)

    def plan(self, task: Task, actions: list[str], timeout_s: float) -> PlanResult:
        """The engine's planner (what `policy_commands` returns) from the state after replaying `actions`;
        games are addressed by path, so one planner process serves every config."""
        return _PLANNER.plan(task, actions, timeout_s)

    def prefetch_plan(self, task: Task, actions: list[str]) -> None:
        _PLANNER.prefetch(task, actions, self.planner_timeout_s)


# ---------------------------------------------------------------------------------------------- tasks


def _json_object(path: str) -> dict:
    """The JSON object in `path`; {} for a file that is unreadable, not JSON, or not an object."""
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):  # decoding errors are ValueErrors
        return {}
    return value if isinstance(value, dict) else {}


def walk_following_links(root: str) -> list[tuple[str, list[str]]]:
    """(folder, file names) under `root`, sorted, following symlinked folders (a split assembled from links
    to task folders), each real folder once (a link back up is not a loop)."""
    out, seen = [], set()
    for dirpath, dirnames, files in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        out.append((dirpath, files))
    return sorted(out)


def _official_tasks(cfg: AlfworldConfig, split: str) -> list[Task]:
    """ALFWorld's own filter (AlfredTWEnv.collect_game_files): traj_data.json + game.tw-pddl present, json
    'solvable' true, no 'movable'/'Sliced' in the path, task type kept. Sorted by path (pinned order)."""
    hint = ("Set ALFWORLD_DATA (or --alfworld.data-dir) to the folder holding json_2.1.1/ (run "
            "`alfworld-download` on a networked machine and copy ~/.cache/alfworld over), or use generated "
            "games: --alfworld.source generated.")
    # a run's saved config may predate the variable: read it here, once
    data_dir = cfg.data_dir or ALFWORLD_DATA
    if not data_dir:
        raise DataError(f"ALFWorld official data requested but ALFWORLD_DATA is not set. {hint}")
    root = os.path.join(os.path.expanduser(data_dir), "json_2.1.1", split)
    if not os.path.isdir(root):
        raise DataError(f"ALFWorld official split {split!r} not found: {root} does not exist "
                        f"(ALFWORLD_DATA={data_dir}). {hint}")
    tasks, skipped = [], {"movable_or_sliced": 0, "task_type": 0, "no_game_file": 0, "unsolvable": 0}
    damaged = []  # files that are not the JSON object they should be: skipped, counted and named
    for dirpath, files in walk_following_links(root):
        if "traj_data.json" not in files:
            continue
        if "movable" in dirpath or "Sliced" in dirpath:
            skipped["movable_or_sliced"] += 1
            continue
        traj = _json_object(os.path.join(dirpath, "traj_data.json"))
        if "task_type" not in traj:
            damaged.append(os.path.join(dirpath, "traj_data.json"))
            continue
        task_type = traj["task_type"]
        game = os.path.join(dirpath, "game.tw-pddl")
        if task_type not in cfg.task_types:
            skipped["task_type"] += 1
        elif not os.path.exists(game):
            skipped["no_game_file"] += 1
        else:
            meta = _json_object(game)
            if not meta:
                damaged.append(game)
                continue
            solvable = meta.get("solvable", False)  # ALFWorld skips a missing key too
            if not solvable:
                skipped["unsolvable"] += 1
                continue
            rel = os.path.relpath(dirpath, root).replace(os.sep, "/")
            tasks.append(Task(f"alfworld/{split}/{rel}", task_type, "alfworld", os.path.abspath(game)))
    skipped["damaged"] = len(damaged)
    print(f"alfworld official {split}: {len(tasks)} games from {root} (skipped: {skipped})")
    if damaged:
        print(f"[alfworld] {len(damaged)} damaged files skipped (not a JSON object, or no task_type): "
              + ", ".join(damaged), flush=True)
    if not tasks:
        raise DataError(f"ALFWorld official split {split!r} under {root} holds no playable game "
                        f"(skipped: {skipped}). {hint}")
    return tasks


def _generated_tasks(cfg: AlfworldConfig, split: str) -> list[Task]:
    n = cfg.num_train_games if split == "train" else cfg.num_eval_games
    paths = alfworld_games.generate(split, n, cfg.room_size, cfg.gen_seed, cfg.cache_dir)
    tasks = [Task(f"alfworld/gen-{split}/{i:05d}", alfworld_games.TASK_TYPES[i % 6], "alfworld",
                  os.path.abspath(p))
             for i, p in enumerate(paths)]
    kept = [t for t in tasks if t.task_type in cfg.task_types]
    print(f"alfworld generated {split}: {len(kept)} of {n} games kept by task type ({cfg.room_size} rooms, "
          f"seed {cfg.gen_seed}) under "
          f"{os.path.dirname(os.path.dirname(paths[0])) if paths else cfg.cache_dir}")
    return kept


# ---------------------------------------------------------------------------------------------- env

# DOTALL: with `.` unable to cross a newline, `(.+)$` failed at every split point of a long multi-line action
# and the match backtracked quadratically (4.8 s on 40 KB); now the first split point ends the match (linear).
_PUT = re.compile(r"^put (.+?) (?:in/on|in|on|into|onto) (.+)$", re.DOTALL)
_MOVE = re.compile(r"^move (.+?) to (.+)$", re.DOTALL)


def normalise_action(action: str, admissible: list[str]) -> str:
    """Maps `put X in/on Y` <-> `move X to Y` onto the form this game's grammar admits (both generations). An
    action longer than envs.MAX_ACTION_CHARS is returned as is (no command is that long: the game answers
    'Nothing happens.')."""
    action = action.strip()
    if action in admissible or len(action) > MAX_ACTION_CHARS:
        return action
    m = _PUT.match(action) or _MOVE.match(action)
    if m:
        o, r = m.groups()
        for cand in (f"move {o} to {r}", f"put {o} in/on {r}", f"put {o} in {r}", f"put {o} on {r}"):
            if cand in admissible:
                return cand
    return action


@dataclass
class GameInfo:
    """Static facts of one game, read once at its first reset:
    what the signature needs besides dynamic facts."""
    recep_at_loc: dict[str, tuple[str, ...]]  # location name -> sorted receptacle display names there
    obj_type: dict[str, str]                   # object display name -> type ("mug")
    recep_type: dict[str, str]                 # receptacle display name -> type ("coffeemachine")
    goal_obj: str                              # goal object type, lowercase ("mug")
    goal_parent: str                           # goal receptacle type ("" for look_at_obj_in_light)
    goal_toggle: str                           # goal light type ("" unless look_at_obj_in_light)
    relevant: frozenset = frozenset()          # objects of the goal's object or toggle type


def _facts_by_predicate(facts) -> dict[str, list[tuple[str, ...]]]:
    """Engine facts (textworld Propositions, display names) -> {predicate: [argument-name tuples]},
    positives only."""
    out = {}
    for f in facts:
        if not f.name.startswith(("not_", "new-axiom")):
            # "agent1 " -> "agent1"
            out.setdefault(f.name, []).append(tuple(a.name.strip() for a in f.arguments))
    return out


def _type_name(t: str) -> str:
    return t[:-4] if t.endswith("type") else t  # "mugtype" -> "mug"


def game_info(facts: dict, pddl_problem: str, task_type: str) -> GameInfo:
    goal = pddl_problem[pddl_problem.rfind("(:goal"):]
    otypes = [t.lower() for t in re.findall(r"objectType \?\w+ (\w+)Type", goal)]
    rtypes = [t.lower() for t in re.findall(r"receptacleType \?\w+ (\w+)Type", goal)]
    toggle = otypes.pop(0) if task_type == "look_at_obj_in_light" else ""  # its goal names the light first
    locs = {}
    for r, loc in facts.get("receptacleatlocation", []):
        locs.setdefault(loc, []).append(r)
    info = GameInfo({loc: tuple(sorted(rs)) for loc, rs in locs.items()},
                    {o: _type_name(t) for o, t in facts.get("objecttype", [])},
                    {r: _type_name(t) for r, t in facts.get("receptacletype", [])},
                    otypes[0], rtypes[0] if rtypes else "", toggle)
    info.relevant = frozenset(o for o, t in info.obj_type.items() if t in (info.goal_obj, info.goal_toggle))
    return info


def _progress(facts: dict, g: GameInfo, task_type: str, here: tuple[str, ...]) -> tuple[str, ...]:
    """Goal conditions already satisfied, as short strings (see the module docstring)."""
    done = []
    in_parent = [o for o, r in facts.get("inreceptacle", []) if g.obj_type.get(o) == g.goal_obj
                 and g.recep_type.get(r) == g.goal_parent]
    flag = {"pick_clean_then_place_in_recep": "clean", "pick_heat_then_place_in_recep": "hot",
            "pick_cool_then_place_in_recep": "cool"}.get(task_type)
    if task_type == "pick_and_place_simple" and in_parent:
        done.append(f"{g.goal_obj} in {g.goal_parent}")
    elif flag:
        flagged = {o for (o,) in facts.get("is" + flag, []) if g.obj_type.get(o) == g.goal_obj}
        done += [f"{flag} {g.goal_obj}"] if flagged else []
        done += [f"{flag} {g.goal_obj} in {g.goal_parent}"] if flagged & set(in_parent) else []
    elif task_type == "pick_two_obj_and_place":
        done += [f"{k} {g.goal_obj} in {g.goal_parent}" for k in range(1, min(len(in_parent), 2) + 1)]
    elif task_type == "look_at_obj_in_light":
        if any(g.obj_type.get(o) == g.goal_obj for _, o in facts.get("holds", [])):
            done.append(f"holding {g.goal_obj}")
        toggled = {o for (o,) in facts.get("istoggled", [])}  # the goal checks isToggled
        if any(o in toggled and g.obj_type.get(o) == g.goal_toggle and r in here
               for o, r in facts.get("inreceptacle", [])):
            done.append(f"{g.goal_toggle} on here")
    return tuple(done)


# "on" is read from isToggled: the engine's ToggleObject leaves isOn false (its two `when` effects cancel
# out), and isToggled is what the look_at_obj_in_light goal checks.
_FLAGS = (("isclean", "clean"), ("ishot", "hot"), ("iscool", "cool"), ("istoggled", "on"))


def alfworld_signature(task: Task, facts: dict, g: GameInfo) -> Signature:
    """The state's `envs.alfworld_signature`, its fields read from the engine's facts. Deterministic: sorted
    tuples."""
    agent_loc = [loc for a, loc in facts.get("atlocation", []) if a == "agent1"]
    here = g.recep_at_loc.get(agent_loc[0], ()) if agent_loc else ()
    return envs.alfworld_signature(
        task.task_id,
        location=here or ("middle of the room",),
        holding=tuple(sorted(o for _, o in facts.get("holds", []))),
        opened=tuple(sorted(r for (r,) in facts.get("opened", []))),
        placed=tuple(sorted((o, r) for o, r in facts.get("inreceptacle", []) if o in g.relevant)),
        states=tuple(sorted((o, flag) for pred, flag in _FLAGS for (o,) in facts.get(pred, [])
                            if o in g.relevant)),
        progress=_progress(facts, g, task.task_type, here))


def memoize_text_grammar() -> None:
    """Speed: textworld derives every observation through its text grammar and re-parses the same template
    strings with a tatsu parser on every step (about two thirds of a step's time). The parse is a pure
    function of its arguments, so it is memoised; each call gets a deep copy (derivation mutates the symbols).
    Observations are unchanged (tested)."""
    from textworld.envs.pddl import textgen
    parse = textgen._parse_and_convert
    if getattr(parse, "memoized", False):
        return
    cache: dict = {}

    def memoized(text, **kwargs):
        key = (text, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = parse(text, **kwargs)
        return copy.deepcopy(cache[key])
    memoized.memoized, memoized.original = True, parse
    textgen._parse_and_convert = memoized


def memoize_pddl_translation(maxsize: int = 32) -> None:
    """Speed: every reset builds the game's state by translating its PDDL domain and problem to Fast
    Downward's SAS format, twice (about 70% of a reset's time), though a game's text never changes between
    resets. The translation is a pure function of its arguments, so the last `maxsize` are memoised; each call
    gets a deep copy of the parsed task (the SAS text is immutable). States and observations are unchanged
    (tested)."""
    import fast_downward
    translate = fast_downward.pddl2sas
    if getattr(translate, "memoized", False):
        return
    cached = functools.lru_cache(maxsize=maxsize)(translate)

    def memoized(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
        task, sas = cached(domain, problem, verbose, optimize)
        return copy.deepcopy(task), sas
    memoized.memoized, memoized.original, memoized.cache_info = True, translate, cached.cache_info
    fast_downward.pddl2sas = memoized


class AlfworldEnv:
    """One ALFWorld episode at a time on the real engine;
    loaded games are kept (LRU) and reused across resets."""

    def __init__(self, cfg: AlfworldConfig):
        self.cfg = cfg
        self._games = OrderedDict()  # gamefile -> [textworld env, GameInfo | None]
        self._task, self._tw, self._info, self._admissible = None, None, None, []
        self._steps, self._done, self._goal = 0, True, ""

    def _load(self, path: str) -> list:
        if path in self._games:
            self._games.move_to_end(path)
            return self._games[path]
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from textworld.envs import PddlEnv
        memoize_text_grammar()
        memoize_pddl_translation()
        infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=True, extras=["gamefile"])
        tw = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
        tw.load(path)
        self._games[path] = [tw, None]
        while len(self._games) > max(1, self.cfg.game_cache_size):
            self._games.popitem(last=False)[1][0].close()
        return self._games[path]

    def reset(self, task: Task) -> StepResult:
        entry = self._load(task.source)
        self._task, self._tw = task, entry[0]
        state = self._tw.reset()
        facts = _facts_by_predicate(state["facts"])
        if entry[1] is None:
            entry[1] = game_info(facts, self._tw._game_data["pddl_problem"], task.task_type)
        self._info, self._steps, self._done = entry[1], 0, False
        intro = state.feedback
        if "Your task is to: " not in intro:
            raise EnvError(f"task {task.task_id}: intro has no 'Your task is to: ' ({intro[-200:]!r})")
        self._goal = intro.split("Your task is to: ", 1)[1].strip().rstrip(".")
        return self._result(state, facts, intro, 0.0, {})

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError(f"task {self._task and self._task.task_id}: step({action!r}) "
                           "on a finished episode")
        command = normalise_action(action, self._admissible)
        state, _, _ = self._tw.step(command)
        self._steps += 1
        won = bool(state["won"])
        extra = {"action": command, "truncated": not won and self._steps >= self.cfg.max_steps}
        return self._result(state, _facts_by_predicate(state["facts"]), state.feedback, 10.0 if won else 0.0,
                            extra)

    def _result(self, state, facts: dict, observation: str, reward: float, extra: dict) -> StepResult:
        won = bool(state["won"])
        self._admissible = list(state["admissible_commands"])
        self._done = won or self._steps >= self.cfg.max_steps
        info = {"gamefile": self._task.source, "step": self._steps, "truncated": False, **extra}
        return StepResult(observation, [a for a in self._admissible if a != "help"], reward, self._done, won,
                          float(won), self._goal, alfworld_signature(self._task, facts, self._info), info)

    def expert_plan(self) -> list[str]:
        """The engine planner's plan from the current state (what EnvInfos(policy_commands=True) calls)."""
        return self._tw._pddl_state.replan(self._tw._entity_infos)

    def close(self):
        for tw, _ in self._games.values():
            tw.close()
        self._games.clear()




_PLANNER = Planner(AlfworldConfig(max_steps=10**9, game_cache_size=2))  # no step limit: plans can be long
atexit.register(_PLANNER.close)
