"""Spectral regularization (Lewandowski et al., "Learning Continually by Spectral
Regularization", ICLR 2025, arXiv:2406.06811).

    mode=max:  R(θ) = Σ_l [ (σ_max(W_l)^k − s_l^k)² + (‖b_l‖₂^k − c_l^k)² ]
    mode=all:  R(θ) = Σ_l [ Σ_j (σ_j(W_l)^k − s_lj^k)² + (‖b_l‖₂^k − c_l^k)² ]     penalty = coef · R

``target="one"`` (the paper): s = 1, c = 0. ``target="init"``: s is the layer's (and member's)
σ_max (``mode=all``: each σ_j) and c its ‖b‖ at construction, exact values recorded in the state
dict, so the penalty and its gradient are 0 at construction and it pulls back toward the
initialization's scale. ``bias=False`` drops the bias terms.

Targets per layer type: a weight's largest singular value (``mode=all``: every singular value)
→ 1, a bias → 0; a normalization layer's gain is a diagonal matrix (σ_j = |g_j|, so σ_max =
max_j |g_j|) → 1 and its shift is a bias → 0. For a member-batched network the sum also runs over
members; each member's gradient is its own penalty's.

``mode=max``: σ_max comes from power iteration with persistent vectors ``u, v`` (one step per
``penalty()`` call, no gradient through ``u, v``): ``v ← Wᵀu/‖Wᵀu‖``, ``u ← Wv/‖Wv‖``,
``σ̂ = uᵀWv = ‖Wv‖``, differentiated with respect to ``W`` only: ∂σ̂/∂W = u vᵀ. The penalty
and its gradient are formed together in closed form: the power steps of all layers (layers of one
shape, such as the hidden layers of a deeper MLP, as one batched product), every per-layer,
per-member scalar as one tensor, and the rank-one gradients ``2·coef·k(σ̂^k − 1)σ̂^{k−1}·u vᵀ``
and ``2·coef·k‖b‖^{2(k−1)}·b``; eager updates hand them to autograd as one node, compiled ones
trace them into their program. The cost is a few dozen small ops per network whatever its depth,
plus writing one gradient per parameter. ``mode=all`` pulls
every singular value toward 1 (exact ``torch.linalg.svdvals``, differentiated by ``torch.func``;
∂σ_j/∂W = u_j v_jᵀ): the deep-linear sequence (after Bartlett, Helmbold & Long 2018) needs all of them, σ_max alone is
not enough. It costs one batched SVD per layer and update. Conv kernels are reshaped to
``[out, in·kh·kw]``. Each member's power step is its own; its result equals a single-member
network's to float rounding (batched products may round differently from a lone one on some CPUs).

Defaults: ``coef=1e-4``, ``k=2``, ``mode="max"``, ``layers="all"`` (the paper regularizes every
layer; ``"hidden"`` skips the output layer), ``target="one"``, ``bias=True``, ``power_iters=1``,
``seed=0`` (initial ``u``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import grad_and_value

from sac_spectral.core.layers import LayerView, checked_views, view_names
from sac_spectral.regularizers.base import ClosedFormPenalty, require
from sac_spectral.regularizers.registry import register

_WARMUP_ITERS = 20
_EPS = 1e-12
MODES = ("max", "all")
TARGETS = ("one", "init")


def _step(
    ws: Sequence[Tensor], u_rows: Sequence[Tensor], tails: Sequence[Tensor] = (), ones: Tensor | None = None
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """One power step on each ``w [B, rows, cols]`` of ``ws`` from ``u [B, 1, rows]``, out of place:
    ``v′ = uᵀW``, ``u′ = v′ᵀWᵀ`` (row-vector products), ``û = u′/‖u′‖``, ``v̂ = v′/‖v′‖``.

    The norms of all vectors and of the extra ``[B, 1, n]`` tensors ``tails`` are clamped to ≥ 1e-12
    and concatenated as ``N = [‖u′‖…, ‖tail‖…, ‖v′‖…, ones]`` (``ones`` pads it to an even length,
    so that ``N[:K] / N[K:]`` with ``K = len(N) // 2`` is ``[σ̂ = ‖u′‖/‖v′‖ = ‖W v̂‖ …, ‖tail‖ …]``).
    Returns ``N`` and the new ``û``, ``v̂`` lists."""
    vs = [torch.bmm(u, w) for u, w in zip(u_rows, ws)]
    us = [torch.bmm(v, w.transpose(1, 2)) for v, w in zip(vs, ws)]
    norms = [torch.linalg.vector_norm(x, dim=2, keepdim=True) for x in (*us, *tails, *vs)]
    torch._foreach_clamp_min_(norms, _EPS)
    if us:
        count, skip = len(us), len(us) + len(tails)
        torch._foreach_div_(us + vs, norms[:count] + norms[skip:])
    if ones is not None:
        norms.append(ones)
    return torch.cat(norms), us, vs


def _power(
    ws: Sequence[Tensor], u_rows: Sequence[Tensor], iters: int, tails: Sequence[Tensor] = (), ones: Tensor | None = None
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """``iters`` power steps (:func:`_step`); returns ``[σ̂…, ‖tail‖…]`` as ``[K, 1, 1]`` and the
    new ``û``, ``v̂`` of every matrix.

    On the CPU it runs eagerly on one thread: the ops are too small to gain from threads, and the
    result then does not depend on the process's thread count (a compiled program fuses them)."""
    threads = 1 if torch.compiler.is_compiling() else torch.get_num_threads()
    single = threads > 1 and (ws or tails)[0].device.type == "cpu"
    if single:
        torch.set_num_threads(1)
    try:
        for _ in range(iters - 1):
            _, u_rows, _ = _step(ws, u_rows)
        norms, us, vs = _step(ws, u_rows, tails, ones)
    finally:
        if single:
            torch.set_num_threads(threads)
    half = norms.shape[0] // 2
    return norms[:half] / norms[half:], us, vs


@torch.no_grad()
def power_step(w: Tensor, u: Tensor, v: Tensor, iters: int = 1) -> Tensor:
    """``iters`` in-place power-iteration steps on ``u [M, rows]``, ``v [M, cols]`` for
    ``w [M, rows, cols]``: ``v ← Wᵀu/‖Wᵀu‖``, ``u ← Wv/‖Wv‖``; returns ``σ̂ = ‖W v‖ = uᵀ W v``, ``[M]``.
    Member ``m``'s result equals a single-member call's to float rounding."""
    sigma, (u_new,), (v_new,) = _power([w], [u.unsqueeze(1)], iters)
    u.copy_(u_new.squeeze(1))
    v.copy_(v_new.squeeze(1))
    return sigma.view(-1)


def _singular_values(w: Tensor, kind: str, mode: str) -> Tensor:
    """Exact σ_max ``[M]`` (``mode=max``) or every σ_j ``[M, r]`` (``mode=all``) of member-batched
    matrices ``w [M, rows, cols]``; a norm layer's gain ``[M, n]`` is the diagonal matrix diag(g)."""
    if kind == "norm":
        return w.abs() if mode == "all" else w.abs().amax(dim=1)
    return torch.linalg.svdvals(w) if mode == "all" else torch.linalg.matrix_norm(w, ord=2)


@dataclass(eq=False)
class _Group:
    """The weight matrices of one shape ``[M, rows, cols]``, power-iterated as one batch of ``G·M``.

    ``u [G·M, rows]`` and ``v [G·M, cols]`` hold the vectors of all its layers (layer ``j``'s are
    rows ``j·M … (j+1)·M − 1``; the regularizer's state holds views of them)."""

    modules: list[nn.Module]
    matrix: tuple[int, int, int]
    u: Tensor
    v: Tensor

    def __post_init__(self) -> None:
        self.shapes = [m.weight.shape for m in self.modules]  # parameter shapes, for the gradients
        self.plain = len(self.modules) == 1 and self.shapes[0] == self.matrix

    def stacked(self, weights: Sequence[Tensor]) -> Tensor:
        """The group's matrices as one ``[G·M, rows, cols]`` tensor (a copy only when ``G > 1``)."""
        if self.plain:
            return weights[0]
        if len(weights) == 1:
            return weights[0].view(self.matrix)
        m, rows, cols = self.matrix
        return torch.stack(list(weights)).view(len(weights) * m, rows, cols)

    def gradients(self, full: Tensor) -> list[Tensor]:
        """Split ``[G·M, rows, cols]`` into each layer's gradient in its parameter's shape."""
        if self.plain:
            return [full]
        return [part.view(shape) for part, shape in zip(full.split(self.matrix[0]), self.shapes)]


class _Plan:
    """What a penalty call needs, fixed at construction: the groups of weight matrices, the bias
    layers, and the constants of the per-entry formula over ``x = [σ̂ per matrix…, ‖b‖ per bias…]``
    (one entry per layer and member): ``R = Σ (x^k − t)²`` with ``t = 1`` for a weight and 0 for a
    bias (``(‖b‖^k)²``), and the gradient scale ``2k(x^k − t)·x^{k−1}`` (weights, times ``u vᵀ``)
    or ``2k‖b‖^{2(k−1)}`` (biases, times ``b``). With ``base`` (``[K, 1, 1]``: the entries at
    construction, ``target="init"``) ``t = base^k``, and a bias's scale is ``2k(‖b‖^k − t)‖b‖^{k−2}``."""

    def __init__(
        self,
        coef: float,
        k: float,
        iters: int,
        members: int,
        groups: list[_Group],
        bias_modules: list[nn.Module],
        base: Tensor | None = None,
    ) -> None:
        self.coef, self.k, self.iters, self.members = coef, k, iters, members
        self.groups, self.bias_modules = groups, bias_modules
        self.sizes = [len(g.modules) for g in groups]
        self.num_weights = sum(self.sizes)
        self.weight_modules = [m for g in groups for m in g.modules]
        self.u_rows = [g.u.unsqueeze(1) for g in groups]
        self.vectors = self.u_rows + [g.v.unsqueeze(1) for g in groups]
        ref = groups[0].u if groups else bias_modules[0].bias
        kw = {"dtype": ref.dtype, "device": ref.device}
        m, lw, lb = members, self.num_weights * members, len(bias_modules) * members
        self.bias_is_row = [b.dim() == 3 and b.shape[:2] == (m, 1) for b in (mod.bias for mod in bias_modules)]
        self.bias_scale_shapes = [(m,) + (1,) * (mod.bias.dim() - 1) for mod in bias_modules]
        self.ones = torch.ones(lb, 1, 1, **kw) if lb else None
        self.weight_entries = lw
        self.grad_sizes = [size * m for size in self.sizes] + [m] * len(bias_modules)
        self.base = base
        self.target = torch.cat([torch.ones(lw, 1, 1, **kw), torch.zeros(lb, 1, 1, **kw)])
        two_ck = 2.0 * coef * k
        is_weight = torch.cat([torch.ones(lw, 1, 1, **kw), torch.zeros(lb, 1, 1, **kw)])
        self.factor_weight, self.factor_bias = is_weight * two_ck, (1.0 - is_weight) * two_ck

    def params(self) -> list[Tensor]:
        """Weights in group order, then biases, read from the modules at every call."""
        return [m.weight for m in self.weight_modules] + [m.bias for m in self.bias_modules]

    def stacked(self, weights: Sequence[Tensor]) -> list[Tensor]:
        """Each group's ``[G·M, rows, cols]`` matrices from the weights in group order."""
        out, start = [], 0
        for g, size in zip(self.groups, self.sizes):
            out.append(g.stacked(weights[start : start + size]))
            start += size
        return out

    def bias_rows(self, biases: Sequence[Tensor]) -> list[Tensor]:
        """Each bias as ``[M, 1, n]``."""
        m = self.members
        return [b if row else b.view(m, 1, -1) for b, row in zip(biases, self.bias_is_row)]

    @torch.no_grad()
    def value_and_grads(self, params: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:
        """``coef·Σ_l Σ_m [(σ̂_lm^k − 1)² + ‖b_lm‖^{2k}]`` at ``params`` (weights in group order,
        then biases) after one power step per weight (``u, v`` updated in place), and its gradient:
        each weight's ``2·coef·k(σ̂^k − 1)σ̂^{k−1}·u vᵀ`` (``u, v`` of this step, held fixed), each
        bias's ``2·coef·k‖b‖^{2(k−1)}·b``."""
        coef, k, n = self.coef, self.k, self.num_weights
        weights, biases = params[:n], params[n:]
        x, us, vs = _power(self.stacked(weights), self.u_rows, self.iters, self.bias_rows(biases), self.ones)
        if us:
            torch._foreach_copy_(self.vectors, us + vs)
        if self.base is not None:
            lw, two_ck = self.weight_entries, 2.0 * coef * k
            gap = x.pow(k) - self.base.pow(k)
            power = torch.cat([x[:lw].pow(k - 1.0), x[lw:].clamp_min(_EPS).pow(k - 2.0)])
            scale = two_ck * gap * power
        elif k == 2.0:
            gap = x.square() - self.target
            scale = gap * torch.addcmul(self.factor_bias, x, self.factor_weight)
        else:
            lw, two_ck = self.weight_entries, 2.0 * coef * k
            gap = x.pow(k) - self.target
            sq = x[lw:].square().clamp_min(1e-30)
            scale = torch.cat([two_ck * gap[:lw] * x[:lw].pow(k - 1.0), two_ck * sq.pow(k - 1.0)])
        pieces = scale.split(self.grad_sizes)
        grads: list[Tensor] = []
        for g, s, u, v in zip(self.groups, pieces, us, vs):
            grads += g.gradients((s * u.transpose(1, 2)) * v)
        for b, s, shape in zip(biases, pieces[len(self.groups):], self.bias_scale_shapes):
            grads.append(b * (s if s.shape == shape else s.view(shape)))
        return gap.square().sum() * coef, grads


@register
class Spectral(ClosedFormPenalty):
    """Keep each layer's top (or every) singular value near 1 and its bias near 0."""

    name = "spectral"

    def __init__(
        self,
        module: nn.Module,
        coef: float = 1e-4,
        k: float = 2.0,
        mode: str = "max",
        layers: str = "all",
        target: str = "one",
        bias: bool = True,
        power_iters: int = 1,
        seed: int = 0,
    ) -> None:
        super().__init__(module)
        require(coef >= 0, f"coef must be >= 0, got {coef}")
        require(k > 0, f"k must be > 0, got {k}")
        require(mode in MODES, f"mode must be one of {', '.join(MODES)}, got '{mode}'")
        require(target in TARGETS, f"target must be one of {', '.join(TARGETS)}, got '{target}'")
        require(isinstance(bias, bool), f"bias must be true or false, got {bias!r}")
        require(int(power_iters) >= 1, f"power_iters must be an integer >= 1, got {power_iters}")
        self.coef, self.k, self.mode, self.power_iters = float(coef), float(k), mode, int(power_iters)
        self.target, self.bias = target, bias
        self.views: list[LayerView] = checked_views(module, layers, self.name)
        exact = [v.weight_param is not None and (v.kind == "norm" or mode == "all") for v in self.views]
        self._exact_index = [i for i, e in enumerate(exact) if e]
        self._bias_index = {i for i, v in enumerate(self.views) if bias and v.bias_param is not None}
        if target == "init":
            self._record_init()
        self._plan = self._build_plan(seed)

    @torch.no_grad()
    def _record_init(self) -> None:
        """``target="init"``: each layer's exact singular values (``sigma{i}``: σ_max ``[M]``, or
        every σ_j ``[M, r]`` for ``mode=all`` and norm gains) and bias norm (``bias_norm{i}`` ``[M]``)
        now, the targets of the penalty, in the state dict."""
        for i, view in enumerate(self.views):
            w = view.weight()
            if w is not None:
                self.state[f"sigma{i}"] = _singular_values(w, view.kind, self.mode).clone()
            if self.bias and view.bias_param is not None:
                self.state[f"bias_norm{i}"] = torch.linalg.vector_norm(view.bias(), dim=1).clone()

    def _weight_target(self, i: int, like: Tensor) -> Tensor:
        """Layer ``i``'s σ target, broadcastable to ``like`` (its singular values)."""
        if self.target == "one":
            return torch.ones((), dtype=like.dtype, device=like.device)
        return self.state[f"sigma{i}"]

    def _bias_target(self, i: int, like: Tensor) -> Tensor:
        """Layer ``i``'s ‖b‖ target, broadcastable to ``like`` (its bias norms ``[M]``)."""
        if self.target == "one":
            return torch.zeros((), dtype=like.dtype, device=like.device)
        return self.state[f"bias_norm{i}"]

    def _build_plan(self, seed: int) -> _Plan | None:
        """Group the weight matrices by shape, draw the initial ``u`` of each layer (in layer order,
        from ``seed``) and warm the vectors up; ``None`` when no weight or bias goes through it."""
        gen = torch.Generator().manual_seed(seed)
        members = self.views[0].members
        by_shape: dict[tuple[Any, ...], list[tuple[int, LayerView, Tensor]]] = {}
        for i, view in enumerate(self.views):
            w = view.weight()
            if view.kind == "norm" or w is None or self.mode == "all":
                continue
            rows = w.shape[1]
            u = F.normalize(torch.randn(rows, generator=gen), dim=0).to(w)
            by_shape.setdefault((tuple(w.shape), w.dtype, w.device), []).append((i, view, u))
        groups = []
        for (shape, dtype, device), layers in by_shape.items():
            u = torch.cat([u.expand(members, -1) for _, _, u in layers])
            v = torch.zeros(len(layers) * members, shape[2], dtype=dtype, device=device)
            for j, (i, _, _) in enumerate(layers):
                part = slice(j * members, (j + 1) * members)
                self.state[f"u{i}"], self.state[f"v{i}"] = u[part], v[part]
            groups.append(_Group([view.module for _, view, _ in layers], shape, u, v))
        bias_modules = [v.module for i, v in enumerate(self.views) if i in self._bias_index]
        if not groups and not bias_modules:
            return None
        base = None
        if self.target == "init":
            index = {id(v.module): i for i, v in enumerate(self.views)}
            keys = [f"sigma{index[id(m)]}" for g in groups for m in g.modules]
            keys += [f"bias_norm{index[id(m)]}" for m in bias_modules]
            base = torch.cat([self.state[key] for key in keys]).view(-1, 1, 1)
            for key, part in zip(keys, base.view(-1).split(members)):
                self.state[key] = part  # a view: loading the state dict updates the plan's targets
        plan = _Plan(self.coef, self.k, self.power_iters, members, groups, bias_modules, base)
        if groups:
            with torch.no_grad():
                weights = tuple(p.detach() for p in plan.params()[: plan.num_weights])
                _, us, vs = _power(plan.stacked(weights), plan.u_rows, _WARMUP_ITERS)
                torch._foreach_copy_(plan.vectors, us + vs)
        return plan

    def _vectors(self, i: int) -> tuple[Tensor, Tensor]:
        return self.state[f"u{i}"], self.state[f"v{i}"]

    def penalized(self) -> list[Tensor]:
        planned = [] if self._plan is None else self._plan.params()
        return planned + [self.views[i].weight_param for i in self._exact_index]

    def _exact(self, weights: list[Tensor]) -> Tensor:
        """The penalty of the layers whose singular values are exact (``mode=all``, norm gains)."""
        terms = []
        for i, param in zip(self._exact_index, weights):
            view = self.views[i]
            sv = _singular_values(view.weight_of(param), view.kind, self.mode)
            target = self._weight_target(i, sv)
            terms.append((sv.pow(self.k) - target.pow(self.k)).square().sum())
        return self.coef * torch.stack(terms).sum()

    def penalty_and_grads(self, params: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:
        planned = 0 if self._plan is None else len(self._plan.bias_modules) + self._plan.num_weights
        values, grads = [], []
        if self._plan is not None:
            value, grads = self._plan.value_and_grads(params[:planned])
            values.append(value)
        if self._exact_index:
            exact_grads, value = grad_and_value(self._exact)(list(params[planned:]))
            values.append(value)
            grads = grads + exact_grads
        return values[0] if len(values) == 1 else values[0] + values[1], grads

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
        for i, (view, sigma) in enumerate(zip(self.views, self.sigma_estimates())):
            w = view.weight()
            if w is not None:
                sv = _singular_values(w, view.kind, "all") if self.mode == "all" else sigma
                gap = (sv.pow(self.k) - self._weight_target(i, sv).pow(self.k)).square()
                total = total + (gap.sum(dim=1) if gap.dim() > 1 else gap)
            if i in self._bias_index:
                norm = torch.linalg.vector_norm(view.bias(), dim=1)
                total = total + (norm.pow(self.k) - self._bias_target(i, norm).pow(self.k)).square()
        return self.coef * total

    @torch.no_grad()
    def metrics(self) -> dict[str, Tensor]:
        out = {f"{name}/sigma_max": s for name, s in zip(view_names(self.views), self.sigma_estimates())}
        out["penalty"] = self._per_member_penalty()
        return out
