"""Evaluation episodes of a policy on separately seeded envs, as the trainer scores its agent."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np

from sac_spectral.core.seeding import derive_seed


def eval_seed(seed: int, step: int | str, episode: int) -> int:
    """Reset seed of episode ``episode`` of the evaluation at env step ``step`` (or a named one, such
    as ``"random_policy"``): every evaluation plays fresh episodes, and an evaluation's episodes do
    not depend on the evaluations before it, so an extended run evaluates as a straight one."""
    return derive_seed(seed, f"eval/{step}/{episode}") % (2**31)


def eval_env_seed(seed: int) -> int:
    """The seed an evaluation env of run seed ``seed`` is made with."""
    return derive_seed(seed, "eval") % (2**31)


def evaluate(policy: Callable[[np.ndarray], np.ndarray], envs: Sequence[gym.Env], seeds: Sequence[int],
             step: int | str, episodes: int) -> np.ndarray:
    """Mean return per seed over ``episodes`` episodes of ``policy`` (a batch of observations, one
    per env, to a batch of actions), env ``i`` reset with :func:`eval_seed` of ``seeds[i]``."""
    n = len(seeds)
    returns = np.zeros((n, episodes))
    for ep in range(episodes):
        obs = np.stack([env.reset(seed=eval_seed(s, step, ep))[0] for env, s in zip(envs, seeds)])
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
