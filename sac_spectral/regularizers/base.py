"""The interface every regularizer and intervention implements.

A regularizer is built on one network (``module``). The training loop adds ``penalty()`` to that
network's loss before ``backward`` and calls ``after_step(step)`` after the optimizer step.
``penalty_and_grads(params)`` gives the penalty's value and gradient as functions of the tensors
``penalized()`` lists, with no autograd graph: a compiled update traces it into its program. The
built-in penalties form their gradients in closed form (:class:`ClosedFormPenalty`, whose
``penalty()`` hands that gradient to autograd); a regularizer that only writes ``penalty()`` gets
``torch.func`` of it on substituted parameters.
``metrics()`` is read only at logging time; values are tensors of shape ``[M]`` (one per member
of a member-batched network) or ``[]`` (one number for the whole network).

Interventions that need more than the parameters get it from their owner:
- ``attach(optimizer)``: the network's optimizer, whose moments they reset;
- ``set_probe(fn)``: ``fn()`` returns a batch of the network's inputs (the RL engine hands over
  each update's replay batch before that update's ``after_step``, a supervised loop its data) for
  activation statistics;
- ``set_target(module)``: the network's Polyak-averaged copy (RL targets), for interventions that
  change the network's function beyond its parameters;
- ``seed_members(seeds)``: one random stream per member for their draws (perturbation noise,
  re-initializations). The streams' states are part of ``state_dict``, so a resumed run draws
  exactly what the uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.func import grad_and_value

from sac_spectral.core.functional import Bound
from sac_spectral.core.seeding import derive_seed

_RNG_KEY = "rng"


class Regularizer:
    """Base class: no penalty, no intervention, no state."""

    #: registry name used in configs (``{name: spectral, coef: 1e-3}``)
    name: ClassVar[str] = ""
    #: False for pure interventions, whose ``penalty`` is never added to a loss
    has_penalty: ClassVar[bool] = True
    #: copies of the network's parameters it keeps (θ₀: 1), for memory estimates
    parameter_copies: ClassVar[int] = 0
    #: at most one per network (a second one would undo the first, e.g. by replacing its hooks)
    one_per_network: ClassVar[bool] = False

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.optimizer: torch.optim.Optimizer | None = None
        self.probe: Callable[[], Tensor] | None = None
        self.state: dict[str, Tensor] = {}
        self.generators: list[torch.Generator] = []
        self._bound = Bound(module)

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Give interventions access to the network's optimizer (to reset its moments)."""
        self.optimizer = optimizer

    def set_probe(self, fn: Callable[[], Tensor]) -> None:
        """``fn()`` returns a batch of the network's inputs, read when an intervention needs
        activation statistics."""
        self.probe = fn

    def set_target(self, module: nn.Module) -> None:
        """``module`` follows this network by Polyak averaging (an RL target network). Parameter
        changes reach it through the averaging; an intervention that changes the network's function
        otherwise (plasticity injection) changes the target's alike."""

    def seed_members(self, seeds: Sequence[int]) -> None:
        """One CPU random stream per member, member ``m`` seeded with ``seeds[m]``."""
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]

    def seed_default(self, seed: int, members: int) -> None:
        """Per-member streams derived from one ``seed`` (standalone use; the RL agent reseeds)."""
        self.seed_members([derive_seed(seed, f"{self.name}/member{m}") for m in range(members)])

    def penalty(self) -> Tensor:
        """Scalar added to the network's loss."""
        return torch.zeros((), device=next(self.module.parameters()).device)

    def penalized(self) -> list[Tensor]:
        """The network's parameters the penalty is a function of (the order of
        :meth:`penalty_and_grads`' ``params``), read from the network at each call."""
        return list(self.module.parameters())

    def penalty_and_grads(self, params: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:
        """The penalty with :meth:`penalized` taking the values ``params``, and its gradient with
        respect to them, with no autograd graph left behind (what a compiled update traces).
        Default: ``torch.func`` of :meth:`penalty` on the substituted parameters."""
        names = {id(p): n for n, p in self.module.named_parameters()}
        keys = [names[id(p)] for p in self.penalized()]

        def value(values: list[Tensor]) -> Tensor:
            return self._bound.call(dict(zip(keys, values)), self.penalty)

        grads, total = grad_and_value(value)(list(params))
        return total, grads

    def after_step(self, step: int) -> None:
        """In-place changes after ``optimizer.step()``; ``step`` counts updates from 1."""

    def traced_state(self) -> Hashable:
        """Python state of this regularizer that its network's forward reads (hooks): a compiled
        update is specialised to it, and compiles anew when it changes. ``None``: no such state."""
        return None

    def metrics(self) -> dict[str, Tensor]:
        """Telling quantities, read only when logging."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Persistent state (copied) for checkpoints, with the members' random streams."""
        out = {k: v.detach().clone() for k, v in self.state.items()}
        if self.generators:
            out[_RNG_KEY] = torch.stack([g.get_state() for g in self.generators])
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        rng = state.pop(_RNG_KEY, None)
        if (rng is None) != (not self.generators):
            raise KeyError(f"{self.name}: random-stream state {'missing from' if rng is None else 'unexpected in'} the "
                           "checkpoint")
        missing = set(self.state) ^ set(state)
        if missing:
            raise KeyError(f"{self.name}: state keys differ from the checkpoint's: {sorted(missing)}")
        for key, value in state.items():
            if self.state[key].shape != value.shape:
                raise ValueError(
                    f"{self.name}: state '{key}' has shape {tuple(value.shape)} in the checkpoint, "
                    f"{tuple(self.state[key].shape)} here"
                )
            self.state[key].copy_(value)
        if rng is not None:
            if len(rng) != len(self.generators):
                raise ValueError(f"{self.name}: checkpoint has {len(rng)} random streams, this network "
                                 f"{len(self.generators)}")
            for g, s in zip(self.generators, rng):
                g.set_state(s.clone())  # a row view of the stacked states is not accepted as is

    def _require_optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise RuntimeError(f"{self.name}: call attach(optimizer) first, so the optimizer state of changed "
                               "parameters is reset")
        return self.optimizer


def require(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` for a bad hyperparameter unless ``condition`` holds."""
    if not condition:
        raise ValueError(message)


class _ClosedForm(torch.autograd.Function):
    """A :class:`ClosedFormPenalty`'s value, whose backward returns the closed-form gradient that
    its forward formed (scaled by the incoming gradient). Differentiable once."""

    @staticmethod
    def forward(ctx: Any, reg: ClosedFormPenalty, *params: Tensor) -> Tensor:
        value, grads = reg.penalty_and_grads(params)
        ctx.save_for_backward(*grads)
        return value

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        if torch.is_grad_enabled():
            raise RuntimeError(
                "a penalty's gradient is formed in closed form and cannot be differentiated again "
                "(backward with create_graph=True); leave the penalty out of losses that need second derivatives"
            )
        return (None, *(grad_out * g for g in ctx.saved_tensors))


class ClosedFormPenalty(Regularizer):
    """A penalty that forms its gradient itself: subclasses give :meth:`penalized` and
    :meth:`penalty_and_grads`; :meth:`penalty` is one autograd node whose backward returns that
    gradient, so eager and compiled updates use the same formula."""

    def penalized(self) -> list[Tensor]:
        raise NotImplementedError

    def penalty_and_grads(self, params: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:
        raise NotImplementedError

    def penalty(self) -> Tensor:
        return _ClosedForm.apply(self, *self.penalized())


def pull(xs: Sequence[Tensor], targets: Sequence[Tensor | None], coef: float) -> tuple[Tensor, list[Tensor]]:
    """``coef·Σ_i ‖x_i − t_i‖²`` (``None`` target: 0) and its gradient ``2·coef·(x_i − t_i)``."""
    diffs = [x if t is None else x - t for x, t in zip(xs, targets)]
    total = torch.stack(torch._foreach_norm(diffs)).square().sum()
    return coef * total, list(torch._foreach_mul(diffs, 2.0 * coef))


def per_member_sq(xs: Sequence[Tensor], targets: Sequence[Tensor | None]) -> Tensor:
    """``Σ_i ‖x_i[m] − t_i[m]‖²`` per member ``m`` for tensors with the member axis first: ``[M]``."""
    return sum((x if t is None else x - t).square().flatten(1).sum(1) for x, t in zip(xs, targets))


def penalized_step(
    loss: Tensor, optimizer: torch.optim.Optimizer, regularizers: Sequence[Regularizer],
    step: Callable[[], Any] | None = None,
) -> None:
    """Add the regularizers' penalties to ``loss``, backpropagate and step (``optimizer.step``
    unless ``step`` is given)."""
    for reg in regularizers:
        if reg.has_penalty:
            loss = loss + reg.penalty()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    (optimizer.step if step is None else step)()


def regularized_step(
    loss: Tensor, optimizer: torch.optim.Optimizer, regularizers: Sequence[Regularizer], update: int,
    step: Callable[[], Any] | None = None,
) -> None:
    """One training step of a network: :func:`penalized_step`, then the interventions'
    ``after_step(update)`` (``update`` counts from 1)."""
    penalized_step(loss, optimizer, regularizers, step)
    for reg in regularizers:
        reg.after_step(update)
