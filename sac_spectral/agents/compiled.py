"""An agent's update as compiled programs (``compile: true``), from the same list of steps that
the eager update runs (:meth:`~sac_spectral.agents.base.ActorCritic.steps`).

Each step is written as a function of its network's parameters — its loss through
:func:`torch.func.functional_call`, its gradient by :func:`torch.func.grad_and_value`, the
regularizers' penalty gradients (:meth:`~sac_spectral.regularizers.Regularizer.penalty_and_grads`,
the formula eager's ``penalty()`` differentiates) added, and the Adam/AdamW step of
:func:`~sac_spectral.core.optim.adam_step_` — so that ``torch.compile`` sees forward, backward,
penalties, optimizer step and the step's ``after()`` (a Polyak step) as one graph and fuses their
elementwise work (inductor's C++ code on the CPU; CUDA graphs on a GPU). Consecutive steps form one program;
a program ends after a step whose network has a regularizer that intervenes after steps (shrink &
perturb, ReDo, resets…), whose ``after_step`` then runs between programs, where eager runs it.
Updates whose step lists differ (TD3's delayed actor) get a program each.

The programs write the agent's own parameters and its optimizers' own Adam state in place, so
checkpoints, resets, evaluation and the regularizers see one set of tensors, and a run may resume
with or without compile. The penalties' state (the spectral power-iteration vectors) is updated
in place inside the program, as eager updates it. ``precision: bf16`` casts the
linear layers' weights to bf16 inside the program (bf16 matmuls on fp32 masters, as eager's bf16
copies give). A program is specialised to its agent's structure and configuration at the first
call; only its arguments (steps, batch, noise, the regularizers with penalties, Adam state and
hyperparameters) are guarded. :meth:`CompiledUpdate.block` runs several consecutive updates as one
program (``compile_block``) where no regularizer intervenes between them.
"""

from __future__ import annotations

import copy
import functools
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.func import functional_call, grad_and_value

from sac_spectral.core.functional import Bound
from sac_spectral.core.nets import BatchedLinear
from sac_spectral.core.optim import adam_state, adam_step_
from sac_spectral.regularizers import Regularizer

if TYPE_CHECKING:
    from sac_spectral.agents.base import ActorCritic, NetStep

Metrics = dict[str, Tensor]
#: a regularizer with a penalty, its tensors' places among the trained ones, and the untrained ones
Penalty = tuple[Regularizer, tuple["int | None", ...], tuple["Tensor | None", ...]]


class _Step:
    """One network's trained tensors (aliases of its parameters, in its optimizer's order) and the
    optimizer's groups as index ranges with their hyperparameters."""

    def __init__(self, wrapper: Bound, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        names = {id(p): n for n, p in wrapper.named_parameters()}
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.names = [names[id(p)] for p in self.params]
        self.aliases = [p.detach() for p in self.params]
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.decoupled = isinstance(optimizer, torch.optim.AdamW)
        self.groups, start = [], 0
        for g in optimizer.param_groups:
            self.groups.append((start, start + len(g["params"])))
            start += len(g["params"])

    def hyper(self) -> tuple[tuple[float, tuple[float, float], float, float], ...]:
        """Each group's ``(lr, betas, eps, weight_decay)`` as they are now."""
        return tuple((g["lr"], tuple(g["betas"]), g["eps"], g["weight_decay"]) for g in self.optimizer.param_groups)

    def penalties(self, regs: Sequence[Regularizer]) -> tuple[Penalty, ...]:
        """The regularizers with penalties, each with its penalized tensors: the place of each among
        :attr:`params`, or (a tensor this optimizer does not train) its value."""
        out = []
        for reg in (r for r in regs if r.has_penalty):
            tensors = reg.penalized()
            places = tuple(self.index.get(id(t)) for t in tensors)
            out.append((reg, places, tuple(None if i is not None else t.detach() for i, t in zip(places, tensors))))
        return tuple(out)

    def add_penalties(self, grads: list[Tensor], penalties: Sequence[Penalty]) -> None:
        """Add each penalty's gradient at the current parameters to ``grads`` (traced into the program)."""
        for reg, places, fixed in penalties:
            _, extra = reg.penalty_and_grads([f if i is None else self.aliases[i] for i, f in zip(places, fixed)])
            for i, g in zip(places, extra):
                if i is not None:
                    grads[i] = grads[i] + g

    def apply(self, grads: list[Tensor], state: tuple[list[Tensor], ...],
              hyper: tuple[tuple[float, tuple[float, float], float, float], ...]) -> None:
        """Adam/AdamW on the aliases, group by group (traced into the program)."""
        for (lo, hi), (lr, betas, eps, wd) in zip(self.groups, hyper):
            adam_step_(self.aliases[lo:hi], grads[lo:hi], *(s[lo:hi] for s in state), lr, betas, eps, wd, self.decoupled)


def _intervenes(reg: Regularizer) -> bool:
    """Whether ``reg`` changes its network after optimizer steps (its ``after_step`` is its own)."""
    return type(reg).after_step is not Regularizer.after_step


def _own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of the function ``fn`` with a code object of its own. Dynamo keeps its compiled
    programs, and counts them against its recompile limit, per code object: each agent's programs
    get their own, so that those of another agent in the process (whose guards on ``self`` are
    dropped) are never tried, and many agents in one process never reach the limit."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _argument_guards(guards: Sequence[Any]) -> list[bool]:
    """Keep the guards on the programs' arguments (steps, batch, noise, the regularizers with
    penalties, Adam state and hyperparameters) and drop those on the agent (``self``) and globals: the agent's structure,
    configuration and parameter tensors (written in place, never replaced) are fixed for the life
    of its :class:`CompiledUpdate`, and checking some 800 guards on them cost ≈ 0.5 ms per call."""
    return [not (g.is_global or g.name == "self" or g.name.startswith("self.")) for g in guards]


Segment = tuple[tuple["NetStep", ...], Any]


class CompiledUpdate:
    """``update(batch, noise)`` of an :class:`~sac_spectral.agents.base.ActorCritic`, as compiled
    programs of its :meth:`steps`."""

    def __init__(self, agent: ActorCritic, bf16: bool = False) -> None:
        self.agent = agent
        self.wrapper = Bound(agent)
        self.nets = {net: _Step(self.wrapper, opt) for net, opt in agent.optimizers.items()}
        self.params = {n: p.detach() for n, p in self.wrapper.named_parameters()}
        self.low = {f"root.{n}.{k}" for n, m in agent.named_modules() if isinstance(m, BatchedLinear)
                    for k, _ in m.named_parameters()} if bf16 else set()
        mode = "reduce-overhead" if next(agent.parameters()).device.type == "cuda" else None
        self._compile = functools.partial(torch.compile, mode=mode, dynamic=False, options={"guard_filter_fn": _argument_guards})
        self._programs: dict[tuple[Any, ...], Segment] = {}

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
                    self._programs[key] = (captured, self._compile(types.MethodType(_own_code(CompiledUpdate._run), self)))
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
        for step, (penalties, state, hyper) in zip(steps, args):
            net = self.nets[step.net]
            grads, (_, metrics) = grad_and_value(functools.partial(self._loss, step, batch, noise), has_aux=True)(net.aliases)
            grads = list(grads)
            net.add_penalties(grads, penalties)
            net.apply(grads, state, hyper)
            if step.after is not None:
                step.after()
            info.update(metrics)
        return info

    def _args(self, net: str) -> tuple[Any, ...]:
        """A step's program arguments: the penalties, Adam state and hyperparameters of ``net``."""
        step = self.nets[net]
        return step.penalties(self._regs(net)), adam_state(step.optimizer, step.params), step.hyper()

    def blockable(self) -> bool:
        """Whether updates can run as one block: no regularizer intervenes between them."""
        return not any(_intervenes(r) for r in self.agent.actor_regs + self.agent.critic_regs)

    def _block(self, plan: tuple[tuple[NetStep, ...], ...], data: Metrics, noise: Tensor,
               args: dict[str, tuple[Any, ...]]) -> Metrics:
        """``len(plan)`` updates, update ``r`` on ``data[·][r]``, ``noise[r]``, traced into one program."""
        info: Metrics = {}
        for r, steps in enumerate(plan):
            info = self._run(steps, {k: v[r] for k, v in data.items()}, noise[r], [args[s.net] for s in steps])
        return info

    def block(self, data: Metrics, noise: Tensor) -> Metrics:
        """``len(noise)`` consecutive updates as one program call (batches ``data[·][r]`` ``[R, N,
        B, ...]``, noise ``[R, 2, N, B, A]``), where :meth:`blockable`; the program is specialised to
        the block's length and the step lists of its updates. Returns the last update's metrics;
        the caller counts the updates."""
        first = self.agent.num_updates + 1
        plan = tuple(tuple(self.agent.steps(u)) for u in range(first, first + len(noise)))
        key = ("block", tuple(tuple((s.net, s.after is not None) for s in steps) for steps in plan))
        if key not in self._programs:
            self._programs[key] = ((), self._compile(types.MethodType(_own_code(CompiledUpdate._block), self)))
        return self._programs[key][1](plan, data, noise, {net: self._args(net) for net in self.nets})

    def __call__(self, batch: Metrics, noise: Tensor) -> Metrics:
        update, info = self.agent.num_updates + 1, {}
        for steps, program in self._segments(self.agent.steps(update)):
            info.update(program(steps, batch, noise, [self._args(s.net) for s in steps]))
            for reg in self._regs(steps[-1].net):
                reg.after_step(update)
        return info
