"""An observation-feasible scripted ALFWorld expert: what the warm start imitates.

Why not the planner: the engine's PDDL planner is omniscient. It walks straight to an object's hidden
location, which an agent cannot infer from what it has seen, so a model cloned from it learns to guess. This
expert uses only what the agent's prompt shows: the goal, the current observation and the admissible
commands. It

  1. searches: visits receptacles in a fixed order (sorted by name, cyclic from where it stands), skipping
     types that cannot hold the object (common sense: a mug is not in a bed; the generator's `CAN_CONTAIN`
     table) and the goal's receptacle type (a target never starts there); opens a closed receptacle it
     searches; takes the first object of the goal's type it sees;
  2. transforms: for clean/heat/cool tasks, goes to the sink basin / microwave / fridge and uses it;
  3. delivers: goes to the first receptacle of the goal's type, opens it if closed, puts the object there
     (twice for pick_two); for look_at_obj_in_light it searches for the lamp instead and uses it.

Its decisions are a function of (goal, where it stands, what it holds, the admissible commands, the last
action), all visible in a prompt with one step of history, so a model can imitate it exactly. `play` runs it
through an env and can replace some of its "go to" moves by random ones (a DAgger-style perturbation: the
label stays the expert's choice, so the imitator also learns to recover from states the clean expert never
visits).
"""
import copy
import json
import os
import random
import re
from dataclasses import dataclass, field

from environments.alfworld_games import CAN_CONTAIN

_HOLDS = {r.lower(): {o.lower() for o in objs} for r, objs in CAN_CONTAIN.items()}
_APPLIANCE = {"pick_clean_then_place_in_recep": ("sinkbasin", "clean"),
              "pick_heat_then_place_in_recep": ("microwave", "heat"),
              "pick_cool_then_place_in_recep": ("fridge", "cool")}


@dataclass(frozen=True)
class Goal:
    """The goal sentence in structured form (ALFWorld's traj_data.json `pddl_params`, lowercase)."""
    task_type: str
    obj: str     # "mug"
    parent: str  # "coffeemachine" ("" for look_at_obj_in_light)
    light: str   # "desklamp" for look_at_obj_in_light, else ""


def goal_of(task) -> Goal:
    with open(os.path.join(os.path.dirname(task.source), "traj_data.json")) as f:
        p = json.load(f)["pddl_params"]
    return Goal(task.task_type, p["object_target"].lower(), p["parent_target"].lower(),
                p["toggle_target"].lower())


def _kind(name: str) -> str:
    return name.rsplit(" ", 1)[0]  # "cabinet 2" -> "cabinet"


def _order(name: str) -> tuple[str, int]:
    kind, number = name.rsplit(" ", 1)
    return kind, int(number)


@dataclass
class Expert:
    goal: Goal
    holding: str | None = None  # object in hand ("mug 1")
    transformed: bool = False   # cleaned / heated / cooled the object in hand
    reverse: bool = False       # another search order: receptacles in descending order, the last of a kind
    log: list = field(default_factory=list)

    def act(self, admissible: list[str]) -> str:
        here = next((a[8:] for a in admissible if a.startswith("examine ") and _kind(a[8:]) in _HOLDS), None)
        places = sorted({a[6:] for a in admissible if a.startswith("go to ")}, key=_order)
        g = self.goal
        if self.holding is None:
            for a in admissible:
                m = re.match(rf"^take ({re.escape(g.obj)} \d+) from (.+)$", a)
                if m and _kind(m.group(2)) != g.parent:
                    self.holding = m.group(1)
                    return a
            if here and f"open {here}" in admissible:
                return f"open {here}"
            return self._search(places, here, g.obj)
        if g.task_type == "look_at_obj_in_light":
            use = [a for a in admissible if a.startswith("use ")]
            return use[0] if use else self._search(places, here, g.light)
        if g.task_type in _APPLIANCE and not self.transformed:
            appliance, verb = _APPLIANCE[g.task_type]
            if here and _kind(here) == appliance:
                self.transformed = True
                return f"{verb} {self.holding} with {here}"
            return self._go(places, appliance)
        if here and _kind(here) == g.parent:
            if f"open {here}" in admissible:
                return f"open {here}"
            # the grammar's own form: "move X to Y" (ALFWorld 0.4 games) or "put X in/on Y" (json_2.1.1)
            action = next(a for a in (f"move {self.holding} to {here}", f"put {self.holding} in/on {here}")
                          if a in admissible)
            self.holding, self.transformed = None, False
            return action
        return self._go(places, g.parent)

    def label(self, admissible: list[str]) -> str:
        """What the expert would do here, without committing to it
        (its state changes only through `follow`)."""
        return copy.copy(self).act(admissible)

    def follow(self, action: str) -> None:
        """Track an action someone else took (a reference's): what is held and whether it was transformed."""
        verb = action.split(" ", 1)[0]
        if verb == "take":
            self.holding = re.match(r"^take (.+) from ", action).group(1)
        elif verb in ("clean", "heat", "cool"):
            self.transformed = True
        elif verb in ("move", "put"):
            self.holding, self.transformed = None, False

    def _search(self, places: list[str], here: str | None, wanted: str) -> str:
        """The next receptacle after `here` (cyclic, sorted by name;
        descending if `reverse`) that can hold `wanted`."""
        fits = [p for p in places if wanted in _HOLDS.get(_kind(p), ()) and _kind(p) != self.goal.parent]
        if self.reverse:
            fits.reverse()  # places come sorted by name
        after = (lambda p: _order(p) < _order(here)) if self.reverse else (lambda p: _order(p) > _order(here))
        later = [p for p in fits if here is None or after(p)]
        return "go to " + (later or fits)[0] if fits else "look"

    def _go(self, places: list[str], kind: str) -> str:
        of_kind = [p for p in places if _kind(p) == kind] or places
        return "go to " + (of_kind[-1] if self.reverse else of_kind[0])


def play(env, task, rng: random.Random, explore: float = 0.0, max_steps: int = 60):
    """One expert episode: a list of (StepResult seen, expert action, action taken) and the final StepResult.
    With probability `explore`, a "go to" move of the expert is replaced by a random "go to" (the label
    stays)."""
    res, expert, steps = env.reset(task), Expert(goal_of(task)), []
    while not res.done and len(steps) < max_steps:
        label = expert.act(res.admissible)
        taken = label
        if explore and label.startswith("go to ") and rng.random() < explore:
            taken = rng.choice([a for a in res.admissible if a.startswith("go to ")])
        steps.append((res, label, taken))
        res = env.step(taken)
    return steps, res
