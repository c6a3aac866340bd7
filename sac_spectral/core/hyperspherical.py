"""SimbaV2, member-batched (Lee, Lee, Seno, Kim, Stone, Choo, "Hyperspherical Normalization for
Scalable Deep Reinforcement Learning", ICML 2025, arXiv:2502.15280).

Features and weights live on unit hyperspheres. With ``n(v) = v / max(‖v‖₂, ε)`` (over the
features; ε = 1e-8) and learnable scalers ``s`` (below), for ``hidden = [W] * (L + 1)``:

- input: running-statistics standardization ``x̂`` (RSNorm, as SimBa's :class:`RunningNorm`), the
  shift ``x̃ = n([x̂; c_shift])`` (a constant coordinate, ``c_shift = 3``, keeps the input's
  magnitude through the normalization) and the projection ``h₀ = n(s_e ⊙ W_e x̃)``;
- ``L`` LERP blocks, with inner width ``4W``::

      h̃ = n(W₂ ReLU(s ⊙ W₁ h))
      h ← n(h + α ⊙ (h̃ − h))                     α learnable, per feature

- each head (the actor's mean and log-std, the critic's ``width`` outputs):
  ``y = W_{o,2}(s_o ⊙ W_{o,1} h_L) + b_o``, the only bias of the network;
- after each optimizer step every weight matrix is projected back, row by row (each unit's
  incoming weights), onto the unit sphere: ``W[j] ← n(W[j])`` (:meth:`HypersphericalNet.project`,
  which the update engine calls inside its step). Rows start on it: orthogonal draws, normalized.

Scalers use the paper's init/scale reparameterization: the stored parameter starts at ``scale``
and the forward multiplies it by ``init / scale``, so the scaler is ``init`` at the start and Adam
moves it ``init / scale`` times its learning rate per step. Feature scalers over ``d`` features
have ``init = scale = √(2/d)``; the blocks' α has ``init = 1/(L + 1)``, ``scale = 1/√W``.

Under ``precision=bf16`` the matrix products run in bf16 and every normalization in float32
(:func:`l2_normalize` of a bf16 product), so the stream, the LERP's interpolation and the features
lie on the sphere to a float32 rounding, as under autocast, whose norms compute in float32.

Our choices: the critic's running statistics cover its whole input (observation and action, as
SimBa's here; the paper's code standardizes the observation only); targets follow by Polyak
averaging and are not projected (as the paper's code).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from sac_spectral.core.nets import ACTIVATIONS, BatchedLinear, BatchedNetwork, RunningNorm
from sac_spectral.core.precision import full
from sac_spectral.core.reinit import per_member

#: the constant coordinate appended to the standardized input before its normalization
C_SHIFT = 3.0
#: the LERP block's inner width over the stream's
EXPANSION = 4
#: the smallest norm :func:`l2_normalize` divides by
EPS = 1e-8


def l2_normalize(x: Tensor) -> Tensor:
    """``x / max(‖x‖₂, ε)`` over the last axis, in float32 where ``x`` is a bf16 product."""
    x = full(x)
    return x / x.norm(dim=-1, keepdim=True).clamp_min(EPS)


class SphereLinear(BatchedLinear):
    """A :class:`BatchedLinear` (no bias unless asked) whose rows lie on the unit sphere: drawn
    (orthogonal or torch's), then normalized; :meth:`project` puts them back after a step."""

    def __init__(self, members: int, in_features: int, out_features: int, bias: bool = False,
                 init: str = "orthogonal", generators: Sequence[torch.Generator | None] | None = None) -> None:
        super().__init__(members, in_features, out_features, bias, init, 1.0, generators)

    def draw(self, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor | None]:
        w, b = super().draw(generator)
        return l2_normalize(w), None if b is None else torch.zeros_like(b)

    @torch.no_grad()
    def project(self) -> None:
        """Every member's rows back onto the unit sphere."""
        w = self.weight.detach()
        w.div_(w.norm(dim=-1, keepdim=True).clamp_min(EPS))


class BatchedScaler(nn.Module):
    """``x ⊙ s`` with a learnable per-member vector ``s = weight · (init / scale)`` ``[M, F]``
    (``weight`` starts at ``scale``). The layer views count it as a normalization layer's gain."""

    def __init__(self, members: int, features: int, init: float, scale: float) -> None:
        super().__init__()
        self.members, self.features, self.init, self.scale = members, features, init, scale
        self.weight = nn.Parameter(torch.full((members, features), scale))

    def draw(self, generator: torch.Generator | None = None) -> tuple[Tensor, None]:
        """The initializer's value for one member: ``scale`` everywhere."""
        return torch.full((self.features,), self.scale), None

    def forward(self, x: Tensor, detach: bool = False) -> Tensor:
        w = self.weight.detach() if detach else self.weight
        return x * (w * (self.init / self.scale)).unsqueeze(1).to(x.dtype)

    def extra_repr(self) -> str:
        return f"members={self.members}, features={self.features}, init={self.init:.4g}, scale={self.scale:.4g}"


def feature_scaler(members: int, features: int) -> BatchedScaler:
    """A feature scaler over ``features`` units: ``init = scale = √(2/features)``."""
    s = math.sqrt(2.0 / features)
    return BatchedScaler(members, features, s, s)


class HypersphericalNet(BatchedNetwork):
    """SimbaV2's network (see the module docstring); arguments as :class:`BatchedMLP`'s, with
    ``hidden = [W] * (blocks + 1)``. ``forward`` maps ``[M, B, in]`` (or ``[B, in]``) to
    ``[M, B, out]`` per head and returns the stream after the embedding and after each block as
    its hidden features."""

    observes = True

    def __init__(self, members: int, in_dim: int, hidden: Sequence[int], out_dims: int | Sequence[int],
                 activation: str = "relu", init: str = "orthogonal",
                 generators: Sequence[torch.Generator | None] | None = None) -> None:
        super().__init__()
        if len(set(hidden)) != 1:
            raise ValueError(f"simbav2 needs equal widths (the embedding's, then one per block), got {list(hidden)}")
        self._act, width_mult = ACTIVATIONS[activation]
        if width_mult != 1:
            raise ValueError(f"simbav2 keeps the stream's width: activation '{activation}' changes it")
        self.members, self.in_dim = members, in_dim
        self.single_head = isinstance(out_dims, int)
        self.out_dims = (out_dims,) if isinstance(out_dims, int) else tuple(out_dims)
        gens, w, blocks = per_member(generators, members), hidden[0], len(hidden) - 1

        def sphere(i: int, o: int, bias: bool = False) -> SphereLinear:
            return SphereLinear(members, i, o, bias, init, gens)

        self.input_norm = RunningNorm(members, in_dim)
        self.embed, self.embed_scaler = sphere(in_dim + 1, w), feature_scaler(members, w)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"linear_in": sphere(w, EXPANSION * w), "scaler": feature_scaler(members, EXPANSION * w),
                           "linear_out": sphere(EXPANSION * w, w),
                           "alpha": BatchedScaler(members, w, 1.0 / (blocks + 1), 1.0 / math.sqrt(w))})
            for _ in range(blocks)
        )
        self.heads = nn.ModuleList(
            nn.ModuleDict({"linear_in": sphere(w, w), "scaler": feature_scaler(members, w),
                           "linear_out": sphere(w, o, bias=True)})
            for o in self.out_dims
        )

    def _embed(self, x: Tensor, detach: bool) -> Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.members, -1, -1)
        x = self.input_norm(x)
        x = l2_normalize(torch.cat([x, torch.full_like(x[..., :1], C_SHIFT)], dim=-1))
        return l2_normalize(self.embed_scaler(self.embed(x, detach), detach))

    def _block(self, block: nn.ModuleDict, h: Tensor, detach: bool) -> tuple[Tensor, Tensor]:
        """The block's output and its inner units' activations."""
        inner = self._act(block["scaler"](block["linear_in"](h, detach), detach))
        proposal = l2_normalize(block["linear_out"](inner, detach))
        return l2_normalize(h + block["alpha"](proposal - h, detach)), inner

    def forward(self, x: Tensor, detach: bool = False, return_hidden: bool = False
                ) -> Tensor | tuple[Tensor, ...] | tuple[Tensor | tuple[Tensor, ...], list[Tensor]]:
        h = self._embed(x, detach)
        hidden = [h]
        for block in self.blocks:
            h = self._block(block, h, detach)[0]
            hidden.append(h)
        outs = tuple(head["linear_out"](head["scaler"](head["linear_in"](h, detach), detach), detach)
                     for head in self.heads)
        out = outs[0] if self.single_head else outs
        return (out, hidden) if return_hidden else out

    def observe(self, x: Tensor) -> None:
        """Fold inputs ``[M, B, in]`` into the running input statistics."""
        self.input_norm.observe(x)

    @torch.no_grad()
    def project(self) -> None:
        """Every weight matrix's rows back onto the unit sphere."""
        for module in self.modules():
            if isinstance(module, SphereLinear):
                module.project()

    def output_layers(self) -> list[nn.Module]:
        return [head["linear_out"] for head in self.heads]

    def tail(self, last: int | None = None) -> list[nn.Module]:
        """The levels: the embedding (with its scaler), each block, the heads."""
        levels: list[list[nn.Module]] = [[self.embed, self.embed_scaler]]
        levels += [list(block.values()) for block in self.blocks]
        levels.append([m for head in self.heads for m in head.values()])
        start = 0 if last is None else max(len(levels) - last, 0)
        return [m for level in levels[start:] for m in level]

    def hidden_units(self) -> list[tuple[BatchedLinear, list[BatchedLinear], list[BatchedScaler]]]:
        """Each block's inner units: ``(producer, [consumer], [their scaler])``."""
        return [(b["linear_in"], [b["linear_out"]], [b["scaler"]]) for b in self.blocks]

    def inner_activations(self, x: Tensor) -> list[Tensor]:
        """The inner units' activations ``[M, B, 4W]`` of each block on inputs ``x``."""
        h, inner = self._embed(x, False), []
        for block in self.blocks:
            h, units = self._block(block, h, False)
            inner.append(units)
        return inner
