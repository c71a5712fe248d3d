"""`tiny-agent`: the embedded tiny model after a short behaviour-cloning pass on planner demonstrations, and
`resolve(name)`, which maps the embedded names to their directories (building them on first use).

The untrained tiny model emits random tokens, so every action is invalid, the agent never leaves its start state and
every turn trivially matches the reference's first state: nothing about routing would be exercised. `tiny-agent` is
the tiny model trained with cross-entropy on (turn prompt → `<action>{planner action}</action>`) pairs from the
planner's solutions of generated *training* games (the same prompt format as the rollouts, no think block), so it
starts RL as a weak agent that acts in the right format and sometimes succeeds. It is built once, saved in Hugging Face
format under $SMRC_CACHE and loaded through `from_pretrained` like any model. Evaluation games are never used.
"""

import random
from pathlib import Path

import torch
from tqdm import tqdm

import envs
import rollout
from embedded import tiny
from environments.alfworld import AlfworldConfig
from models import chat_ids, collate, load_model, token_logprobs

TINY, TINY_AGENT = "tiny", "tiny-agent"
VERSION = "v2"
NUM_GAMES, EPOCHS, BATCH, LR = 24, 4, 16, 3e-3


def demonstrations(num_games: int, history_length: int = 2) -> list[tuple[str, str]]:
    """(user prompt, response) for every planner step of `num_games` generated small training games."""
    cfg = AlfworldConfig(source="generated", room_size="small", num_train_games=num_games, max_steps=10**6)
    env, pairs = envs.make_env(cfg), []
    for task in envs.load_tasks(cfg, "train"):
        result = envs.plan(cfg, task, [])
        if result.status != "ok":
            continue
        ep = rollout.replay(env, task, result.actions,
                            prompt=lambda e: rollout.turn_prompt(e, "alfworld", history_length, require_think=False))
        pairs += [(t.user_text, f"<action>{t.action}</action>") for t in ep.turns]
    env.close()
    return pairs


def build_tiny_agent(path: Path, seed: int = 0) -> None:
    torch.manual_seed(seed)
    model, tok = load_model(tiny.model_dir())
    data = [(chat_ids(tok, p), tok(r)["input_ids"] + [tok.eos_token_id]) for p, r in demonstrations(NUM_GAMES)]
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    rng = random.Random(seed)
    model.train()
    for _ in tqdm(range(EPOCHS), desc="tiny-agent warm start (behaviour cloning)"):
        rng.shuffle(data)
        for i in range(0, len(data), BATCH):
            batch = collate([p for p, _ in data[i:i + BATCH]], [r for _, r in data[i:i + BATCH]], tok.pad_token_id)
            logp, _ = token_logprobs(model, batch)                      # (B, R)
            loss = -(logp * batch.response_mask).sum() / batch.response_mask.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    tiny.save_atomically(model, tok, path)


def resolve(name: str) -> str:
    """What `from_pretrained` takes for a model name: the embedded `tiny` / `tiny-agent` directories (built on first
    use, under $SMRC_CACHE), anything else unchanged (a hub id or a directory)."""
    if name == TINY:
        return tiny.model_dir()
    if name != TINY_AGENT:
        return name
    path = tiny.cache_dir() / f"tiny-agent-{VERSION}"
    if not (path / "config.json").exists():
        build_tiny_agent(path)
    return str(path)
