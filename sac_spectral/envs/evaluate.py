"""Evaluation episodes of a policy on separately seeded envs, as the trainer scores its agent."""

from __future__ import annotations

import math
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


def _episodes(policy: Callable[[np.ndarray], np.ndarray], envs: Sequence[gym.Env], seeds: Sequence[int],
              step: int | str, episodes: int, q_fn: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
              ) -> tuple[np.ndarray, list[list[tuple[np.ndarray, np.ndarray]]]]:
    """The returns ``[seeds, episodes]`` (summed in step order) and, per episode and seed, the rewards
    ``[T]`` and (with ``q_fn``, a batch of observations and actions to one Q-value per env) the
    Q-values ``[T]`` of the actions taken."""
    n = len(seeds)
    returns = np.zeros((n, episodes))
    out = []
    for ep in range(episodes):
        obs = np.stack([env.reset(seed=eval_seed(s, step, ep))[0] for env, s in zip(envs, seeds)])
        done = np.zeros(n, dtype=bool)
        rewards: list[list[float]] = [[] for _ in range(n)]
        qs: list[list[float]] = [[] for _ in range(n)]
        while not done.all():
            actions = policy(obs)
            q = q_fn(obs, actions) if q_fn is not None else None
            for i, env in enumerate(envs):
                if done[i]:
                    continue
                o, r, te, tr, _ = env.step(actions[i])
                rewards[i].append(float(r))
                returns[i, ep] += r
                if q is not None:
                    qs[i].append(float(q[i]))
                obs[i] = o
                done[i] = te or tr
        out.append([(np.asarray(r), np.asarray(q)) for r, q in zip(rewards, qs)])
    return returns, out


def evaluate(policy: Callable[[np.ndarray], np.ndarray], envs: Sequence[gym.Env], seeds: Sequence[int],
             step: int | str, episodes: int) -> np.ndarray:
    """Mean return per seed over ``episodes`` episodes of ``policy`` (a batch of observations, one
    per env, to a batch of actions), env ``i`` reset with :func:`eval_seed` of ``seeds[i]``."""
    return _episodes(policy, envs, seeds, step, episodes)[0].mean(axis=1)


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """``G_t = Σ_{j ≥ 0} γ^j r_{t+j}`` to the episode's end, for every step ``t``."""
    out = np.zeros(len(rewards))
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def q_scale(policy: Callable[[np.ndarray], np.ndarray], q_fn: Callable[[np.ndarray, np.ndarray], np.ndarray],
            envs: Sequence[gym.Env], seeds: Sequence[int], step: int | str, episodes: int, gamma: float,
            ) -> dict[str, np.ndarray]:
    """The critic's value scale on the policy's own evaluation episodes, per seed: the mean Q of the
    actions taken (``q_mean``) against the mean discounted Monte-Carlo return of the same states
    (``mc_return``), and ``normalized_bias = mean(Q − G) / |mean G|`` (Chen et al. 2021's measure).

    Only states at least ``H = ⌈ln 0.01 / ln γ⌉`` steps before the episode's end count (the
    return's cut-off tail weighs ≤ 1 %); in episodes no longer than ``H`` every state counts, and
    ``truncated`` says so (there G misses the tail that Q bootstraps)."""
    horizon = math.ceil(math.log(0.01) / math.log(gamma)) if 0 < gamma < 1 else 0
    _, played = _episodes(policy, envs, seeds, step, episodes, q_fn)
    q_all: list[list[np.ndarray]] = [[] for _ in seeds]
    g_all: list[list[np.ndarray]] = [[] for _ in seeds]
    truncated = False
    for episode in played:
        for i, (rewards, qs) in enumerate(episode):
            keep = len(rewards) - horizon if len(rewards) > horizon else len(rewards)
            truncated |= len(rewards) <= horizon
            q_all[i].append(qs[:keep])
            g_all[i].append(discounted_returns(rewards, gamma)[:keep])
    q = np.array([np.concatenate(x).mean() for x in q_all])
    g = np.array([np.concatenate(x).mean() for x in g_all])
    bias = np.array([np.mean(np.concatenate(qa) - np.concatenate(ga)) for qa, ga in zip(q_all, g_all)])
    return {"q_mean": q, "mc_return": g, "normalized_bias": bias / np.maximum(np.abs(g), 1e-8),
            "truncated": np.full(len(seeds), float(truncated))}
