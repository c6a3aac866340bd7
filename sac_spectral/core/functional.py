"""Calling any function of a module's parameters on substituted values (``torch.func`` style)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.func import functional_call


class Bound(nn.Module):
    """``module`` under the name ``root``; ``forward(fn, *args)`` is ``fn(*args)``. With
    :func:`torch.func.functional_call` any function that reads ``module``'s parameters (a loss, a
    penalty, a method of the object that owns it) then runs on substituted parameter values."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.root = module

    def forward(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def call(self, params: dict[str, Tensor], fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` with ``root``'s parameters named in ``params`` (``root``'s own names)
        replaced by those values."""
        return functional_call(self, {f"root.{k}": v for k, v in params.items()}, (fn, *args))
