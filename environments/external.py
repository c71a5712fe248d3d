"""An environment from outside the project: `python smrc.py --env package.module:Class` (contract: envs.py).

`Class` is either
- an `envs.EpisodeConfig` subclass: the whole contract in your hands (tasks by split, an env with reset(task)
  and step(action) answering `envs.StepResult`, optionally a planner), built with its defaults; or
- a gymnasium-style text environment, plugged in through `TextEnvAdapter`:
      reset(seed=None, options=None) -> (observation: str, info: dict)
      step(action: str) -> (observation: str, reward: float, terminated: bool, truncated: bool, info: dict)
  info may hold "admissible_commands" (list[str]), "won" (bool; else: terminated with a positive reward) and
  "goal" (the task text the prompt shows; else ""). Optional methods: `tasks(split) -> list[int]` (the seeds
  of a split; else 0..n-1 for train and 1_000_000.. for eval, --external.num-*-tasks), `walkthrough() ->
  list[str]` (a solution from the state just reset: the planner's references), `signature() -> tuple` of
  (name, value) pairs (a structured signature; else the generic one, envs.observation_signature), `close()`.
A task is a seed: `reset(seed=s)` must start the same task in the same state every time (a GRPO group plays
it n times). The class is built with `--external.kwargs` (a JSON object) in every env worker.

`check(cfg)` (before anything is written): the module imports, the class has what the contract asks, and a
reset of the first train task answers a string observation and, if any, a list of string actions; each
failure is one `error:` line.
"""
import importlib
import json
import time
from dataclasses import dataclass

from envs import EnvError, EpisodeConfig, PlanResult, StepResult, Task

EVAL_SEED0 = 1_000_000  # eval seeds start here, so train and eval never share one


@dataclass
class ExternalConfig(EpisodeConfig):
    """An environment of your own (--env package.module:Class)."""
    spec: str = ""
    """package.module:Class (set from --env)"""
    kwargs: str = "{}"
    """the class's keyword arguments, a JSON object"""
    num_train_tasks: int = 64
    """train seeds 0..n-1 (when the class has no `tasks(split)`)"""
    num_eval_tasks: int = 32
    """eval seeds 1_000_000.. (when the class has no `tasks(split)`)"""

    def build(self):
        return load_class(self.spec)(**json.loads(self.kwargs))

    def load_tasks(self, split: str) -> list[Task]:
        env = self.build()
        if isinstance(env, EpisodeConfig):
            return env.load_tasks(split)
        n, first = (self.num_train_tasks, 0) if split == "train" else (self.num_eval_tasks, EVAL_SEED0)
        seeds = env.tasks(split) if hasattr(env, "tasks") else range(first, first + n)
        name = env_name(self.spec)
        getattr(env, "close", lambda: None)()
        return [Task(f"{name}/{split}/{s}", name, name, str(s)) for s in seeds]

    def make_env(self):
        env = self.build()
        return env.make_env() if isinstance(env, EpisodeConfig) else TextEnvAdapter(env, self.max_steps)

    def plan(self, task: Task, actions: list[str], timeout_s: float) -> PlanResult:
        built = self.build()
        if isinstance(built, EpisodeConfig):
            return built.plan(task, actions, timeout_s)
        t0, env = time.perf_counter(), TextEnvAdapter(built, self.max_steps)
        try:
            if hasattr(built, "walkthrough") and not actions:
                env.reset(task)
                return PlanResult(list(env.env.walkthrough()), "ok", time.perf_counter() - t0, "")
            return PlanResult(None, "unsolvable", time.perf_counter() - t0, "no walkthrough from this state")
        finally:
            env.close()


def env_name(spec: str) -> str:
    """The environment's name in task ids and prompts: the class name, lowercased."""
    return spec.rsplit(":", 1)[-1].lower()


def load_class(spec: str):
    """The class `package.module:Class` names; a failure is one error line."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise SystemExit(f"error: --env {spec!r} is neither alfworld, webshop, textworld nor "
                         f"package.module:Class")
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise SystemExit(f"error: --env {spec}: module {module!r} does not import ({e}); is it on "
                         f"PYTHONPATH?") from None
    except AttributeError:
        raise SystemExit(f"error: --env {spec}: module {module!r} has no {name!r}") from None
    if not isinstance(cls, type) or issubclass(cls, EpisodeConfig):
        return cls
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        raise SystemExit(f"error: --env {spec}: {name} has no {' and no '.join(missing)} method; an "
                         f"environment needs reset(seed, options) -> (obs, info) and step(action) -> (obs, "
                         f"reward, terminated, truncated, info) (envs.py, the contract)")
    return cls


def check_kwargs(text: str) -> None:
    """--external.kwargs is a JSON object (one error line if not), checked before the class is built."""
    try:
        ok = isinstance(json.loads(text), dict)
    except ValueError as e:
        raise SystemExit(f"error: --external.kwargs is not a JSON object ({e})") from None
    if not ok:
        raise SystemExit(f"error: --external.kwargs {text} is not a JSON object")


def check(cfg: ExternalConfig) -> None:
    """The environment answers as the contract says on its first train task (one error line if not)."""
    tasks = cfg.load_tasks("train")
    if not tasks:
        raise SystemExit(f"error: --env {cfg.spec} has no train task")
    env = cfg.make_env()
    try:
        env.reset(tasks[0])
    except EnvError as e:
        raise SystemExit(f"error: --env {cfg.spec}: {e}") from None
    finally:
        env.close()


class TextEnvAdapter:
    """A gymnasium-style text environment as an envs env: reset(task) -> StepResult, step(action) ->
    StepResult, close(). reward 10.0 on the winning step (as the built-in environments: the env's own reward
    is in info['reward']); done on terminated, truncated or max_steps; score = float(won)."""

    def __init__(self, env, max_steps: int):
        self.env, self.max_steps = env, max_steps
        self.task, self.goal, self.steps = None, "", 0

    def reset(self, task: Task) -> StepResult:
        self.task, self.steps = task, 0
        obs, info = self.env.reset(seed=int(task.source), options={"task": task.task_id})
        self.goal = str(info.get("goal", ""))
        return self._result(obs, 0.0, False, False, info)

    def step(self, action: str) -> StepResult:
        self.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._result(obs, reward, terminated, truncated, {**info, "action": action})

    def _result(self, obs, reward, terminated, truncated, info: dict) -> StepResult:
        if not isinstance(obs, str):
            raise EnvError(f"{self.task.task_id}: the observation is a {type(obs).__name__}, not a str")
        admissible = info.get("admissible_commands", [])
        if not isinstance(admissible, list) or not all(isinstance(a, str) for a in admissible):
            raise EnvError(f"{self.task.task_id}: info['admissible_commands'] is not a list of str")
        won = bool(info.get("won", terminated and reward > 0))
        over = self.steps >= self.max_steps
        done = bool(terminated or truncated or won or over)
        extra = {"step": self.steps, "truncated": bool(truncated or (over and not won)),
                 "reward": float(reward)}
        signature = tuple(self.env.signature()) if hasattr(self.env, "signature") else ()
        info = {k: v for k, v in info.items() if _jsonable(v)}
        return StepResult(obs, admissible, 10.0 if won else 0.0, done, won, float(won), self.goal, signature,
                          {**info, **extra})

    def close(self) -> None:
        getattr(self.env, "close", lambda: None)()


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False

