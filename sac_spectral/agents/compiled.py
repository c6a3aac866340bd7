"""An agent's update as compiled programs (``compile: true``), from the same list of steps that
the eager update runs (:meth:`~sac_spectral.agents.base.ActorCritic.steps`).

Each step is written as a function of its network's parameters — its loss through
:func:`torch.func.functional_call`, its gradient by :func:`torch.func.grad_and_value`, the
regularizers' penalty gradients added, and the Adam/AdamW step of
:func:`~sac_spectral.core.optim.adam_step_` — so that ``torch.compile`` sees forward, backward,
optimizer step and the step's ``after()`` (a Polyak step) as one graph and fuses their elementwise
work (inductor's C++ code on the CPU; CUDA graphs on a GPU). Consecutive steps form one program;
a program ends after a step whose network has a regularizer that intervenes after steps (shrink &
perturb, ReDo, resets…), whose ``after_step`` then runs between programs, where eager runs it.
Updates whose step lists differ (TD3's delayed actor) get a program each.

The programs write the agent's own parameters and its optimizers' own Adam state in place, so
checkpoints, resets, evaluation and the regularizers see one set of tensors, and a run may resume
with or without compile. Penalties are computed in eager before the program (their power
iterations and state updates are eager's) and enter it as gradients. ``precision: bf16`` casts the
linear layers' weights to bf16 inside the program (bf16 matmuls on fp32 masters, as eager's bf16
copies give). A program is specialised to its agent's structure and configuration at the first
call; only its arguments (batch, noise, penalty gradients, Adam state and hyperparameters) are
guarded.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value

from sac_spectral.core.nets import BatchedLinear
from sac_spectral.core.optim import adam_state, adam_step_
from sac_spectral.regularizers import Regularizer

if TYPE_CHECKING:
    from sac_spectral.agents.base import ActorCritic, NetStep

Metrics = dict[str, Tensor]


class _Agent(nn.Module):
    """``forward(fn, *args)`` is ``fn(*args)``: functional_call then runs an agent's step loss (a
    bound method of the agent) on substituted parameters."""

    def __init__(self, agent: ActorCritic) -> None:
        super().__init__()
        self.agent = agent

    def forward(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class _Step:
    """One network's trained tensors (aliases of its parameters, in its optimizer's order) and the
    optimizer's groups as index ranges with their hyperparameters."""

    def __init__(self, wrapper: _Agent, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        names = {id(p): n for n, p in wrapper.named_parameters()}
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.names = [names[id(p)] for p in self.params]
        self.aliases = [p.detach() for p in self.params]
        self.decoupled = isinstance(optimizer, torch.optim.AdamW)
        self.groups, start = [], 0
        for g in optimizer.param_groups:
            self.groups.append((start, start + len(g["params"])))
            start += len(g["params"])

    def hyper(self) -> tuple[tuple[float, tuple[float, float], float, float], ...]:
        """Each group's ``(lr, betas, eps, weight_decay)`` as they are now."""
        return tuple((g["lr"], tuple(g["betas"]), g["eps"], g["weight_decay"]) for g in self.optimizer.param_groups)

    def penalty_grads(self, regs: Sequence[Regularizer]) -> list[Tensor] | None:
        """The gradient of the summed penalties at the current parameters (``None``: no penalty)."""
        penalties = [r.penalty() for r in regs if r.has_penalty]
        if not penalties:
            return None
        grads = torch.autograd.grad(torch.stack(penalties).sum(), self.params, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, self.params)]

    def apply(self, grads: list[Tensor], penalty: list[Tensor] | None, state: tuple[list[Tensor], ...],
              hyper: tuple[tuple[float, tuple[float, float], float, float], ...]) -> None:
        """Adam/AdamW on the aliases, group by group (traced into the program)."""
        if penalty is not None:
            grads = torch._foreach_add(grads, penalty)
        for (lo, hi), (lr, betas, eps, wd) in zip(self.groups, hyper):
            adam_step_(self.aliases[lo:hi], grads[lo:hi], *(s[lo:hi] for s in state), lr, betas, eps, wd, self.decoupled)


def _intervenes(reg: Regularizer) -> bool:
    """Whether ``reg`` changes its network after optimizer steps (its ``after_step`` is its own)."""
    return type(reg).after_step is not Regularizer.after_step


def _argument_guards(guards: Sequence[Any]) -> list[bool]:
    """Keep the guards on the programs' arguments (batch, noise, penalty gradients, Adam state and
    hyperparameters) and drop those on the agent (``self``) and globals: the agent's structure,
    configuration and parameter tensors (written in place, never replaced) are fixed for the life
    of its :class:`CompiledUpdate`, and checking some 800 guards on them cost ≈ 0.5 ms per call."""
    return [not (g.is_global or g.name == "self" or g.name.startswith("self.")) for g in guards]


Segment = tuple[tuple["NetStep", ...], Any]


class CompiledUpdate:
    """``update(batch, noise)`` of an :class:`~sac_spectral.agents.base.ActorCritic`, as compiled
    programs of its :meth:`steps`."""

    def __init__(self, agent: ActorCritic, bf16: bool = False) -> None:
        self.agent = agent
        self.wrapper = _Agent(agent)
        self.nets = {net: _Step(self.wrapper, opt) for net, opt in agent.optimizers.items()}
        self.params = {n: p.detach() for n, p in self.wrapper.named_parameters()}
        self.low = {f"agent.{n}.{k}" for n, m in agent.named_modules() if isinstance(m, BatchedLinear)
                    for k, _ in m.named_parameters()} if bf16 else set()
        mode = "reduce-overhead" if next(agent.parameters()).device.type == "cuda" else None
        self._compile = functools.partial(torch.compile, mode=mode, dynamic=False, options={"guard_filter_fn": _argument_guards})
        self._programs: dict[tuple[int, tuple[tuple[str, bool], ...]], Segment] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> CompiledUpdate:
        """A copied agent gets its own programs (compiled ones close over this agent)."""
        return CompiledUpdate(copy.deepcopy(self.agent, memo), bool(self.low))

    def _regs(self, net: str) -> list[Regularizer]:
        return self.agent.actor_regs if net == "actor" else self.agent.critic_regs

    def _segments(self, steps: Sequence[NetStep]) -> list[Segment]:
        """The programs of ``steps``: a segment ends after a step whose regularizers intervene."""
        out, current = [], []
        for i, step in enumerate(steps):
            current.append(step)
            if i == len(steps) - 1 or any(_intervenes(r) for r in self._regs(step.net)):
                key = (i, tuple((s.net, s.after is not None) for s in current))
                if key not in self._programs:
                    captured = tuple(current)
                    self._programs[key] = (captured, self._compile(functools.partial(self._run, captured)))
                out.append(self._programs[key])
                current = []
        return out

    def _loss(self, step: NetStep, batch: Metrics, noise: Tensor, params: list[Tensor]) -> tuple[Tensor, Metrics]:
        substituted = {**self.params, **dict(zip(self.nets[step.net].names, params))}
        if self.low:
            substituted = {n: t.to(torch.bfloat16) if n in self.low else t for n, t in substituted.items()}
        loss, metrics = functional_call(self.wrapper, substituted, (step.loss, batch, noise))
        return loss, metrics

    def _run(self, steps: tuple[NetStep, ...], batch: Metrics, noise: Tensor, args: Sequence[tuple[Any, ...]]) -> Metrics:
        """A segment's steps, traced into one program."""
        info: Metrics = {}
        for step, (penalty, state, hyper) in zip(steps, args):
            net = self.nets[step.net]
            grads, (_, metrics) = grad_and_value(functools.partial(self._loss, step, batch, noise), has_aux=True)(net.aliases)
            net.apply(grads, penalty, state, hyper)
            if step.after is not None:
                step.after()
            info.update(metrics)
        return info

    def __call__(self, batch: Metrics, noise: Tensor) -> Metrics:
        update, info = self.agent.num_updates + 1, {}
        for steps, program in self._segments(self.agent.steps()):
            args = [(self.nets[s.net].penalty_grads(self._regs(s.net)),
                     adam_state(self.nets[s.net].optimizer, self.nets[s.net].params), self.nets[s.net].hyper()) for s in steps]
            info.update(program(batch, noise, args))
            for reg in self._regs(steps[-1].net):
                reg.after_step(update)
        return info
