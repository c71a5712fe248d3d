"""TextWorld on the real engine: games generated offline by TextWorld's own challenges, the env, the
walkthrough as the expert. No hand-written signature: the routing signature is the generic one of envs.

- `TextWorldConfig` (an `envs.EpisodeConfig`): `load_tasks(split)` generates (once) and lists the games of
  `tw-make <challenge> <settings>`, `make_env()`, and `plan(task, actions, timeout_s)`: the game's
  walkthrough.
- `TextWorldEnv`: the stock engine, `textworld.start(game.z8, EnvInfos(admissible_commands, won, lost, ...))`
  (Jericho runs the compiled Inform 7 game; TextWorld's TWInform7 wrapper tracks the state). A game is loaded
  once per env instance and reused across resets (a small LRU).

Games. `textworld.challenges.CHALLENGES[challenge]` makes a game from the challenge's own tw-make options
(parsed by the challenge's own argparse arguments, so `settings` reads exactly like `tw-make`'s command line),
and `textworld.generator.compile_game` compiles it to `tw-game.z8` + `tw-game.json` (the .json holds the
walkthrough and the objective). Game i of a split has seed `seed * 1_000_000 + 2 * i` (+1 for eval), so
train and eval never share a seed; each game is generated into a temporary folder, its walkthrough replayed to
a win, then renamed into place (atomic), under a file lock per split (torchrun ranks wait for one writer, then
reuse).
Layout: `<cache_dir>/<challenge>-<settings>-seed<seed>/<split>/<nnnnn>/tw-game.{z8,json}`. The `tw-` prefix is
needed: Jericho fully supports a TextWorld game (score, and no status line in the text) only when its file
name starts with `tw-` (a `game.z8` leaks `-= Cellar =-0/1` into every observation).

Measured (2 cores, `SMRC_CACHE=$(mktemp -d) .venv/bin/python -m environments.textworld --num-train-games 10`,
add `--challenge X` for the others): at the defaults (tw-coin_collector --level 5) one game takes 1.1-1.5 s to
generate (1.3 s CPU, the Inform 7 compiler included; 0.6 s make + 0.5 s compile on an idle machine), so the
default 100 + 30 games take 2-3 min once; every walkthrough has 5 steps (level n <= 100: a chain of n rooms,
n - 1 moves and `take coin`; the objective spells the path out). Other challenges at their DEFAULT_SETTINGS
(CPU per game, walkthrough steps): tw-treasure_hunter 0.9 s, 3; tw-simple 1.7 s, 8-12; tw-cooking 1.8 s, 5.
An env start is 13 ms, a reset 5 ms, a step 1-2 ms. Of 30 default eval games none equals a train game, but 15
share their walkthrough (the sequence of directions) with one of the 100 train games (65 distinct there):
coin_collector at level 5 has few direction sequences; the text (rooms, objective wording) differs.

Episode conventions (as ALFWorld's in envs.StepResult): observation = the engine's text, tidied (trailing
spaces cut, runs of blank lines made one, stripped); the intro also loses TextWorld's ASCII-art banner
(`clean_intro`: leading paragraphs drawn only from the banner's glyphs). admissible = the engine's list
(TWInform7 sorts and deduplicates it). reward 10.0 on the winning step; done on won, lost (the game's own
losing states, e.g. a wrong object in tw-treasure_hunter) or max_steps (info['truncated']);
score = float(won); goal = the game's objective text ('' for tw-simple --goal none); info: gamefile, step,
truncated, lost, points (the game's own score), action (the command sent).

Deviations from the raw engine (numbered):
1. Newlines (and carriage returns) in an action become spaces: Jericho queues the text after a newline as the
   next turn's input, so one action would leak into later steps.
2. Out-of-world commands (save, restore, restart, quit, undo, script, verbose/brief, ...) and TextWorld's
   framework commands (tw-*, print_state, restrict commands, ...) are not sent to the engine: they write files
   into the working directory or change the game behind TextWorld's state tracking (after `restart` + `yes`
   the admissible commands describe the old room). The step counts and answers BLOCKED_TEXT.
"""
import argparse
import fcntl
import json
import os
import re
import shlex
import shutil
import statistics
import tempfile
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Literal

import envs
from envs import EnvError, EpisodeConfig, PlanResult, StepResult, Task

CHALLENGES = ("tw-coin_collector", "tw-treasure_hunter", "tw-simple", "tw-cooking")
DEFAULT_SETTINGS = {  # small games a tiny model has a chance on, generated in about a second each
    "tw-coin_collector": "--level 5",
    "tw-treasure_hunter": "--level 5",
    "tw-simple": "--rewards sparse --goal detailed",
    "tw-cooking": "--recipe 1 --take 1 --go 1",
}
SPLITS = ("train", "eval")
GAMES_KEPT = 4  # loaded games kept per env instance (a start costs about 13 ms)


@dataclass
class TextWorldConfig(EpisodeConfig):
    """TextWorld games generated offline by a `tw-make` challenge."""
    challenge: Literal["tw-coin_collector", "tw-treasure_hunter", "tw-simple", "tw-cooking"] = \
        "tw-coin_collector"
    """game kind, as `tw-make <challenge>` names it"""
    settings: str = ""
    """the challenge's tw-make options, given after '=' (--textworld.settings='--level 7'); '' = the
    challenge's DEFAULT_SETTINGS"""
    num_train_games: int = 100
    """games in the 'train' split"""
    num_eval_games: int = 30
    """games in the 'eval' split (seeds disjoint from training)"""
    seed: int = 0
    """generator seed (game i of a split: seed * 1_000_000 + 2 * i, +1 for eval)"""
    cache_dir: str = ""
    """where generated games are kept ('' = $SMRC_CACHE/textworld_gen, ~/.cache/smrc when unset)"""
    max_steps: int = 20
    """episode step limit; reaching it ends the episode with info['truncated']"""

    def load_tasks(self, split: str) -> list[Task]:
        """'train' or 'eval': the split's games (generated on first use), in index order."""
        if split not in SPLITS:
            raise ValueError(f"TextWorld splits are {SPLITS}, not {split!r}")
        return [Task(f"textworld/{self.challenge}/{split}/{i:05d}", self.challenge, "textworld", path)
                for i, path in enumerate(generate(self, split))]

    def make_env(self) -> "TextWorldEnv":
        return TextWorldEnv(self)

    def plan(self, task: Task, actions: list[str], timeout_s: float) -> PlanResult:
        """The walkthrough from the state after replaying `actions` (in this process; see `plan`)."""
        return plan(self, task, actions, timeout_s)


# ---------------------------------------------------------------------------------------------- games


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the usage and exit the trainer
        raise ValueError(message)


def challenge_settings(challenge: str, settings: str) -> dict:
    """`settings` (or the challenge's default) parsed by the challenge's own tw-make arguments."""
    import textworld.challenges
    if challenge not in CHALLENGES:
        raise ValueError(f"unknown TextWorld challenge {challenge!r}; one of {CHALLENGES}")
    parser = _Parser(prog=f"tw-make {challenge}", add_help=False)
    textworld.challenges.CHALLENGES[challenge][2](parser)
    text = settings or DEFAULT_SETTINGS[challenge]
    try:
        return vars(parser.parse_args(shlex.split(text)))
    except ValueError as e:
        raise ValueError(f"TextWorld settings {text!r} for {challenge}: {e}") from None


def game_seed(seed: int, split: str, index: int) -> int:
    """Disjoint by construction: train games take even offsets, eval games odd ones."""
    assert split in SPLITS and 0 <= index < 500_000, (split, index)
    return seed * 1_000_000 + 2 * index + SPLITS.index(split)


def split_dir(cfg: TextWorldConfig, split: str) -> str:
    root = cfg.cache_dir or os.path.join(os.environ.get("SMRC_CACHE", "~/.cache/smrc"), "textworld_gen")
    settings = challenge_settings(cfg.challenge, cfg.settings)
    name = "-".join(k if v is True else f"{k}{v}" for k, v in sorted(settings.items())
                    if v is not None and v is not False)
    return os.path.join(os.path.abspath(os.path.expanduser(root)), f"{cfg.challenge}-{name}-seed{cfg.seed}",
                        split)


def generate(cfg: TextWorldConfig, split: str) -> list[str]:
    """The tw-game.z8 paths of games 0..n-1 of a split, generating the missing ones (under a lock)."""
    n = cfg.num_train_games if split == "train" else cfg.num_eval_games
    if n < 1:
        raise ValueError(f"TextWorld split {split!r} needs at least one game (got {n})")
    root = split_dir(cfg, split)
    paths = [os.path.join(root, f"{i:05d}", "tw-game.z8") for i in range(n)]
    if all(map(os.path.exists, paths)):
        return paths
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        missing = [i for i, p in enumerate(paths) if not os.path.exists(p)]
        settings, t0 = challenge_settings(cfg.challenge, cfg.settings), time.perf_counter()
        for i in missing:
            make_game(cfg.challenge, settings, game_seed(cfg.seed, split, i), os.path.dirname(paths[i]))
        if missing:
            print(f"textworld: generated {len(missing)} {cfg.challenge} games of {split!r} in "
                  f"{time.perf_counter() - t0:.1f} s under {root}", flush=True)
    return paths


def make_game(challenge: str, settings: dict, seed: int, folder: str) -> None:
    """One game into `folder` (tw-game.z8 + tw-game.json): made and compiled in a temporary folder, checked
    (its walkthrough wins), then renamed into place."""
    import textworld
    import textworld.challenges
    from textworld.generator import compile_game
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(folder))
    try:
        options = textworld.GameOptions()
        options.seeds, options.path, options.file_ext = seed, os.path.join(tmp, "tw-game.z8"), ".z8"
        game = textworld.challenges.CHALLENGES[challenge][1](settings=dict(settings), options=options)
        compile_game(game, options)
        for name in os.listdir(tmp):  # the Inform 7 source (.ni) is not needed to play
            if name not in ("tw-game.z8", "tw-game.json"):
                os.remove(os.path.join(tmp, name))
        walkthrough = game.metadata.get("walkthrough") or []
        env = TextWorldEnv(TextWorldConfig(max_steps=10**9))
        try:
            final = envs.replay(env, Task("check", challenge, "textworld", options.path), walkthrough)
        finally:
            env.close()
        if not final[-1].won:
            raise EnvError(f"generated {challenge} game (seed {seed}) is not won by its walkthrough "
                           f"{walkthrough}")
        os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def walkthrough(game_file: str) -> list[str]:
    """The walkthrough stored with a game (its .json metadata)."""
    with open(os.path.splitext(game_file)[0] + ".json") as f:
        return list(json.load(f)["metadata"].get("walkthrough") or [])


# ---------------------------------------------------------------------------------------------- env

_BANNER_GLYPHS = set(" _|\\/$<>\n")
BLOCKED_TEXT = "That command is not available in this game."
# Inform's out-of-world verbs (the Z-machine reads 9 letters of a word) and TextWorld's framework commands
_META_VERBS = {w[:9] for w in ("quit", "q", "save", "restore", "restart", "verify", "undo", "script",
                               "transcript", "unscript", "noscript", "verbose", "long", "brief", "normal",
                               "superbrief", "short", "notify", "pronouns", "nouns", "version", "score",
                               "full", "fullscore", "print_state", "enable", "disable", "restrict")}
_SUBCOMMANDS = re.compile(r"[.,;]|\bthen\b")  # where Inform's parser splits one line into several commands


def clean_intro(text: str) -> str:
    """The intro without TextWorld's ASCII-art banner: leading paragraphs made only of its glyphs go."""
    paragraphs = text.strip("\n").split("\n\n")
    while paragraphs and set(paragraphs[0]) <= _BANNER_GLYPHS:
        paragraphs.pop(0)
    return "\n\n".join(paragraphs)


def tidy(text: str) -> str:
    """Trailing spaces cut, runs of blank lines made one, stripped."""
    lines = "\n".join(line.rstrip() for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", lines).strip()


def command(action: str) -> str:
    """The command sent to the engine: one line (deviation 1)."""
    return re.sub(r"[\r\n]+", " ", action).strip()


def is_blocked(cmd: str) -> bool:
    """An out-of-world or framework command anywhere in the line (deviation 2)."""
    for part in _SUBCOMMANDS.split(cmd.lower()):
        words = part.split()
        if words and (words[0][:9] in _META_VERBS or words[0].startswith("tw-")):
            return True
    return False


class TextWorldEnv:
    """One TextWorld episode at a time on the real engine; loaded games are kept (LRU) and reused across
    resets. `expert=True` also asks the engine for its winning policy (`expert_plan`)."""

    def __init__(self, cfg: TextWorldConfig, expert: bool = False):
        self.cfg, self.expert = cfg, expert
        self._games = OrderedDict()  # game file -> started textworld env
        self._task, self._tw, self._state = None, None, None
        self._steps, self._done, self._goal = 0, True, ""

    def _load(self, path: str):
        if path in self._games:
            self._games.move_to_end(path)
            return self._games[path]
        import textworld
        if not os.path.basename(path).startswith("tw-"):
            raise EnvError(f"TextWorld game {path}: the file name must start with 'tw-' (Jericho fully "
                           "supports TextWorld games only then; see the module docstring)")
        # Jericho's own valid-action search knows no generated game (it warns and returns []); TextWorld's
        # state tracker gives the admissible commands. The game's metadata (its walkthrough too) comes as
        # extra.* without asking.
        warnings.filterwarnings("ignore", "Unable to find valid actions in an unsupported game")
        infos = textworld.EnvInfos(admissible_commands=True, won=True, lost=True, objective=True, score=True,
                                   policy_commands=self.expert)
        self._games[path] = textworld.start(path, request_infos=infos)
        while len(self._games) > GAMES_KEPT:
            self._games.popitem(last=False)[1].close()
        return self._games[path]

    def reset(self, task: Task) -> StepResult:
        self._task, self._tw = task, self._load(task.source)
        self._state = self._tw.reset()
        self._steps, self._done = 0, False
        self._goal = tidy(self._state["objective"] or "")
        return self._result(clean_intro(self._state.feedback), {})

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError(f"task {self._task and self._task.task_id}: step({action!r}) "
                           "on a finished episode")
        cmd = command(action)
        self._steps += 1
        if is_blocked(cmd):
            return self._result(BLOCKED_TEXT, {"action": cmd})
        self._state, _, _ = self._tw.step(cmd)
        return self._result(self._state.feedback, {"action": cmd})

    def _result(self, observation: str, extra: dict) -> StepResult:
        state = self._state
        won, lost = bool(state["won"]), bool(state["lost"])
        out_of_steps = self._steps >= self.cfg.max_steps
        self._done = won or lost or out_of_steps
        info = {"gamefile": self._task.source, "step": self._steps, "truncated": out_of_steps and not won
                and not lost, "lost": lost, "points": int(state["score"] or 0), **extra}
        return StepResult(tidy(observation), list(state["admissible_commands"]),
                          10.0 if won and self._steps else 0.0, self._done, won, float(won), self._goal,
                          (), info)  # no hand-written signature: envs computes the generic one

    def walkthrough(self) -> list[str]:
        """The game's walkthrough, from its start."""
        return list(self._state["extra.walkthrough"] or [])

    def expert_plan(self) -> list[str]:
        """The engine's winning policy from the current state (EnvInfos(policy_commands=True))."""
        assert self.expert, "expert_plan() needs TextWorldEnv(cfg, expert=True)"
        return list(self._state["policy_commands"] or [])

    def close(self):
        for tw in self._games.values():
            tw.close()
        self._games.clear()


# ---------------------------------------------------------------------------------------------- expert


def plan(cfg: TextWorldConfig, task: Task, actions: list[str], timeout_s: float) -> PlanResult:
    """Replay `actions` from reset (no step limit, as ALFWorld's planner), then: the rest of the walkthrough
    when `actions` are a prefix of it, else the engine's winning policy from the state reached; [] once won;
    'unsolvable' when the game is lost or no policy exists. In-process (milliseconds): a slower answer is
    reported as 'timeout' after the fact."""
    t0 = time.perf_counter()
    env = TextWorldEnv(replace(cfg, max_steps=10**9), expert=True)
    try:
        last = envs.replay(env, task, actions)[-1]
        steps = [command(a).lower() for a in actions]
        full = env.walkthrough()
        if last.won:
            rest, status, message = [], "ok", "already won"
        elif last.info["lost"]:
            rest, status, message = None, "unsolvable", "the game is lost"
        elif steps == [a.lower() for a in full[:len(steps)]]:
            rest, status, message = full[len(steps):], "ok", "walkthrough"
        else:
            rest = env.expert_plan() or None
            status, message = ("ok", "policy") if rest else ("unsolvable", "the engine found no policy")
    except Exception as e:  # a plan failure must not take the trainer down; report it
        return PlanResult(None, "error", time.perf_counter() - t0, f"{type(e).__name__}: {e}")
    finally:
        env.close()
    seconds = time.perf_counter() - t0
    if seconds > timeout_s:
        return PlanResult(None, "timeout", seconds, f"took {seconds:.2f} s > {timeout_s} s")
    return PlanResult(rest, status, seconds, message)


def measure(cfg: TextWorldConfig) -> None:
    """Generates cfg's train split and prints the time per game (wall, and CPU with the Inform 7 compiler's
    processes) and the walkthrough lengths."""
    def cpu() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system
    t0, c0 = time.perf_counter(), cpu()
    tasks = cfg.load_tasks("train")
    seconds, cpu_s, n = time.perf_counter() - t0, cpu() - c0, len(tasks)
    lengths = [len(walkthrough(t.source)) for t in tasks]
    settings = cfg.settings or DEFAULT_SETTINGS[cfg.challenge]
    print(f"{cfg.challenge} {settings!r}: {n} games in {seconds:.1f} s "
          f"({seconds / n:.2f} s wall, {cpu_s / n:.2f} s CPU per game; ~0 if cached); walkthrough steps min "
          f"{min(lengths)}, median {statistics.median(lengths)}, max {max(lengths)}")


if __name__ == "__main__":  # python -m environments.textworld (not the file path: it would shadow textworld)
    import tyro
    measure(tyro.cli(TextWorldConfig))
