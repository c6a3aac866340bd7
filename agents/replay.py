"""Uniform replay buffer on a preallocated ``TensorDict`` of shape ``[num_seeds, capacity]``.

All seeds of a run step together, so they share the write pointer; each seed samples its own
indices from its own generator. Transitions hold ``obs``, ``action``, ``reward``, ``next_obs`` and
``terminated`` (float 0/1: 1 only at a true task end, never at a time-limit truncation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict
from torch import Tensor

KEYS = ("obs", "action", "reward", "next_obs", "terminated")


class ReplayBuffer:
    """Ring buffer of ``capacity`` transitions per seed, stored on ``device``."""

    def __init__(
        self,
        capacity: int,
        obs_dim: int,
        act_dim: int,
        num_seeds: int = 1,
        device: str | torch.device = "cpu",
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        n = num_seeds
        self.capacity, self.num_seeds = capacity, num_seeds
        self.storage = TensorDict(
            {
                "obs": torch.zeros(n, capacity, obs_dim),
                "action": torch.zeros(n, capacity, act_dim),
                "reward": torch.zeros(n, capacity),
                "next_obs": torch.zeros(n, capacity, obs_dim),
                "terminated": torch.zeros(n, capacity),
            },
            batch_size=[n, capacity],
            device=device,
        )
        self._data: dict[str, Tensor] = {k: self.storage.get(k) for k in KEYS}
        self.ptr = 0
        self.size = 0

    @property
    def device(self) -> torch.device:
        return self.storage.device

    def __len__(self) -> int:
        return self.size

    def add(self, obs: Tensor, action: Tensor, reward: Tensor, next_obs: Tensor, terminated: Tensor) -> None:
        """Append one transition per seed (leading dimension ``num_seeds``)."""
        values = (obs, action, reward, next_obs, terminated)
        for key, value in zip(KEYS, values):
            self._data[key][:, self.ptr] = value
        self.ptr = (self.ptr + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample_indices(self, generators: Sequence[torch.Generator], shape: Sequence[int]) -> Tensor:
        """``[num_seeds, *shape]`` uniform indices into the filled part, seed ``i`` from ``generators[i]``."""
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        return torch.stack(
            [torch.randint(self.size, tuple(shape), generator=g, device=g.device) for g in generators]
        ).to(self.device)

    def gather(self, idx: Tensor) -> dict[str, Tensor]:
        """Transitions at ``idx: [num_seeds, *shape]`` → each ``[num_seeds, *shape, ...]``."""
        rows = torch.arange(self.num_seeds, device=idx.device).view(-1, *([1] * (idx.dim() - 1)))
        return {k: v[rows, idx] for k, v in self._data.items()}

    def sample(self, generators: Sequence[torch.Generator], batch_size: int) -> TensorDict:
        """A ``[num_seeds, batch_size]`` TensorDict of uniformly drawn transitions."""
        batch = self.gather(self.sample_indices(generators, (batch_size,)))
        return TensorDict(batch, batch_size=[self.num_seeds, batch_size], device=self.device)

    def state_dict(self) -> dict[str, Any]:
        return {
            "ptr": self.ptr,
            "size": self.size,
            "capacity": self.capacity,
            "data": {k: v[:, : self.size].clone() for k, v in self._data.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(f"checkpoint buffer capacity {state['capacity']} differs from {self.capacity}")
        for k, v in state["data"].items():
            if v.shape[0] != self.num_seeds or v.shape[2:] != self._data[k].shape[2:]:
                raise ValueError(f"checkpoint buffer '{k}' has shape {tuple(v.shape)}, expected [{self.num_seeds}, n, ...]")
            self._data[k][:, : v.shape[1]] = v.to(self.device)
        self.ptr, self.size = int(state["ptr"]), int(state["size"])
