"""Independent, checkpointable random streams per seed.

Seed ``s`` owns one ``torch.Generator`` per purpose (for SAC: ``init`` for network initialization
and resets, ``act`` for exploration and warm-up actions, ``sample`` for replay indices and update
noise), each seeded from ``numpy.random.SeedSequence([s, crc32(purpose)])``. Seed ``i`` of a
multi-seed run therefore draws exactly what a single-seed run with the same seed draws.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

PURPOSES = ("init", "act", "sample")


def derive_seed(seed: int, purpose: str) -> int:
    """A 63-bit seed for ``(seed, purpose)`` that does not collide across seeds or purposes."""
    tag = zlib.crc32(purpose.encode())
    return int(np.random.SeedSequence([seed, tag]).generate_state(1, dtype=np.uint64)[0] >> 1)


class SeedStreams:
    """Per-seed generators for each purpose; ``init`` lives on the CPU, the others on ``device``."""

    def __init__(
        self, seeds: Sequence[int], device: str | torch.device = "cpu", purposes: Sequence[str] = PURPOSES
    ) -> None:
        self.seeds = [int(s) for s in seeds]
        self.device = torch.device(device)
        self.gens: dict[str, list[torch.Generator]] = {}
        for purpose in purposes:
            dev = torch.device("cpu") if purpose == "init" else self.device
            self.gens[purpose] = [
                torch.Generator(device=dev).manual_seed(derive_seed(s, purpose)) for s in self.seeds
            ]

    def __len__(self) -> int:
        return len(self.seeds)

    def __getitem__(self, purpose: str) -> list[torch.Generator]:
        return self.gens[purpose]

    def randn(self, purpose: str, shape: Sequence[int]) -> torch.Tensor:
        """``[N, *shape]`` standard normal draws, row ``i`` from seed ``i``'s stream."""
        return torch.stack([torch.randn(tuple(shape), generator=g, device=g.device) for g in self.gens[purpose]])

    def rand(self, purpose: str, shape: Sequence[int]) -> torch.Tensor:
        """``[N, *shape]`` uniform [0, 1) draws, row ``i`` from seed ``i``'s stream."""
        return torch.stack([torch.rand(tuple(shape), generator=g, device=g.device) for g in self.gens[purpose]])

    def state_dict(self) -> dict[str, Any]:
        return {p: [g.get_state() for g in gens] for p, gens in self.gens.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for p, states in state.items():
            if len(states) != len(self.gens[p]):
                raise ValueError(f"checkpoint has {len(states)} '{p}' streams, this run {len(self.gens[p])}")
            for g, s in zip(self.gens[p], states):
                g.set_state(s)
