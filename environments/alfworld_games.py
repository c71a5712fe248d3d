"""Seeded generator of ALFWorld games (game.tw-pddl + traj_data.json) for the real TextWorld engine.

What it does: writes games that the stock ALFWorld engine (`textworld.envs.PddlEnv` + alfworld wrappers) loads
exactly like downloaded ones. The PDDL domain and the grammar are read from the installed alfworld wheel
(`alfworld.info.ALFRED_PDDL_PATH` / `ALFRED_TWL2_PATH`); the task sentence is put into the grammar by
ALFWorld's own `add_task_to_grammar` (which draws the goal template with the *global* `random`, so we seed it
around the call and restore its state). Only the PDDL problem (objects, initial facts, goal) is ours, written
from the room tables below. The goal is ALFWorld's `goal_library.gdict[task_type]['pddl']` with the type names
filled in.

Layout: `<cache_dir>/<size>-<seed>/<split>/<task_type>-<Obj>-<MRecep>-<Recep>-gen<NNNNN>/{game.tw-pddl,
traj_data.json}`; the task type is in the path, as in the official data (verl-agent logs success per type by
substring of the game path). Writing is deterministic and idempotent (a file whose content hash is unchanged
is not rewritten; writes are atomic).

Use: `python environments/alfworld_games.py --split train --num-games 12 --size small` prints the game paths;
the trainer calls `generate(...)` through `envs.load_tasks(AlfworldConfig(source="generated"), split)`.

Deviations from the official data set (numbered):
1. Rooms are drawn from our own type lists and one canContain table, not from THOR scenes; every receptacle
   has its own location (official scenes sometimes put two receptacles at one location).
2. Task types cycle with the game index (game i has type TASK_TYPES[i % 6]), so any split of >= 6 games holds
   all six types; the official data is imbalanced.
3. Solvability is by construction (the target objects, the appliance and a receptacle of the parent type are
   present and reachable; no target object starts where the goal wants it). `"solvable": true` is written
   without running the planner; tests/test_alfworld_games.py checks it with the Fast Downward planner.
4. Only DeskLamp is used as the light for look_at_obj_in_light (no FloorLamp); no sliced or movable tasks
   (ALFWorld filters those out of its data set too).
5. Train and eval games come from disjoint seeds by construction: game i of split s uses
   seed * 1_000_000 + 2 * i (+1 for eval).
"""
import hashlib
import json
import os
import random
from dataclasses import dataclass

TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")
SPLITS = ("train", "eval")
DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser(os.environ.get("SMRC_CACHE", "~/.cache/smrc")),
                                 "alfworld_gen")


@dataclass(frozen=True)
class RoomSize:
    receptacles: tuple[int, int]  # inclusive range of receptacle count
    objects: tuple[int, int]      # inclusive range of object count (targets included)


SIZES = {
    "small": RoomSize((4, 8), (4, 8)),       # CPU runs: short intros, few admissible actions
    "medium": RoomSize((9, 14), (10, 19)),
    "real": RoomSize((15, 25), (20, 40)),    # the size of ALFRED scenes
}

# ---------------------------------------------------------------- type tables (ours, ALFRED-like)
FOOD = {"Apple", "Bread", "Egg", "Lettuce", "Potato", "Tomato"}
DISH = {"Bowl", "Cup", "Mug", "Plate", "Pan", "Pot", "Kettle"}
UTENSIL = {"ButterKnife", "Fork", "Knife", "Ladle", "Spatula", "Spoon"}
CONDIMENT = {"PepperShaker", "SaltShaker"}
SMALL = {"CellPhone", "CreditCard", "KeyChain", "Pen", "Pencil", "CD", "Watch"}
DESK = SMALL | {"AlarmClock", "Book", "Laptop", "Newspaper", "RemoteControl", "Statue", "Vase", "Box"}
BATH = {"Candle", "Cloth", "DishSponge", "HandTowel", "SoapBar", "SoapBottle", "SprayBottle", "ToiletPaper"}

# receptacle type -> object types it can contain (one table shared by all rooms)
CAN_CONTAIN = {
    "CounterTop": FOOD | DISH | UTENSIL | CONDIMENT | BATH | {"WineBottle", "CellPhone", "CreditCard",
                                                              "KeyChain"},
    "DiningTable": FOOD | DISH | UTENSIL | CONDIMENT | DESK | {"WineBottle", "SoapBottle"},
    "Cabinet": DISH | CONDIMENT | BATH | {"WineBottle", "Book", "Vase", "Box"},
    "Drawer": UTENSIL | SMALL | BATH - {"SoapBottle"} | {"Book"},
    "Fridge": FOOD | DISH - {"Kettle"} | {"WineBottle"},
    "Microwave": FOOD | {"Bowl", "Cup", "Mug", "Plate"},
    "SinkBasin": FOOD | DISH | UTENSIL | {"DishSponge", "Cloth", "SoapBar", "HandTowel"},
    "StoveBurner": {"Pan", "Pot", "Kettle"},
    "CoffeeMachine": {"Mug", "Cup"},
    "GarbageCan": FOOD | BATH - {"HandTowel"} | {"CD", "CreditCard", "Newspaper", "Pen", "Pencil",
                                                 "WineBottle"},
    "Shelf": DISH - {"Pan", "Pot"} | CONDIMENT | DESK | BATH | {"DeskLamp", "WineBottle"},
    "Bed": {"Book", "CellPhone", "Laptop", "Pillow", "TeddyBear", "BaseballBat", "TennisRacket", "Cloth"},
    "Desk": DESK | {"Mug", "Bowl", "Cup", "DeskLamp", "BaseballBat", "TennisRacket"},
    "Dresser": DESK | {"Mug", "Cup", "Bowl", "DeskLamp", "TeddyBear", "Cloth"},
    "SideTable": DESK | {"Mug", "Cup", "Bowl", "Plate", "DeskLamp", "Apple", "Bread"},
    "Safe": SMALL | {"Book"},
    "LaundryHamper": {"Cloth", "HandTowel"},
    "ArmChair": {"Book", "CellPhone", "Laptop", "Pillow", "RemoteControl", "Newspaper", "CreditCard",
                 "KeyChain", "Box", "Watch"},
    "Sofa": {"Book", "CellPhone", "Laptop", "Pillow", "RemoteControl", "Newspaper", "CreditCard", "KeyChain",
             "Box"},
    "CoffeeTable": DESK | {"Mug", "Bowl", "Plate", "Cup", "WateringCan", "DeskLamp"},
    "TVStand": DESK | {"WateringCan"},
    "Toilet": BATH - {"HandTowel"},
    "TowelHolder": {"Towel"},
    "HandTowelHolder": {"HandTowel"},
    "ToiletPaperHanger": {"ToiletPaper"},
    "BathtubBasin": {"Cloth", "SoapBar", "DishSponge", "HandTowel", "SoapBottle"},
}
OPENABLE = {"Cabinet", "Drawer", "Fridge", "Microwave", "Safe"}
CLEANABLE = FOOD | DISH | UTENSIL | {"Cloth", "SoapBar"}
HEATABLE = {"Apple", "Bread", "Cup", "Egg", "Mug", "Plate", "Potato", "Tomato"}
COOLABLE = FOOD | DISH - {"Kettle"} | {"WineBottle"}
SLICEABLE = FOOD - {"Egg"}
RECEPTACLE_OBJECTS = {"Bowl", "Cup", "Mug", "Pan", "Plate", "Pot"}
TOGGLEABLE = {"DeskLamp"}
APPLIANCE = {"pick_clean_then_place_in_recep": "SinkBasin", "pick_heat_then_place_in_recep": "Microwave",
             "pick_cool_then_place_in_recep": "Fridge"}
PROPERTY = {"pick_clean_then_place_in_recep": CLEANABLE, "pick_heat_then_place_in_recep": HEATABLE,
            "pick_cool_then_place_in_recep": COOLABLE}


@dataclass(frozen=True)
class Room:
    receptacles: dict[str, int]  # receptacle type -> max count at real size
    objects: tuple[str, ...]     # object types that occur in this room
    task_types: tuple[str, ...]  # task types this room hosts (as in ALFRED: heat/cool only in kitchens)


ROOMS = {
    "kitchen": Room({"Cabinet": 8, "CounterTop": 3, "Drawer": 6, "Fridge": 1, "Microwave": 1, "SinkBasin": 1,
                     "StoveBurner": 4, "CoffeeMachine": 1, "GarbageCan": 1, "Shelf": 3, "DiningTable": 1},
                    tuple(sorted(FOOD | DISH | UTENSIL | CONDIMENT
                                 | {"DishSponge", "SoapBottle", "WineBottle", "CellPhone", "CreditCard"})),
                    (TASK_TYPES[0], TASK_TYPES[2], TASK_TYPES[3], TASK_TYPES[4], TASK_TYPES[5])),
    "bedroom": Room({"Bed": 1, "Desk": 1, "Drawer": 6, "Dresser": 1, "SideTable": 2, "Shelf": 6,
                     "GarbageCan": 1, "LaundryHamper": 1, "Safe": 1, "ArmChair": 1},
                    tuple(sorted(DESK | {"BaseballBat", "TennisRacket", "Pillow", "TeddyBear", "Mug", "Cloth",
                                         "DeskLamp"})),
                    (TASK_TYPES[0], TASK_TYPES[1], TASK_TYPES[5])),
    "bathroom": Room({"Cabinet": 4, "CounterTop": 1, "Drawer": 4, "SinkBasin": 2, "Toilet": 1,
                      "TowelHolder": 1, "HandTowelHolder": 2, "ToiletPaperHanger": 1, "GarbageCan": 1,
                      "BathtubBasin": 1, "Shelf": 3},
                     tuple(sorted(BATH | {"Towel", "ScrubBrush", "Plunger"})),
                     (TASK_TYPES[0], TASK_TYPES[2], TASK_TYPES[5])),
    "livingroom": Room({"Sofa": 1, "ArmChair": 2, "CoffeeTable": 1, "SideTable": 3, "TVStand": 1, "Shelf": 6,
                        "Drawer": 6, "Cabinet": 4, "GarbageCan": 1, "Dresser": 1, "DiningTable": 1},
                       tuple(sorted(DESK | {"Pillow", "WateringCan", "DeskLamp", "Bowl", "Plate"})),
                       (TASK_TYPES[0], TASK_TYPES[1], TASK_TYPES[5])),
}
# Every type the domain's preconditions name must be declared in the problem, used or not.
DOMAIN_RTYPES = {"SinkBasin", "Microwave", "Fridge"}
DOMAIN_OTYPES = {"Knife", "ButterKnife"}


@dataclass(frozen=True)
class GameSpec:
    """What one generated game asks for (also the traj_data.json pddl_params)."""
    task_type: str
    room: str
    obj: str     # object_target type, e.g. "Mug"
    parent: str  # parent_target receptacle type ("" for look_at_obj_in_light)
    toggle: str  # toggle_target ("DeskLamp" for look_at_obj_in_light, else "")


def _num(v: float) -> str:
    return ("_plus_" if v >= 0 else "_minus_") + f"{abs(v):05.2f}".replace(".", "_dot_")


def _new_id(rng: random.Random, kind: str, used: set, suffix: str = "") -> str:
    """A PDDL id in ALFRED's mangled form (Type|x|y|z); the demangler turns it into '<type> N'."""
    while True:
        pid = kind + "".join("_bar_" + _num(rng.randint(-400, 400) / 100) for _ in range(3)) + suffix
        if pid not in used:
            used.add(pid)
            return pid


def _new_loc(rng: random.Random, used: set) -> str:
    while True:
        a, b = rng.randint(-15, 15), rng.randint(-15, 15)
        name = "loc" + "".join("_bar_" + (f"_minus_{-v}" if v < 0 else str(v))
                               for v in (a, b, rng.randint(0, 3), rng.choice((0, 15, 30, 45, 60))))
        if (a, b) not in used:
            used.add((a, b))
            return name


def _pick_spec(rng: random.Random, task_type: str) -> GameSpec:
    room_name = rng.choice(sorted(r for r, room in ROOMS.items() if task_type in room.task_types))
    room = ROOMS[room_name]
    if task_type == "look_at_obj_in_light":
        objs = sorted(o for o in room.objects if o in DESK
                      and any(o in CAN_CONTAIN[r] for r in room.receptacles))
        return GameSpec(task_type, room_name, rng.choice(objs), "", "DeskLamp")
    appliance = APPLIANCE.get(task_type, "")
    objs = [o for o in room.objects if o in PROPERTY.get(task_type, room.objects) and o not in TOGGLEABLE]
    while True:  # an (obj, parent) pair with a parent type and a different source type that hold obj
        obj = rng.choice(objs)
        holders = sorted(r for r in room.receptacles if obj in CAN_CONTAIN[r])
        parents = [r for r in holders if r != appliance and len(holders) >= 2]
        if parents:
            return GameSpec(task_type, room_name, obj, rng.choice(parents), "")


def _choose_receptacle_types(rng: random.Random, spec: GameSpec, n: int) -> list[str]:
    """Mandatory types first (parent, appliance, a source for the target, a holder for the lamp),
    then fill."""
    room = ROOMS[spec.room]
    mandatory = [spec.parent, APPLIANCE.get(spec.task_type, "")]
    mandatory.append(rng.choice(sorted(r for r in room.receptacles if spec.obj in CAN_CONTAIN[r]
                                       and r != spec.parent)))
    if spec.toggle:
        mandatory.append(rng.choice(sorted(r for r in room.receptacles if spec.toggle in CAN_CONTAIN[r])))
    types = sorted(set(t for t in mandatory if t))
    slots = [t for t, k in sorted(room.receptacles.items()) for _ in range(k - types.count(t))]
    rng.shuffle(slots)
    return types + slots[:max(0, n - len(types))]


def _place(rng: random.Random, otype: str, receps: list[tuple[str, str]], spec: GameSpec) -> str | None:
    """A receptacle id that can hold otype; target-type objects never start in a parent-type receptacle."""
    ok = [rid for rid, rtype in receps if otype in CAN_CONTAIN[rtype]
          and not (otype == spec.obj and rtype == spec.parent)]
    return rng.choice(ok) if ok else None


def make_problem(seed: int, task_type: str, size: str) -> tuple[str, GameSpec]:
    """The PDDL problem text of one game, and its spec. Deterministic in (seed, task_type, size)."""
    import alfworld.gen.goal_library as glib
    rng, size_ = random.Random(seed), SIZES[size]
    spec = _pick_spec(rng, task_type)
    used_ids, used_locs = set(), set()
    receps = []  # (id, type)
    for rtype in _choose_receptacle_types(rng, spec, rng.randint(*size_.receptacles)):
        kind, suffix = {"SinkBasin": ("Sink", "_bar_SinkBasin"),
                        "BathtubBasin": ("Bathtub", "_bar_BathtubBasin")}.get(rtype, (rtype, ""))
        receps.append((_new_id(rng, kind, used_ids, suffix), rtype))
    loc = {rid: _new_loc(rng, used_locs) for rid, _ in receps}
    start = _new_loc(rng, used_locs)  # the agent starts at a location that holds no receptacle
    # target object(s) first, then the lamp, then distractors of any type of this room
    wanted = ([spec.obj] * (2 if task_type == "pick_two_obj_and_place" else 1)
              + ([spec.toggle] if spec.toggle else []))
    n_obj = max(rng.randint(*size_.objects), len(wanted))
    room_objs = [o for o in ROOMS[spec.room].objects if o not in TOGGLEABLE]
    objects = []  # (id, type, receptacle id)
    for i in range(50 * n_obj):
        if len(objects) >= n_obj:
            break
        otype = wanted[i] if i < len(wanted) else rng.choice(room_objs)
        rid = _place(rng, otype, receps, spec)
        assert rid is not None or i >= len(wanted), f"no receptacle for target {otype} in {spec}"
        if rid is not None:
            objects.append((_new_id(rng, otype, used_ids), otype, rid))
    otypes = sorted({t for _, t, _ in objects} | DOMAIN_OTYPES | {spec.obj} | ({spec.toggle} - {""}))
    rtypes = sorted({t for _, t in receps} | DOMAIN_RTYPES)
    decl = ["agent1 - agent"] + [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in rtypes]
    decl += [f"{oid} - object" for oid, _, _ in objects] + [f"{rid} - receptacle" for rid, _ in receps]
    decl += [f"{l} - location" for l in sorted(set(loc.values()) | {start})]
    init = [f"(atLocation agent1 {start})"]
    for rid, rtype in receps:
        init += [f"(receptacleType {rid} {rtype}Type)", f"(receptacleAtLocation {rid} {loc[rid]})"]
        init += [f"(openable {rid})"] if rtype in OPENABLE else []
    for rtype in sorted({t for _, t in receps}):
        init += [f"(canContain {rtype}Type {o}Type)" for o in otypes if o in CAN_CONTAIN[rtype]]
    for oid, otype, rid in objects:
        init += [f"(objectType {oid} {otype}Type)", f"(inReceptacle {oid} {rid})",
                 f"(objectAtLocation {oid} {loc[rid]})"]
        for pred, members in (("cleanable", CLEANABLE), ("heatable", HEATABLE), ("coolable", COOLABLE),
                              ("sliceable", SLICEABLE), ("isReceptacleObject", RECEPTACLE_OBJECTS),
                              ("toggleable", TOGGLEABLE)):
            init += [f"({pred} {oid})"] if otype in members else []
        init += [] if otype in TOGGLEABLE else [f"(pickupable {oid})"]
    goal = glib.gdict[task_type]["pddl"].replace("#", "-").format(obj=spec.obj, recep=spec.parent,
                                                                   toggle=spec.toggle, mrecep="")
    nl = "\n        "
    text = (f"(define (problem gen_{seed})\n(:domain alfred)\n(:objects\n        {nl.join(decl)}\n        )\n"
            f"(:init\n        {nl.join(init)}\n        )\n{goal}")
    return text, spec


def _domain_and_grammar() -> tuple[str, str]:
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH
    with open(ALFRED_PDDL_PATH) as f, open(ALFRED_TWL2_PATH) as g:
        return f.read(), g.read()


def make_game(seed: int, task_type: str, size: str) -> tuple[dict, dict]:
    """(game.tw-pddl content, traj_data.json content) of one game."""
    from alfworld.agents.utils.misc import add_task_to_grammar
    problem, spec = make_problem(seed, task_type, size)
    traj = {"task_id": f"gen_{seed}", "task_type": task_type,
            "pddl_params": {"object_target": spec.obj, "parent_target": spec.parent, "mrecep_target": "",
                            "toggle_target": spec.toggle, "object_sliced": False},
            "scene": {"room": spec.room, "size": size, "seed": seed}}
    domain, grammar = _domain_and_grammar()
    state = random.getstate()  # add_task_to_grammar draws the goal template from the global random
    random.seed(seed)
    grammar = add_task_to_grammar(grammar, traj)
    random.setstate(state)
    goal = grammar.split("Your task is to: ", 1)[1].split('"', 1)[0].rstrip(".")
    traj["turk_annotations"] = {"anns": [{"task_desc": goal}]}
    game = {"pddl_domain": domain, "grammar": grammar, "pddl_problem": problem, "solvable": True,
            "walkthrough": None}
    return game, traj


def _write_if_changed(path: str, text: str) -> bool:
    """Atomic write; skipped when the file already holds exactly this content (same sha1).
    Returns True if written."""
    digest = hashlib.sha1(text.encode()).hexdigest()
    if os.path.exists(path):
        with open(path, "rb") as f:
            if hashlib.sha1(f.read()).hexdigest() == digest:
                return False
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return True


def game_seed(seed: int, split: str, index: int) -> int:
    """Disjoint by construction: train games take even offsets, eval games odd ones."""
    assert split in SPLITS and 0 <= index < 500_000, (split, index)
    return seed * 1_000_000 + 2 * index + SPLITS.index(split)


def generate(split: str, num_games: int, size: str = "small", seed: int = 0,
             cache_dir: str = DEFAULT_CACHE_DIR) -> list[str]:
    """Writes (or finds) games 0..num_games-1 of a split; returns their game.tw-pddl paths in index order."""
    assert size in SIZES, f"unknown room size {size!r}; one of {sorted(SIZES)}"
    root = os.path.join(os.path.expanduser(cache_dir), f"{size}-{seed}", split)
    paths = []
    for i in range(num_games):
        task_type = TASK_TYPES[i % len(TASK_TYPES)]
        game, traj = make_game(game_seed(seed, split, i), task_type, size)
        p = traj["pddl_params"]
        folder = os.path.join(root, f"{task_type}-{p['object_target']}-None-"
                                    f"{p['parent_target'] or p['toggle_target']}-gen{i:05d}")
        os.makedirs(folder, exist_ok=True)
        _write_if_changed(os.path.join(folder, "traj_data.json"), json.dumps(traj, indent=1, sort_keys=True))
        _write_if_changed(os.path.join(folder, "game.tw-pddl"), json.dumps(game))
        paths.append(os.path.join(folder, "game.tw-pddl"))
    return paths


if __name__ == "__main__":
    import tyro
    for path in tyro.cli(generate):
        print(path)
