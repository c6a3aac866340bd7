"""What an update is made of: the steps an agent declares (:class:`NetStep`), the segments a
backend runs as one (:class:`Segment`), and which regularizers intervene between steps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from sac_spectral.regularizers import Regularizer

Metrics = dict[str, Tensor]


@dataclass(frozen=True)
class NetStep:
    """One network's step within an update: ``loss(batch, noise) → (scalar loss, metrics)``, a
    function of that network's parameters (and of nothing the other steps of the update still
    change), then ``after()``: in-place work on tensors that are not trained (a Polyak step of
    targets)."""

    net: str
    loss: Callable[[Metrics, Tensor], tuple[Tensor, Metrics]]
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
