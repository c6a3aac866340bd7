"""Normalize-and-Project, NaP (Lyle, Zheng, Khetarpal, Martens, van Hasselt, Pascanu, Dabney,
"Normalization and effective learning rates in reinforcement learning", NeurIPS 2024,
arXiv:2407.01800).

NaP is two things: a normalization layer before every nonlinearity, and after every optimizer step
a projection of the parameters back onto the sphere of their initial norm. A layer followed by a
normalization computes the same function for ``W`` and ``c·W`` (``c > 0``), so a growing ‖W‖ only
shrinks the effective learning rate (≈ lr/‖W‖²); the projection keeps it constant.

The normalization is part of the network, so this method checks for it and refuses a network
without one (``layer_norm: true`` for the RL networks, ``model.norm=layer`` for continual models;
BroNet has one, SimBa does not: its blocks go ``LN → Linear → ReLU``).
After every step, for each member separately:

    W_l ← W_l · ‖W_l⁰‖_F / ‖W_l‖_F                     every hidden linear/conv weight (``layers=all``:
                                                        the output layer's too)
    (γ_l, β_l) ← (γ_l, β_l) · ‖(γ_l⁰, β_l⁰)‖ / ‖(γ_l, β_l)‖   each normalization layer's gain and shift,
                                                        as one vector (gain 1, shift 0: norm √n)

with ``W⁰``, ``γ⁰``, ``β⁰`` the values at construction. Biases of linear/conv layers are left free.
Our choices: the output layer is not followed by a normalization, so its scale is the network's
output scale (a critic's Q-values must be able to grow with the returns) and it is left free by
default (``layers=hidden``); the gains and shifts are projected jointly, which fixes their overall
scale and leaves their direction (and the output layer's freedom) to carry the rest
(``norm_params=free`` leaves them alone). The paper's effective-learning-rate schedule is the
optimizer's business and not part of this method.

Defaults: ``layers="hidden"``, ``norm_params="joint"``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sac_spectral.core.layers import NORMS, WEIGHTED, LayerView, checked_views
from sac_spectral.core.nets import BatchedMLP
from sac_spectral.core.residual import ResidualNet
from sac_spectral.regularizers.base import Regularizer, require
from sac_spectral.regularizers.registry import register

NORM_PARAMS = ("joint", "free")
_EPS = 1e-12
HINT = ("set layer_norm: true (RL: actor.layer_norm=true, critic.layer_norm=true) "
        "or model.norm=layer (continual)")
SIMBA_HINT = ("SimBa's blocks have none between their first Linear and the ReLU; use arch=bronet or arch=mlp "
              "with layer_norm=true")


def unnormalized_layers(module: nn.Module) -> list[str]:
    """Hidden layers of ``module`` with no normalization layer between them and the next layer
    (``["all"]`` when it has none at all; a module of unknown layer order, neither a BatchedMLP, a
    residual network nor an ``nn.Sequential``, only needs one)."""
    if isinstance(module, BatchedMLP):
        return [] if module.norms is not None else ["all"]
    if isinstance(module, ResidualNet):
        return module.unnormalized_layers()
    leaves = [(name, m) for name, m in module.named_modules() if next(m.children(), None) is None]
    if not any(isinstance(m, NORMS) for _, m in leaves):
        return ["all"]
    if not isinstance(module, nn.Sequential):
        return []
    out, pending = [], None
    for name, leaf in leaves:
        if isinstance(leaf, WEIGHTED):
            if pending is not None:
                out.append(pending)
            pending = name
        elif isinstance(leaf, NORMS):
            pending = None
    return out


@register
class NaP(Regularizer):
    """Project weights (and normalization gains/shifts) back to their initial norm after every step."""

    name = "nap"
    has_penalty = False

    def __init__(self, module: nn.Module, layers: str = "hidden", norm_params: str = "joint") -> None:
        super().__init__(module)
        views = checked_views(module, layers, self.name)
        require(norm_params in NORM_PARAMS, f"norm_params must be one of {', '.join(NORM_PARAMS)}, got '{norm_params}'")
        missing = unnormalized_layers(module)
        where = "the network has none" if missing == ["all"] else f"missing after layer {', '.join(missing)}"
        hint = SIMBA_HINT if isinstance(module, ResidualNet) else HINT
        require(not missing, f"nap needs a normalization layer before every nonlinearity ({where}): {hint}")
        self.weights: list[LayerView] = [v for v in views if v.kind != "norm" and v.weight_param is not None]
        self.norms: list[LayerView] = [v for v in views if v.kind == "norm"] if norm_params == "joint" else []
        with torch.no_grad():
            for i, view in enumerate(self.weights):
                self.state[f"w{i}"] = self._norms_of(view.weight()).clone()
            for i, view in enumerate(self.norms):
                self.state[f"n{i}"] = self._norms_of(*view.tensors()).clone()
        self.state["growth"] = torch.ones(views[0].members, device=views[0].tensors()[0].device)

    @staticmethod
    def _norms_of(*tensors: Tensor) -> Tensor:
        """Per-member Frobenius norm of the tensors together: ``[M]``."""
        return torch.stack([t.flatten(1).square().sum(1) for t in tensors]).sum(0).sqrt()

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        growth = []
        for i, view in enumerate(self.weights):
            w = view.weight()
            norm = self._norms_of(w)
            growth.append(norm / self.state[f"w{i}"])
            w.mul_((self.state[f"w{i}"] / norm.clamp_min(_EPS)).view(-1, 1, 1))
        for i, view in enumerate(self.norms):
            tensors = view.tensors()
            scale = (self.state[f"n{i}"] / self._norms_of(*tensors).clamp_min(_EPS)).view(-1, 1)
            for t in tensors:
                t.mul_(scale)
        if growth:
            self.state["growth"].copy_(torch.stack(growth).mean(0))

    def metrics(self) -> dict[str, Tensor]:
        """``growth``: mean over the projected weights of ‖W‖/‖W⁰‖ before the last projection (how
        much one step had grown them, i.e. shrunk their effective learning rate)."""
        return {"growth": self.state["growth"]}
