"""Parseval regularization: keep weight matrices (near-)orthogonal.

    R(θ) = Σ_l ‖G_l − I‖_F²,    G_l = W_l W_lᵀ if W_l has no more rows than columns, else W_lᵀ W_l,
    penalty = coef · R

The smaller Gram matrix is the one that can equal the identity: a wide ``W`` (rows ≤ cols) can
have orthonormal rows, a tall one orthonormal columns. Either way R = Σ_j (σ_j² − 1)² over the
``min(rows, cols)`` singular values, so the orientation of the stored weight (``nn.Linear``'s
``[out, in]`` or ``BatchedLinear``'s ``[in, out]``) does not matter. Conv kernels are reshaped to
``[out, in·kh·kw]``; a normalization gain is the diagonal matrix ``diag(g)``: R = Σ_j (g_j² − 1)².
Biases and shifts are not regularized. Autograd differentiates the Gram matrices.

Defaults: ``coef=1e-3`` (ours), ``layers="hidden"``: the output layer stays free (a 1-output
critic head with orthonormal rows would fix the scale of Q). Paper: Chung, Cherif, Meger, Precup,
"Parseval Regularization for Continual Reinforcement Learning" (NeurIPS 2024).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sac_spectral.core.layers import checked_views, view_names
from sac_spectral.regularizers.base import Regularizer, require
from sac_spectral.regularizers.registry import register


def gram_residual(w: Tensor) -> Tensor:
    """``‖G − I‖_F²`` per member for ``w [M, rows, cols]`` with the smaller Gram matrix ``G``: ``[M]``."""
    g = w @ w.transpose(1, 2) if w.shape[1] <= w.shape[2] else w.transpose(1, 2) @ w
    eye = torch.eye(g.shape[1], dtype=w.dtype, device=w.device)
    return (g - eye).square().sum(dim=(1, 2))


@register
class Parseval(Regularizer):
    """Pull each weight matrix toward orthonormal rows (wide) or columns (tall)."""

    name = "parseval"

    def __init__(self, module: nn.Module, coef: float = 1e-3, layers: str = "hidden") -> None:
        super().__init__(module)
        require(coef >= 0, f"coef must be >= 0, got {coef}")
        self.coef = float(coef)
        self.views = checked_views(module, layers, self.name)

    def _residuals(self) -> list[Tensor]:
        out = []
        for view in self.views:
            w = view.weight()
            if w is None:
                continue
            out.append((w.square() - 1.0).square().sum(dim=1) if view.kind == "norm" else gram_residual(w))
        return out

    def penalty(self) -> Tensor:
        return self.coef * torch.stack([r.sum() for r in self._residuals()]).sum()

    @torch.no_grad()
    def metrics(self) -> dict[str, Tensor]:
        res = self._residuals()
        names = [n for n, v in zip(view_names(self.views), self.views) if v.weight_param is not None]
        out = {f"{name}/orthogonality_error": r.sqrt() for name, r in zip(names, res)}
        out["penalty"] = self.coef * torch.stack(res).sum(dim=0)
        return out
