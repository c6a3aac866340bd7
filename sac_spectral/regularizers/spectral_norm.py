"""Spectral normalization as a hard constraint: ``W ← W / σ_max(W)`` after every optimizer step.

Implemented as an after-step projection, not with ``torch.nn.utils.parametrize``: a projection
works unchanged on ``nn.Linear``, conv kernels (reshaped to ``[out, in·kh·kw]``) and the member-
batched ``[M, in, out]`` weights (torch's spectral-norm parametrization would treat the member
axis as an output dimension), leaves the module's structure, ``state_dict`` keys, forward cost
and the target-network copies of the RL agent untouched, and composes with the other methods.
It is projected gradient descent onto {σ_max = 1}; Miyato et al.'s parametrization also
differentiates through σ (the gradient of the normalized weight), which the projection does not.

σ_max comes from power iteration with persistent vectors, run after each step until the
estimate σ̂ (which only grows) rises by less than ``tol``·σ̂ in one iteration (at most
``max_iters``; Miyato et al. use one fixed iteration). After rescaling, σ_max = σ/σ̂ exceeds 1
only by the estimate's error; a relative rise below ``tol = 1e-6`` keeps that error ≲ 1e-3 when
the start vector is not orthogonal to the top singular vector (singular values within 1e-3 of
σ_max matter less than that, farther ones would still make the estimate rise). Slowly changing
weights need one or two iterations per step; each convergence check reads one number from the
device. A normalization layer's gain is ``diag(g)``: it is divided by ``max_j |g_j|``. Biases
and shifts are left alone.

Defaults: ``layers="all"``, ``tol=1e-6``, ``max_iters=1000``, ``seed=0`` (initial ``u``). Papers: Miyato et al.,
"Spectral Normalization for GANs" (ICLR 2018); in RL critics Gogianu et al. (ICML 2021) normalize
only some layers (``layers: hidden`` leaves the output layer free).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sac_spectral.core.layers import checked_views, view_names
from sac_spectral.regularizers.base import Regularizer, require
from sac_spectral.regularizers.registry import register
from sac_spectral.regularizers.spectral import power_step

_WARMUP_ITERS = 20


@register
class SpectralNorm(Regularizer):
    """Divide every weight matrix by its largest singular value after each step."""

    name = "spectral_norm"
    has_penalty = False

    def __init__(
        self, module: nn.Module, layers: str = "all", tol: float = 1e-6, max_iters: int = 1000, seed: int = 0
    ) -> None:
        super().__init__(module)
        require(tol > 0, f"tol must be > 0, got {tol}")
        require(int(max_iters) >= 1, f"max_iters must be an integer >= 1, got {max_iters}")
        self.tol, self.max_iters = float(tol), int(max_iters)
        self.views = [v for v in checked_views(module, layers, self.name) if v.weight_param is not None]
        gen = torch.Generator().manual_seed(seed)
        for i, view in enumerate(self.views):
            if view.kind == "norm":
                continue
            w = view.weight().detach()
            members, rows, cols = w.shape
            u = F.normalize(torch.randn(rows, generator=gen), dim=0).to(w)
            self.state[f"u{i}"] = u.expand(members, rows).clone()
            self.state[f"v{i}"] = torch.zeros(members, cols, dtype=w.dtype, device=w.device)
            power_step(w, self.state[f"u{i}"], self.state[f"v{i}"], _WARMUP_ITERS)
        self.state["sigma_before"] = torch.ones(len(self.views), self.views[0].members,
                                                device=self.views[0].weight().device)

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        for i, view in enumerate(self.views):
            w = view.weight()
            if view.kind == "norm":
                sigma = w.abs().amax(dim=1)
                w.div_(sigma.clamp_min(1e-12).unsqueeze(1))
            else:
                sigma = self._sigma_max(w, self.state[f"u{i}"], self.state[f"v{i}"])
                w.div_(sigma.clamp_min(1e-12).view(-1, 1, 1))
            self.state["sigma_before"][i].copy_(sigma)

    def _sigma_max(self, w: Tensor, u: Tensor, v: Tensor) -> Tensor:
        """Power iteration from the persistent ``u, v`` until σ̂ stops rising, per member: a member
        that has converged keeps its vectors while the others iterate on, so its result never
        depends on the other members."""
        sigma = power_step(w, u, v)
        done = torch.zeros_like(sigma, dtype=torch.bool)
        for _ in range(self.max_iters - 1):
            before = u.clone(), v.clone()
            new = power_step(w, u, v)
            for vec, old in zip((u, v), before):
                vec.copy_(torch.where(done.unsqueeze(1), old, vec))
            converged = new - sigma <= self.tol * new
            sigma = torch.where(done, sigma, new)
            done |= converged
            if bool(done.all()):
                break
        return sigma

    def metrics(self) -> dict[str, Tensor]:
        """σ_max estimate of each layer before its last projection (after it, σ_max = 1)."""
        return {f"{name}/sigma_before": s for name, s in zip(view_names(self.views), self.state["sigma_before"])}
