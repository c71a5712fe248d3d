"""The run's seeds: one formula every torch seed derives from (`derived_seed`: training steps, validation,
evaluation panels), so a resumed run and a re-run evaluation replay the same numbers; `seed_step` seeds a
training step.
"""
import random

import numpy as np
import torch

SEED_STRIDE, STEP_STRIDE = 1_000_003, 101  # derived seeds:
                                           # seed·SEED_STRIDE + step·STEP_STRIDE + stream + rank


def derived_seed(seed: int, step: int = 0, rank: int = 0, stream: int = 0) -> int:
    """The one formula every torch seed of a run derives from (module docstring)."""
    return seed * SEED_STRIDE + step * STEP_STRIDE + stream + rank


def seed_step(seed: int, step: int, rank: int = 0) -> random.Random:
    """Seed torch and numpy for a training step from (seed, step, rank);
    returns the step's Python RNG (routing)."""
    torch.manual_seed(derived_seed(seed, step, rank))
    np.random.seed(derived_seed(seed, step, rank) % 2**32)
    return random.Random(f"{seed}-{step}-{rank}")
