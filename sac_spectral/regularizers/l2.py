"""L2 regularization toward zero.

    R(θ) = Σ_layers Σ_{p ∈ layer} ‖p‖²,        penalty = coef · R

Every parameter of the chosen layers: weights and biases of linear/conv layers, gains and shifts
of normalization layers (what an L2 term on ``model.parameters()`` does). For the decoupled form
use the optimizer option ``weight_decay`` (AdamW) instead. The gradient ``2·coef·θ`` is formed
analytically (one autograd node for all tensors).

Defaults: ``coef=1e-4`` (ours), ``layers="all"``. Reference: the L2 baseline of Lewandowski et al.
(2025), Kumar et al. (2023).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from sac_spectral.core.layers import checked_views
from sac_spectral.regularizers.base import ClosedFormPenalty, per_member_sq, pull, require
from sac_spectral.regularizers.registry import register


@register
class L2(ClosedFormPenalty):
    """Pull every parameter toward zero."""

    name = "l2"

    def __init__(self, module: nn.Module, coef: float = 1e-4, layers: str = "all") -> None:
        super().__init__(module)
        require(coef >= 0, f"coef must be >= 0, got {coef}")
        self.coef = float(coef)
        self.views = checked_views(module, layers, self.name)

    def _tensors(self) -> list[Tensor]:
        return [t for v in self.views for t in v.tensors()]

    def penalized(self) -> list[Tensor]:
        return [p for v in self.views for p in v.params()]

    def penalty_and_grads(self, params: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:
        return pull(params, [None] * len(params), self.coef)

    def metrics(self) -> dict[str, Tensor]:
        xs = [t.detach() for t in self._tensors()]
        sq = per_member_sq(xs, [None] * len(xs))
        return {"penalty": self.coef * sq, "param_norm": sq.sqrt()}
