"""Per-example gradient matrices and their spectra: gradient diversity (Lewandowski et al. 2025; docs/papers.md).

For a probe batch of ``B`` examples with per-example losses ``ℓ_i``, the gradient matrix ``G`` has
one row per example, ``g_i = ∇_θ ℓ_i``, over a chosen parameter group ``θ``. A member-batched
network (every parameter has the leading member axis ``M``) has one ``G_m`` per member, built from
member ``m``'s slice of every parameter; members never mix because member ``m``'s loss depends on
member ``m``'s parameters only.

**Loss closures.** ``loss_fn(module, batch) -> Tensor [..., B]`` returns per-example losses with
the example axis last (leading axes, such as members, are summed). ``batch`` is a pytree (tensor,
tuple, dict) of tensors whose example axis is ``example_dim``. The closure may reach the
parameters through ``module`` or through any object that holds it (``agent.policy`` when
``module`` is ``agent.actor``).

**Gram matrices.** Spectra come from ``K_m = G_m G_mᵀ`` (``[M, B, B]``, float64), whose
eigenvalues are the squared singular values of ``G_m``. Two exact ways to form them:

- ``"func"``: ``torch.func`` — ``vmap(grad(·))`` over examples with ``functional_call``; any
  closure and parameters; chunked over examples (``chunk_size``, or sized to ``max_bytes``).
- ``"factored"``: a ``Linear``/``BatchedLinear`` weight's per-example gradient is the outer
  product ``δ_i a_iᵀ`` of the loss gradient ``δ_i`` at the layer output and the layer input ``a_i``
  (per member; a plain ``Linear`` is one member), so ``⟨g_i, g_j⟩ = (a_iᵀa_j)(δ_iᵀδ_j)`` and ``K = (A Aᵀ) ∘ (Δ Δᵀ)``
  (``+ Δ Δᵀ`` for the bias): one forward and backward of the batch and ``B²(in + out)`` FLOPs per layer instead of
  ``B²·in·out``. It requires examples that do not interact (no batch statistics) and layers that
  run once per loss; a layer that runs twice, or a weight whose summed gradient differs from
  ``Aᵀ Δ`` (the weight used elsewhere too), raises ``ValueError``. A LayerNorm's gain and shift
  (``y = γ ∘ n(x) + β``, ``n`` the normalized input) factor alike: their per-example gradients are
  ``δ_i ∘ n_i`` and ``δ_i``, so ``K = (Δ ∘ N)(Δ ∘ N)ᵀ + Δ Δᵀ``, and residual LayerNorm networks
  (BroNet, SimBa) never hold the ``B × P`` per-example gradients in memory; a SimbaV2 scaler
  (``y = x ∘ c·s``) is a gain alone, with per-example gradients ``c·δ_i ∘ x_i``.

- ``"jacobian"``: for losses whose examples interact (batch statistics, which the other two
  would take over a batch of one or attribute wrongly): each example's loss differentiated through
  the whole batch's forward, ``vmap`` of the backward over one-hot cotangents (``torch.func.vjp``);
  ``B`` backward passes of the batch, chunked alike. Exact for any closure.

``"auto"`` uses ``factored`` when every selected parameter is the weight or bias of a
``Linear``/``BatchedLinear`` layer, of a LayerNorm over one feature axis
(``nn.LayerNorm``/``BatchedLayerNorm``) or of a SimbaV2 scaler, and the module has no batch-norm
layer, else ``func``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vjp, vmap
from torch.utils._pytree import tree_flatten, tree_map

from sac_spectral.core.hyperspherical import BatchedScaler
from sac_spectral.core.layers import layer_views
from sac_spectral.core.nets import BatchedLayerNorm, BatchedLinear
from sac_spectral.core.reinit import member_count, members_view
from sac_spectral.diagnostics.metrics import (
    DEFAULT_RTOL,
    singular_values_from_gram,
    spectrum_summary,
)

LossFn = Callable[[nn.Module, Any], Tensor]
Method = Literal["auto", "func", "factored", "jacobian"]
METHODS = ("auto", "func", "factored", "jacobian")
ALL = "all"
DEFAULT_MAX_BYTES = 256 * 2**20


def members_of(module: nn.Module) -> int:
    """The member count ``M`` of a member-batched module (1 for ordinary modules)."""
    counts = {v.members for v in layer_views(module)}
    if len(counts) > 1:
        raise ValueError(f"layers of this module have different member counts {sorted(counts)}")
    return counts.pop() if counts else 1


def _selected(module: nn.Module, params: Sequence[str] | None, members: int) -> dict[str, nn.Parameter]:
    named = dict(module.named_parameters())
    if params is None:
        chosen = {k: p for k, p in named.items() if p.requires_grad}
    else:
        unknown = [k for k in params if k not in named]
        if unknown:
            raise ValueError(f"unknown parameters {unknown}; valid: {', '.join(named)}")
        chosen = {k: named[k] for k in params}
    if not chosen:
        raise ValueError("no parameters selected")
    for k, p in chosen.items():
        if members > 1 and (p.dim() == 0 or p.shape[0] != members):
            raise ValueError(f"parameter '{k}' of shape {tuple(p.shape)} has no leading member axis of size {members}")
    return chosen


def _layer_groups(module: nn.Module) -> dict[int, str]:
    """``id(layer module) → "layer<i>"`` for linear/conv layers, numbered as in the weight spectra."""
    views = [v for v in layer_views(module) if v.kind != "norm"]
    return {id(v.module): f"layer{i}" for i, v in enumerate(views)}


def _owner(module: nn.Module, name: str) -> nn.Module:
    return module.get_submodule(name.rpartition(".")[0])


def _batch_size(batch: Any, example_dim: int) -> int:
    leaves = [t for t in tree_flatten(batch)[0] if isinstance(t, Tensor)]
    if not leaves:
        raise ValueError("the batch holds no tensors")
    return leaves[0].shape[example_dim]


class _Bound(nn.Module):
    """``forward(example)``: the closure's summed loss on a batch of one example."""

    def __init__(self, root: nn.Module, loss_fn: LossFn, example_dim: int) -> None:
        super().__init__()
        self.root, self.loss_fn, self.example_dim = root, loss_fn, example_dim

    def forward(self, example: Any) -> Tensor:
        batch = tree_map(lambda t: t.unsqueeze(self.example_dim), example)
        return self.loss_fn(self.root, batch).sum()


def per_example_gradients(
    module: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    params: Sequence[str] | None = None,
    example_dim: int = 0,
    chunk_size: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> dict[str, Tensor]:
    """``name → [B, *param.shape]``: the gradient of each example's loss (``torch.func``).

    Examples are processed ``chunk_size`` at a time (default: as many as fit ``max_bytes`` at
    about three float32 copies of the selected parameters per example).
    """
    selected = _selected(module, params, members_of(module))
    bound = _Bound(module, loss_fn, example_dim)

    def loss(p: dict[str, Tensor], example: Any) -> Tensor:
        return functional_call(bound, {f"root.{k}": v for k, v in p.items()}, (example,))

    numel = sum(p.numel() for p in selected.values())
    chunk = chunk_size or max(1, max_bytes // (12 * numel))
    detached = {k: p.detach() for k, p in selected.items()}
    with torch.enable_grad():
        return vmap(grad(loss), in_dims=(None, example_dim), chunk_size=chunk)(detached, batch)


class _Whole(nn.Module):
    """``forward(batch)``: the closure's per-example losses ``[B]`` on the whole batch (leading axes summed)."""

    def __init__(self, root: nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.root, self.loss_fn = root, loss_fn

    def forward(self, batch: Any) -> Tensor:
        out = self.loss_fn(self.root, batch)
        return out.reshape(-1, out.shape[-1]).sum(0)


def coupled_gradients(
    module: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    params: Sequence[str] | None = None,
    chunk_size: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> dict[str, Tensor]:
    """``name → [B, *param.shape]``: the gradient of each example's loss, every one through the
    forward of the whole batch (examples may interact), as rows of the losses' Jacobian."""
    selected = _selected(module, params, members_of(module))
    whole = _Whole(module, loss_fn)

    def losses(p: dict[str, Tensor]) -> Tensor:
        return functional_call(whole, {f"root.{k}": v for k, v in p.items()}, (batch,))

    numel = sum(p.numel() for p in selected.values())
    chunk = chunk_size or max(1, max_bytes // (12 * numel))
    with torch.enable_grad():
        out, backward = vjp(losses, {k: p.detach() for k, p in selected.items()})
        eye = torch.eye(out.shape[0], dtype=out.dtype, device=out.device)
        return vmap(backward, chunk_size=chunk)(eye)[0]


def gradient_matrix(grads: dict[str, Tensor], members: int = 1) -> Tensor:
    """``G: [M, B, P]`` from :func:`per_example_gradients` (member ``m``'s slice of every parameter)."""
    rows = [g.reshape(g.shape[0], members, -1).transpose(0, 1) for g in grads.values()]
    return torch.cat(rows, dim=2)


def _func_grams(
    module: nn.Module, loss_fn: LossFn, batch: Any, selected: dict[str, nn.Parameter], example_dim: int,
    members: int, chunk_size: int | None, coupled: bool = False,
) -> dict[str, Tensor]:
    grads = (coupled_gradients(module, loss_fn, batch, list(selected), chunk_size) if coupled
             else per_example_gradients(module, loss_fn, batch, list(selected), example_dim, chunk_size))
    groups = _layer_groups(module)
    grams: dict[str, Tensor] = {}
    for name, g in grads.items():
        flat = g.reshape(g.shape[0], members, -1).transpose(0, 1).double()
        k = flat @ flat.transpose(1, 2)
        owner = id(_owner(module, name))
        for key in [ALL, groups[owner]] if owner in groups else [ALL]:
            grams[key] = grams[key] + k if key in grams else k
    return grams


def _is_gain(mod: nn.Module) -> bool:
    """A LayerNorm with a gain and shift over one (the last) feature axis, or a SimbaV2 scaler."""
    return isinstance(mod, (BatchedLayerNorm, BatchedScaler)) or (
        isinstance(mod, nn.LayerNorm) and mod.elementwise_affine and len(mod.normalized_shape) == 1)


def _gain_input(mod: nn.Module, a: Tensor) -> Tensor:
    """What a gain layer's gain multiplies, from its input ``a``: a LayerNorm's normalized input, a
    scaler's input times ``init / scale``."""
    if isinstance(mod, BatchedScaler):
        return a * (mod.init / mod.scale)
    return mod.normalized(a) if isinstance(mod, BatchedLayerNorm) else F.layer_norm(a, (a.shape[-1],), eps=mod.eps)


def _factorable(module: nn.Module, selected: dict[str, nn.Parameter]) -> bool:
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
        return False
    for name, p in selected.items():
        owner, leaf = _owner(module, name), name.rpartition(".")[2]
        layer = isinstance(owner, (nn.Linear, BatchedLinear)) or _is_gain(owner)
        if not layer or leaf not in ("weight", "bias") or not p.requires_grad:
            return False
    return True


def _layer_gram(name: str, mod: nn.Module, leaves: set[str], inp: Tensor, d: Tensor, w_grad: Tensor | None,
                checked: bool) -> Tensor:
    """``K = G Gᵀ [M, B, B]`` of one layer's selected parameters from its input ``inp`` and the loss
    gradient ``d`` at its output (float64, ``[M, B, out]``); ``checked`` (the weight is selected):
    add the weight's part, after verifying that its summed per-example gradients equal its real
    gradient ``w_grad``."""
    dd = d @ d.transpose(1, 2)
    k = dd if "bias" in leaves else torch.zeros_like(dd)
    if not checked:
        return k
    a = inp.detach().double()
    if _is_gain(mod):
        a = _gain_input(mod, a).reshape(d.shape[0], -1, a.shape[-1])
        gain = d * a  # the gain's per-example gradients
        recon, weight_gram = gain.sum(1), gain @ gain.transpose(1, 2)
    else:
        a = a.reshape(d.shape[0], -1, a.shape[-1])
        recon, weight_gram = torch.einsum("mbi,mbo->moi", a, d), (a @ a.transpose(1, 2)) * dd
    ref = members_view(torch.zeros_like(mod.weight) if w_grad is None else w_grad, mod).double()
    if not torch.allclose(recon, ref, rtol=1e-3, atol=1e-4 * float(ref.abs().amax())):
        raise ValueError(f"the weight gradient of layer '{name}' is not the sum of its per-example gradients "
                         "(the weight is used outside the layer); use method='func'")
    return k + weight_gram


def _factored_grams(
    module: nn.Module, loss_fn: LossFn, batch: Any, selected: dict[str, nn.Parameter], example_dim: int,
) -> dict[str, Tensor]:
    n = _batch_size(batch, example_dim)
    layers: dict[int, tuple[str, nn.Module, set[str]]] = {}  # id → (name, layer, selected leaves)
    for name in selected:
        owner = _owner(module, name)
        layers.setdefault(id(owner),
                          (name.rpartition(".")[0] or "<root>", owner, set()))[2].add(name.rpartition(".")[2])
    records: dict[int, list[tuple[Tensor, Tensor]]] = {i: [] for i in layers}

    def hook(mod: nn.Module, inputs: tuple[Tensor, ...], out: Tensor) -> None:
        if out.requires_grad:  # a forward without gradient (a TD target's) adds nothing to the loss's gradient
            records[id(mod)].append((inputs[0], out))

    handles = [mod.register_forward_hook(hook) for _, mod, _ in layers.values()]
    try:
        with torch.enable_grad():
            total = loss_fn(module, batch).sum()
    finally:
        for handle in handles:
            handle.remove()
    for i, (name, _, _) in layers.items():
        if len(records[i]) != 1:
            raise ValueError(f"layer '{name}' ran {len(records[i])} times in the loss; use method='func'")
    ids = list(layers)
    checked = [i for i in ids if "weight" in layers[i][2]]
    derivs = torch.autograd.grad(
        total, [records[i][0][1] for i in ids] + [layers[i][1].weight for i in checked], allow_unused=True
    )
    d_out, w_grads = dict(zip(ids, derivs[: len(ids)])), dict(zip(checked, derivs[len(ids) :]))
    groups = _layer_groups(module)
    grams: dict[str, Tensor] = {}
    for i in ids:
        name, mod, leaves = layers[i]
        (inp, out), d = records[i][0], d_out[i]
        members = member_count(mod)
        d = torch.zeros_like(out, dtype=torch.float64) if d is None else d.double()
        d = d.reshape(members, -1, out.shape[-1])
        if d.shape[1] != n:
            raise ValueError(f"layer '{name}' saw input of shape {tuple(inp.shape)}, not one row per example "
                             f"of the batch of {n}; use method='func'")
        k = _layer_gram(name, mod, leaves, inp, d, w_grads.get(i), i in w_grads)
        for key in [ALL, groups[i]] if i in groups else [ALL]:
            grams[key] = grams[key] + k if key in grams else k
    return grams


def gradient_grams(
    module: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    params: Sequence[str] | None = None,
    example_dim: int = 0,
    method: Method = "auto",
    chunk_size: int | None = None,
) -> dict[str, Tensor]:
    """Gram matrices ``G_m G_mᵀ: [M, B, B]`` (float64) of the per-example gradients, for the whole
    selected group (key ``"all"``) and each linear/conv layer (``"layer<i>"``)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got '{method}'")
    members = members_of(module)
    selected = _selected(module, params, members)
    if method == "factored" or (method == "auto" and _factorable(module, selected)):
        if method == "factored" and not _factorable(module, selected):
            raise ValueError("method='factored' needs every selected parameter to be the weight or bias of a "
                             "Linear/BatchedLinear, LayerNorm or scaler layer (and no batch norm); use method='func'")
        return _factored_grams(module, loss_fn, batch, selected, example_dim)
    return _func_grams(module, loss_fn, batch, selected, example_dim, members, chunk_size, method == "jacobian")


def gradient_spectra(
    module: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    params: Sequence[str] | None = None,
    example_dim: int = 0,
    method: Method = "auto",
    rtol: float = DEFAULT_RTOL,
) -> dict[str, tuple[Tensor, dict[str, Tensor]]]:
    """``group → (σ(G) [M, B] descending, spectrum summary)`` for the groups of :func:`gradient_grams`."""
    grams = gradient_grams(module, loss_fn, batch, params, example_dim, method)
    out = {}
    for key, k in grams.items():
        sigma = singular_values_from_gram(k)
        out[key] = (sigma.float(), {name: v.float() for name, v in spectrum_summary(sigma, rtol).items()})
    return out
