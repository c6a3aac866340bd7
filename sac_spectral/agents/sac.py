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

import copy
import math
from typing import Any

import torch
from torch import Tensor, nn

from sac_spectral.agents.base import NetStep, actor_dims, make_optimizers, register_agent
from sac_spectral.agents.config import SACConfig
from sac_spectral.agents.networks import (
    SACNetworks,
    actor_mean_log_std,
    make_actor,
    make_critic,
    tanh_gaussian,
)
from sac_spectral.core.nets import BatchedNetwork
from sac_spectral.core.seeding import SeedStreams

__all__ = ["SAC", "actor_mean_log_std", "make_actor", "make_critic", "tanh_gaussian"]


def sac_optimizers(nets: SACNetworks, cfg: SACConfig) -> dict[str, torch.optim.Optimizer]:
    """The critic's optimizer, and the actor's with ``log α`` in its own group (its own learning
    rate, no decay); the compiled update steps the same state in its own program."""
    actor_groups: list[dict[str, Any]] = [{"params": list(nets.actor.parameters()), "lr": cfg.actor.lr}]
    if cfg.alpha.learn:
        actor_groups.append({"params": [nets.log_alpha], "lr": cfg.alpha.lr, "weight_decay": 0.0})
    return make_optimizers(cfg, actor_groups, nets.critic)


@register_agent("sac")
class SAC(SACNetworks):
    """``len(seeds)`` independent SAC agents in member-batched networks."""


    def __init__(self, obs_dim: int, act_dim: int, cfg: SACConfig, streams: SeedStreams,
                 device: str | torch.device = "cpu") -> None:
        super().__init__(obs_dim, act_dim, cfg, streams, device)
        self._setup(sac_optimizers(self, cfg), {
            "actor": (self.actor, True), "critic": (self.critic, True), "target": (self.target_critic, False),
        }, cfg.precision)
        self.actor_opt, self.critic_opt = self.optimizers["actor"], self.optimizers["critic"]
        self._online_params = [p.detach() for p in self.critic.parameters()]
        self._target_params = list(self.target_critic.parameters())

    @classmethod
    def networks(cls, members: int, obs_dim: int, act_dim: int, cfg: SACConfig) -> dict[str, nn.Module]:
        critic = make_critic(members * cfg.critic.num_critics, obs_dim, act_dim, cfg.critic)
        return {"actor": make_actor(members, obs_dim, act_dim, cfg.actor), "critic": critic, "target_critic": copy.deepcopy(critic)}

    @classmethod
    def export_policy(cls, cfg: SACConfig, actor_state: dict[str, Tensor]) -> nn.Module:
        actor = make_actor(*actor_dims(actor_state), cfg.actor)
        actor.load_state_dict(actor_state)
        return TanhGaussianPolicy(actor, cfg)

    # ----------------------------------------------------------------------------- the update
    def steps(self, update: int) -> list[NetStep]:
        """Critic step, Polyak step of the targets, then actor and temperature step (on the updated
        critic), as jaxrl orders them."""
        return [NetStep("critic", self.critic_step, self.polyak), NetStep("actor", self.actor_step)]

    def critic_step(self, batch: dict[str, Tensor], noise: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """``Σ_n Σ_j mean_i ℓ_{n,j,i}``; metrics: per-seed critic loss and mean Q ``[N]``. ``noise[0]``
        samples the next-state actions."""
        losses, q = self.critic_losses(batch, noise[0])
        per_seed = losses.mean(dim=-1).sum(dim=1)
        return per_seed.sum(), {"loss/critic": per_seed.detach(), "q/mean": q.detach().mean(dim=(1, 2))}

    def polyak(self) -> None:
        """``θ̄ ← θ̄ + τ(θ − θ̄)`` for the target critics."""
        torch._foreach_lerp_(self._target_params, self._online_params, self.cfg.tau)
        self.precision.refresh("target")

    def actor_step(self, batch: dict[str, Tensor], noise: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """Actor loss ``mean_i ℓ_{n,i}`` plus (when α is learned) the temperature loss ``α(H − H̄)``
        with the entropy estimate ``H = −mean_i log π``, summed over seeds; ``noise[1]`` samples the
        actions. Metrics: per-seed actor and temperature losses and entropy ``[N]``."""
        losses, logp = self.actor_losses(batch["obs"], noise[1])
        entropy = -logp.detach().mean(dim=-1)
        actor_loss = losses.mean(dim=-1)
        alpha_loss = self.log_alpha.exp() * (entropy - self.target_entropy)
        total = actor_loss.sum() + alpha_loss.sum() if self.cfg.alpha.learn else actor_loss.sum()
        return total, {"loss/actor": actor_loss.detach(), "loss/alpha": alpha_loss.detach(), "entropy": entropy}

    # ----------------------------------------------------------------------------- resets
    @torch.no_grad()
    def reset(self, last: int | None = None) -> None:
        """The shared reset (:meth:`ActorCritic.reset`); a full one also resets α and its Adam state."""
        if last is None:
            self.log_alpha.fill_(math.log(self.cfg.alpha.init))
            self.actor_opt.state.pop(self.log_alpha, None)
        super().reset(last)

    def metrics(self) -> dict[str, Tensor]:
        """Per-seed ``[N]`` temperature and regularizer metrics (the state, not the last update:
        :meth:`update` returns those)."""
        return {"alpha": self.log_alpha.detach().exp(), **super().metrics()}


class TanhGaussianPolicy(nn.Module):
    """SAC's acting policy: ``tanh(mean)``, or a tanh-Gaussian sample (the trainer's act)."""

    def __init__(self, actor: BatchedNetwork, cfg: SACConfig) -> None:
        super().__init__()
        self.actor, self.cfg = actor, cfg

    def forward(self, obs: Tensor, member: int, deterministic: bool, generator: torch.Generator) -> Tensor:
        mean, log_std = actor_mean_log_std(self.actor, obs, self.cfg.actor)
        mean, log_std = mean[member], log_std[member]
        if deterministic:
            return torch.tanh(mean)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        return torch.tanh(mean + log_std.exp() * noise)
