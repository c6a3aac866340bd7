"""Member-batched residual LayerNorm networks for high-replay-ratio control: BroNet and SimBa.

- **BroNet** (Nauman et al. 2024, "Bigger, Regularized, Optimistic"): ``Linear → LN → ReLU``, then
  residual blocks ``x + LN(Linear(ReLU(LN(Linear(x)))))``, then the heads.
- **SimBa** (Lee et al. 2025, "SimBa: Simplicity Bias for Scaling Up Parameters in Deep RL"):
  running-statistics input normalization (:class:`RunningNorm`), a linear embedding, pre-LN
  residual blocks with an inverted bottleneck ``x + Linear(ReLU(Linear(LN(x))))`` (inner width
  ``4·W``), a final LayerNorm, then the heads.

Both take ``hidden = [W] * (blocks + 1)``: the embedding's width, then one entry per block (all
equal, the residual stream's width). Like :class:`~sac_spectral.core.nets.BatchedMLP` they map
``[M, B, in]`` (or ``[B, in]``) to ``[M, B, out]``, return the residual stream after the
embedding and after each block as their hidden features, and count levels for resets
(:meth:`tail`): the heads are the last level, each block one level before them (SimBa's final
LayerNorm belongs to the last block), the embedding the first. :meth:`hidden_units` names the
units inside each block with the layer that produces them and the layer that reads them, which is
what ReDo re-initializes.

:func:`make_network` builds every arch of :data:`ARCHS` by name: these two, the MLP and SimbaV2
(:mod:`~sac_spectral.core.hyperspherical`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from sac_spectral.core.hyperspherical import HypersphericalNet
from sac_spectral.core.nets import (
    ACTIVATIONS,
    BatchedLayerNorm,
    BatchedLinear,
    BatchedMLP,
    BatchedNetwork,
    RunningNorm,
)
from sac_spectral.core.reinit import per_member

ARCHS = ("mlp", "bronet", "simba", "simbav2")
#: the residual LayerNorm networks of this module
RESIDUAL = ("bronet", "simba")
#: SimBa's inverted bottleneck: the block's inner width over the stream's
EXPANSION = 4


class ResidualNet(BatchedNetwork):
    """``arch`` ∈ {``bronet``, ``simba``} (see the module docstring); arguments as BatchedMLP's."""

    def __init__(self, arch: str, members: int, in_dim: int, hidden: Sequence[int], out_dims: int | Sequence[int],
                 activation: str = "relu", init: str = "orthogonal", hidden_gain: float = math.sqrt(2.0),
                 out_gains: float | Sequence[float] = 1.0,
                 generators: Sequence[torch.Generator | None] | None = None) -> None:
        super().__init__()
        if arch not in RESIDUAL:
            raise ValueError(f"unknown residual arch '{arch}'; valid: {', '.join(RESIDUAL)}")
        if len(set(hidden)) != 1:
            raise ValueError(f"{arch} needs equal widths (the embedding's, then one per block), got {list(hidden)}")
        self.arch, self.members, self.in_dim = arch, members, in_dim
        self.single_head = isinstance(out_dims, int)
        self.out_dims = (out_dims,) if isinstance(out_dims, int) else tuple(out_dims)
        gains = [out_gains] * len(self.out_dims) if isinstance(out_gains, (int, float)) else list(out_gains)
        self._act, width_mult = ACTIVATIONS[activation]
        if width_mult != 1:
            raise ValueError(f"{arch} keeps the stream's width: activation '{activation}' changes it")
        gens, w = per_member(generators, members), hidden[0]
        linear = lambda i, o, g=hidden_gain: BatchedLinear(members, i, o, init=init, gain=g, generators=gens)  # noqa: E731
        inner = w * EXPANSION if arch == "simba" else w
        self.input_norm = RunningNorm(members, in_dim) if arch == "simba" else None
        self.observes = self.input_norm is not None
        self.embed = linear(in_dim, w)
        self.embed_norm = BatchedLayerNorm(members, w) if arch == "bronet" else None
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"norm_in": BatchedLayerNorm(members, w if arch == "simba" else inner),
                           "linear_in": linear(w, inner), "linear_out": linear(inner, w),
                           **({"norm_out": BatchedLayerNorm(members, w)} if arch == "bronet" else {})})
            for _ in hidden[1:]
        )
        self.final_norm = BatchedLayerNorm(members, w) if arch == "simba" else None
        self.heads = nn.ModuleList(linear(w, o, g) for o, g in zip(self.out_dims, gains))

    def _block(self, block: nn.ModuleDict, x: Tensor, detach: bool) -> tuple[Tensor, Tensor]:
        """The block's output and its inner units' activations."""
        if self.arch == "simba":
            h = self._act(block["linear_in"](block["norm_in"](x, detach), detach))
            return x + block["linear_out"](h, detach), h
        h = self._act(block["norm_in"](block["linear_in"](x, detach), detach))
        return x + block["norm_out"](block["linear_out"](h, detach), detach), h

    def forward(self, x: Tensor, detach: bool = False, return_hidden: bool = False
                ) -> Tensor | tuple[Tensor, ...] | tuple[Tensor | tuple[Tensor, ...], list[Tensor]]:
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.members, -1, -1)
        if self.input_norm is not None:
            x = self.input_norm(x)
        x = self.embed(x, detach)
        if self.embed_norm is not None:
            x = self._act(self.embed_norm(x, detach))
        hidden = [x]
        for block in self.blocks:
            x = self._block(block, x, detach)[0]
            hidden.append(x)
        if self.final_norm is not None:
            x = hidden[-1] = self.final_norm(x, detach)
        outs = tuple(head(x, detach) for head in self.heads)
        out = outs[0] if self.single_head else outs
        return (out, hidden) if return_hidden else out

    def observe(self, x: Tensor) -> None:
        """Fold inputs ``[M, B, in]`` into SimBa's running input statistics (BroNet: nothing)."""
        if self.input_norm is not None:
            self.input_norm.observe(x)

    def output_layers(self) -> list[nn.Module]:
        return list(self.heads)

    def tail(self, last: int | None = None) -> list[nn.Module]:
        levels: list[list[nn.Module]] = [[self.embed] + ([self.embed_norm] if self.embed_norm is not None else [])]
        levels += [list(block.values()) for block in self.blocks]
        if self.final_norm is not None:
            levels[-1].append(self.final_norm)
        levels.append(list(self.heads))
        start = 0 if last is None else max(len(levels) - last, 0)
        return [m for level in levels[start:] for m in level]

    def hidden_units(self) -> list[tuple[BatchedLinear, list[BatchedLinear], list[BatchedLayerNorm]]]:
        """Each block's inner units: ``(producer, [consumer], [norms on them])`` (the residual
        stream's units feed every later block and are left out)."""
        return [(b["linear_in"], [b["linear_out"]],
                 [b["norm_in"]] if self.arch == "bronet" else []) for b in self.blocks]

    def unnormalized_layers(self) -> list[str]:
        """Layers whose output reaches a nonlinearity with no normalization between: SimBa's block
        inputs (``LN → Linear → ReLU``); none in BroNet (``Linear → LN → ReLU``)."""
        return [f"blocks.{i}.linear_in" for i in range(len(self.blocks))] if self.arch == "simba" else []

    def inner_activations(self, x: Tensor) -> list[Tensor]:
        """The inner units' activations ``[M, B, inner]`` of each block on inputs ``x``."""
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.members, -1, -1)
        if self.input_norm is not None:
            x = self.input_norm(x)
        x = self.embed(x)
        if self.embed_norm is not None:
            x = self._act(self.embed_norm(x))
        inner = []
        for block in self.blocks:
            x, h = self._block(block, x, False)
            inner.append(h)
        return inner


def make_network(arch: str, members: int, in_dim: int, hidden: Sequence[int], out_dims: int | Sequence[int],
                 activation: str = "relu", layer_norm: bool = False, init: str = "orthogonal",
                 out_gains: float | Sequence[float] = 1.0,
                 generators: Sequence[torch.Generator | None] | None = None) -> BatchedNetwork:
    """The member-batched network of ``arch`` (:data:`ARCHS`; ``simbav2``:
    :class:`~sac_spectral.core.hyperspherical.HypersphericalNet`, whose rows on the sphere make
    ``out_gains`` moot); ``layer_norm`` is the MLP's option (the others always normalize)."""
    if arch == "mlp":
        return BatchedMLP(members, in_dim, hidden, out_dims, activation, layer_norm, init, out_gains=out_gains,
                          generators=generators)
    if arch == "simbav2":
        if layer_norm:
            raise ValueError("simbav2 normalizes its features onto the unit sphere: layer_norm must be false")
        return HypersphericalNet(members, in_dim, hidden, out_dims, activation, init, generators)
    return ResidualNet(arch, members, in_dim, hidden, out_dims, activation, init, out_gains=out_gains,
                       generators=generators)
