"""Spectral regularization (Lewandowski et al., "Learning Continually by Spectral
Regularization", ICLR 2025, arXiv:2406.06811).

    mode=max:  R(θ) = Σ_l [ (σ_max(W_l)^k − 1)² + (‖b_l‖₂^k)² ]
    mode=all:  R(θ) = Σ_l [ Σ_j (σ_j(W_l)^k − 1)² + (‖b_l‖₂^k)² ]          penalty = coef · R

Targets per layer type: a weight's largest singular value (``mode=all``: every singular value)
→ 1, a bias → 0; a normalization layer's gain is a diagonal matrix (σ_j = |g_j|, so σ_max =
max_j |g_j|) → 1 and its shift is a bias → 0. For a member-batched network the sum also runs over
members; each member's gradient is its own penalty's.

``mode=max``: σ_max comes from power iteration with persistent vectors ``u, v`` (one step per
``penalty()`` call, no gradient through ``u, v``): ``v ← Wᵀu/‖Wᵀu‖``, ``u ← Wv/‖Wv‖``,
``σ̂ = uᵀWv = ‖Wv‖``, differentiated with respect to ``W`` only: ∂σ̂/∂W = u vᵀ. The gradient is
formed analytically in the forward pass (one autograd node for all layers), which keeps the cost
to a few memory-bound ops per layer. ``mode=all`` pulls every singular value toward 1 (exact
``torch.linalg.svdvals``, differentiated by autograd; ∂σ_j/∂W = u_j v_jᵀ): the deep-linear
sequence of PAPERS.md §5 needs all of them, σ_max alone is not enough. It costs one batched SVD
per layer and update. Conv kernels are reshaped to ``[out, in·kh·kw]``.

Defaults: ``coef=1e-4``, ``k=2``, ``mode="max"``, ``layers="all"`` (the paper regularizes every
layer; ``"hidden"`` skips the output layer), ``power_iters=1``, ``seed=0`` (initial ``u``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sac_spectral.layers import LayerView, checked_views
from sac_spectral.regularizers.base import Regularizer, require
from sac_spectral.regularizers.registry import register

_WARMUP_ITERS = 20
MODES = ("max", "all")


@torch.no_grad()
def power_step(w: Tensor, u: Tensor, v: Tensor, iters: int = 1) -> Tensor:
    """``iters`` in-place power-iteration steps on ``u [M, rows]``, ``v [M, cols]`` for
    ``w [M, rows, cols]``; returns the estimate ``σ̂ = ‖W v‖ = uᵀ W v``, shape ``[M]``."""
    u3, v3 = u.unsqueeze(1), v.unsqueeze(2)  # views: [M, 1, rows], [M, cols, 1]
    for _ in range(iters):
        torch.bmm(u3, w, out=v3.transpose(1, 2))
        v3.div_(torch.linalg.vector_norm(v3, dim=1, keepdim=True).clamp_min_(1e-12))
        torch.bmm(v3.transpose(1, 2), w.transpose(1, 2), out=u3)  # row form: same bits for any M
        sigma = torch.linalg.vector_norm(u3, dim=2)
        u3.div_(sigma.clamp_min(1e-12).unsqueeze(2))
    return sigma.squeeze(1)


class _MatrixPenalty(torch.autograd.Function):
    """``coef·Σ_l Σ_m [(σ̂_l^k − 1)² + ‖b_l‖^{2k}]`` with the analytic gradient (u, v held fixed).

    The per-member scalars of all layers are computed together; backward writes each weight
    gradient once, as the rank-one ``(grad_out·scale·u) vᵀ``."""

    @staticmethod
    def forward(ctx: Any, spec: tuple[float, float, list[tuple[Tensor, Tensor, int]], int], *tensors: Tensor) -> Tensor:
        coef, k, vectors, n = spec
        weights, biases = tensors[:n], tensors[n:]
        total = tensors[0].new_zeros(())
        w_scale = b_scale = total
        if weights:
            sigma = torch.stack([power_step(w, u, v, iters) for w, (u, v, iters) in zip(weights, vectors)])
            sk = sigma.square() if k == 2.0 else sigma.pow(k)
            total = (sk - 1.0).square().sum()
            w_scale = (2.0 * coef * k) * (sk - 1.0) * (sigma if k == 2.0 else sigma.pow(k - 1.0))
        if biases:
            sq = torch.stack([b.square().sum(dim=1) for b in biases])
            total = total + (sq.square() if k == 2.0 else sq.pow(k)).sum()
            b_scale = (2.0 * coef * k) * (sq if k == 2.0 else sq.clamp_min(1e-30).pow(k - 1.0))
        ctx.n = n
        ctx.save_for_backward(w_scale, b_scale, *(t.clone() for u, v, _ in vectors for t in (u, v)), *biases)
        return coef * total

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        w_scale, b_scale, *rest = ctx.saved_tensors
        n = ctx.n
        uvs, biases = rest[: 2 * n], rest[2 * n :]
        w_scale, b_scale = grad_out * w_scale, grad_out * b_scale
        grads = [(w_scale[i].unsqueeze(1) * uvs[2 * i]).unsqueeze(2) * uvs[2 * i + 1].unsqueeze(1) for i in range(n)]
        grads += [b_scale[i].unsqueeze(1) * b for i, b in enumerate(biases)]
        return (None, *grads)


@register
class Spectral(Regularizer):
    """Keep each layer's top (or every) singular value near 1 and its bias near 0."""

    name = "spectral"

    def __init__(
        self,
        module: nn.Module,
        coef: float = 1e-4,
        k: float = 2.0,
        mode: str = "max",
        layers: str = "all",
        power_iters: int = 1,
        seed: int = 0,
    ) -> None:
        super().__init__(module)
        require(coef >= 0, f"coef must be >= 0, got {coef}")
        require(k > 0, f"k must be > 0, got {k}")
        require(mode in MODES, f"mode must be one of {', '.join(MODES)}, got '{mode}'")
        require(int(power_iters) >= 1, f"power_iters must be an integer >= 1, got {power_iters}")
        self.coef, self.k, self.mode, self.power_iters = float(coef), float(k), mode, int(power_iters)
        self.views: list[LayerView] = checked_views(module, layers, self.name)
        gen = torch.Generator().manual_seed(seed)
        for i, view in enumerate(self.views):
            w = view.weight()
            if view.kind == "norm" or w is None or mode == "all":
                continue
            members, rows, cols = w.shape
            u = F.normalize(torch.randn(rows, generator=gen), dim=0).to(w)
            self.state[f"u{i}"] = u.expand(members, rows).clone()
            self.state[f"v{i}"] = torch.zeros(members, cols, dtype=w.dtype, device=w.device)
            power_step(w.detach(), self.state[f"u{i}"], self.state[f"v{i}"], _WARMUP_ITERS)

    def _vectors(self, i: int) -> tuple[Tensor, Tensor]:
        return self.state[f"u{i}"], self.state[f"v{i}"]

    def penalty(self) -> Tensor:
        weights, vectors, biases, exact_terms = [], [], [], []
        for i, view in enumerate(self.views):
            w, b = view.weight(), view.bias()
            if w is not None and view.kind == "norm":
                sv = w.abs() if self.mode == "all" else w.abs().amax(dim=1)
                exact_terms.append((sv.pow(self.k) - 1.0).square().sum())
            elif w is not None and self.mode == "all":
                exact_terms.append((torch.linalg.svdvals(w).pow(self.k) - 1.0).square().sum())
            elif w is not None:
                weights.append(w)
                vectors.append((*self._vectors(i), self.power_iters))
            if b is not None:
                biases.append(b)
        terms = []
        if weights or biases:
            terms.append(_MatrixPenalty.apply((self.coef, self.k, vectors, len(weights)), *weights, *biases))
        if exact_terms:
            terms.append(self.coef * torch.stack(exact_terms).sum())
        return torch.stack(terms).sum() if len(terms) > 1 else terms[0]

    @torch.no_grad()
    def sigma_estimates(self) -> list[Tensor]:
        """σ_max per layer, ``[M]`` each: the power-iteration estimate ``uᵀWv`` (``mode=max``) or
        the exact value (``mode=all``); norm layers: max |gain|."""
        out = []
        for i, view in enumerate(self.views):
            w = view.weight()
            if view.kind == "norm":
                out.append(w.abs().amax(dim=1))
            elif self.mode == "all":
                out.append(torch.linalg.matrix_norm(w, ord=2))
            else:
                u, v = self._vectors(i)
                out.append(torch.einsum("mi,mij,mj->m", u, w, v))
        return out

    @torch.no_grad()
    def _per_member_penalty(self) -> Tensor:
        total = torch.zeros(self.views[0].members, device=self.views[0].tensors()[0].device)
        for view, sigma in zip(self.views, self.sigma_estimates()):
            w, b = view.weight(), view.bias()
            if w is not None and self.mode == "all":
                sv = w.abs() if view.kind == "norm" else torch.linalg.svdvals(w)
                total = total + (sv.pow(self.k) - 1.0).square().sum(dim=1)
            elif w is not None:
                total = total + (sigma.pow(self.k) - 1.0).square()
            if b is not None:
                total = total + b.square().sum(dim=1).pow(self.k)
        return self.coef * total

    @torch.no_grad()
    def metrics(self) -> dict[str, Tensor]:
        out = {f"layer{i}/sigma_max": s for i, s in enumerate(self.sigma_estimates())}
        out["penalty"] = self._per_member_penalty()
        return out
