"""The optimizers a network trains with, built by name (the RL agent's and the continual learner's)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

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


def adam_state(optimizer: torch.optim.Optimizer, params: Sequence[Tensor]) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """``(exp_avg, exp_avg_sq, step)`` of ``params`` in an Adam/AdamW ``optimizer``'s own state, created
    as torch creates it where missing (a fresh optimizer, or parameters whose state a reset dropped)."""
    for p in params:
        if not optimizer.state.get(p):
            optimizer.state[p] = {
                "step": torch.zeros((), dtype=torch.float32, device=p.device),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
    states = [optimizer.state[p] for p in params]
    return [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [s["step"] for s in states]


def adam_step_(
    params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor], steps: list[Tensor],
    lr: float, betas: tuple[float, float], eps: float, weight_decay: float, decoupled: bool,
) -> None:
    """One Adam (``decoupled``: AdamW) step in place on lists of tensors, torch.optim's formula with
    per-parameter step counts as tensors (so it traces into one graph for torch.compile):
    ``m ← β₁m + (1−β₁)g``, ``v ← β₂v + (1−β₂)g²``, ``θ ← θ − lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε)``;
    weight decay adds ``wd·θ`` to ``g`` (Adam) or multiplies ``θ`` by ``1 − lr·wd`` first (AdamW)."""
    beta1, beta2 = betas
    if weight_decay and decoupled:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)
    elif weight_decay:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_add_(steps, 1.0)
    torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1.0 - beta2)
    # the bias corrections in float64, as torch's fused kernels form them (1 − β₂ᵗ loses digits in float32)
    wide = [s.double() for s in steps]
    correction1 = torch._foreach_sub(torch._foreach_pow(beta1, wide), 1.0)  # −(1 − β₁ᵗ)
    correction2 = torch._foreach_sqrt(torch._foreach_neg(torch._foreach_sub(torch._foreach_pow(beta2, wide), 1.0)))
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, correction2)
    torch._foreach_add_(denom, eps)
    torch._foreach_mul_(denom, correction1)  # now −(1 − β₁ᵗ)·(√v̂ + ε)
    torch._foreach_addcdiv_(params, exp_avgs, denom, lr)
