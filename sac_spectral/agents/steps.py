"""What an update is made of: the steps an agent declares (:class:`NetStep`), the noise it draws
(named shapes, :func:`draw_shapes`, :func:`split_draws`), the segments a backend runs as one
(:class:`Segment`), and which regularizers intervene between steps."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from sac_spectral.regularizers import Regularizer

Metrics = dict[str, Tensor]
#: an update's noise by name, each ``[N, *shape]`` (seed ``n``'s draws first)
Noise = dict[str, Tensor]
#: what an agent draws for one update of one seed: name → shape of standard normals, in the order drawn
Draws = dict[str, tuple["int | str", ...]]
#: the batch axis in a declared shape, ``{"next_action": (BATCH, act_dim)}``: only first, where it
#: marks a per-example draw (the diagnostics hand example ``i`` its own draws)
BATCH = "B"


def draw_shapes(draws: Draws, batch_size: int) -> dict[str, tuple[int, ...]]:
    """The declared shapes with :data:`BATCH` as ``batch_size``; a ``ValueError`` where it is not first."""
    for name, shape in draws.items():
        if BATCH in shape[1:]:
            raise ValueError(f"draw '{name}' {shape}: the batch axis can only be the first")
    return {name: tuple(batch_size if d == BATCH else int(d) for d in shape) for name, shape in draws.items()}


def per_example(draws: Draws) -> list[str]:
    """The names drawn per example (their shape starts with :data:`BATCH`)."""
    return [name for name, shape in draws.items() if shape[:1] == (BATCH,)]


def draw_size(shapes: dict[str, tuple[int, ...]]) -> int:
    """How many standard normals one update of one seed draws for ``shapes``."""
    return sum(math.prod(shape) for shape in shapes.values())


def split_draws(flat: Tensor, shapes: dict[str, tuple[int, ...]]) -> Noise:
    """``flat [..., total]`` standard normals as named draws: consecutive slices, in the order of
    ``shapes``, each ``[..., *shape]``."""
    sizes = [math.prod(shape) for shape in shapes.values()]
    parts = flat.split(sizes, dim=-1)
    return {name: part.reshape(*flat.shape[:-1], *shape) for (name, shape), part in zip(shapes.items(), parts)}


@dataclass(frozen=True)
class NetStep:
    """One network's step within an update: ``loss(batch, noise) → (scalar loss, metrics)`` (noise
    by name, :data:`Noise`), a function of that network's parameters (and of nothing the other steps of the update still
    change), then ``after()``: in-place work on tensors that are not trained (a Polyak step of
    targets)."""

    net: str
    loss: Callable[[Metrics, Noise], tuple[Tensor, Metrics]]
    after: Callable[[], None] | None = None


def intervenes(reg: Regularizer) -> bool:
    """Whether ``reg`` changes its network after optimizer steps (its ``after_step`` is its own)."""
    return type(reg).after_step is not Regularizer.after_step


@dataclass(frozen=True)
class Segment:
    """Consecutive steps a backend runs as one: ``after_inside`` says whether the last step's
    ``after()`` runs inside (every earlier step's does); ``program`` is the compiled one, if any."""

    steps: tuple[NetStep, ...]
    after_inside: bool = False
    program: Any = None
