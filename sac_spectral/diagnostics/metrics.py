"""Scalar summaries of a spectrum, shared by every diagnostic (gradients, weights, features).

All functions take singular values ``σ: [..., k]`` (any order, non-negative) and reduce the last
axis, so one call handles every member of a member-batched network. Definitions (docs/papers.md):

- **effective rank** (Roy & Vetterli 2007): ``erank = exp(−Σ_i p_i log p_i)``, ``p_i = σ_i / Σ_j σ_j``;
  between 1 (rank one) and the number of non-zero σ (flat spectrum).
- **Frobenius stable rank** (Rudelson & Vershynin 2007): ``‖M‖_F² / σ_max² = Σ σ_i² / σ_max²``.
  Not Kumar et al.'s srank_δ, which ``features/<net>/stable_rank`` logs
  (:func:`~sac_spectral.diagnostics.plasticity.srank`).
- **numerical rank at 99 % energy**: the smallest ``k`` with ``Σ_{i≤k} σ_i² ≥ 0.99 Σ_i σ_i²``
  (σ sorted descending; energy means squared singular values, i.e. the Frobenius norm).
- **condition number**: ``σ_max / σ_min`` over the non-negligible singular values, those with
  ``σ_i > rtol · σ_max``; default ``rtol = 1e-5`` (float32 rounding alone perturbs singular values
  by ≈ 1e-7 ‖M‖_F, so smaller values are noise), hence ``1 ≤ cond ≤ 1/rtol``.

An all-zero matrix has erank, Frobenius stable rank and numerical rank 0 and an undefined (NaN) condition
number.
"""

from __future__ import annotations

import torch
from torch import Tensor

DEFAULT_RTOL = 1e-5
ENERGY = 0.99


def effective_rank(sigma: Tensor) -> Tensor:
    """``exp`` of the entropy of ``σ / Σσ``; 0 for an all-zero spectrum."""
    total = sigma.sum(dim=-1, keepdim=True)
    p = sigma / total.clamp_min(torch.finfo(sigma.dtype).tiny)
    entropy = -torch.special.xlogy(p, p).sum(dim=-1)
    return torch.where(total.squeeze(-1) > 0, entropy.exp(), torch.zeros_like(entropy))


def frobenius_stable_rank(sigma: Tensor) -> Tensor:
    """``Σ σ_i² / σ_max²``; 0 for an all-zero spectrum."""
    top = sigma.amax(dim=-1)
    ratio = sigma.square().sum(dim=-1) / top.square().clamp_min(torch.finfo(sigma.dtype).tiny)
    return torch.where(top > 0, ratio, torch.zeros_like(ratio))


def numerical_rank(sigma: Tensor, energy: float = ENERGY) -> Tensor:
    """Smallest ``k`` whose top-``k`` singular values hold ``energy`` of ``Σ σ²`` (integer-valued)."""
    sq = sigma.sort(dim=-1, descending=True).values.square()
    cum = sq.cumsum(dim=-1)
    total = cum[..., -1:]
    below = (cum < energy * total).sum(dim=-1) + 1
    return torch.where(total.squeeze(-1) > 0, below, torch.zeros_like(below)).to(sigma.dtype)


def condition_number(sigma: Tensor, rtol: float = DEFAULT_RTOL) -> Tensor:
    """``σ_max / σ_min`` over ``σ_i > rtol·σ_max``; NaN for an all-zero spectrum."""
    top = sigma.amax(dim=-1, keepdim=True)
    kept = torch.where(sigma > rtol * top, sigma, torch.full_like(sigma, float("inf")))
    cond = top.squeeze(-1) / kept.amin(dim=-1)
    return torch.where(top.squeeze(-1) > 0, cond, torch.full_like(cond, float("nan")))


def spectrum_summary(sigma: Tensor, rtol: float = DEFAULT_RTOL) -> dict[str, Tensor]:
    """``sigma_max``, ``sigma_min`` (smallest non-negligible), ``cond``, ``erank``, ``frobenius_stable_rank``,
    ``rank99`` of ``σ: [..., k]``, each ``[...]``."""
    top = sigma.amax(dim=-1)
    cond = condition_number(sigma, rtol)
    return {
        "sigma_max": top,
        "sigma_min": top / cond,
        "cond": cond,
        "erank": effective_rank(sigma),
        "frobenius_stable_rank": frobenius_stable_rank(sigma),
        "rank99": numerical_rank(sigma),
    }


def singular_values_from_gram(gram: Tensor) -> Tensor:
    """Singular values of ``M`` (descending) from its Gram matrix ``M Mᵀ: [..., n, n]``."""
    eig = torch.linalg.eigvalsh(gram)
    return eig.clamp_min(0.0).sqrt().flip(-1)
