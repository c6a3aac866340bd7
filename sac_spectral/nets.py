"""Member-batched layers and MLP builders.

Every trainable network carries a leading *member* axis ``M``: the critics of an ensemble and the
seeds of a multi-seed run are members of one network. A :class:`BatchedLinear` holds
``weight: [M, in, out]`` and ``bias: [M, 1, out]`` and maps ``x: [M, B, in]`` to ``[M, B, out]``
with one ``torch.baddbmm``. Members never interact, so Adam (elementwise) keeps them independent.

Initializers draw each member from its own ``torch.Generator`` so that member ``i`` of an
``M``-member network equals the single-member network built from the same generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sac_spectral.reinit import per_member, reinitialize

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
    """``y[m] = x[m] @ weight[m] + bias[m]`` for ``M`` independent members.

    ``init="orthogonal"``: each member's ``[out, in]`` matrix is orthogonal with ``gain``
    (jaxrl/rl_with_resets lineage) and biases are zero. ``init="torch"``: weight and bias uniform in
    ``±1/sqrt(in)``, exactly as ``nn.Linear``'s default.
    """

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
        self.weight = nn.Parameter(torch.empty(members, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(members, 1, out_features)) if bias else None
        self.reset_parameters(generators)

    def draw(self, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor | None]:
        """A fresh initializer sample ``(weight [in, out], bias [1, out] | None)`` for one member."""
        if self.init == "orthogonal":
            w = torch.empty(self.out_features, self.in_features)
            nn.init.orthogonal_(w, gain=self.gain, generator=generator)
            w = w.t()
            b = torch.zeros(1, self.out_features) if self.bias is not None else None
        else:
            bound = 1.0 / math.sqrt(self.in_features)
            w = torch.rand(self.in_features, self.out_features, generator=generator) * (2 * bound) - bound
            b = None
            if self.bias is not None:
                b = torch.rand(1, self.out_features, generator=generator) * (2 * bound) - bound
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
        if detach:
            w = w.detach()
            b = b.detach() if b is not None else None
        if b is None:
            return torch.bmm(x, w)
        return torch.baddbmm(b, x, w)

    def extra_repr(self) -> str:
        return f"members={self.members}, in={self.in_features}, out={self.out_features}, init={self.init}"


class BatchedLayerNorm(nn.Module):
    """Layer normalization over features with a per-member gain ``[M, 1, F]`` and shift."""

    def __init__(self, members: int, features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.members, self.features, self.eps = members, features, eps
        self.weight = nn.Parameter(torch.ones(members, 1, features))
        self.bias = nn.Parameter(torch.zeros(members, 1, features))

    def draw(self, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """The initializer's value for one member: gain 1, shift 0."""
        return torch.ones(1, self.features), torch.zeros(1, self.features)

    @torch.no_grad()
    def reset_parameters(
        self,
        generators: Sequence[torch.Generator | None] | None = None,
        members: Sequence[int] | None = None,
    ) -> None:
        reinitialize([self], generators, members)

    def forward(self, x: Tensor, detach: bool = False) -> Tensor:
        w, b = (self.weight.detach(), self.bias.detach()) if detach else (self.weight, self.bias)
        return torch.addcmul(b, F.layer_norm(x, (self.features,), eps=self.eps), w)


class BatchedMLP(nn.Module):
    """``M`` independent MLPs ``Linear → [LayerNorm] → activation → … → Linear``.

    ``forward`` accepts ``[M, B, in]`` (one input per member) or ``[B, in]`` (shared by all members)
    and returns ``[M, B, out]``; with ``return_hidden=True`` also the post-activation features of
    every hidden layer.
    """

    def __init__(
        self,
        members: int,
        in_dim: int,
        hidden: Sequence[int],
        out_dim: int,
        activation: str = "relu",
        layer_norm: bool = False,
        init: str = "orthogonal",
        hidden_gain: float = math.sqrt(2.0),
        out_gain: float = 1.0,
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation '{activation}'; valid: {', '.join(ACTIVATIONS)}")
        self.members, self.in_dim, self.out_dim = members, in_dim, out_dim
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
        self.layers.append(BatchedLinear(members, d, out_dim, init=init, gain=out_gain, generators=gens))

    def tail(self, last: int | None = None) -> list[nn.Module]:
        """The last ``last`` linear layers and their norms (every layer if ``None``)."""
        start = 0 if last is None else max(len(self.layers) - last, 0)
        mods: list[nn.Module] = list(self.layers[start:])
        if self.norms is not None:
            mods += list(self.norms[start:])
        return mods

    @torch.no_grad()
    def reset_parameters(
        self,
        generators: Sequence[torch.Generator | None] | None = None,
        members: Sequence[int] | None = None,
        last: int | None = None,
    ) -> None:
        """Re-initialize every layer, or only the ``last`` linear layers (with their norms)."""
        reinitialize(self.tail(last), generators, members)

    def forward(
        self, x: Tensor, detach: bool = False, return_hidden: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.members, -1, -1)
        hidden: list[Tensor] = []
        for i, layer in enumerate(self.layers[:-1]):
            x = layer(x, detach)
            if self.norms is not None:
                x = self.norms[i](x, detach)
            x = self._act(x)
            if return_hidden:
                hidden.append(x)
        out = self.layers[-1](x, detach)
        return (out, hidden) if return_hidden else out
