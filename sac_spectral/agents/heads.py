"""Critic heads: what a critic's outputs mean, how the critics' next-state outputs form a TD target,
and the per-example loss, for every actor-critic agent (``critic.head``).

- ``scalar``: one output, ``Q``. Target ``y = r + γ(1 − d)(min_j Q̄_j(s′, a′) − α log π(a′|s′))``;
  loss ``(Q − y)²``.
- ``categorical`` (C51, Bellemare et al. 2017; SimbaV2, BRC): ``K = num_atoms`` logits ``ℓ`` over the
  support ``z_k = v_min + kΔ``, ``Δ = (v_max − v_min)/(K − 1)``; ``Q = Σ_k softmax(ℓ)_k z_k``. Target:
  the next-state distribution ``p`` of the critic whose expectation is smallest (per example, as
  SimbaV2's clipped double Q), its atoms moved to ``y_k = r + γ(1 − d)(z_k − α log π)``, clipped to
  ``[v_min, v_max]`` and projected onto the support, ``m_i = Σ_k p_k φ_i(y_k)``, by
  ``projection``: ``two_hot`` (C51: ``φ_i(y) = max(0, 1 − |y − z_i|/Δ)``, each atom's mass split
  between its two neighbours) or ``hl_gauss`` (Farebrother et al. 2024: ``φ_i(y)`` the mass of
  ``𝒩(y, (σΔ)²)`` in bin ``[z_i − Δ/2, z_i + Δ/2]`` over its mass in ``[v_min − Δ/2, v_max + Δ/2]``,
  ``σ = sigma`` in bin widths), both computed in bin units ``b = (y − v_min)/Δ`` (``|y − z_i|/Δ =
  |b − i|``), so that each atom's two-hot masses sum to 1 to a float32 rounding on any support.
  Loss: the cross-entropy ``−Σ_i m_i log softmax(ℓ)_i``.
- ``quantile`` (QR-DQN, Dabney et al. 2018; TQC, Kuznetsov et al. 2020): ``K = num_quantiles``
  outputs ``θ_i`` at ``τ_i = (2i + 1)/(2K)``; ``Q = mean_i θ_i``. Target (TQC): the next-state
  quantiles of the ``C′`` critics the agent's target reads are pooled (``C′K`` atoms), sorted, the
  top ``drop_top·C′`` dropped (this truncation takes the place of the minimum over critics), and each
  kept atom moved to ``y_j = r + γ(1 − d)(atom_j − α log π)``. Loss (QR-DQN, ``κ = 1``):
  ``Σ_i mean_j |τ_i − 1{u_ij < 0}|·H(u_ij)``, ``u_ij = y_j − θ_i``, ``H`` the Huber loss.

A head sees the critics' raw outputs ``[N, C, B, *shape]`` and gives expectations ``[N, C, B]`` (the
actor's, the logs' and the diagnostics' Q-values), the target and the per-example losses ``[N, C, B]``.
It computes in float32 whatever the outputs' precision (``precision=bf16``: a bf16 layer's output),
as autocast computes softmax, its logarithm and losses.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from sac_spectral.core.precision import full

HEADS = ("scalar", "categorical", "quantile")
PROJECTIONS = ("two_hot", "hl_gauss")
#: each head's own options of ``critic`` (given with another head, they are refused)
HEAD_OPTIONS: dict[str, tuple[str, ...]] = {
    "scalar": (), "categorical": ("num_atoms", "v_min", "v_max", "projection", "sigma"),
    "quantile": ("num_quantiles", "drop_top"),
}


def support_bounds(reward_bound: float, gamma: float) -> tuple[float, float]:
    """``±R/(1 − γ)``: the discounted return's range when each reward lies in ``[−R, R]`` (soft values
    add the entropy term, of either sign, hence the symmetric range); ``γ = 1`` has none."""
    if gamma >= 1:
        raise ValueError("gamma = 1: the return is unbounded; give critic.v_min and critic.v_max")
    bound = float(f"{reward_bound / (1 - gamma):.12g}")  # 1/(1 − 0.99) is 100, not 99.99999999999991
    return -bound, bound


class ScalarHead:
    """One output per critic: the Q-value itself."""

    width = 1
    shape: tuple[int, ...] = ()

    def expectation(self, out: Tensor) -> Tensor:
        return full(out)

    def next_value(self, out: Tensor) -> tuple[Tensor, Tensor | None]:
        """The minimum over the critics ``[N, C, B]`` → ``[N, B]`` (no weights)."""
        return full(out).amin(dim=1), None

    def target(self, values: Tensor, weights: Tensor | None) -> Tensor:
        return values

    def losses(self, out: Tensor, target: Tensor) -> Tensor:
        return (full(out) - target.unsqueeze(1)).square()


class CategoricalHead:
    """``num_atoms`` logits over a fixed support; cross-entropy on the projected target."""

    def __init__(self, num_atoms: int, v_min: float, v_max: float, projection: str, sigma: float) -> None:
        self.width, self.shape = num_atoms, (num_atoms,)
        self.v_min, self.v_max, self.projection, self.sigma = v_min, v_max, projection, sigma
        self.delta = (v_max - v_min) / (num_atoms - 1)

    def support(self, like: Tensor) -> Tensor:
        """``z`` ``[K]`` on ``like``'s device and dtype."""
        return torch.linspace(self.v_min, self.v_max, self.width, device=like.device, dtype=like.dtype)

    def expectation(self, out: Tensor) -> Tensor:
        out = full(out)
        return (out.softmax(dim=-1) * self.support(out)).sum(dim=-1)

    def next_value(self, out: Tensor) -> tuple[Tensor, Tensor | None]:
        """The support (``[N, B, K]``) and the distribution ``[N, B, K]`` of the critic with the smallest
        expectation, per example."""
        out = full(out)
        probs = out.softmax(dim=-1)
        low = (probs * self.support(out)).sum(dim=-1).argmin(dim=1, keepdim=True)
        picked = probs.gather(1, low.unsqueeze(-1).expand(-1, -1, -1, self.width)).squeeze(1)
        return self.support(out).expand_as(picked), picked

    def target(self, values: Tensor, weights: Tensor | None) -> Tensor:
        """The target distribution ``[N, B, K]``: atoms ``values [N, B, K]`` of mass ``weights``
        projected onto the support."""
        values, weights = full(values), full(weights)
        b = ((values - self.v_min) / self.delta).clamp(0, self.width - 1)  # y clipped, in bins
        if self.projection == "two_hot":  # φ is non-zero on two bins only: scatter, not a K × K kernel
            # a NaN atom gets a valid index and a NaN mass, so the run's non-finite check sees it
            lower = b.nan_to_num(0.0).floor().clamp(max=self.width - 2)
            frac = b - lower
            index = lower.long()
            m = weights.new_zeros(*weights.shape[:-1], self.width).scatter_add(-1, index, weights * (1 - frac))
            return m.scatter_add(-1, index + 1, weights * frac)
        i = torch.arange(self.width, device=values.device, dtype=values.dtype)
        cdf = torch.erf((torch.cat([i, i[-1:] + 1]) - 0.5 - b.unsqueeze(-1)) / (self.sigma * math.sqrt(2)))
        phi = (cdf[..., 1:] - cdf[..., :-1]) / (cdf[..., -1:] - cdf[..., :1])
        return (weights.unsqueeze(-1) * phi).sum(dim=-2)

    def losses(self, out: Tensor, target: Tensor) -> Tensor:
        return -(target.unsqueeze(1) * full(out).log_softmax(dim=-1)).sum(dim=-1)


class QuantileHead:
    """``num_quantiles`` quantiles; the quantile Huber loss on TQC's truncated pooled target."""

    def __init__(self, num_quantiles: int, drop_top: int) -> None:
        self.width, self.shape, self.drop_top = num_quantiles, (num_quantiles,), drop_top

    def expectation(self, out: Tensor) -> Tensor:
        return full(out).mean(dim=-1)

    def target(self, values: Tensor, weights: Tensor | None) -> Tensor:
        return values

    def next_value(self, out: Tensor) -> tuple[Tensor, Tensor | None]:
        """The ``[N, C′, B, K]`` quantiles pooled per example, sorted, the top ``drop_top·C′`` dropped."""
        n, c, b, k = out.shape
        pooled = full(out).transpose(1, 2).reshape(n, b, c * k).sort(dim=-1).values
        return pooled[..., : c * (k - self.drop_top)], None

    def losses(self, out: Tensor, target: Tensor) -> Tensor:
        out = full(out)
        tau = (torch.arange(self.width, device=out.device, dtype=out.dtype) + 0.5) / self.width
        u = target[:, None, :, None, :] - out.unsqueeze(-1)  # [N, C, B, K, J]
        huber = F.huber_loss(u, torch.zeros_like(u), reduction="none", delta=1.0)
        return ((tau.unsqueeze(-1) - (u < 0).to(u.dtype)).abs() * huber).sum(dim=-2).mean(dim=-1)


Head = ScalarHead | CategoricalHead | QuantileHead


def make_head(cfg: Any) -> Head:
    """The head ``cfg.head`` (a :class:`~sac_spectral.agents.config.CriticConfig`) names; a categorical
    head needs its support resolved (``v_min``, ``v_max``)."""
    if cfg.head == "categorical":
        if cfg.v_min is None or cfg.v_max is None:
            raise ValueError("critic.v_min / v_max: the categorical support is not resolved; give both")
        return CategoricalHead(cfg.num_atoms, cfg.v_min, cfg.v_max, cfg.projection, cfg.sigma)
    if cfg.head == "quantile":
        return QuantileHead(cfg.num_quantiles, cfg.drop_top)
    return ScalarHead()


def head_width(cfg: Any) -> int:
    """The critic's outputs per example for ``cfg.head``."""
    return {"categorical": cfg.num_atoms, "quantile": cfg.num_quantiles}.get(cfg.head, 1)


def loss_elements(cfg: Any) -> int:
    """Elements per example of the head's largest intermediates beyond the critic's outputs: the
    quantile loss's ``K × C·K`` pairwise errors per critic (and their gradient), the HL-Gauss
    projection's ``K × (K + 1)`` kernel, the two-hot projection's few ``K``-vectors (0 for a scalar
    head)."""
    if cfg.head == "quantile":
        return 2 * cfg.num_critics * cfg.num_quantiles * cfg.num_critics * cfg.num_quantiles
    if cfg.head == "categorical":
        return cfg.num_atoms * (cfg.num_atoms + 1) if cfg.projection == "hl_gauss" else 4 * cfg.num_atoms
    return 0
