"""The plasticity metrics of Plasticine and SimbaV2, one definition each, per network and per member.

Every function returns one value per member, ``[M]``: a member-batched network's parameters carry
the member axis first (``weight: [M, out, in]``, member ``m`` at index ``m``), its hidden features
are ``[M, B, F]`` (``net(x, return_hidden=True)[1]``) and its outputs ``[M, B, ...]``. A plain
``nn.Module`` is one member (``[1]``; features ``[B, F]``, outputs ``[B, ...]``). Per-member sums
are ``reshape(M, -1)`` reductions: no loop over members.

Features (on a batch of inputs; the last hidden layer, the features the heads read):

- ``features/<net>/stable_rank`` — :func:`feature_srank`, srank_δ (Kumar et al. 2021, "Implicit
  Under-Parameterization Inhibits Data-Efficient Deep RL"): the smallest ``k`` with
  ``Σ_{i≤k} σ_i / Σ_i σ_i ≥ 1 − δ``, ``δ = 0.01``, σ the singular values (descending) of the
  ``B × F`` feature matrix. Not ``Σσ²/σ_max²`` (:func:`~sac_spectral.diagnostics.metrics.frobenius_stable_rank`).
- ``features/<net>/norm`` — :func:`feature_norm`: ``(1/B) Σ_b ‖h_b‖₂`` (SimbaV2, Plasticine).
- ``active/<net>/fraction`` — :func:`active_fraction`: Plasticine's fraction of active units, the
  share of (example, unit) entries of ``h`` that are active, ``h > 0`` (``tanh``: ``|h| ≤ 0.99``).

Weights and one update:

- ``weights/<net>/magnitude`` — :func:`weight_magnitude`: ``(1/n) Σ_j |θ_j|`` over all ``n`` parameters.
- ``weights/<net>/distance_from_init`` — :meth:`ParamSnapshot.distance` of a snapshot of θ₀:
  ``‖θ − θ₀‖₂`` over all parameters.
- ``grads/<net>/norm`` — :func:`grad_norm`: ``‖g‖₂`` of one update's gradient over all parameters.
- ``weights/<net>/effective_lr`` — :func:`effective_lr`: ``‖θ_{t+1} − θ_t‖₂ / ‖θ_t‖₂`` of one
  optimizer step (SimbaV2's effective learning rate, measured on the step actually taken).
- ``churn/<net>`` — :func:`churn`: ``mean |f_{θ_{t+1}}(x̄) − f_{θ_t}(x̄)|`` over a reference batch
  ``x̄`` that is not in the update and over the output entries (C-CHAIN, Tang et al. 2025;
  Schaul et al. 2022, "The Phenomenon of Policy Churn").

:func:`feature_metrics`, :func:`weight_metrics` and :class:`UpdateProbe` return these under their
TensorBoard tags; docs/diagnostics.md says when a runner computes which, and what each costs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from sac_spectral.diagnostics.gradients import members_of

#: Kumar et al.'s δ: srank keeps the singular values holding 99 % of Σσ
SRANK_DELTA = 0.01
#: |tanh| above this is saturated, not active (Plasticine)
TANH_SATURATION = 0.99

Outputs = Tensor | Sequence[Tensor]
Forward = Callable[[Tensor], Outputs]


# ----------------------------------------------------------------------------- features
def _members_first(h: Tensor) -> Tensor:
    """Features ``[M, B, F]`` (a ``[B, F]`` matrix is one member)."""
    if h.dim() == 2:
        return h.unsqueeze(0)
    if h.dim() != 3:
        raise ValueError(f"features must be [B, F] or [M, B, F], got shape {tuple(h.shape)}")
    return h


def srank(sigma: Tensor, delta: float = SRANK_DELTA) -> Tensor:
    """srank_δ of singular values ``σ: [..., k]`` (any order): the smallest ``k`` with
    ``Σ_{i≤k} σ_i / Σ_i σ_i ≥ 1 − δ``, σ sorted descending (Kumar et al. 2021, §3; δ = 0.01).
    Integer-valued, ``[...]``; 0 for an all-zero spectrum. Plasticine's ``compute_stable_rank``
    and SimbaV2's ``srank-kumar`` are this with ``δ = 0.01``."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    s = sigma.sort(dim=-1, descending=True).values.double()
    cum = s.cumsum(dim=-1)
    total = cum[..., -1:]
    k = (cum < (1.0 - delta) * total).sum(dim=-1) + 1
    return torch.where(total.squeeze(-1) > 0, k, torch.zeros_like(k)).to(sigma.dtype)


@torch.no_grad()
def feature_srank(h: Tensor, delta: float = SRANK_DELTA) -> Tensor:
    """srank_δ ``[M]`` of each member's feature matrix ``h: [M, B, F]`` (or ``[B, F]``): the
    singular values of the uncentered ``B × F`` matrix, then :func:`srank`."""
    return srank(torch.linalg.svdvals(_members_first(h).detach().float()), delta)


@torch.no_grad()
def feature_norm(h: Tensor) -> Tensor:
    """Mean ℓ2 norm ``[M]`` of the feature vectors: ``(1/B) Σ_b ‖h_b‖₂`` for ``h: [M, B, F]``
    (SimbaV2's ``featnorm``, Plasticine's ``compute_feature_norm``)."""
    return torch.linalg.vector_norm(_members_first(h).detach().float(), dim=-1).mean(dim=-1)


@torch.no_grad()
def active_fraction(h: Tensor, activation: str = "relu") -> Tensor:
    """Plasticine's fraction of active units ``[M]`` of post-activation features ``h: [M, B, F]``:
    ``(1/(B·F)) Σ_{b,i} 1[h_{b,i} active]``, the share of (example, unit) entries that are active.

    Active means ``h > 0`` for ``relu``, ``crelu``, ``leaky_relu``, ``elu``, ``gelu`` and ``silu``
    (each is positive exactly where its input is; Plasticine defines ``h ≠ 0`` for the ReLU family
    and nothing for the others), and ``|h| ≤ 0.99`` (not saturated) for ``tanh``. A unit that fires
    on one input of the batch counts ``1/B``; compare the ReDo dormant score, a per-unit test."""
    h = _members_first(h).detach()
    if activation == "tanh":
        active = h.abs() <= TANH_SATURATION
    elif activation in ("relu", "crelu", "leaky_relu", "elu", "gelu", "silu"):
        active = h > 0
    else:
        raise ValueError(f"no active-unit rule for activation '{activation}'")
    return active.float().mean(dim=(-2, -1))


def feature_metrics(h: Tensor, name: str, activation: str = "relu", delta: float = SRANK_DELTA,
                    sigma: Tensor | None = None) -> dict[str, Tensor]:
    """``features/<name>/stable_rank``, ``features/<name>/norm`` and ``active/<name>/fraction``
    (each ``[M]``) of the last hidden layer's features ``h: [M, B, F]``. ``sigma``: their singular
    values when already computed (the diagnostics' feature spectrum), which saves the SVD."""
    return {
        f"features/{name}/stable_rank": feature_srank(h, delta) if sigma is None else srank(sigma, delta),
        f"features/{name}/norm": feature_norm(h),
        f"active/{name}/fraction": active_fraction(h, activation),
    }


# ----------------------------------------------------------------------------- weights
def _per_member(tensors: Sequence[Tensor], members: int, what: str) -> list[Tensor]:
    """Each tensor as ``[M, n]``: member ``m``'s entries in row ``m``."""
    out = []
    for t in tensors:
        if members > 1 and (t.dim() == 0 or t.shape[0] != members):
            raise ValueError(f"{what} of shape {tuple(t.shape)} has no leading member axis of size {members}")
        out.append(t.detach().reshape(members, -1))
    return out


def member_parameters(net: nn.Module) -> list[Tensor]:
    """``net``'s parameters as ``[M, n_i]`` views (``M`` = :func:`~sac_spectral.diagnostics.gradients.members_of`)."""
    return _per_member(list(net.parameters()), members_of(net), "parameter")


def _sum_sq(rows: Sequence[Tensor]) -> Tensor:
    """``Σ_i ‖rows_i[m]‖²`` ``[M]``."""
    return sum(torch.linalg.vector_norm(r.float(), dim=1).square() for r in rows)


@torch.no_grad()
def weight_magnitude(net: nn.Module) -> Tensor:
    """Mean absolute parameter ``[M]``: ``(1/n) Σ_j |θ_j|`` over all ``n`` parameters of each member
    (weights, biases, normalization gains and shifts)."""
    rows = member_parameters(net)
    return sum(torch.linalg.vector_norm(r.float(), ord=1, dim=1) for r in rows) / sum(r.shape[1] for r in rows)


class ParamSnapshot:
    """A copy of a network's parameters, to measure how far the network has moved from it.

    Taken at construction as θ₀ it gives ``weights/<net>/distance_from_init``; taken just before
    an optimizer step it gives that step's :func:`effective_lr`. ``state_dict`` /
    ``load_state_dict`` carry it through checkpoints (θ₀ must be the run's, not the resumed
    network's); :meth:`record` re-takes it (e.g. after a reset, if distance should count from the
    new draw)."""

    def __init__(self, net: nn.Module) -> None:
        self.params: dict[str, Tensor] = {}
        self.record(net)

    @torch.no_grad()
    def record(self, net: nn.Module) -> None:
        """Copy ``net``'s parameters now."""
        self.members = members_of(net)
        self.params = {name: p.detach().clone() for name, p in net.named_parameters()}

    def _pairs(self, net: nn.Module) -> list[tuple[Tensor, Tensor]]:
        named = dict(net.named_parameters())
        if named.keys() != self.params.keys():
            raise ValueError(f"parameters differ from the snapshot's: {sorted(named.keys() ^ self.params.keys())}")
        for name, p in named.items():
            if p.shape != self.params[name].shape:
                raise ValueError(f"parameter '{name}' has shape {tuple(p.shape)}, {tuple(self.params[name].shape)} in "
                                 "the snapshot")
        return [(named[k], self.params[k]) for k in self.params]

    @torch.no_grad()
    def distance(self, net: nn.Module) -> Tensor:
        """``‖θ − θ_snap‖₂`` ``[M]`` over all parameters of each member."""
        diffs = [p.detach() - q for p, q in self._pairs(net)]
        return _sum_sq(_per_member(diffs, self.members, "parameter")).sqrt()

    @torch.no_grad()
    def norm(self) -> Tensor:
        """``‖θ_snap‖₂`` ``[M]``."""
        return _sum_sq(_per_member(list(self.params.values()), self.members, "parameter")).sqrt()

    def state_dict(self) -> dict[str, Tensor]:
        return {k: v.clone() for k, v in self.params.items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if state.keys() != self.params.keys():
            raise KeyError(f"snapshot keys differ from the checkpoint's: {sorted(state.keys() ^ self.params.keys())}")
        for k, v in state.items():
            if v.shape != self.params[k].shape:
                raise ValueError(f"snapshot '{k}' has shape {tuple(v.shape)} in the checkpoint, "
                                 f"{tuple(self.params[k].shape)} here")
            self.params[k].copy_(v)


def weight_metrics(net: nn.Module, name: str, init: ParamSnapshot | None = None) -> dict[str, Tensor]:
    """``weights/<name>/magnitude`` and, given the snapshot ``init`` of θ₀,
    ``weights/<name>/distance_from_init`` (each ``[M]``)."""
    out = {f"weights/{name}/magnitude": weight_magnitude(net)}
    if init is not None:
        out[f"weights/{name}/distance_from_init"] = init.distance(net)
    return out


# ----------------------------------------------------------------------------- one update
@torch.no_grad()
def grad_norm(source: nn.Module | Sequence[Tensor | None], members: int | None = None) -> Tensor:
    """``‖g‖₂`` ``[M]`` over all parameters of each member, from a module's ``.grad``s (read after
    ``backward``; the agents' eager update leaves them set until the next update) or from a list of
    gradients with the member axis first (``members`` required). A missing gradient counts as 0;
    no gradient at all raises ``ValueError`` (the compiled update keeps its gradients to itself)."""
    if isinstance(source, nn.Module):
        m = members_of(source) if members is None else members
        grads = [p.grad for p in source.parameters()]
    else:
        if members is None:
            raise ValueError("grad_norm of a list of gradients needs members=")
        m, grads = members, list(source)
    present = [g for g in grads if g is not None]
    if not present:
        raise ValueError("no gradient is set (call after backward; a compiled update does not set .grad)")
    return _sum_sq(_per_member(present, m, "gradient")).sqrt()


@torch.no_grad()
def effective_lr(before: ParamSnapshot, net: nn.Module) -> Tensor:
    """``‖θ_{t+1} − θ_t‖₂ / ‖θ_t‖₂`` ``[M]``: the relative size of the step from the snapshot
    ``before`` (taken just before the optimizer step) to ``net`` now, over all parameters of each
    member. SimbaV2 (Lee et al. 2025) tracks the effective learning rate as ``‖g‖/‖θ‖`` per layer;
    this is the step the optimizer actually took (learning rate and Adam's scaling included)."""
    return before.distance(net) / before.norm().clamp_min(torch.finfo(torch.float32).tiny)


def _flat_outputs(out: Outputs, members: int) -> Tensor:
    """Outputs (a tensor or a tuple of heads) as ``[M, K]`` floats."""
    heads = [out] if isinstance(out, Tensor) else list(out)
    return torch.cat([t.detach().float().reshape(members, -1) for t in heads], dim=1)


def _output_members(net: Forward, out: Outputs, members: int | None) -> int:
    if members is not None:
        return members
    if isinstance(net, nn.Module):
        return members_of(net)
    first = out if isinstance(out, Tensor) else out[0]
    return first.shape[0]


@torch.no_grad()
def reference_outputs(net: Forward, reference_inputs: Tensor, members: int | None = None) -> Tensor:
    """``net``'s outputs on ``reference_inputs`` as ``[M, K]`` floats (heads concatenated), for
    :func:`churn`. ``net``: a module or any function of the inputs; a function that is not a
    module must return the member axis first (or give ``members``)."""
    out = net(reference_inputs)
    return _flat_outputs(out, _output_members(net, out, members))


@torch.no_grad()
def churn(net: Forward, reference_inputs: Tensor, outputs_before: Outputs, squared: bool = False,
          members: int | None = None) -> Tensor:
    """Churn ``[M]`` of one update: ``(1/K) Σ_k |f_{θ_{t+1}}(x̄)_k − f_{θ_t}(x̄)_k|`` over the ``K``
    output entries (examples × output dims) of a reference batch ``x̄`` that the update did not
    train on; ``outputs_before`` = :func:`reference_outputs` before the update (or the raw outputs).
    ``squared=True``: the mean squared change, which C-CHAIN's code logs (``policy_churn`` of
    the action means, ``value_churn``) and penalizes (Tang et al. 2025, "Mitigating Plasticity
    Loss in Continual RL by Reducing Churn"; churn: Schaul et al. 2022)."""
    now = reference_outputs(net, reference_inputs, members)
    diff = now - _flat_outputs(outputs_before, now.shape[0])
    return (diff.square() if squared else diff.abs()).mean(dim=1)


class UpdateProbe:
    """``grads/<name>/norm``, ``weights/<name>/effective_lr`` and ``churn/<name>`` of one update.

    >>> probe = UpdateProbe(agent.critic, "critic")                      # doctest: +SKIP
    >>> probe.before(reference_inputs)   # copies θ_t, outputs on x̄     # doctest: +SKIP
    >>> agent.train_steps(buffer, 1, batch_size)                         # doctest: +SKIP
    >>> scalars = probe.after()          # {tag: [M]}                    # doctest: +SKIP

    ``forward``: what churn compares (default ``net`` itself; e.g. the actor's action
    ``tanh(mean)``). ``grads/<name>/norm`` is left out when the update set no ``.grad`` (compiled).
    A block of several updates between ``before`` and ``after`` measures the block."""

    def __init__(self, net: nn.Module, name: str, forward: Forward | None = None) -> None:
        self.net, self.name = net, name
        self.forward: Forward = net if forward is None else forward
        self.members = members_of(net)
        self._state: tuple[ParamSnapshot, Tensor, Tensor] | None = None

    def before(self, reference_inputs: Tensor) -> None:
        """Take θ_t and the outputs on the reference batch, just before the update."""
        outputs = reference_outputs(self.forward, reference_inputs, self.members)
        self._state = (ParamSnapshot(self.net), reference_inputs, outputs)

    def after(self) -> dict[str, Tensor]:
        """The three metrics of the update since :meth:`before` (each ``[M]``)."""
        if self._state is None:
            raise RuntimeError("call before() first")
        snap, inputs, outputs = self._state
        self._state = None
        out: dict[str, Tensor] = {}
        if any(p.grad is not None for p in self.net.parameters()):
            out[f"grads/{self.name}/norm"] = grad_norm(self.net, self.members)
        out[f"weights/{self.name}/effective_lr"] = effective_lr(snap, self.net)
        out[f"churn/{self.name}"] = churn(self.forward, inputs, outputs, members=self.members)
        return out
