"""Shared fixtures: small configs, a toy env with true terminations, CPU determinism."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

TOY_ID = "SacSpectralToyTerminating-v0"


class ToyTerminatingEnv(gym.Env):
    """1-D walk: terminates (a true end) when |x| > 1, else truncated by a 50-step TimeLimit."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
        self.action_space = spaces.Box(-2.0, 2.0, (1,), np.float64)
        self.x = 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-0.1, 0.1))
        return np.array([self.x, 1.0]), {}

    def step(self, action):
        self.x += 0.1 * float(np.clip(action[0], -2, 2))
        terminated = abs(self.x) > 1.0
        return np.array([self.x, 1.0]), 1.0, terminated, False, {}


if TOY_ID not in gym.registry:
    gym.register(TOY_ID, entry_point=ToyTerminatingEnv, max_episode_steps=50)


@pytest.fixture(autouse=True)
def _one_thread():
    """Small nets gain nothing from more threads, and a single thread never spin-waits against
    a subprocess the test starts."""
    torch.set_num_threads(1)
    yield


SMALL = [
    "actor.hidden=[32, 32]",
    "critic.hidden=[32, 32]",
    "batch_size=32",
    "progress=false",
    "eval_episodes=1",
]
