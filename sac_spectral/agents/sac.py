"""Soft Actor-Critic (Haarnoja et al. 2018) in the jaxrl / primacy-bias form, member-batched.

- Networks (:mod:`~sac_spectral.agents.networks`): a tanh-Gaussian actor, ``num_critics`` critics
  and their target copies, and ``log α`` per seed.
- Critic target ``y = r + γ·(1 − terminated)·(min_j Q̄_j(s′, a′) − α·log π(a′|s′))``: a time-limit
  truncation keeps bootstrapping, only a true termination stops it.
- Order per update (jaxrl): critic step → target update (Polyak, ``τ``) → actor and temperature
  step (on the updated critic, whose parameters are detached so no critic weight gradients are
  built), with ``L(α) = α·(−log π − H̄)``, ``H̄ = −target_entropy_scale·|A|``. Actor and ``log α``
  share one fused Adam (separate parameter groups and learning rates; the two losses touch
  disjoint parameters, so this equals two separate steps).
- ``precision="bf16"`` runs the networks' matmuls in bf16 on bf16 copies of the weights, re-cast
  once per optimizer step (:mod:`sac_spectral.core.precision`); weights, Adam state,
  log-probabilities, Q-values, targets and losses stay fp32.

``num_seeds`` independent agents train together. Losses are summed over seeds (each seed's
gradient is its own) and averaged over the batch.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from sac_spectral.agents.actor_critic import ActorCritic, ExportedPolicy, member_generators
from sac_spectral.agents.base import actor_dims, register_agent
from sac_spectral.agents.config import SACConfig
from sac_spectral.agents.networks import (
    actor_mean_log_std,
    make_actor,
    make_critic,
    tanh_gaussian,
    tanh_gaussian_actions,
)
from sac_spectral.agents.steps import Metrics, NetStep, Noise
from sac_spectral.core.config import check, option
from sac_spectral.core.seeding import SeedStreams

__all__ = ["SAC", "AlphaConfig", "actor_mean_log_std", "make_actor", "make_critic", "tanh_gaussian"]


@dataclass
class AlphaConfig:
    """SAC's temperature: its start, learning rate and target entropy."""

    init: float = option(1.0, "initial temperature α")
    lr: float = option(3e-4, "temperature learning rate")
    learn: bool = option(True, "learn α toward the target entropy; false keeps it fixed")
    target_entropy_scale: float = option(0.5, "target entropy = −scale·|A| (jaxrl / rl_with_resets: 0.5)")

    def validate(self) -> None:
        check(self.init > 0, "init", f"must be > 0, got {self.init}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")


@register_agent("sac", config=AlphaConfig, section="alpha")
class SAC(ActorCritic):
    """``len(seeds)`` independent SAC agents in member-batched networks."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: SACConfig, streams: SeedStreams,
                 device: str | torch.device = "cpu") -> None:
        super().__init__(obs_dim, act_dim, cfg, streams)
        n = self.num_seeds
        self.target_entropy = -cfg.alpha.target_entropy_scale * act_dim
        for name, net in self.networks(n, obs_dim, act_dim, cfg, streams).items():
            setattr(self, name, net)
        self.log_alpha = nn.Parameter(torch.full((n,), math.log(cfg.alpha.init)), requires_grad=cfg.alpha.learn)
        self.to(device)
        groups: list[dict[str, Any]] = [{"params": list(self.actor.parameters()), "lr": cfg.actor.lr}]
        if cfg.alpha.learn:
            groups.append({"params": [self.log_alpha], "lr": cfg.alpha.lr, "weight_decay": 0.0})
        self._train_actor_critic(groups)
        self._acting = functools.partial(tanh_gaussian_actions, cfg.actor)
        self._polyak = self.polyak(*(net for net, t in self.trained.items() if t.target is not None))

    @classmethod
    def networks(cls, members: int, obs_dim: int, act_dim: int, cfg: SACConfig,
                 streams: SeedStreams | None = None) -> dict[str, nn.Module]:
        actor = make_actor(members, obs_dim, act_dim, cfg.actor, member_generators(streams, 1))
        critic = make_critic(members * cfg.critic.num_critics, obs_dim, act_dim, cfg.critic,
                             member_generators(streams, cfg.critic.num_critics), cls.critic_width)
        return {"actor": actor, "critic": critic, "target_critic": copy.deepcopy(critic).requires_grad_(False)}

    @classmethod
    def export_policy(cls, cfg: SACConfig, actor_state: dict[str, Tensor]) -> nn.Module:
        members, obs_dim, act_dim = actor_dims(actor_state)
        actor = make_actor(members, obs_dim, act_dim, cfg.actor)
        actor.load_state_dict(actor_state)
        return ExportedPolicy(actor, functools.partial(tanh_gaussian_actions, cfg.actor), act_dim)

    # ----------------------------------------------------------------------------- acting and losses
    @torch.inference_mode()
    def act(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """Actions ``[N, A]`` for observations ``[N, obs_dim]`` (one per seed)."""
        noise = None if deterministic else self.streams.randn("act", (1, self.act_dim))
        return self._acting(self.actor, obs.unsqueeze(1), noise).squeeze(1)

    def policy(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Sample ``a ~ π(·|obs)`` with given standard-normal ``noise``; returns ``(a, log π(a))``."""
        return tanh_gaussian(*actor_mean_log_std(self.actor, obs, self.cfg.actor), noise)

    @torch.no_grad()
    def critic_target(self, batch: Metrics, noise: Tensor) -> Tensor:
        """``[N, B]`` soft TD target ``r + γ(1 − terminated)(min_j Q̄_j(s′, a′) − α log π(a′|s′))``."""
        next_obs = batch["next_obs"]
        next_action, next_logp = self.policy(next_obs, noise)
        next_q = self.q_values(self.target_critic, next_obs, next_action).amin(dim=1)
        alpha = self.log_alpha.exp().unsqueeze(-1)
        return batch["reward"] + self.cfg.gamma * (1.0 - batch["terminated"]) * (next_q - alpha * next_logp)

    def critic_losses(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Tensor]:
        """Per-example TD losses ``ℓ_{n,j,i} = (Q_{n,j}(s_i, a_i) − y_{n,i})²`` ``[N, C, B]`` with the
        target ``y`` (:meth:`critic_target` on ``noise["next_action"]``) held fixed, and the
        Q-values ``[N, C, B]``."""
        target = self.critic_target(batch, noise["next_action"])
        q = self.q_values(self.critic, batch["obs"], batch["action"])
        return (q - target.unsqueeze(1)).square(), q

    def actor_losses(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Tensor]:
        """Per-example actor losses ``ℓ_{n,i} = α_n log π_n(ã_i|s_i) − min_j Q_{n,j}(s_i, ã_i)`` ``[N, B]``
        on critics whose weights are detached (no critic weight gradients are built; α is a
        constant here), with ``ã_i`` reparameterized by ``noise["action"]``, and ``log π`` ``[N, B]``."""
        obs = batch["obs"]
        action, logp = self.policy(obs, noise["action"])
        q_pi = self.q_values(self.critic, obs, action, detach=True).amin(dim=1)
        return self.log_alpha.detach().exp().unsqueeze(-1) * logp - q_pi, logp

    # ----------------------------------------------------------------------------- the update
    def steps(self, update: int) -> list[NetStep]:
        """Critic step, Polyak step of the targets, then actor and temperature step (on the updated
        critic), as jaxrl orders them."""
        return [NetStep("critic", self.critic_step, self._polyak), NetStep("actor", self.actor_step)]

    def actor_step(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Metrics]:
        """Actor loss ``mean_i ℓ_{n,i}`` plus (when α is learned) the temperature loss ``α(H − H̄)``
        with the entropy estimate ``H = −mean_i log π``, summed over seeds. Metrics: per-seed actor
        and temperature losses and entropy ``[N]``."""
        losses, logp = self.actor_losses(batch, noise)
        entropy = -logp.detach().mean(dim=-1)
        actor_loss = losses.mean(dim=-1)
        alpha_loss = self.log_alpha.exp() * (entropy - self.target_entropy)
        total = actor_loss.sum() + alpha_loss.sum() if self.cfg.alpha.learn else actor_loss.sum()
        return total, {"loss/actor": actor_loss.detach(), "loss/alpha": alpha_loss.detach(), "entropy": entropy}

    # ----------------------------------------------------------------------------- resets
    @torch.no_grad()
    def reset(self, last: int | None = None) -> None:
        """The engine's reset; a full one also resets α and its Adam state."""
        if last is None:
            self.log_alpha.fill_(math.log(self.cfg.alpha.init))
            self.trained["actor"].optimizer.state.pop(self.log_alpha, None)
        super().reset(last)

    def metrics(self) -> Metrics:
        """Per-seed ``[N]`` temperature and regularizer metrics (the state, not the last update:
        :meth:`update` returns those)."""
        return {"alpha": self.log_alpha.detach().exp(), **super().metrics()}
