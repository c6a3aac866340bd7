"""The interface every regularizer and intervention implements.

A regularizer is built on one network (``module``). The training loop adds ``penalty()`` to that
network's loss before ``backward`` and calls ``after_step(step)`` after the optimizer step.
``metrics()`` is read only at logging time; values are tensors of shape ``[M]`` (one per member
of a member-batched network) or ``[]`` (one number for the whole network).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn


class Regularizer:
    """Base class: no penalty, no intervention, no state."""

    #: registry name used in configs (``{name: spectral, coef: 1e-3}``)
    name: ClassVar[str] = ""
    #: False for pure interventions, whose ``penalty`` is never added to a loss
    has_penalty: ClassVar[bool] = True

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.optimizer: torch.optim.Optimizer | None = None
        self.state: dict[str, Tensor] = {}

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Give interventions access to the network's optimizer (to reset its moments)."""
        self.optimizer = optimizer

    def penalty(self) -> Tensor:
        """Scalar added to the network's loss."""
        return torch.zeros((), device=next(self.module.parameters()).device)

    def after_step(self, step: int) -> None:
        """In-place changes after ``optimizer.step()``; ``step`` counts updates from 1."""

    def metrics(self) -> dict[str, Tensor]:
        """Telling quantities, read only when logging."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Persistent state (copied) for checkpoints."""
        return {k: v.detach().clone() for k, v in self.state.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = set(self.state) ^ set(state)
        if missing:
            raise KeyError(f"{self.name}: state keys differ from the checkpoint's: {sorted(missing)}")
        for key, value in state.items():
            if self.state[key].shape != value.shape:
                raise ValueError(
                    f"{self.name}: state '{key}' has shape {tuple(value.shape)} in the checkpoint, "
                    f"{tuple(self.state[key].shape)} here"
                )
            self.state[key].copy_(value)


def require(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` for a bad hyperparameter unless ``condition`` holds."""
    if not condition:
        raise ValueError(message)
