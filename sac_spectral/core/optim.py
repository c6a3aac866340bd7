"""The optimizers a network trains with, built by name (the RL agent's and the continual learner's)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import torch
from torch import nn

OPTIMIZERS = ("adam", "adamw", "sgd")


def make_optimizer(
    name: str, params: Iterable[nn.Parameter] | Iterable[dict[str, Any]], lr: float, weight_decay: float = 0.0,
    momentum: float = 0.0, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
    implementation: Literal["fused", "foreach"] | None = None,
) -> torch.optim.Optimizer:
    """``adam`` (L2 weight decay in the gradient), ``adamw`` (decoupled) or ``sgd`` over
    ``params`` (parameters, or groups that may carry their own ``lr`` and ``weight_decay``).
    ``implementation``: torch's default kernels (``None``), ``fused`` or ``foreach`` (Adam's only)."""
    kind = {} if implementation is None else {implementation: True}
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, **kind)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, **kind)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer '{name}'; valid: {', '.join(OPTIMIZERS)}")
