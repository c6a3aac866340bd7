"""Uniform replay buffer: preallocated tensors ``[num_seeds, capacity, ...]``, one per field.

All seeds of a run step together, so they share the write pointer; each seed samples its own
indices from its own generator. Transitions hold ``obs``, ``action``, ``reward``, ``next_obs`` and
``terminated`` (float 0/1: 1 only at a true task end, never at a time-limit truncation).
``add`` takes tensors or NumPy arrays; on the CPU it writes through NumPy views of the storage
(one env step's five small writes cost microseconds, not tensor-indexing dispatches).
``sample`` returns a ``TensorDict``; ``tensordict`` is imported only then (it pulls in
``torch._dynamo``, seconds of start-up that the training loop does not need).
With a :class:`~sac_spectral.agents.reward_scale.RewardScale`, ``add`` folds each step's rewards and
episode ends into its statistics and ``gather`` divides the rewards it returns by the current scale;
the stored rewards stay as the env gave them. ``clear`` restarts those statistics with the data and
``end_episodes`` ends the episodes they follow (a task switch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from sac_spectral.agents.reward_scale import RewardScale
from sac_spectral.core.seeding import derive_seed

if TYPE_CHECKING:
    from tensordict import TensorDict

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
        reward_scale: RewardScale | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        n = num_seeds
        self.capacity, self.num_seeds = capacity, num_seeds
        self.device = torch.device(device)
        shapes = {"obs": (obs_dim,), "action": (act_dim,), "reward": (), "next_obs": (obs_dim,), "terminated": ()}
        #: field → ``[num_seeds, capacity, ...]`` tensor
        # uninitialized: only the filled part [:, :size] is ever read (untouched pages cost nothing)
        self.storage: dict[str, Tensor] = {k: torch.empty(n, capacity, *shapes[k], device=self.device) for k in KEYS}
        self._numpy = [v.numpy() for v in self.storage.values()] if self.device.type == "cpu" else None
        self.ptr = 0
        self.size = 0
        self.reward_scale = reward_scale

    def __len__(self) -> int:
        return self.size

    def clear(self) -> None:
        """Forget every transition (a task switch with ``on_switch.buffer=clear``), and the reward
        scale's statistics of them."""
        self.ptr = self.size = 0
        if self.reward_scale is not None:
            self.reward_scale.restart()

    def end_episodes(self) -> None:
        """The episodes under way end without a transition saying so (a task switch): the reward
        scale's running return restarts."""
        if self.reward_scale is not None:
            self.reward_scale.end_episodes()

    def add(
        self,
        obs: Tensor | np.ndarray,
        action: Tensor | np.ndarray,
        reward: Tensor | np.ndarray,
        next_obs: Tensor | np.ndarray,
        terminated: Tensor | np.ndarray,
        ended: Tensor | np.ndarray | None = None,
    ) -> None:
        """Append one transition per seed (leading dimension ``num_seeds``), cast to the storage's dtype
        (torch's default: float32); ``ended`` (terminated or truncated, default ``terminated``) ends
        the reward scale's running return."""
        if self.reward_scale is not None:
            self.reward_scale.observe(reward, terminated if ended is None else ended)
        values = (obs, action, reward, next_obs, terminated)
        if self._numpy is not None:
            for array, value in zip(self._numpy, values):
                array[:, self.ptr] = value.numpy(force=True) if isinstance(value, Tensor) else value
        else:
            for key, value in zip(KEYS, values):
                self.storage[key][:, self.ptr] = torch.as_tensor(value, dtype=self.storage[key].dtype)
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
        """Transitions at ``idx: [num_seeds, *shape]`` → each ``[num_seeds, *shape, ...]``, rewards
        scaled by the reward scale, if any."""
        rows = torch.arange(self.num_seeds, device=idx.device).view(-1, *([1] * (idx.dim() - 1)))
        out = {k: v[rows, idx] for k, v in self.storage.items()}
        if self.reward_scale is not None:
            out["reward"] = self.reward_scale.scale(out["reward"])
        return out

    def sample(self, generators: Sequence[torch.Generator], batch_size: int) -> TensorDict:
        """A ``[num_seeds, batch_size]`` TensorDict of uniformly drawn transitions."""
        from tensordict import TensorDict

        batch = self.gather(self.sample_indices(generators, (batch_size,)))
        return TensorDict(batch, batch_size=[self.num_seeds, batch_size], device=self.device)

    def state_dict(self) -> dict[str, Any]:
        return {
            "ptr": self.ptr,
            "size": self.size,
            "capacity": self.capacity,
            "data": {k: v[:, : self.size].clone() for k, v in self.storage.items()},
            **({"reward_scale": self.reward_scale.state_dict()} if self.reward_scale is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(f"checkpoint buffer capacity {state['capacity']} differs from {self.capacity}")
        for k, v in state["data"].items():
            if v.shape[0] != self.num_seeds or v.shape[2:] != self.storage[k].shape[2:]:
                raise ValueError(f"checkpoint buffer '{k}' has shape {tuple(v.shape)}, expected [{self.num_seeds}, n, "
                                 "...]")
            self.storage[k][:, : v.shape[1]] = v.to(self.device)
        self.ptr, self.size = int(state["ptr"]), int(state["size"])
        if (self.reward_scale is None) != ("reward_scale" not in state):
            have = "has" if "reward_scale" in state else "has no"
            raise ValueError(f"the checkpoint's buffer {have} reward-scale statistics, this run's reward_scale "
                             f"is {'none' if self.reward_scale is None else 'simbav2'}")
        if self.reward_scale is not None:
            self.reward_scale.load_state_dict(state["reward_scale"])


def distinct_rows(buffer: ReplayBuffer, size: int, seeds: Sequence[int], purpose: str
                  ) -> tuple[Tensor, list[torch.Generator]]:
    """``[N, min(size, len(buffer))]`` distinct buffer rows per seed, drawn from generators seeded
    by ``derive_seed(seed, purpose)`` (never the agent's streams), and those generators."""
    b = min(size, len(buffer))
    gens = [torch.Generator(device=buffer.device).manual_seed(derive_seed(s, purpose)) for s in seeds]
    return torch.stack([torch.randperm(len(buffer), generator=g, device=g.device)[:b] for g in gens]), gens
