"""Soft Actor-Critic (Haarnoja et al. 2018) in the jaxrl / primacy-bias form, member-batched: the
update, its optimizers and regularizers, resets and state, on the networks and losses of
:mod:`sac_spectral.agents.networks`.

- Order per update (jaxrl): critic step → target update (Polyak, ``τ``) → actor and temperature
  step (on the updated critic, whose parameters are detached so no critic weight gradients are
  built), with ``L(α) = α·(−log π − H̄)``, ``H̄ = −target_entropy_scale·|A|``. Actor and ``log α``
  share one fused Adam (separate parameter groups and learning rates; the two losses touch
  disjoint parameters, so this equals two separate steps).
- ``precision="bf16"`` runs the networks' matmuls in bf16 on bf16 copies of the weights, re-cast
  once per optimizer step (:mod:`sac_spectral.core.precision`); weights, Adam state,
  log-probabilities, Q-values, targets and losses stay fp32.

``num_seeds`` independent agents train together. Losses are summed over seeds (each seed's
gradient is its own) and averaged over the batch. Each network's regularizers add their penalties
to its loss and run their ``after_step`` hooks after its optimizer step
(:func:`~sac_spectral.regularizers.regularized_step`).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

import torch
from torch import Tensor

from sac_spectral.agents.compiled import CompiledUpdate
from sac_spectral.agents.config import SACConfig
from sac_spectral.agents.networks import (
    SACNetworks,
    actor_mean_log_std,
    make_actor,
    make_critic,
    tanh_gaussian,
)
from sac_spectral.agents.replay import ReplayBuffer
from sac_spectral.core.optim import make_optimizer
from sac_spectral.core.precision import make_precision
from sac_spectral.core.reinit import reset_layers
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.regularizers import Regularizer, build_regularizers, regularized_step

__all__ = ["SAC", "actor_mean_log_std", "make_actor", "make_critic", "tanh_gaussian"]

Net = Literal["actor", "critic"]


def make_optimizers(nets: SACNetworks, cfg: SACConfig) -> dict[Net, torch.optim.Optimizer]:
    """Adam, or AdamW (decoupled decay) when ``weight_decay > 0``, for the critic and for the actor
    with ``log α`` (its own group and learning rate, no decay), with fused kernels (the compiled
    update steps the same state in its own program)."""
    actor_groups: list[dict[str, Any]] = [{"params": list(nets.actor.parameters()), "lr": cfg.actor.lr}]
    if cfg.alpha.learn:
        actor_groups.append({"params": [nets.log_alpha], "lr": cfg.alpha.lr, "weight_decay": 0.0})
    return {
        net: make_optimizer("adamw" if c.weight_decay > 0 else "adam", params, c.lr, c.weight_decay, implementation="fused")
        for net, c, params in (("actor", cfg.actor, actor_groups), ("critic", cfg.critic, nets.critic.parameters()))
    }


class SAC(SACNetworks):
    """``len(seeds)`` independent SAC agents in member-batched networks."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: SACConfig, streams: SeedStreams,
                 device: str | torch.device = "cpu") -> None:
        super().__init__(obs_dim, act_dim, cfg, streams, device)
        self.optimizers = make_optimizers(self, cfg)
        self.actor_opt, self.critic_opt = self.optimizers["actor"], self.optimizers["critic"]
        self._batch: dict[str, Tensor] = {}
        self.actor_regs, self.critic_regs = self._build_regularizers()
        self.num_updates = 0
        self._online_params = list(self.critic.parameters())
        self._target_params = list(self.target_critic.parameters())
        # compiled, bf16 is a cast inside the program (sac_spectral.agents.compiled), not a set of weight copies
        self.precision = make_precision("fp32" if cfg.compile else cfg.precision, {
            "actor": (self.actor, True), "critic": (self.critic, True), "target": (self.target_critic, False),
        })
        self._compiled = CompiledUpdate(self) if cfg.compile else None

    def _build_regularizers(self) -> tuple[list[Regularizer], list[Regularizer]]:
        """Build each network's regularizers, give them its optimizer, its inputs of the current
        update as probe, and per-member random streams seeded from each seed's ``init`` stream (so
        seed i of a multi-seed run draws what a single-seed run draws)."""
        built = {}
        for net, gens in (("actor", self.streams["init"]), ("critic", self._critic_generators())):
            regs = build_regularizers(getattr(self, net), getattr(self.cfg, net).regularizers, f"{net}.regularizers")
            for reg in regs:
                reg.attach(self.optimizers[net])
                reg.set_probe(functools.partial(self._probe, net))
                if reg.generators:
                    reg.seed_members([int(torch.randint(2**62, (), generator=g)) for g in gens])
            built[net] = regs
        return built["actor"], built["critic"]

    def _critic_loss(self, batch: dict[str, Tensor], noise: Tensor) -> tuple[Tensor, Tensor]:
        """Per-seed critic loss ``Σ_j mean_i ℓ_{n,j,i}`` ``[N]`` and mean Q ``[N]``."""
        with self.precision.forward():
            losses, q = self.critic_losses(batch, noise)
        return losses.mean(dim=-1).sum(dim=1), q.detach().mean(dim=(1, 2))

    def _actor_loss(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Per-seed actor loss ``mean_i ℓ_{n,i}``, temperature loss ``α(H − H̄)`` and entropy estimate
        ``H = −mean_i log π``, each ``[N]``."""
        with self.precision.forward():
            losses, logp = self.actor_losses(obs, noise)
        entropy = -logp.detach().mean(dim=-1)
        return losses.mean(dim=-1), self.log_alpha.exp() * (entropy - self.target_entropy), entropy

    # ----------------------------------------------------------------------------- updates
    def update(self, batch: dict[str, Tensor], noise: Tensor) -> dict[str, Tensor]:
        """One SAC update of every seed; returns its per-seed ``[N]`` metrics (device tensors, no
        host sync). ``batch`` tensors are ``[N, B, ...]``, ``noise`` is ``[2, N, B, A]``
        (next-state actions, current-state actions)."""
        self._batch = batch
        if self._compiled is not None:
            info = self._compiled(batch, noise)
            self.num_updates += 1
            return info
        critic_loss, q_mean = self._critic_loss(batch, noise[0])
        self._step("critic", critic_loss.sum())
        torch._foreach_lerp_(self._target_params, self._online_params, self.cfg.tau)
        self.precision.refresh("target")

        actor_loss, alpha_loss, entropy = self._actor_loss(batch["obs"], noise[1])
        loss = actor_loss.sum() + alpha_loss.sum() if self.cfg.alpha.learn else actor_loss.sum()
        self._step("actor", loss)

        self.num_updates += 1
        return {
            "loss/critic": critic_loss.detach(),
            "loss/actor": actor_loss.detach(),
            "loss/alpha": alpha_loss.detach(),
            "q/mean": q_mean,
            "entropy": entropy,
        }

    def _probe(self, net: Net) -> Tensor:
        """``net``'s inputs in the current update (what interventions such as ReDo score units on)."""
        obs = self._batch["obs"]
        return obs if net == "actor" else self.critic_inputs(obs, self._batch["action"])

    def _step(self, net: Net, loss: Tensor) -> None:
        """``net``'s regularized optimizer step (its bf16 copies' gradients collected before it and
        the copies re-cast after it)."""
        def step() -> None:
            self.precision.collect_grads(net)
            self.optimizers[net].step()

        regs = self.actor_regs if net == "actor" else self.critic_regs
        regularized_step(loss, self.optimizers[net], regs, self.num_updates + 1, step)
        self.precision.refresh(net)

    def train_steps(self, buffer: ReplayBuffer, count: int, batch_size: int) -> dict[str, Tensor]:
        """``count`` updates on fresh uniform batches; indices and noise for all of them are drawn
        at once from each seed's ``sample`` stream. Returns the last update's metrics."""
        idx = buffer.sample_indices(self.streams["sample"], (count, batch_size))
        data = {k: v.transpose(0, 1).contiguous() for k, v in buffer.gather(idx).items()}
        noise = self.streams.randn("sample", (count, 2, batch_size, self.act_dim)).permute(1, 2, 0, 3, 4)
        info: dict[str, Tensor] = {}
        for r in range(count):
            info = self.update({k: v[r] for k, v in data.items()}, noise[r])
        return info

    # ----------------------------------------------------------------------------- resets
    @torch.no_grad()
    def reset(self, last: int | None = None) -> None:
        """Nikishin et al. (2022) resets; the replay buffer is kept by the caller.

        ``last=None`` re-draws actor, critics, targets and α and clears every optimizer state (the
        regularizers are rebuilt); ``last=k`` re-draws the last ``k`` levels of actor and critics
        (:func:`~sac_spectral.core.layers.layer_tail`: the heads are the last level), copies them
        into the targets and clears their Adam moments.
        """
        reset_layers(self.actor.tail(last), self.streams["init"], self.actor_opt)
        reset_layers(self.critic.tail(last), self._critic_generators(), self.critic_opt)
        for src, dst in zip(self.critic.tail(last), self.target_critic.tail(last)):
            dst.load_state_dict(src.state_dict())
        if last is None:
            self.log_alpha.fill_(math.log(self.cfg.alpha.init))
            self.actor_opt.state.pop(self.log_alpha, None)
            self.actor_regs, self.critic_regs = self._build_regularizers()
        self.precision.refresh()

    # ----------------------------------------------------------------------------- state & metrics
    def metrics(self) -> dict[str, Tensor]:
        """Per-seed ``[N]`` temperature and regularizer metrics (the state, not the last update:
        :meth:`update` returns those)."""
        out = {"alpha": self.log_alpha.detach().exp()}
        for net, regs in (("actor", self.actor_regs), ("critic", self.critic_regs)):
            for reg in regs:
                for key, value in reg.metrics().items():
                    out[f"reg/{net}/{reg.name}/{key}"] = self.per_seed(net, value)
        return out

    def full_state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, temperature, regularizer state and update count."""
        return {
            "modules": self.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "actor_regs": [r.state_dict() for r in self.actor_regs],
            "critic_regs": [r.state_dict() for r in self.critic_regs],
            "num_updates": self.num_updates,
        }

    def load_full_state_dict(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["modules"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        for reg, s in zip(self.actor_regs, state["actor_regs"], strict=True):
            reg.load_state_dict(s)
        for reg, s in zip(self.critic_regs, state["critic_regs"], strict=True):
            reg.load_state_dict(s)
        self.num_updates = int(state["num_updates"])
        self.precision.refresh()
