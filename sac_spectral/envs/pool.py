"""Several independent envs (one per seed) stepped in lockstep, with episode bookkeeping."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from sac_spectral.envs.make import make_env
from sac_spectral.envs.state import get_env_state, set_env_state


@dataclass
class Transition:
    """Result of one pool step; ``next_obs`` is what to store, ``obs`` what to act on next."""

    next_obs: np.ndarray  # [N, obs_dim], the true successor (final obs when an episode ended)
    obs: np.ndarray  # [N, obs_dim], reset obs where an episode ended
    reward: np.ndarray  # [N]
    terminated: np.ndarray  # [N] bool
    truncated: np.ndarray  # [N] bool
    finished: list[tuple[int, float, int]]  # (env index, episode return, episode length)


class EnvPool:
    """``len(seeds)`` envs of one id; env ``i`` is built and first reset with ``seeds[i]`` (or the
    ``envs`` given, already seeded)."""

    def __init__(self, env_id: str, seeds: list[int], action_repeat: int = 1,
                 envs: Sequence[gym.Env] | None = None) -> None:
        self.replace(list(envs) if envs is not None else [make_env(env_id, s, action_repeat) for s in seeds])
        self.obs_dim = int(self.obs.shape[1])
        self.act_dim = int(self.envs[0].action_space.shape[0])

    def replace(self, envs: list[gym.Env]) -> None:
        """Step ``envs`` from now on, each from a new episode (a task switch: the episodes under
        way end untold)."""
        self.envs = envs
        self.obs = np.stack([e.reset()[0] for e in self.envs])
        self.returns = np.zeros(len(envs))
        self.lengths = np.zeros(len(envs), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.envs)

    def step(self, actions: np.ndarray) -> Transition:
        n = len(self.envs)
        next_obs = np.empty_like(self.obs)
        obs = np.empty_like(self.obs)
        reward = np.empty(n)
        term = np.zeros(n, dtype=bool)
        trunc = np.zeros(n, dtype=bool)
        finished = []
        for i, env in enumerate(self.envs):
            o, r, te, tr, _ = env.step(actions[i])
            next_obs[i], reward[i], term[i], trunc[i] = o, r, te, tr
            self.returns[i] += r
            self.lengths[i] += 1
            if te or tr:
                finished.append((i, float(self.returns[i]), int(self.lengths[i])))
                self.returns[i], self.lengths[i] = 0.0, 0
                o, _ = env.reset()
            obs[i] = o
        self.obs = obs
        return Transition(next_obs, obs, reward, term, trunc, finished)

    def state_dict(self) -> dict[str, Any]:
        return {
            "envs": [get_env_state(e) for e in self.envs],
            "obs": torch.from_numpy(self.obs.copy()),
            "returns": torch.from_numpy(self.returns.copy()),
            "lengths": torch.from_numpy(self.lengths.copy()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore the pool; returns False if some env could not be restored (a new episode began)."""
        exact = all(s is not None for s in state["envs"])
        if not exact:
            self.obs = np.stack([e.reset()[0] for e in self.envs])
            self.returns[:] = 0.0
            self.lengths[:] = 0
            return False
        for env, s in zip(self.envs, state["envs"]):
            set_env_state(env, s)
        self.obs = state["obs"].numpy().copy()
        self.returns = state["returns"].numpy().copy()
        self.lengths = state["lengths"].numpy().copy()
        return True
