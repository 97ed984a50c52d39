"""ca's random number generator: one seeded numpy Generator whose state can be
saved and restored (checkpointing replays dropout masks with it)."""
from __future__ import annotations

import copy

import numpy as np

_generator = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Seed ca's RNG (dropout, randn, rand)."""
    global _generator
    _generator = np.random.default_rng(int(seed))


def generator() -> np.random.Generator:
    return _generator


def get_rng_state():
    """An opaque copy of the RNG state."""
    return copy.deepcopy(_generator.bit_generator.state)


def set_rng_state(state) -> None:
    _generator.bit_generator.state = copy.deepcopy(state)
