"""One episode of a policy in an env, from a seeded reset."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np


def run_episode(
    policy_fn: Callable[[np.ndarray], np.ndarray], env: gym.Env, seed: int,
    on_step: Callable[[gym.Env, int, bool], None] | None = None,
) -> float:
    """Return of one episode from ``env.reset(seed=seed)``, acting ``policy_fn(obs)`` until it
    terminates or is truncated. ``on_step(env, t, done)`` runs after the reset (``t = 0``) and
    after each step ``t``."""
    obs, _ = env.reset(seed=seed)
    total, t, done = 0.0, 0, False
    if on_step is not None:
        on_step(env, t, done)
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy_fn(obs))
        total += float(reward)
        t += 1
        done = bool(terminated or truncated)
        if on_step is not None:
            on_step(env, t, done)
    return total
