"""Parseval regularization: keep weight matrices (near-)orthogonal.

    R(θ) = Σ_l ‖G_l − I‖_F²,    G_l = W_l W_lᵀ if W_l has no more rows than columns, else W_lᵀ W_l,
    penalty = coef · R

The smaller Gram matrix is the one that can equal the identity: a wide ``W`` (rows ≤ cols) can
have orthonormal rows, a tall one orthonormal columns. Either way R = Σ_j (σ_j² − 1)² over the
``min(rows, cols)`` singular values, so the orientation of the stored weight (``nn.Linear``'s
``[out, in]`` or ``BatchedLinear``'s ``[in, out]``) does not matter. Conv kernels are reshaped to
``[out, in·kh·kw]``; a normalization gain is the diagonal matrix ``diag(g)``: R = Σ_j (g_j² − 1)².
Biases and shifts are not regularized. The gradient is formed in closed form: ``4·coef·(G − I)W``
(wide), ``4·coef·W(G − I)`` (tall), ``4·coef·g(g² − 1)`` (gain).

Defaults: ``coef=1e-3`` (ours), ``layers="hidden"``: the output layer stays free (a 1-output
critic head with orthonormal rows would fix the scale of Q). Paper: Chung, Cherif, Meger, Precup,
"Parseval Regularization for Continual Reinforcement Learning" (NeurIPS 2024).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from sac_spectral.core.layers import LayerView, checked_views, view_names
from sac_spectral.regularizers.base import ClosedFormPenalty, require
from sac_spectral.regularizers.registry import register


def _gram_gap(w: Tensor) -> Tensor:
    """``G − I`` for ``w [M, rows, cols]`` with the smaller Gram matrix ``G``."""
    g = w @ w.transpose(1, 2) if w.shape[1] <= w.shape[2] else w.transpose(1, 2) @ w
    return g - torch.eye(g.shape[1], dtype=w.dtype, device=w.device)


def gram_residual(w: Tensor) -> Tensor:
    """``‖G − I‖_F²`` per member for ``w [M, rows, cols]`` with the smaller Gram matrix ``G``: ``[M]``."""
    return _gram_gap(w).square().sum(dim=(1, 2))


@register
class Parseval(ClosedFormPenalty):
    """Pull each weight matrix toward orthonormal rows (wide) or columns (tall)."""

    name = "parseval"

    def __init__(self, module: nn.Module, coef: float = 1e-3, layers: str = "hidden") -> None:
        super().__init__(module)
        require(coef >= 0, f"coef must be >= 0, got {coef}")
        self.coef = float(coef)
        self.views = checked_views(module, layers, self.name)

    def _weighted(self) -> list[LayerView]:
        """The chosen layers that have a weight (or gain)."""
        return [v for v in self.views if v.weight_param is not None]

    def _residuals(self) -> list[Tensor]:
        out = []
        for view in self._weighted():
            w = view.weight()
            out.append((w.square() - 1.0).square().sum(dim=1) if view.kind == "norm" else gram_residual(w))
        return out

    def penalized(self) -> list[Tensor]:
        return [v.weight_param for v in self._weighted()]

    def penalty_and_grads(self, params: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:
        totals, grads = [], []
        for view, param in zip(self._weighted(), params):
            w = view.weight_of(param)
            if view.kind == "norm":
                gap = w.square() - 1.0
                grad = w * gap
            else:
                gap = _gram_gap(w)
                grad = gap @ w if w.shape[1] <= w.shape[2] else w @ gap
            totals.append(gap.square().sum())
            grads.append((4.0 * self.coef) * grad.reshape(param.shape))
        return self.coef * torch.stack(totals).sum(), grads

    @torch.no_grad()
    def metrics(self) -> dict[str, Tensor]:
        res = self._residuals()
        names = [n for n, v in zip(view_names(self.views), self.views) if v.weight_param is not None]
        out = {f"{name}/orthogonality_error": r.sqrt() for name, r in zip(names, res)}
        out["penalty"] = self.coef * torch.stack(res).sum(dim=0)
        return out
