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


def adam_state(optimizer: torch.optim.Optimizer,
               params: Sequence[Tensor]) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
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


_LIBRARY = torch.library.Library("sac_spectral", "FRAGMENT")
_LIBRARY.define(
    "adam_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] steps, "
    "float lr, float beta1, float beta2, float eps, float weight_decay, bool decoupled) -> ()",
    tags=(torch.Tag.flexible_layout,),  # inductor passes the gradients in the layout it made them
)


def _same_layout(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` (of one shape) lay their elements out in the same order."""
    return all(x == y for x, y, n in zip(a.stride(), b.stride(), a.shape) if n > 1)


def _check_sizes(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
                 steps: list[Tensor]) -> None:
    """ValueError unless each list holds one tensor per parameter, of its parameter's shape (a step
    count: of one element), as the C++ kernel checks (``adam.cpp``)."""
    for name, tensors in (("gradients", grads), ("exp_avgs", exp_avgs), ("exp_avg_sqs", exp_avg_sqs), ("steps", steps)):
        if len(tensors) != len(params):
            raise ValueError(f"sac_spectral::adam_: {len(tensors)} {name} for {len(params)} parameters")
    for i, (p, g, m, v, t) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, steps)):
        if not p.shape == g.shape == m.shape == v.shape or t.numel() != 1:
            raise ValueError(f"sac_spectral::adam_: parameter {i} of shape {list(p.shape)} has gradient "
                             f"{list(g.shape)}, "
                             f"exp_avg {list(m.shape)}, exp_avg_sq {list(v.shape)} and step {list(t.shape)}")


def _adam(
    params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor], steps: list[Tensor],
    lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool,
) -> None:
    _check_sizes(params, grads, exp_avgs, exp_avg_sqs, steps)
    # the fused kernel walks each gradient's memory in its parameter's order: match the layout
    grads = [g if _same_layout(p, g) else torch.empty_like(p).copy_(g) for p, g in zip(params, grads)]
    torch._foreach_add_(steps, 1.0)
    step = torch._fused_adamw_ if decoupled else torch._fused_adam_
    step(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=lr, beta1=beta1, beta2=beta2,
         weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False)


_LIBRARY.impl("adam_", _adam, "CompositeExplicitAutograd")


@torch.library.register_fake("sac_spectral::adam_")
def _adam_shapes(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
                 steps: list[Tensor], *hyper: Any) -> None:
    _check_sizes(params, grads, exp_avgs, exp_avg_sqs, steps)


def adam_step_(
    params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor], steps: list[Tensor],
    lr: float, betas: tuple[float, float], eps: float, weight_decay: float, decoupled: bool,
) -> None:
    """One Adam (``decoupled``: AdamW) step in place on lists of tensors with per-parameter step
    counts as tensors: torch's fused kernel (``torch.optim.Adam(fused=True)``'s, one pass over each
    tensor), as the operator ``sac_spectral::adam_``, so that a compiled program calls it as one
    kernel (inductor's own code for the multi-tensor formula runs 4× slower on the CPU, with the
    bias corrections formed per vector). ``m ← β₁m + (1−β₁)g``, ``v ← β₂v + (1−β₂)g²``,
    ``θ ← θ − lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε)``; weight decay adds ``wd·θ`` to ``g`` (Adam) or
    multiplies ``θ`` by ``1 − lr·wd`` first (AdamW)."""
    torch.ops.sac_spectral.adam_(params, grads, exp_avgs, exp_avg_sqs, steps, lr, *betas, eps, weight_decay, decoupled)
