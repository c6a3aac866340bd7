"""Low-rank gradient lab (Sonthalia, Murray & Montúfar, "Low Rank Gradients and Where to Find Them", NeurIPS 2024).

Data (spiked covariance): ``x ~ N(0, Σ̂ + ζ² q qᵀ)`` with bulk eigenvalues ``λ_k = k^{−α}`` (Σ̂ diagonal
in the standard basis), spike size ``ζ = n^ν`` along a unit vector ``q`` (uniform on the sphere
unless given). Rows are stored as ``X = X_B + ζ z qᵀ`` with ``X_B ~ N(0, Σ̂)`` and ``z ~ N(0, I_n)``.

Model: ``f(x) = γ_m aᵀ σ(W x)`` with ``W ∈ R^{m×d}`` (unit-norm rows, uniform on the sphere),
fixed ``a_j ∈ {±1}`` and ``γ_m = 1/√m`` (``"ntk"``) or ``1/m`` (``"mf"``). The loss is the mean
squared error ``L(W) = (1/2n) Σ_i (f(x_i) − y_i)²``, so the residue is ``r = f(X) − y`` and

    G = ∂L/∂W = (γ_m / n) [(r aᵀ) ∘ σ′(X Wᵀ)]ᵀ X        (m × d).

The paper writes the gradient as a ``d × m`` matrix; its leading *left* singular vector ``u₁`` is the
leading right singular vector of our ``m × d`` G: the input-space direction of the update.
Candidate directions: ``X_Bᵀ r`` (residue spike S1), ``X_Bᵀ y`` (its mean-field form), ``q`` (data
spike). Targets: ``"single_index"`` ``y = sigmoid(ωᵀx) + ε`` (the paper's Fig. 4 model), or
``"triple_index"`` ``y = Σ_{k=1..3} tanh(ω_kᵀx) + ε`` — the paper's Appendix C triple-index
target is not in our copy; this is our stand-in.

:func:`top_direction_alignment` works on any gradient matrix, e.g. the full-batch gradient of a
layer of your own model: ``top_direction_alignment(torch.autograd.grad(loss, layer.weight)[0], v)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Scaling = Literal["ntk", "mf"]
Target = Literal["single_index", "triple_index"]
LAB_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "tanh": torch.tanh,
    "elu": F.elu,
    "silu": F.silu,
    "softplus": F.softplus,
    "sigmoid": torch.sigmoid,
}


@dataclass
class SpikedData:
    """A spiked-covariance sample: ``x = x_b + ζ z q``; all tensors float64."""

    x: Tensor  # [n, d]
    x_bulk: Tensor  # [n, d]
    z: Tensor  # [n]
    q: Tensor  # [d]
    y: Tensor  # [n]
    zeta: float


def spiked_data(
    n: int,
    d: int,
    nu: float,
    alpha: float = 0.0,
    q: Tensor | None = None,
    target: Target = "single_index",
    noise: float = 0.1,
    generator: torch.Generator | None = None,
) -> SpikedData:
    """Draw ``n`` points in ``R^d`` with bulk decay ``alpha`` and spike ``ζ = n^nu`` along ``q``."""
    if n < 1 or d < 1:
        raise ValueError(f"n and d must be >= 1, got n={n}, d={d}")
    if nu < 0 or alpha < 0:
        raise ValueError(f"nu and alpha must be >= 0, got nu={nu}, alpha={alpha}")
    if target not in ("single_index", "triple_index"):
        raise ValueError(f"target must be single_index or triple_index, got '{target}'")
    g, f64 = generator, torch.float64
    if q is None:
        q = torch.randn(d, generator=g, dtype=f64)
    q = F.normalize(q.to(f64), dim=0)
    scale = torch.arange(1, d + 1, dtype=f64).pow(-alpha / 2.0)
    x_bulk = torch.randn(n, d, generator=g, dtype=f64) * scale
    z = torch.randn(n, generator=g, dtype=f64)
    zeta = float(n) ** nu
    x = x_bulk + zeta * z.unsqueeze(1) * q
    k = 1 if target == "single_index" else 3
    omega = F.normalize(torch.randn(k, d, generator=g, dtype=f64), dim=1)
    proj = x @ omega.T
    y = torch.sigmoid(proj).squeeze(1) if k == 1 else torch.tanh(proj).sum(dim=1)
    y = y + noise * torch.randn(n, generator=g, dtype=f64)
    return SpikedData(x, x_bulk, z, q, y, zeta)


class TwoLayer(nn.Module):
    """``f(x) = γ_m aᵀσ(Wx)``; only ``W`` is trainable."""

    def __init__(
        self,
        d: int,
        m: int,
        scaling: Scaling = "ntk",
        activation: str = "relu",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if scaling not in ("ntk", "mf"):
            raise ValueError(f"scaling must be ntk or mf, got '{scaling}'")
        if activation not in LAB_ACTIVATIONS:
            raise ValueError(f"unknown activation '{activation}'; valid: {', '.join(LAB_ACTIVATIONS)}")
        self.gamma = 1.0 / math.sqrt(m) if scaling == "ntk" else 1.0 / m
        self.act = LAB_ACTIVATIONS[activation]
        w = F.normalize(torch.randn(m, d, generator=generator, dtype=torch.float64), dim=1)
        self.weight = nn.Parameter(w)
        signs = torch.randint(0, 2, (m,), generator=generator, dtype=torch.float64) * 2.0 - 1.0
        self.register_buffer("a", signs)

    def forward(self, x: Tensor) -> Tensor:
        return self.gamma * self.act(x @ self.weight.T) @ self.a


def mse_gradient(model: TwoLayer, data: SpikedData) -> tuple[Tensor, Tensor]:
    """Full-batch ``G = ∂L/∂W`` (``[m, d]``) of ``L = (1/2n)‖f(X) − y‖²`` and the residue ``r = f(X) − y``."""
    out = model(data.x)
    residue = (out - data.y).detach()
    loss = 0.5 * (out - data.y).square().mean()
    (grad,) = torch.autograd.grad(loss, model.weight)
    return grad, residue


def top_direction_alignment(grad: Tensor, v: Tensor, side: Literal["right", "left"] = "right") -> Tensor:
    """``|cos(s₁, v)|`` between the leading singular vector ``s₁`` of ``grad: [..., rows, cols]``
    and ``v``: ``side="right"`` uses the right singular vector (length ``cols``; the input space of
    an ``[out, in]`` weight), ``"left"`` the left one (length ``rows``)."""
    if side not in ("right", "left"):
        raise ValueError(f"side must be right or left, got '{side}'")
    u, _, vh = torch.linalg.svd(grad, full_matrices=False)
    s1 = vh[..., 0, :] if side == "right" else u[..., :, 0]
    if s1.shape[-1] != v.shape[-1]:
        raise ValueError(f"v has length {v.shape[-1]}, the {side} singular vector {s1.shape[-1]}")
    return F.cosine_similarity(s1, v.to(s1).expand_as(s1), dim=-1).abs()


def lab_alignments(model: TwoLayer, data: SpikedData, top: int = 5) -> dict[str, Tensor]:
    """Top ``top`` singular values of G and ``|cos(u₁, ·)|`` with ``X_Bᵀr``, ``X_Bᵀy`` and ``q``."""
    grad, residue = mse_gradient(model, data)
    return {
        "singular_values": torch.linalg.svdvals(grad)[:top],
        "residue": top_direction_alignment(grad, data.x_bulk.T @ residue),
        "target": top_direction_alignment(grad, data.x_bulk.T @ data.y),
        "spike": top_direction_alignment(grad, data.q),
    }

