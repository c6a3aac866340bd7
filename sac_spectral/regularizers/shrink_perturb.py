"""Shrink & Perturb (Ash & Adams, "On Warm-Starting Neural Network Training", NeurIPS 2020).

Every ``every`` updates, for every parameter of the chosen layers and separately per member:

    θ ← (1 − shrink)·θ + sigma·ε,    ε a fresh draw from the layer's own initializer

(orthogonal or uniform for sac_spectral's layers, torch's default for ``nn.Linear``/``nn.Conv*d``;
a normalization layer's initializer is deterministic, gain 1 and shift 0, so its gain moves toward
``sigma/shrink``). ``shrink = sigma = 0`` leaves the parameters unchanged. Each member draws from
its own random stream (checkpointed); drawing an orthogonal matrix costs a QR decomposition, so
``every = 1`` on wide layers is slow.

Defaults: ``shrink=1e-4``, ``sigma=1e-4``, ``every=1`` (ours: the every-step variant of continual
learning; Ash & Adams 2020 apply it when new data arrives), ``layers="all"``, ``seed=0``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sac_spectral.core.layers import checked_views
from sac_spectral.core.reinit import draw, member_param
from sac_spectral.regularizers.base import Regularizer, per_member_sq, require
from sac_spectral.regularizers.registry import register


@register
class ShrinkPerturb(Regularizer):
    """Periodically shrink parameters toward zero and add fresh-initialization noise."""

    name = "shrink_perturb"
    has_penalty = False

    def __init__(
        self,
        module: nn.Module,
        shrink: float = 1e-4,
        sigma: float = 1e-4,
        every: int = 1,
        layers: str = "all",
        seed: int = 0,
    ) -> None:
        super().__init__(module)
        require(0.0 <= shrink <= 1.0, f"shrink must be in [0, 1], got {shrink}")
        require(sigma >= 0, f"sigma must be >= 0, got {sigma}")
        require(int(every) >= 1, f"every must be an integer >= 1, got {every}")
        self.shrink, self.sigma, self.every = float(shrink), float(sigma), int(every)
        self.views = checked_views(module, layers, self.name)
        self.seed_default(seed, self.views[0].members)

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        if step % self.every:
            return
        for view in self.views:
            mod = view.module
            for m, gen in enumerate(self.generators):
                for param, noise in zip((view.weight_param, view.bias_param), draw(mod, gen)):
                    if param is not None and noise is not None:
                        target = member_param(param, mod, m)
                        target.mul_(1.0 - self.shrink).add_(noise.to(target), alpha=self.sigma)

    @torch.no_grad()
    def metrics(self) -> dict[str, Tensor]:
        xs = [t for v in self.views for t in v.tensors()]
        return {"param_norm": per_member_sq(xs, [None] * len(xs)).sqrt()}
