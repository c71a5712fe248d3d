"""`tiny-agent`: the embedded CPU agent, built by behaviour cloning an observation-feasible expert, and
`resolve(name)`, which maps the embedded names to their directories (building them on first use).

Recipe (its choices and their measurements are in the README, "Learning you can see"):
- Games: small generated *training* games (evaluation games are never used).
- Demonstrations: per game, one episode of the expert (environments/alfworld_expert.py) and `explore_episodes`
  episodes in which some of its "go to" moves are replaced by random ones. Every turn is one example, the
  ordinary prompt -> `<action>{the expert's action in that state}</action>`, so the agent also learns to
  recover from states the clean expert never visits (DAgger-style labels). The states of the reference runs
  below get plain examples with the expert's label too.
- Reference-conditioned examples, the stand-in for in-context ability at CPU scale: a pretrained LLM reads a
  reference in its prompt untaught; a model this small reads it only where reading was the only way to be
  right. So the references are clean successful runs whose choices the observation-only expert could not make
  from its prompt: the engine planner's solution (it walks straight to the hidden object) and the expert with
  the other search order (it finds the object elsewhere first, and delivers to another receptacle of the
  kind). Every state of the expert's episodes and of the reference runs that matches a reference position
  (router.match_structured) gives a context example: the teacher's user message (router.teacher_context,
  joined to the ordinary prompt as teacher.py joins them) -> the reference's next action there (the
  candidate). Its format is one of the state's own blocks (`summary`, `candidate`, `smrc`, rotating), and a
  state matched at its own step index also gets the bare `trajectory`, which FullPath-SD's teacher must read
  by step number (as router.match_by_index aligns it). The same state's plain example keeps the expert's own
  label, so where the two differ only the context is right (`context_stats` counts that share by format and
  phase; the build writes it to warmstart_stats.json).
  Mismatched states are never used, in either direction, so the teacher's behaviour off-reference is whatever
  it generalises to, as with a real LLM.
- Model: a Qwen3-architecture model with the embedded tiny tokenizer; cross-entropy on the response tokens,
  AdamW with warm-up and a cosine decay, batches packed by token count. Identical examples are one example
  weighing their count (`weighted`), so an epoch sums the same loss terms without the copies' forward passes.
  The plain examples train for `epochs` passes and the context examples (longer: they carry the trajectory)
  for `context_epochs`, fewer, so that the build fits in 20 minutes on 2 cores (`training_plan`; docs/notes.md
  v16-v21 measure what the epochs cost and buy).
Two recipes: `tiny-agent` (the full one, for bench/learn.py) and `tiny-agent-quick` (fewer games, for the
`--preset tiny` smoke run). Deterministic (seeded); saved in Hugging Face format under $SMRC_CACHE and loaded
through `from_pretrained` like any model.
"""

import hashlib
import json
import math
import multiprocessing as mp
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

import envs
import rollout
import router
from embedded import tiny
from environments import alfworld_expert
from environments.alfworld import AlfworldConfig
from models import chat_ids, load_model
from teacher import teacher_user_text

TINY, TINY_AGENT, TINY_AGENT_QUICK = "tiny", "tiny-agent", "tiny-agent-quick"
VERSION = "v21"  # bump when the code that builds the examples changes; a recipe change renames its own cache
STATE_FORMATS = ("summary", "candidate", "smrc")  # the formats built on the matched state's own blocks
CONTEXTS = ("trajectory", *STATE_FORMATS)  # every format a reverse-KL algorithm's teacher shows


@dataclass(frozen=True)
class Recipe:
    games: int                 # small generated training games
    epochs: float              # passes over the plain examples
    context_epochs: float | None = None  # passes over the context examples (None: `epochs`)
    layers: int = 3            # transformer layers (width 128, the tiny tokenizer)
    explore_episodes: int = 2  # perturbed expert episodes per game, besides the clean one
    explore_prob: float = 0.3  # chance that a "go to" of the expert is replaced by a random one
    context_formats: int = 1   # per matched state, this many of STATE_FORMATS, rotating
    differing_repeats: int = 3  # weight of a context example whose target differs from the plain label
    lr: float = 3e-3
    batch_tokens: int = 8192   # padded tokens per optimizer step, counting each example `weight` times
    bf16: bool = False         # bfloat16 autocast for the forward pass (weights and optimizer stay float32),
    #                            where the CPU computes bf16 natively (native_bf16); float32 elsewhere

    @property
    def passes_with_context(self) -> float:
        return self.epochs if self.context_epochs is None else self.context_epochs


RECIPES = {TINY_AGENT: Recipe(games=320, epochs=1.8, context_epochs=1.2, bf16=True),
           # quick: the smoke run's, CI's
           TINY_AGENT_QUICK: Recipe(games=96, epochs=1.5, differing_repeats=1)}
GAMES = AlfworldConfig(source="generated", room_size="small", max_steps=60, require_think=False)
PLANNER_TIMEOUT_S = 120.0  # generous: a timed-out plan would make the build depend on the machine's speed


@dataclass
class Example:
    user_text: str  # the ordinary prompt, or the teacher's user message (context + ordinary prompt)
    action: str     # the target
    format: str = ""  # "" for a plain example, else the context format
    phase: str = ""   # search | transform | deliver (of the state)
    plain_label: str = ""  # the expert's label in the same state (a context example's target may differ)


def phase(task: envs.Task, signature: envs.Signature) -> str:
    """search (hands empty), transform (holding, a clean/heat/cool not done yet) or deliver."""
    sig = dict(signature)
    if not sig["holding"]:
        return "search"
    needs = {"pick_clean_then_place_in_recep": "clean", "pick_heat_then_place_in_recep": "hot",
             "pick_cool_then_place_in_recep": "cool"}.get(task.task_type)
    done = any(o in sig["holding"] and flag == needs for o, flag in sig["states"])
    return "transform" if needs and not done else "deliver"


def labelled_episode(env, task: envs.Task, choose) -> tuple[rollout.Episode, list[str]]:
    """Play `choose(admissible, label) -> action` from reset; every turn records its ordinary prompt, state,
    history key, and the (observation-only) expert's label in that state, whoever chose the action taken."""
    expert = alfworld_expert.Expert(alfworld_expert.goal_of(task))
    ep, labels = rollout.replay(env, task, []), []
    while not ep.done and len(ep.turns) < GAMES.max_steps:
        label = expert.label(ep.admissible)
        taken = choose(ep.admissible, label)
        expert.follow(taken)
        rollout.replay(env, task, [taken], episode=ep,
                       prompt=lambda e: rollout.turn_prompt(e, "alfworld", GAMES.history_length, False))
        labels.append(label)
    return ep, labels


def explorer(rng: random.Random, explore: float):
    """The expert, with probability `explore` taking a random "go to" instead of its own (the label stays)."""
    def choose(admissible: list[str], label: str) -> str:
        if explore and label.startswith("go to ") and rng.random() < explore:
            return rng.choice([a for a in admissible if a.startswith("go to ")])
        return label
    return choose


def reference_runs(env, task: envs.Task, plan: list[str] | None) -> list[tuple[rollout.Episode, list[str]]]:
    """Clean successful trajectories whose choices the observation-only expert could not make from its prompt:
    the engine planner's solution (it walks straight to the hidden object) and the expert with the other
    search order (descending: it finds the object elsewhere first, and delivers to the last receptacle of a
    kind)."""
    runs = []
    if plan:
        steps = iter(plan)
        runs.append(labelled_episode(env, task, lambda adm, label: next(steps)))
    other = alfworld_expert.Expert(alfworld_expert.goal_of(task), reverse=True)
    runs.append(labelled_episode(env, task, lambda adm, label: other.act(adm)))
    return [(ep, labels) for ep, labels in runs if ep.won and len(ep.turns) == len(labels)]


def game_examples(env, task: envs.Task, recipe: Recipe, seed: int, plan: list[str] | None) -> list[Example]:
    """One game's examples. Plain: every state of the expert's clean and perturbed episodes and of the
    reference runs -> the expert's label. Context: every state of those episodes that matches a reference
    position (router.match_structured; a reference run's own states match it), in `recipe.context_formats` of
    the state's formats and, matched at its own index, in the `trajectory` format -> the reference's next
    action there (the candidate). Mismatched states give no context example."""
    rng = random.Random(seed)
    students = [labelled_episode(env, task, explorer(rng, recipe.explore_prob if k else 0.0))
                for k in range(1 + recipe.explore_episodes)]
    refs = reference_runs(env, task, plan)
    students += refs
    trajectories = [rollout.to_trajectory(ep, f"reference-{k}") for k, (ep, _) in enumerate(refs)]
    examples = [Example(t.user_text, label) for ep, labels in students for t, label in zip(ep.turns, labels)]
    seen, rotation = set(), rng.randrange(len(CONTEXTS))
    for ep, labels in students:
        for t, label in zip(ep.turns, labels):
            for ref in trajectories:
                match = router.match_structured(t, [ref])
                if match is None or (t.user_text, ref.traj_id) in seen:
                    continue
                seen.add((t.user_text, ref.traj_id))
                # the bare trajectory is read by step number, as FullPath-SD aligns it: its examples are the
                # states matched at their own index, every one (most ask for the plain label: a teacher that
                # trained only where the two differ learned to lean away from the plain answer,
                # docs/notes.md v14)
                formats = [STATE_FORMATS[(rotation + k) % len(STATE_FORMATS)]
                           for k in range(recipe.context_formats)]
                rotation += recipe.context_formats
                if match.position == t.index:
                    formats.append("trajectory")
                for fmt in formats:
                    context = router.teacher_context(fmt, ref, match, t.step.signature)
                    examples.append(Example(teacher_user_text(context, t.user_text), match.candidate, fmt,
                                            phase(task, t.step.signature), label))
    return examples


def _worker_examples(job: tuple) -> list[Example]:
    task, recipe, seed = job
    env = _WORKER_ENV.get("env") or _WORKER_ENV.setdefault("env", envs.make_env(GAMES))
    plan = envs.plan(GAMES, task, [], PLANNER_TIMEOUT_S)
    return game_examples(env, task, recipe, seed, plan.actions if plan.status == "ok" else None)


_WORKER_ENV: dict = {}  # one env per worker process


def demonstrations(recipe: Recipe, workers: int = 2) -> list[Example]:
    """Every game's examples, in game order (deterministic whatever the number of workers)."""
    cfg = AlfworldConfig(**{**GAMES.__dict__, "num_train_games": recipe.games})
    jobs = [(task, recipe, i) for i, task in enumerate(envs.load_tasks(cfg, "train"))]
    with mp.get_context("fork").Pool(workers) as pool:
        per_game = list(tqdm(pool.imap(_worker_examples, jobs, chunksize=4), total=len(jobs),
                             desc="tiny-agent: planner references and expert demonstrations"))
    return [x for game in per_game for x in game]


def weighted(examples: list[Example], differing_repeats: int) -> tuple[list[Example], list[int]]:
    """Identical examples merged into one with a weight, their count (38% of plain examples repeat another
    state exactly); a context example whose target differs from the plain label weighs `differing_repeats`
    times more. An epoch's loss has the same terms as training on every copy; the copies' forward passes are
    saved."""
    first, count = {}, Counter()
    for e in examples:
        key = (e.user_text, e.action, e.format)
        first.setdefault(key, e)
        count[key] += 1
    return (list(first.values()),
            [count[k] * (differing_repeats if e.format and e.action != e.plain_label else 1)
             for k, e in first.items()])


def _batches(members: list[int], lengths: list[int], weights: list[int], budget: int,
             rng: random.Random) -> list[list[int]]:
    """`members` of similar length packed up to `budget` padded tokens (each counted `weight` times, as if its
    copies were there), in a shuffled order of batches."""
    order = sorted(members, key=lambda i: (lengths[i], rng.random()))
    out, cur, copies = [], [], 0
    for i in order:
        if cur and (copies + weights[i]) * lengths[i] > budget:
            out.append(cur)
            cur, copies = [], 0
        cur.append(i)
        copies += weights[i]
    out += [cur] if cur else []
    rng.shuffle(out)
    return out


def training_plan(lengths: list[int], weights: list[int], epochs: list[float], budget: int,
                  rng: random.Random) -> list[list[int]]:
    """The optimizer steps' batches: example i is visited `epochs[i]` times on average over ceil(max) passes,
    its visits spread evenly over them (systematic sampling from a random offset: an example of 1 epoch in 2
    passes is in exactly one, of 1.8 in 2 passes in 90% of each); each pass packed by `_batches`."""
    passes = math.ceil(max(epochs))
    offsets = [rng.random() for _ in epochs]
    plan = []
    for k in range(passes):
        members = [i for i, (e, u) in enumerate(zip(epochs, offsets))
                   if math.floor((k + 1) * e / passes + u) > math.floor(k * e / passes + u)]
        plan += _batches(members, lengths, weights, budget, rng)
    return plan


def response_logprobs(model, rows: list[tuple[list[int], list[int]]], pad_id: int):
    """(B, R) log π of each response token of the (prompt ids, response ids) `rows`, 0 at padding, and its
    (B, R) mask. Each row is laid out [prompt | response | padding] from column 0, so causal attention alone
    is exact for every real token and the batch needs no padding mask: a build batch takes 0.83x the time it
    takes in the trainer's left-padded layout (`models.collate`), with the same values up to float rounding
    (tested)."""
    B, L, R = len(rows), max(len(p) + len(r) for p, r in rows), max(len(r) for _, r in rows)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    cols = torch.zeros((B, R), dtype=torch.long)     # the column whose output predicts each response token
    targets = torch.full((B, R), pad_id, dtype=torch.long)
    mask = torch.zeros((B, R))
    for i, (p, r) in enumerate(rows):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        cols[i, :len(r)] = torch.arange(len(p) - 1, len(p) + len(r) - 1)
        targets[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1.0
    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state       # (B, L, H)
    hidden = hidden.gather(1, cols[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, R, H)
    logp = torch.log_softmax(model.lm_head(hidden).float(), dim=-1)              # (B, R, V)
    return logp.gather(-1, targets[..., None]).squeeze(-1) * mask, mask


def context_stats(examples: list[Example]) -> dict:
    """Context examples by format and by phase: how many, and the share whose target (the reference's next
    action) differs from the expert's plain label in the same state (where only reading the context is
    right)."""
    ctx = [e for e in examples if e.format]
    out = {"examples": len(examples), "plain": len(examples) - len(ctx), "context": len(ctx)}
    for key in ("format", "phase"):
        for value in sorted({getattr(e, key) for e in ctx}):
            group = [e for e in ctx if getattr(e, key) == value]
            out[f"{key}={value}"] = {
                "n": len(group), "target_differs": sum(e.action != e.plain_label for e in group) / len(group)}
    out["target_differs"] = sum(e.action != e.plain_label for e in ctx) / max(1, len(ctx))
    return out


def training_set(tok, recipe: Recipe, seed: int = 0) -> tuple[list, list[int], list[list[int]], dict]:
    """What a build trains on: each example as (prompt ids, response ids + eos), its weight (copies), the plan
    (every epoch's batches of example indices, packed by length) and the examples' `context_stats`."""
    examples = demonstrations(recipe)
    stats = context_stats(examples)
    examples, weights = weighted(examples, recipe.differing_repeats)  # where only reading is right: x repeats
    data = [(chat_ids(tok, e.user_text),
             tok(envs.action_response(e.action))["input_ids"] + [tok.eos_token_id]) for e in examples]
    plan = training_plan([len(p) + len(r) for p, r in data], weights,
                         [recipe.passes_with_context if e.format else recipe.epochs for e in examples],
                         recipe.batch_tokens, random.Random(seed))
    return data, weights, plan, stats


def build_tiny_agent(path: Path, recipe: Recipe, seed: int = 0) -> None:
    _, tok = load_model(tiny.model_dir())
    model = tiny.new_model(tok, layers=recipe.layers, hidden=128, seed=seed)
    data, weights, plan, stats = training_set(tok, recipe, seed)
    print(f"{path.name}: {json.dumps(stats)}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01)
    warmup_cosine = lambda k: (min(1.0, (k + 1) / 30) * 0.5  # noqa: E731
                               * (1 + math.cos(math.pi * k / len(plan))))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
    model.train()
    bf16 = recipe.bf16 and native_bf16()  # emulated bf16 is ~6x slower than float32 (AVX2-only CPUs)
    stats.update(bf16_autocast=bf16, cpu_capability=torch.backends.cpu.get_cpu_capability())
    bar = tqdm(plan, desc=f"{path.name}: behaviour cloning ({len(data)} examples weighing {sum(weights)}, "
                          f"{recipe.epochs:g} epochs, context {recipe.passes_with_context:g})")
    for idx in bar:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logp, mask = response_logprobs(model, [data[i] for i in idx], tok.pad_token_id)   # (B, R)
        mask = mask * torch.tensor([float(weights[i]) for i in idx])[:, None]  # (B, R) counting the copies
        loss = -(logp * mask).sum() / mask.sum()  # token-mean cross-entropy over every copy
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    stats["final_loss"] = loss.item()
    tiny.save_atomically(model, tok, path, extra={"warmstart_stats.json": json.dumps(stats, indent=1)})


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX); elsewhere torch emulates it."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, c, lambda: False)() for c in checks)


def resolve(name: str) -> str:
    """What `from_pretrained` takes for a model name: the embedded `tiny`, `tiny-agent`, `tiny-agent-quick`
    directories (built on first use, under $SMRC_CACHE), anything else unchanged (a hub id or a directory)."""
    if name == TINY:
        return tiny.model_dir()
    if name not in RECIPES:
        return name
    recipe = RECIPES[name]
    precision = "-fp32" if recipe.bf16 and not native_bf16() else ""  # not the same weights: its own folder
    digest = hashlib.sha256(repr(recipe).encode()).hexdigest()[:8]
    path = tiny.cache_dir() / f"{name}-{VERSION}-{digest}{precision}"
    tiny.build_once(path, lambda p: build_tiny_agent(p, recipe))  # a second resolver waits for this build
    return str(path)
