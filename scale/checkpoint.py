"""Checkpoints: step_XXXXXX/ = save_pretrained (safetensors, loadable by from_pretrained) + tokenizer +
trainer_state.pt (optimizer, reference bank, RNG states, step) + smrc_config.json, written to a temporary folder and
renamed, so a run killed mid-save never leaves a half checkpoint; `latest` names the newest one. Under torchrun every
rank takes part in gathering the full weights and optimizer state (FSDP shards them); rank 0 alone writes.
"""

import dataclasses
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from scale.distributed import (World, full_optimizer_state_dict, full_state_dict, load_full_optimizer_state_dict,
                               unwrap)


def save_checkpoint(out: Path, step: int, model, tokenizer, optimizer, bank, cfg, world: World) -> Path | None:
    """Collective under torchrun (every rank calls it); rank 0 writes. Returns the checkpoint path on rank 0."""
    weights = full_state_dict(model)
    optim = full_optimizer_state_dict(model, optimizer)
    final, tmp = out / f"step_{step:06d}", out / f".tmp_step_{step:06d}"
    if world.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        unwrap(model).save_pretrained(tmp, state_dict=weights, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        torch.save({"step": step, "optimizer": optim, "bank": bank.state_dict(), "rng": rng}, tmp / "trainer_state.pt")
        (tmp / "smrc_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        (out / "latest.tmp").write_text(final.name)
        os.replace(out / "latest.tmp", out / "latest")
        for old in sorted(out.glob("step_*"))[:-cfg.keep_checkpoints]:
            shutil.rmtree(old)
    world.barrier()
    return final if world.is_main else None


def latest_checkpoint(out: Path) -> Path | None:
    p = out / "latest"
    return out / p.read_text().strip() if p.exists() else None


def load_trainer_state(ckpt: Path, model, optimizer, bank) -> int:
    """Every rank loads the same checkpoint (weights were loaded by from_pretrained before wrapping the model)."""
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    load_full_optimizer_state_dict(model, optimizer, state["optimizer"])
    bank.load_state_dict(state["bank"])
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    return state["step"]
