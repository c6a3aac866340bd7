"""Fresh initializer draws and optimizer-state clearing: the one mechanism behind every reset.

Network initialization, the RL resets of :meth:`sac_spectral.agents.SAC.reset`, the ``reset``, ``redo`` and
``shrink_perturb`` regularizers all draw parameters through :func:`draw` and write them with
:func:`reinitialize`; optimizer moments are cleared with :func:`forget` (whole tensors) or
:func:`zero_moments` (some rows or columns).

Each member of a member-batched layer draws from its own ``torch.Generator`` (``generators[m]``),
layer by layer and member by member, so member ``m`` of an ``M``-member network equals the
single-member network driven by the same generator. A member's slice of a member-batched layer's
parameter has the shape of the plain torch layer's parameter (``BatchedLinear``: ``[out, in]`` and
``[out]``), and a plain layer counts as one member, so the code below never asks which kind a layer
is. Member-batched layers (anything with a ``members`` attribute and a ``draw(generator)`` method,
e.g. :class:`~sac_spectral.core.nets.BatchedLinear`) own their initializer; plain torch layers use torch's defaults:
``nn.Linear`` and ``nn.Conv*d`` weight and bias uniform in ``±1/√fan_in`` (what ``reset_parameters`` gives),
normalization gain 1 and shift 0. Draws happen on the CPU and are copied to the parameter's device and dtype.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

#: torch's normalization layers (gain and shift; the member-batched ones draw their own)
TORCH_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm)


def member_count(module: nn.Module) -> int:
    """``M`` for a member-batched layer, 1 for a plain torch layer."""
    return int(getattr(module, "members", 1))


def members_view(param: Tensor, module: nn.Module) -> Tensor:
    """``module``'s parameter with the member axis first: a member-batched layer's parameters have it
    already; a plain torch layer's get a leading axis of size 1 (a plain layer is one member)."""
    return param if hasattr(module, "members") else param.unsqueeze(0)


def member_param(param: Tensor, module: nn.Module, m: int) -> Tensor:
    """Member ``m``'s slice of one of ``module``'s parameters, shaped like a plain torch layer's."""
    return members_view(param, module)[m]


def _uniform(shape: torch.Size, bound: float, generator: torch.Generator | None) -> Tensor:
    return torch.empty(shape).uniform_(-bound, bound, generator=generator)


def draw(module: nn.Module, generator: torch.Generator | None = None) -> tuple[Tensor | None, Tensor | None]:
    """A fresh initializer sample ``(weight, bias)`` of one member, shaped like ``member_param``."""
    if hasattr(module, "members") and hasattr(module, "draw"):
        return module.draw(generator)
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    if isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
        fan_in = weight[0].numel()
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        w = _uniform(weight.shape, bound, generator)
        return w, None if bias is None else _uniform(bias.shape, bound, generator)
    if isinstance(module, TORCH_NORMS):
        return (
            None if weight is None else torch.ones(weight.shape),
            None if bias is None else torch.zeros(bias.shape),
        )
    raise TypeError(f"no initializer known for {type(module).__name__}")


def per_member(generators: Sequence[torch.Generator | None] | None, members: int) -> list[torch.Generator | None]:
    """One generator per member (``None``: torch's global generator for every member)."""
    if generators is None:
        return [None] * members
    if len(generators) != members:
        raise ValueError(f"expected {members} generators (one per member), got {len(generators)}")
    return list(generators)


@torch.no_grad()
def reinitialize(
    modules: Iterable[nn.Module],
    generators: Sequence[torch.Generator | None] | None = None,
    members: Sequence[int] | None = None,
) -> None:
    """Overwrite the listed members (all by default) of each module with fresh draws, module by
    module and member by member, member ``m`` from ``generators[m]``."""
    for mod in modules:
        gens = per_member(generators, member_count(mod))
        for m in range(member_count(mod)) if members is None else members:
            for param, value in zip((mod.weight, getattr(mod, "bias", None)), draw(mod, gens[m])):
                if param is not None and value is not None:
                    member_param(param, mod, m).copy_(value)
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.reset_running_stats()


def forget(optimizer: torch.optim.Optimizer, params: Iterable[Tensor]) -> None:
    """Drop the optimizer state (Adam moments and step count) of ``params``; it restarts lazily."""
    for p in params:
        optimizer.state.pop(p, None)


@torch.no_grad()
def zero_moments(optimizer: torch.optim.Optimizer, module: nn.Module, param: Tensor, mask: Tensor,
                 member: int = 0) -> None:
    """Zero the entries ``mask`` of member ``member``'s slice of ``module``'s parameter ``param``
    (``mask`` is shaped like that slice) in every per-element state tensor of ``param``: Adam's
    ``exp_avg`` and ``exp_avg_sq``, SGD's momentum, …. Per-tensor entries such as Adam's ``step`` stay."""
    for value in optimizer.state.get(param, {}).values():
        if isinstance(value, Tensor) and value.shape == param.shape:
            member_param(value, module, member).masked_fill_(mask, 0.0)


def reset_layers(
    modules: Sequence[nn.Module],
    generators: Sequence[torch.Generator | None] | None,
    optimizer: torch.optim.Optimizer | None,
) -> None:
    """Re-draw every member of ``modules`` and forget their optimizer state (a reset)."""
    reinitialize(modules, generators)
    if optimizer is not None:
        forget(optimizer, [p for mod in modules for p in mod.parameters()])
