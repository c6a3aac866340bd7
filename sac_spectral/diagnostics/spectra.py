"""Exact singular values of every weight matrix of a network, per member, and their summaries."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sac_spectral.core.layers import layer_views
from sac_spectral.diagnostics.metrics import DEFAULT_RTOL, spectrum_summary


@torch.no_grad()
def weight_singular_values(module: nn.Module) -> list[tuple[str, Tensor]]:
    """``(layer name, σ [M, min(rows, cols)])`` for every linear/conv layer, σ descending."""
    out = []
    for view in layer_views(module):
        if view.kind != "norm":
            out.append((view.name, torch.linalg.svdvals(view.weight().float())))
    return out


@torch.no_grad()
def layer_sigma_max(module: nn.Module) -> list[Tensor]:
    """σ_max ``[M]`` of every linear/conv layer (``torch.linalg.matrix_norm(W, 2)``)."""
    return [
        torch.linalg.matrix_norm(view.weight().float(), ord=2)
        for view in layer_views(module)
        if view.kind != "norm"
    ]


@torch.no_grad()
def weight_spectra(module: nn.Module, rtol: float = DEFAULT_RTOL) -> list[tuple[Tensor, dict[str, Tensor]]]:
    """Per linear/conv layer (in the order of :func:`layer_sigma_max`): ``σ [M, k]`` and its
    :func:`~sac_spectral.diagnostics.metrics.spectrum_summary` (σ_max, σ_min, cond, erank, …, each ``[M]``)."""
    return [(sigma, spectrum_summary(sigma, rtol)) for _, sigma in weight_singular_values(module)]
