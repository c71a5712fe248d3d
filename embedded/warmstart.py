"""`tiny-agent`: the embedded CPU agent, built by behaviour cloning an observation-feasible expert, and
`resolve(name)`, which maps the embedded names to their directories (building them on first use).

Recipe (its choices and their measurements are in the README, "Learning you can see"):
- Games: small generated *training* games (evaluation games are never used).
- Demonstrations: per game, one episode of the expert (environments/alfworld_expert.py) and `explore_episodes`
  episodes in which some of its "go to" moves are replaced by random ones. Every turn is one example, the ordinary
  prompt -> `<action>{the expert's action in that state}</action>`, so the agent also learns to recover from states
  the clean expert never visits (DAgger-style labels).
- Reference-conditioned examples, the stand-in for in-context ability at CPU scale: a pretrained LLM can read a
  reference trajectory in its prompt; a model this small cannot unless it learns to. For a share of the turns whose
  state matches a position of another successful episode of the same game (router.match_structured), the example is
  the teacher's user message (router.teacher_context in one of the formats the algorithms use, joined to the ordinary
  prompt as teacher.py joins them) -> the reference's next action. Mismatched states are never used, in either
  direction, so the teacher's behaviour off-reference is whatever it generalises to, as with a real LLM.
- Model: a Qwen3-architecture model with the embedded tiny tokenizer; cross-entropy on the response tokens, AdamW
  with warm-up and a cosine decay, batches packed by token count.
Two recipes: `tiny-agent` (the full one, for bench/learn.py) and `tiny-agent-quick` (fewer games, for the
`--preset tiny` smoke run). Deterministic (seeded); saved in Hugging Face format under $SMRC_CACHE and loaded through
`from_pretrained` like any model.
"""

import hashlib
import math
import multiprocessing as mp
import random
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
from models import chat_ids, collate, load_model, token_logprobs
from teacher import teacher_user_text

TINY, TINY_AGENT, TINY_AGENT_QUICK = "tiny", "tiny-agent", "tiny-agent-quick"
VERSION = "v4"  # bump when the code that builds the examples changes; a recipe change renames its own cache
CONTEXTS = ("fullpath", "summary", "candidate", "full")  # every format an algorithm's teacher shows


@dataclass(frozen=True)
class Recipe:
    games: int                 # small generated training games
    epochs: float              # passes over the examples
    layers: int = 3            # transformer layers (width 128, the tiny tokenizer)
    explore_episodes: int = 2  # perturbed expert episodes per game, besides the clean one
    explore_prob: float = 0.3  # chance that a "go to" of the expert is replaced by a random one
    context_share: float = 0.35  # matched turns that also give a reference-conditioned example
    lr: float = 3e-3
    batch_tokens: int = 8192   # padded tokens per optimizer step


RECIPES = {TINY_AGENT: Recipe(games=320, epochs=2.5), TINY_AGENT_QUICK: Recipe(games=128, epochs=2.0)}
GAMES = AlfworldConfig(source="generated", room_size="small", max_steps=60, require_think=False)


def expert_episode(env, task: envs.Task, rng: random.Random, explore: float) -> tuple[rollout.Episode, list[str]]:
    """One expert episode as a rollout.Episode (ordinary prompts, signatures, history keys) and the expert's label
    in every state it visited (with probability `explore` a "go to" label is not the action taken)."""
    expert = alfworld_expert.Expert(alfworld_expert.goal_of(task))
    ep, labels = rollout.replay(env, task, []), []
    while not ep.done and len(ep.turns) < GAMES.max_steps:
        label = taken = expert.act(ep.admissible)
        if explore and label.startswith("go to ") and rng.random() < explore:
            taken = rng.choice([a for a in ep.admissible if a.startswith("go to ")])
        rollout.replay(env, task, [taken], episode=ep,
                       prompt=lambda e: rollout.turn_prompt(e, "alfworld", GAMES.history_length, False))
        labels.append(label)
    return ep, labels


def game_examples(env, task: envs.Task, recipe: Recipe, seed: int) -> list[tuple[str, str]]:
    """(user message, action) examples of one game: its demonstrations, then its reference-conditioned examples."""
    rng = random.Random(seed)
    runs = [expert_episode(env, task, rng, recipe.explore_prob if k else 0.0)
            for k in range(1 + recipe.explore_episodes)]
    examples = [(t.user_text, label) for ep, labels in runs for t, label in zip(ep.turns, labels)]
    refs = [rollout.to_trajectory(ep, f"expert-{k}") for k, (ep, _) in enumerate(runs) if ep.won]
    for k, (ep, _) in enumerate(runs):
        others = [r for r in refs if r.traj_id != f"expert-{k}"]
        for t in ep.turns:
            if not others or rng.random() >= recipe.context_share:
                continue
            ref = rng.choice(others)
            step = router.Step(t.signature, t.history_key, t.observation, t.action)
            match = router.match_structured(router.Turn(task.task_id, f"expert-{k}", t.index, step), [ref])
            if match is not None:  # a matched state: the reference's next action is a right one there
                context = router.teacher_context(rng.choice(CONTEXTS), ref, match, t.signature)
                examples.append((teacher_user_text(context, t.user_text), match.candidate))
    return examples


def _worker_examples(job: tuple) -> list[tuple[str, str]]:
    task, recipe, seed = job
    env = _WORKER_ENV.get("env") or _WORKER_ENV.setdefault("env", envs.make_env(GAMES))
    return game_examples(env, task, recipe, seed)


_WORKER_ENV: dict = {}  # one env per worker process


def demonstrations(recipe: Recipe, workers: int = 2) -> list[tuple[str, str]]:
    """Every game's examples, in game order (deterministic whatever the number of workers)."""
    cfg = AlfworldConfig(**{**GAMES.__dict__, "num_train_games": recipe.games})
    jobs = [(task, recipe, i) for i, task in enumerate(envs.load_tasks(cfg, "train"))]
    with mp.get_context("fork").Pool(workers) as pool:
        per_game = list(tqdm(pool.imap(_worker_examples, jobs, chunksize=4), total=len(jobs),
                             desc="tiny-agent: expert demonstrations"))
    return [x for game in per_game for x in game]


def _batches(lengths: list[int], budget: int, rng: random.Random) -> list[list[int]]:
    """Examples of similar length packed up to `budget` padded tokens, in a shuffled order of batches."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    out, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > budget:
            out.append(cur)
            cur = []
        cur.append(i)
    out += [cur] if cur else []
    rng.shuffle(out)
    return out


def build_tiny_agent(path: Path, recipe: Recipe, seed: int = 0) -> None:
    _, tok = load_model(tiny.model_dir())
    model = tiny.new_model(tok, layers=recipe.layers, hidden=128, seed=seed)
    data = [(chat_ids(tok, p), tok(envs.action_response(a))["input_ids"] + [tok.eos_token_id])
            for p, a in demonstrations(recipe)]
    rng = random.Random(seed)
    plan = [b for _ in range(math.ceil(recipe.epochs)) for b in _batches([len(p) + len(r) for p, r in data],
                                                                          recipe.batch_tokens, rng)]
    plan = plan[:round(len(plan) * recipe.epochs / math.ceil(recipe.epochs))]
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01)
    warmup_cosine = lambda k: min(1.0, (k + 1) / 30) * 0.5 * (1 + math.cos(math.pi * k / len(plan)))  # noqa: E731
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
    model.train()
    bar = tqdm(plan, desc=f"{path.name}: behaviour cloning ({len(data)} examples, {recipe.epochs:g} epochs)")
    for idx in bar:
        batch = collate([data[i][0] for i in idx], [data[i][1] for i in idx], tok.pad_token_id)
        logp, _ = token_logprobs(model, batch)                                   # (B, R)
        loss = -(logp * batch.response_mask).sum() / batch.response_mask.sum()  # token-mean cross-entropy
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    tiny.save_atomically(model, tok, path)


def resolve(name: str) -> str:
    """What `from_pretrained` takes for a model name: the embedded `tiny`, `tiny-agent`, `tiny-agent-quick`
    directories (built on first use, under $SMRC_CACHE), anything else unchanged (a hub id or a directory)."""
    if name == TINY:
        return tiny.model_dir()
    if name not in RECIPES:
        return name
    recipe = RECIPES[name]
    path = tiny.cache_dir() / f"{name}-{VERSION}-{hashlib.sha256(repr(recipe).encode()).hexdigest()[:8]}"
    if not (path / "config.json").exists():
        build_tiny_agent(path, recipe)
    return str(path)
