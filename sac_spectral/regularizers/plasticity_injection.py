"""Plasticity injection (Nikishin, Oh, Ostrovski, Lyle, Pascanu, Dabney, Barreto, "Deep
Reinforcement Learning with Plasticity Injection", NeurIPS 2023).

At update ``at_step`` the network's head h_θ (its last ``levels`` linear layers with what lies
between them: normalization, activation) is frozen, and a freshly initialized copy θ′ is added
minus a frozen copy of the same draw:

    h(x) = h_θ(x) + h_θ′(x) − h_θ′₀(x),    θ′₀ = θ′ at injection (frozen), θ frozen,

so the output is unchanged at injection (to float rounding) and from then on only θ′ trains; the
layers below the head keep training, with gradients through all three branches. θ′ is drawn with
each layer's own initializer from the member's random stream (checkpointed).

As a regularizer (penalty 0): the head's parameters stay the trainable tensors and become θ′
(re-drawn in place, so the optimizer built before keeps stepping them; their optimizer state is
dropped, Adam restarts), θ and θ′₀ are kept here (checkpointed with ``state_dict``), and forward
hooks on the head add ``h_θ(x) − h_θ′₀(x)`` to its output, ``x`` being the head's input. The hooks
exist from construction and add nothing before injection. A network that follows this one by
Polyak averaging (the RL agent's target networks, :meth:`set_target`) is injected alike: its head
becomes θ′ too and its own frozen θ (its parameters at injection) is added with θ′₀ subtracted,
so the target's function is unchanged as well and then follows the online head. One injection per
network: a list with two is refused; a new ``plasticity_injection`` on the same network (e.g.
built by a full reset) replaces the hooks of the previous one.

``levels``: the head's depth. ``levels=1`` is the output layers alone (every head, on any
network, residual ones included); a linear head makes
θ + θ′ − θ′₀ one linear map trained by the same gradient, so injection then amounts to resetting
the head's optimizer state (penalties on the parameters, such as weight decay, aside).
``levels=2`` (default, ours) adds the last hidden layer, so that the fresh head is nonlinear.
``levels > 1`` needs the layer order: a :class:`~sac_spectral.core.nets.BatchedMLP` or an
``nn.Sequential``.

Compiled updates (``compile: true``) trace the hooks, and compile anew at injection
(:meth:`traced_state`). ``load_policy`` builds the actor's regularizers on the exported actor
and loads their state, so an injected actor acts with its frozen branches there too.

Defaults: ``at_step=50_000`` updates (ours: about halfway through the default 100 000-step SAC
run; inject once the network has lost plasticity), ``levels=2``, ``seed=0``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sac_spectral.core.layers import WEIGHTED, checked_views, layer_views
from sac_spectral.core.nets import BatchedLayerNorm, BatchedLinear, BatchedMLP
from sac_spectral.core.reinit import forget, reinitialize
from sac_spectral.regularizers.base import Regularizer, require
from sac_spectral.regularizers.registry import register


def _batched_linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return torch.bmm(x, w.transpose(1, 2)) if b is None else torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))


def _apply(module: nn.Module, x: Tensor, tensors: tuple[Tensor | None, Tensor | None]) -> Tensor:
    """``module``'s forward with its weight and bias replaced by ``tensors``, without its hooks."""
    w, b = tensors
    if isinstance(module, BatchedLinear):
        return _batched_linear(x, w, b)
    if isinstance(module, nn.Linear):
        return F.linear(x, w, b)
    if isinstance(module, nn.modules.conv._ConvNd):
        return module._conv_forward(x, w, b)
    if isinstance(module, BatchedLayerNorm):
        return torch.addcmul(b.unsqueeze(1), F.layer_norm(x, (module.features,), eps=module.eps), w.unsqueeze(1))
    if isinstance(module, nn.LayerNorm):
        return F.layer_norm(x, module.normalized_shape, w, b, module.eps)
    if isinstance(module, nn.GroupNorm):
        return F.group_norm(x, module.num_groups, w, b, module.eps)
    raise TypeError(f"plasticity_injection cannot run a frozen copy of {type(module).__name__}")


class Head:
    """The injected part of one network: its output modules, its parameterized modules and their
    parameters in order, where it starts (``entry``, for ``levels > 1``), and its forward with
    other tensors."""

    def __init__(self, module: nn.Module, levels: int) -> None:
        self.single = levels == 1
        self.net: BatchedMLP | None = None
        self.leaves: list[nn.Module] = []
        if self.single:  # the output layers, wherever they sit; each sees its own input
            self.outputs = [v.module for v in layer_views(module) if v.is_output]
            require(bool(self.outputs), "plasticity_injection: the module has no output layer")
            self.modules = list(self.outputs)
        elif isinstance(module, BatchedMLP):
            self.net = module
            require(levels <= len(module.layers) + 1,
                    f"levels must be <= {len(module.layers) + 1} (the network's linear layers), got {levels}")
            self.hidden = list(range(len(module.layers) - (levels - 1), len(module.layers)))
            self.modules = module.tail(levels)
            self.outputs = list(module.heads)
        else:
            containers = list(dict.fromkeys(type(m).__name__ for m in module.modules()
                                            if next(m.children(), None) is not None
                                            and not isinstance(m, nn.Sequential)))
            require(isinstance(module, nn.Sequential) and not containers,
                    f"plasticity_injection with levels={levels} needs the layer order: a BatchedMLP or an "
                    f"nn.Sequential, got {', '.join(containers) or type(module).__name__} "
                    "(levels=1 injects its output layers)")
            leaves = [m for m in module.modules() if next(m.children(), None) is None]
            weighted = [i for i, m in enumerate(leaves) if isinstance(m, WEIGHTED)]
            require(levels <= len(weighted),
                    f"levels must be <= {len(weighted)} (the network's linear/conv layers), got {levels}")
            self.leaves = leaves[weighted[-levels] : weighted[-1] + 1]
            self.modules = [m for m in self.leaves if any(True for _ in m.parameters(recurse=False))]
            self.outputs = [self.leaves[-1]]
        bad = [type(m).__name__ for m in self.modules if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        require(not bad,
                "plasticity_injection: batch normalization in the head is not supported (its running statistics)")
        self.entry = None if self.single else (self.leaves or self.modules)[0]
        self.slots = [(mod, name) for mod in self.modules for name in ("weight", "bias")
                      if getattr(mod, name, None) is not None]

    def params(self) -> list[Tensor]:
        """The head's parameters (weight, then bias, module by module)."""
        return [getattr(mod, name) for mod, name in self.slots]

    def _by_module(self, tensors: list[Tensor]) -> dict[int, tuple[Tensor | None, Tensor | None]]:
        out: dict[int, list[Tensor | None]] = {}
        for (mod, name), t in zip(self.slots, tensors):
            out.setdefault(id(mod), [None, None])[0 if name == "weight" else 1] = t
        return {k: (v[0], v[1]) for k, v in out.items()}

    def output(self, k: int, x: Tensor, tensors: list[Tensor]) -> Tensor:
        """Output module ``k`` on its input ``x`` with the head's parameters replaced by ``tensors`` (``levels=1``)."""
        mod = self.outputs[k]
        return _apply(mod, x.to(tensors[0].dtype), self._by_module(tensors)[id(mod)])

    def forward(self, x: Tensor, tensors: list[Tensor]) -> list[Tensor]:
        """Every output of the head on its input ``x`` with its parameters replaced by ``tensors`` (``levels > 1``)."""
        by_module = self._by_module(tensors)
        x = x.to(tensors[0].dtype)
        if self.net is None:
            for leaf in self.leaves:
                x = _apply(leaf, x, by_module[id(leaf)]) if id(leaf) in by_module else leaf(x)
            return [x]
        net = self.net
        for i in self.hidden:
            x = _apply(net.layers[i], x, by_module[id(net.layers[i])])
            if net.norms is not None:
                x = _apply(net.norms[i], x, by_module[id(net.norms[i])])
            x = net._act(x)
        return [_apply(h, x, by_module[id(h)]) for h in net.heads]


class _Hooks:
    """The forward hooks of one network. Once its owner has injected, they add
    ``h_old(x) − h_init(x)`` to each output of the head: computed from the output module's own
    input (``levels=1``), or for every output at once by a pre-hook on the head's first module."""

    def __init__(self, head: Head, old: list[Tensor], init: list[Tensor], owner: PlasticityInjection) -> None:
        self.head, self.old, self.init, self.owner = head, old, init, owner
        self.delta: list[Tensor] | None = None
        self.handles = [] if head.entry is None else [head.entry.register_forward_pre_hook(self._pre)]
        self.handles += [out.register_forward_hook(functools.partial(self._post, k)) for k,
                         out in enumerate(head.outputs)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def _pre(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if not self.owner.injected:
            self.delta = None
            return
        x = args[0]
        self.delta = [a - b for a, b in zip(self.head.forward(x, self.old), self.head.forward(x, self.init))]

    def _post(self, k: int, module: nn.Module, args: tuple[Any, ...], out: Tensor) -> Tensor | None:
        if self.head.single:
            if not self.owner.injected:
                return None
            x = args[0]
            return out + (self.head.output(k, x, self.old) - self.head.output(k, x, self.init)).to(out.dtype)
        if self.delta is None:
            return None
        delta = self.delta[k]
        if k == len(self.delta) - 1:
            self.delta = None  # hold no graph between forwards
        return out + delta.to(out.dtype)


_ATTR = "_plasticity_injection_hooks"


def _install(module: nn.Module, hooks: _Hooks) -> _Hooks:
    """Register ``hooks`` on ``module``, removing those an earlier injection left on it."""
    previous = module.__dict__.get(_ATTR)
    if previous is not None:
        previous.remove()
    module.__dict__[_ATTR] = hooks
    return hooks


@register
class PlasticityInjection(Regularizer):
    """At ``at_step``, freeze the head and add a fresh trainable copy minus its frozen twin."""

    name = "plasticity_injection"
    has_penalty = False
    parameter_copies = 3  # at most: the frozen θ and θ′₀ of the head, the target's frozen θ
    one_per_network = True  # a second one's hooks would replace the first's

    def __init__(self, module: nn.Module, at_step: int = 50_000, levels: int = 2, seed: int = 0) -> None:
        super().__init__(module)
        members = checked_views(module, "all", self.name)[0].members
        require(int(at_step) >= 1, f"at_step must be an integer >= 1 (the update that injects), got {at_step}")
        require(int(levels) >= 1, f"levels must be an integer >= 1 (the head's linear layers), got {levels}")
        self.at_step, self.levels = int(at_step), int(levels)
        self.head = Head(module, self.levels)
        self.seed_default(seed, members)
        params = self.head.params()
        self.state["injected"] = torch.zeros((), device=params[0].device)
        for j, p in enumerate(params):
            self.state[f"old{j}"] = torch.zeros_like(p, requires_grad=False)
            self.state[f"init{j}"] = torch.zeros_like(p, requires_grad=False)
        self.injected = False
        self.target_head: Head | None = None
        self.hooks = [_install(module, _Hooks(self.head, self._tensors("old"), self._tensors("init"), self))]

    def _tensors(self, prefix: str) -> list[Tensor]:
        return [self.state[f"{prefix}{j}"] for j in range(len(self.head.slots))]

    def set_target(self, module: nn.Module) -> None:
        """``module`` follows this network by Polyak averaging: inject it alike."""
        head = Head(module, self.levels)
        shapes = [p.shape for p in head.params()]
        require(shapes == [p.shape for p in self.head.params()],
                "plasticity_injection: the target's head differs from the network's")
        self.target_head = head
        for j, p in enumerate(head.params()):
            self.state[f"target_old{j}"] = torch.zeros_like(p, requires_grad=False)
        self.hooks.append(_install(module, _Hooks(head, self._tensors("target_old"), self._tensors("init"), self)))

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        if self.injected or step < self.at_step:
            return
        optimizer = self._require_optimizer()
        params = self.head.params()
        torch._foreach_copy_(self._tensors("old"), params)
        reinitialize(self.head.modules, self.generators)
        torch._foreach_copy_(self._tensors("init"), params)
        forget(optimizer, params)
        if self.target_head is not None:
            targets = self.target_head.params()
            torch._foreach_copy_(self._tensors("target_old"), targets)
            torch._foreach_copy_(targets, params)
        self.state["injected"].fill_(1.0)
        self.injected = True

    def traced_state(self) -> bool:
        """Whether the hooks add the frozen branches (compiled updates are specialised to it)."""
        return self.injected

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.injected = bool(self.state["injected"].item())

    def metrics(self) -> dict[str, Tensor]:
        """``injected``: 1 once the head is injected."""
        return {"injected": self.state["injected"]}
