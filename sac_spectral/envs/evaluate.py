"""Evaluation episodes of a policy on separately seeded envs, as the trainer scores its agent."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np

from sac_spectral.core.seeding import derive_seed


def eval_seed(seed: int, evaluation: int | str, episode: int) -> int:
    """Reset seed of episode ``episode`` of evaluation number ``evaluation``: every evaluation plays
    fresh episodes (a stream that continues between evaluations), deterministically and resumably."""
    return derive_seed(seed, f"eval/{evaluation}/{episode}") % (2**31)


def eval_env_seed(seed: int) -> int:
    """The seed an evaluation env of run seed ``seed`` is made with."""
    return derive_seed(seed, "eval") % (2**31)


def evaluate(policy: Callable[[np.ndarray], np.ndarray], envs: Sequence[gym.Env], seeds: Sequence[int],
             evaluation: int | str, episodes: int) -> np.ndarray:
    """Mean return per seed over ``episodes`` episodes of ``policy`` (a batch of observations, one
    per env, to a batch of actions), env ``i`` reset with :func:`eval_seed` of ``seeds[i]``."""
    n = len(seeds)
    returns = np.zeros((n, episodes))
    for ep in range(episodes):
        obs = np.stack([env.reset(seed=eval_seed(s, evaluation, ep))[0] for env, s in zip(envs, seeds)])
        done = np.zeros(n, dtype=bool)
        while not done.all():
            actions = policy(obs)
            for i, env in enumerate(envs):
                if done[i]:
                    continue
                o, r, te, tr, _ = env.step(actions[i])
                returns[i, ep] += r
                obs[i] = o
                done[i] = te or tr
    return returns.mean(axis=1)
