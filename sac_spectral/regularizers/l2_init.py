"""L2 regularization toward the initial parameters ("regenerative regularization").

    R(θ) = Σ_layers Σ_{p ∈ layer} ‖p − p₀‖²,    penalty = coef · R

``p₀`` is a copy of every parameter of the chosen layers taken when the regularizer is built
(kept in ``state`` and checkpointed). Normalization gains are pulled toward their initial value
(1), shifts toward theirs (0). The gradient ``2·coef·(θ − θ₀)`` is formed analytically.

Defaults: ``coef=1e-4`` (ours), ``layers="all"``. Paper: Kumar, Marklund, Van Roy, "Maintaining
Plasticity in Continual Learning via Regenerative Regularization" (2023).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from sac_spectral.core.layers import checked_views
from sac_spectral.regularizers.base import ClosedFormPenalty, per_member_sq, pull, require
from sac_spectral.regularizers.registry import register


@register
class L2Init(ClosedFormPenalty):
    """Pull every parameter toward its value at construction."""

    name = "l2_init"
    parameter_copies = 1  # θ₀

    def __init__(self, module: nn.Module, coef: float = 1e-4, layers: str = "all") -> None:
        super().__init__(module)
        require(coef >= 0, f"coef must be >= 0, got {coef}")
        self.coef = float(coef)
        self.views = checked_views(module, layers, self.name)
        for i, t in enumerate(self._tensors()):
            self.state[f"init{i}"] = t.detach().clone()

    def _tensors(self) -> list[Tensor]:
        return [t for v in self.views for t in v.tensors()]

    def _inits(self) -> list[Tensor]:
        return [self.state[f"init{i}"] for i in range(len(self.state))]

    def penalized(self) -> list[Tensor]:
        return [p for v in self.views for p in v.params()]

    def penalty_and_grads(self, params: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:
        return pull(params, [t.view(p.shape) for t, p in zip(self._inits(), params)], self.coef)

    @torch.no_grad()
    def metrics(self) -> dict[str, Tensor]:
        sq = per_member_sq(self._tensors(), self._inits())
        return {"penalty": self.coef * sq, "distance_to_init": sq.sqrt()}
