"""Member-batched layers and MLP builders.

Every trainable network carries a leading *member* axis ``M``: the critics of an ensemble and the
seeds of a multi-seed run are members of one network. A :class:`BatchedLinear` holds
``weight: [M, out, in]`` and ``bias: [M, out]`` (member ``m``'s slices are an ``nn.Linear``'s
weight and bias) and maps ``x: [M, B, in]`` to ``[M, B, out]`` with one ``torch.baddbmm``. Members
never interact, so Adam (elementwise) keeps them independent.

Initializers draw each member from its own ``torch.Generator`` so that member ``i`` of an
``M``-member network equals the single-member network built from the same generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sac_spectral.core.reinit import per_member, reinitialize

INITS = ("orthogonal", "torch")


def _crelu(x: Tensor) -> Tensor:
    return torch.cat([F.relu(x), F.relu(-x)], dim=-1)


#: name → (function, output width multiplier)
ACTIVATIONS: dict[str, tuple[Callable[[Tensor], Tensor], int]] = {
    "relu": (F.relu, 1),
    "tanh": (torch.tanh, 1),
    "elu": (F.elu, 1),
    "gelu": (F.gelu, 1),
    "silu": (F.silu, 1),
    "leaky_relu": (F.leaky_relu, 1),
    "crelu": (_crelu, 2),
}


class Activation(nn.Module):
    """An activation of :data:`ACTIVATIONS` as a module, by name (``crelu`` doubles the width)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        if name not in ACTIVATIONS:
            raise ValueError(f"unknown activation '{name}'; valid: {', '.join(ACTIVATIONS)}")
        self.name = name
        self.fn, self.width_mult = ACTIVATIONS[name]

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return self.name


class BatchedLinear(nn.Module):
    """``y[m] = x[m] @ weight[m]ᵀ + bias[m]`` for ``M`` independent members.

    ``weight: [M, out, in]`` and ``bias: [M, out]``, so member ``m``'s ``weight[m]`` and ``bias[m]``
    are exactly an ``nn.Linear``'s parameters. ``init="orthogonal"``: each member's matrix is
    orthogonal with ``gain`` (jaxrl/rl_with_resets lineage) and biases are zero.
    ``init="torch"``: weight and bias uniform in ``±1/sqrt(in)``, exactly as ``nn.Linear``'s default.
    ``low``: bf16 copies ``(weight, bias, switch)`` from :mod:`sac_spectral.core.precision`, used (with the
    input cast to bf16) while ``switch.on``; an input of another dtype than the weight is cast to it.

    The product is formed feature-major, ``y[m] = (weight[m] · x[m]ᵀ + bias[m])ᵀ``, and returned as
    a transposed view (``[M, B, out]`` with the batch as the fastest axis): the weight gradient
    ``g[m]ᵀ · x[m]`` then comes out in the weight's own layout, where ``x · weightᵀ`` gives it
    transposed and autograd copies it into place (about 6 % of a plain SAC update on 2 threads).
    Elementwise ops keep the layout, and the next layer reads it without a copy; flatten an output
    with ``reshape`` (``view`` needs the row-major layout). ``products``: a differentiable ``torch.bmm`` that
    the forward multiplies with instead, the bias added after it, where it returns a product (else
    ``baddbmm``): :func:`sac_spectral.core.onednn.eager_bmm`, set by the update engine where it is faster.
    """

    low: tuple[Tensor, Tensor | None, Any] | None = None
    products: Callable[[Tensor, Tensor], Tensor | None] | None = None

    def __init__(
        self,
        members: int,
        in_features: int,
        out_features: int,
        bias: bool = True,
        init: str = "orthogonal",
        gain: float = 1.0,
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> None:
        super().__init__()
        if init not in INITS:
            raise ValueError(f"unknown init '{init}'; valid: {', '.join(INITS)}")
        self.members, self.in_features, self.out_features = members, in_features, out_features
        self.init, self.gain = init, gain
        self.weight = nn.Parameter(torch.empty(members, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(members, out_features)) if bias else None
        self.reset_parameters(generators)

    def draw(self, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor | None]:
        """A fresh initializer sample ``(weight [out, in], bias [out] | None)`` for one member."""
        if self.init == "orthogonal":
            w = torch.empty(self.out_features, self.in_features)
            nn.init.orthogonal_(w, gain=self.gain, generator=generator)
            b = torch.zeros(self.out_features) if self.bias is not None else None
        else:
            bound = 1.0 / math.sqrt(self.in_features)
            w = torch.rand(self.out_features, self.in_features, generator=generator) * (2 * bound) - bound
            b = None
            if self.bias is not None:
                b = torch.rand(self.out_features, generator=generator) * (2 * bound) - bound
        return w, b

    @torch.no_grad()
    def reset_parameters(
        self,
        generators: Sequence[torch.Generator | None] | None = None,
        members: Sequence[int] | None = None,
    ) -> None:
        """Re-draw the listed members (all by default), member ``m`` from ``generators[m]``."""
        reinitialize([self], generators, members)

    def forward(self, x: Tensor, detach: bool = False) -> Tensor:
        w, b = self.weight, self.bias
        if self.low is not None and self.low[2].on:
            w, b, _ = self.low
        if x.dtype != w.dtype:
            x = x.to(w.dtype)
        if detach:
            w = w.detach()
            b = b.detach() if b is not None else None
        if torch.compiler.is_compiling():
            # row-major, with the bias added in inductor's fused elementwise kernels rather than by
            # baddbmm (which first copies the broadcast bias): 1.05× at one seed, 1.17× at ten
            y = torch.bmm(x, w.transpose(1, 2))
            return y if b is None else y + b.unsqueeze(1)
        xt = x.transpose(1, 2)
        if self.products is not None and (y := self.products(w, xt)) is not None:
            return (y if b is None else y + b.unsqueeze(2)).transpose(1, 2)
        return (torch.bmm(w, xt) if b is None else torch.baddbmm(b.unsqueeze(2), w, xt)).transpose(1, 2)

    def extra_repr(self) -> str:
        return f"members={self.members}, in={self.in_features}, out={self.out_features}, init={self.init}"


class BatchedLayerNorm(nn.Module):
    """Layer normalization over features with a per-member gain ``[M, F]`` and shift ``[M, F]``."""

    def __init__(self, members: int, features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.members, self.features, self.eps = members, features, eps
        self.weight = nn.Parameter(torch.ones(members, features))
        self.bias = nn.Parameter(torch.zeros(members, features))

    def draw(self, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """The initializer's value for one member: gain 1, shift 0."""
        return torch.ones(self.features), torch.zeros(self.features)

    @torch.no_grad()
    def reset_parameters(
        self,
        generators: Sequence[torch.Generator | None] | None = None,
        members: Sequence[int] | None = None,
    ) -> None:
        reinitialize([self], generators, members)

    def normalized(self, x: Tensor) -> Tensor:
        """``x`` ``[M, B, F]`` normalized as the forward normalizes it before the gain and shift."""
        return F.layer_norm(x, (self.features,), eps=self.eps)

    def forward(self, x: Tensor, detach: bool = False) -> Tensor:
        w, b = (self.weight.detach(), self.bias.detach()) if detach else (self.weight, self.bias)
        return torch.addcmul(b.unsqueeze(1), self.normalized(x), w.unsqueeze(1))


class RunningNorm(nn.Module):
    """Per-member running mean and variance of the inputs ``[M, in]`` (Chan et al.'s parallel
    update from each batch that :meth:`observe` sees); ``forward`` standardizes with them."""

    def __init__(self, members: int, features: int, eps: float = 1e-8) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("mean", torch.zeros(members, features))
        self.register_buffer("var", torch.ones(members, features))
        self.register_buffer("count", torch.zeros(members, 1))

    @torch.no_grad()
    def observe(self, x: Tensor) -> None:
        """Fold the batch ``x [M, B, in]`` into the statistics."""
        n = x.shape[1]
        mean, var = x.mean(dim=1), x.var(dim=1, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        self.var.copy_((self.var * self.count + var * n + delta.square() * self.count * n / total) / total)
        self.mean.add_(delta * n / total)
        self.count.copy_(total)

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.mean.unsqueeze(1)) * torch.rsqrt(self.var.unsqueeze(1) + self.eps)


class BatchedNetwork(nn.Module):
    """What every member-batched network of the agents offers: ``forward(x, detach,
    return_hidden)``, its output layers, its levels from the input (:meth:`tail`, for resets),
    :meth:`observe` (inputs seen in training, for networks that keep input statistics) and
    :meth:`project` (its constraint, applied after each optimizer step)."""

    members: int
    #: whether :meth:`observe` keeps statistics of the inputs
    observes = False

    def output_layers(self) -> list[nn.Module]:
        """The heads: the layers whose outputs are the network's outputs."""
        raise NotImplementedError

    def tail(self, last: int | None = None) -> list[nn.Module]:
        """The modules of the last ``last`` levels (every level if ``None``)."""
        raise NotImplementedError

    @torch.no_grad()
    def reset_parameters(
        self,
        generators: Sequence[torch.Generator | None] | None = None,
        members: Sequence[int] | None = None,
        last: int | None = None,
    ) -> None:
        """Re-initialize every layer, or only the ``last`` levels (see :meth:`tail`)."""
        reinitialize(self.tail(last), generators, members)

    def observe(self, x: Tensor) -> None:
        """Inputs ``[M, B, in]`` of a training batch (nothing to do for a plain network)."""

    def project(self) -> None:
        """Constrain the parameters in place; the update engine calls it right after each optimizer
        step of the network, inside a compiled program too (nothing to do for a plain network)."""


class BatchedMLP(BatchedNetwork):
    """``M`` independent MLPs ``Linear → [LayerNorm] → activation → … → head(s)``.

    ``out_dims`` is one output width (one head; ``forward`` returns ``[M, B, out]``) or a tuple of
    widths (one linear head per entry on the last hidden features, as the mean and log-std heads of a
    Gaussian policy; ``forward`` returns a tuple). ``out_gains`` gives each head's orthogonal gain.
    ``forward`` accepts ``[M, B, in]`` (one input per member) or ``[B, in]`` (shared by all members);
    with ``return_hidden=True`` it also returns the post-activation features of every hidden layer.
    """

    def __init__(
        self,
        members: int,
        in_dim: int,
        hidden: Sequence[int],
        out_dims: int | Sequence[int],
        activation: str = "relu",
        layer_norm: bool = False,
        init: str = "orthogonal",
        hidden_gain: float = math.sqrt(2.0),
        out_gains: float | Sequence[float] = 1.0,
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation '{activation}'; valid: {', '.join(ACTIVATIONS)}")
        self.single_head = isinstance(out_dims, int)
        dims = [out_dims] if isinstance(out_dims, int) else list(out_dims)
        gains = [out_gains] * len(dims) if isinstance(out_gains, (int, float)) else list(out_gains)
        if len(gains) != len(dims):
            raise ValueError(f"expected {len(dims)} output gains (one per head), got {len(gains)}")
        self.members, self.in_dim, self.out_dims = members, in_dim, tuple(dims)
        self.activation = activation
        self._act, width_mult = ACTIVATIONS[activation]
        gens = per_member(generators, members)
        self.layers = nn.ModuleList()
        self.norms = nn.ModuleList() if layer_norm else None
        d = in_dim
        for h in hidden:
            self.layers.append(BatchedLinear(members, d, h, init=init, gain=hidden_gain, generators=gens))
            if self.norms is not None:
                self.norms.append(BatchedLayerNorm(members, h))
            d = h * width_mult
        self.heads = nn.ModuleList(
            BatchedLinear(members, d, o, init=init, gain=g, generators=gens) for o, g in zip(dims, gains)
        )

    def output_layers(self) -> list[nn.Module]:
        return list(self.heads)

    def tail(self, last: int | None = None) -> list[nn.Module]:
        """The modules of the last ``last`` levels (every level if ``None``): the heads are the
        last level, each hidden linear layer with its norm one level before."""
        levels: list[list[nn.Module]] = [
            [layer] + ([self.norms[i]] if self.norms is not None else []) for i, layer in enumerate(self.layers)
        ]
        levels.append(list(self.heads))
        start = 0 if last is None else max(len(levels) - last, 0)
        return [m for level in levels[start:] for m in level]

    def forward(
        self, x: Tensor, detach: bool = False, return_hidden: bool = False
    ) -> Tensor | tuple[Tensor, ...] | tuple[Tensor | tuple[Tensor, ...], list[Tensor]]:
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.members, -1, -1)
        hidden: list[Tensor] = []
        for i, layer in enumerate(self.layers):
            x = layer(x, detach)
            if self.norms is not None:
                x = self.norms[i](x, detach)
            x = self._act(x)
            if return_hidden:
                hidden.append(x)
        outs = tuple(head(x, detach) for head in self.heads)
        out = outs[0] if self.single_head else outs
        return (out, hidden) if return_hidden else out
