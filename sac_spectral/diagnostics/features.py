"""Hidden-feature statistics on a probe batch: feature rank and dormant units (ReDo).

Activations are ``h: [..., B, F]`` — a batch of ``B`` examples with ``F`` units, optionally with a
leading member axis ``M`` — and every statistic is computed per member.

- **Feature rank**: the spectrum of the (uncentered) ``B × F`` activation matrix, summarized by
  :func:`~sac_spectral.diagnostics.metrics.spectrum_summary` (erank, stable rank, …).
- **Dormant score** (Sokar et al. 2023, ReDo): ``s_i = E|h_i| / ((1/F) Σ_j E|h_j|)``, expectations
  over the batch; unit ``i`` is dormant when ``s_i ≤ τ`` (``τ = 0``: exactly silent on the batch;
  ReDo uses ``τ = 0.025`` in supervised learning and ``0.1`` in RL). A layer whose units are all
  silent has every score 0.

:func:`normalized_scores` is the one definition of the score: :func:`dormant_scores` applies it to
activations, the ReDo intervention to its units' mean activations.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sac_spectral.core.nets import Activation, BatchedNetwork
from sac_spectral.diagnostics.metrics import DEFAULT_RTOL, spectrum_summary

ACTIVATION_MODULES = (
    Activation, nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Softplus, nn.Mish, nn.ReLU6,
)


def normalized_scores(mean_abs: Tensor) -> Tensor:
    """ReDo scores ``s_i = E|h_i| / mean_j E|h_j|`` from the units' mean activations ``[..., F]``."""
    layer_mean = mean_abs.mean(dim=-1, keepdim=True)
    return mean_abs / layer_mean.clamp_min(torch.finfo(mean_abs.dtype).tiny)


def dormant_scores(h: Tensor) -> Tensor:
    """ReDo scores ``[..., F]`` of activations ``h: [..., B, F]``."""
    return normalized_scores(h.detach().abs().mean(dim=-2))


def dormant_fraction(h: Tensor, tau: float) -> Tensor:
    """Fraction ``[...]`` of units with ReDo score ``≤ tau``."""
    return (dormant_scores(h) <= tau).to(h.dtype).mean(dim=-1)


@torch.no_grad()
def feature_spectrum(h: Tensor, rtol: float = DEFAULT_RTOL) -> tuple[Tensor, dict[str, Tensor]]:
    """Singular values ``[..., min(B, F)]`` of ``h: [..., B, F]`` and their summary."""
    sigma = torch.linalg.svdvals(h.detach().float())
    return sigma, spectrum_summary(sigma, rtol)


@torch.no_grad()
def hidden_activations(model: nn.Module, inputs: Tensor) -> list[Tensor]:
    """Post-activation hidden features of ``model`` on ``inputs``, one ``[..., B, F]`` tensor per layer.

    A :class:`~sac_spectral.core.nets.BatchedNetwork` returns its hidden layers directly (``[M, B, F]``). Any
    other model is run with forward hooks on its activation modules (``nn.ReLU``, ``nn.Tanh``, …;
    functional activations are invisible to hooks); an activation output with more than two axes is
    taken as convolutional, ``[B, C, *spatial]``, and becomes ``[B, C]`` by averaging ``|h|`` over
    the spatial positions, as ReDo scores channels.
    """
    if isinstance(model, BatchedNetwork):
        return list(model(inputs, return_hidden=True)[1])
    captured: list[Tensor] = []

    def keep(_: nn.Module, __: tuple[Tensor, ...], out: Tensor) -> None:
        captured.append(out.abs().flatten(2).mean(dim=2) if out.dim() > 2 else out)

    handles = [m.register_forward_hook(keep) for m in model.modules() if isinstance(m, ACTIVATION_MODULES)]
    try:
        model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return captured
