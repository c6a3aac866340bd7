"""SAC's update as compiled programs (``compile: true``).

Each network's step is written as a function of its parameters — the loss through
:func:`torch.func.functional_call` of the agent's own loss methods, its gradient by
:func:`torch.func.grad_and_value`, the regularizers' penalty gradients added, and the Adam/AdamW
step of :func:`~sac_spectral.core.optim.adam_step_` — so that ``torch.compile`` sees forward,
backward and optimizer step as one graph and fuses their elementwise work (inductor's C++ code on
the CPU; CUDA graphs on a GPU). In eager's order, one program per update:

    critic loss, gradient, Adam step → Polyak step of the targets → actor and temperature loss,
    gradient, Adam step

then the actor regularizers' ``after_step``. When a critic regularizer intervenes after steps
(shrink & perturb, ReDo, resets…), the update runs as two programs with its ``after_step`` between
them, where eager runs it.

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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value

from sac_spectral.core.nets import BatchedLinear
from sac_spectral.core.optim import adam_state, adam_step_
from sac_spectral.regularizers import Regularizer

if TYPE_CHECKING:
    from sac_spectral.agents.sac import SAC

Metrics = dict[str, Tensor]


class _Agent(nn.Module):
    """``forward(method, *args)`` calls ``agent.method(*args)``: what functional_call needs to run
    the agent's loss methods on substituted parameters."""

    def __init__(self, agent: SAC) -> None:
        super().__init__()
        self.agent = agent

    def forward(self, method: str, *args: Any) -> Any:
        return getattr(self.agent, method)(*args)


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


class CompiledUpdate:
    """``update(batch, noise)`` of a :class:`~sac_spectral.agents.sac.SAC`, as compiled programs."""

    def __init__(self, agent: SAC) -> None:
        self.agent = agent
        self.wrapper = _Agent(agent)
        self.critic, self.actor = _Step(self.wrapper, agent.critic_opt), _Step(self.wrapper, agent.actor_opt)
        self.params = {n: p.detach() for n, p in self.wrapper.named_parameters()}
        self.targets = [p.detach() for p in agent.target_critic.parameters()]
        self.low = {f"agent.{n}.{k}" for n, m in agent.named_modules() if isinstance(m, BatchedLinear)
                    for k, _ in m.named_parameters()} if agent.cfg.precision == "bf16" else set()
        mode = "reduce-overhead" if agent.log_alpha.device.type == "cuda" else None
        compile_ = functools.partial(torch.compile, mode=mode, dynamic=False, options={"guard_filter_fn": _argument_guards})
        self._critic_program, self._actor_program = compile_(self._critic_step), compile_(self._actor_step)
        self._program = compile_(self._steps)

    def __deepcopy__(self, memo: dict[int, Any]) -> CompiledUpdate:
        """A copied agent gets its own programs (compiled ones close over this agent)."""
        return CompiledUpdate(copy.deepcopy(self.agent, memo))

    def _call(self, method: str, params: dict[str, Tensor], *args: Any) -> Any:
        if self.low:
            params = {n: t.to(torch.bfloat16) if n in self.low else t for n, t in params.items()}
        return functional_call(self.wrapper, params, (method, *args))

    def _critic_step(self, batch: dict[str, Tensor], noise: Tensor, penalty: list[Tensor] | None,
                     state: tuple[list[Tensor], ...], hyper: Any) -> tuple[Tensor, Tensor]:
        def loss(params: list[Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
            per_seed, q_mean = self._call("_critic_loss", {**self.params, **dict(zip(self.critic.names, params))}, batch, noise)
            return per_seed.sum(), (per_seed.detach(), q_mean)

        grads, (_, (critic_loss, q_mean)) = grad_and_value(loss, has_aux=True)(self.critic.aliases)
        self.critic.apply(grads, penalty, state, hyper)
        return critic_loss, q_mean

    def _actor_step(self, obs: Tensor, noise: Tensor, penalty: list[Tensor] | None, state: tuple[list[Tensor], ...],
                    hyper: Any) -> tuple[Tensor, Tensor, Tensor]:
        agent = self.agent
        torch._foreach_lerp_(self.targets, self.critic.aliases, agent.cfg.tau)

        def loss(params: list[Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
            actor_loss, alpha_loss, entropy = self._call(
                "_actor_loss", {**self.params, **dict(zip(self.actor.names, params))}, obs, noise)
            total = actor_loss.sum() + alpha_loss.sum() if agent.cfg.alpha.learn else actor_loss.sum()
            return total, (actor_loss.detach(), alpha_loss.detach(), entropy)

        grads, (_, metrics) = grad_and_value(loss, has_aux=True)(self.actor.aliases)
        self.actor.apply(grads, penalty, state, hyper)
        return metrics

    def _steps(self, batch: dict[str, Tensor], noise: Tensor, critic: tuple[Any, ...], actor: tuple[Any, ...]
               ) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]:
        return self._critic_step(batch, noise[0], *critic), self._actor_step(batch["obs"], noise[1], *actor)

    def __call__(self, batch: dict[str, Tensor], noise: Tensor) -> Metrics:
        agent, update = self.agent, self.agent.num_updates + 1
        critic = (self.critic.penalty_grads(agent.critic_regs), adam_state(self.critic.optimizer, self.critic.params),
                  self.critic.hyper())
        actor = (self.actor.penalty_grads(agent.actor_regs), adam_state(self.actor.optimizer, self.actor.params),
                 self.actor.hyper())
        if any(_intervenes(reg) for reg in agent.critic_regs):
            critic_loss, q_mean = self._critic_program(batch, noise[0], *critic)
            for reg in agent.critic_regs:
                reg.after_step(update)
            actor_loss, alpha_loss, entropy = self._actor_program(batch["obs"], noise[1], *actor)
        else:
            (critic_loss, q_mean), (actor_loss, alpha_loss, entropy) = self._program(batch, noise, critic, actor)
        for reg in agent.actor_regs:
            reg.after_step(update)
        return {"loss/critic": critic_loss, "loss/actor": actor_loss, "loss/alpha": alpha_loss,
                "q/mean": q_mean, "entropy": entropy}
