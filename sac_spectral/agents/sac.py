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
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from sac_spectral.agents.actor_critic import ActorCritic, ExportedPolicy, head_target, member_generators, td_step
from sac_spectral.agents.base import actor_dims, register_agent
from sac_spectral.agents.config import SACConfig
from sac_spectral.agents.heads import head_width
from sac_spectral.agents.networks import (
    actor_mean_log_std,
    make_actor,
    make_critic,
    tanh_gaussian,
    tanh_gaussian_actions,
)
from sac_spectral.agents.steps import BATCH, Metrics, NetStep, Noise
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
        self.draws = {"next_action": (BATCH, act_dim), "action": (BATCH, act_dim)}
        nets = self.networks(self.num_seeds, obs_dim, act_dim, cfg, streams)
        self.actor, self.critic, self.target_critic = nets["actor"], nets["critic"], nets["target_critic"]
        self._soft_temperature(act_dim)
        self.to(device)
        self._train_actor_critic(self._soft_actor_groups())
        self.acting = functools.partial(tanh_gaussian_actions, cfg.actor)
        self._polyak = self.polyak("critic")

    @classmethod
    def networks(cls, members: int, obs_dim: int, act_dim: int, cfg: SACConfig,
                 streams: SeedStreams | None = None) -> dict[str, nn.Module]:
        actor = make_actor(members, obs_dim, act_dim, cfg.actor, member_generators(streams, 1))
        critic = make_critic(members * cfg.critic.num_critics, obs_dim, act_dim, cfg.critic,
                             member_generators(streams, cfg.critic.num_critics), head_width(cfg.critic))
        return {"actor": actor, "critic": critic, "target_critic": copy.deepcopy(critic).requires_grad_(False)}

    @classmethod
    def export_policy(cls, cfg: SACConfig, actor_state: dict[str, Tensor]) -> nn.Module:
        members, obs_dim, act_dim = actor_dims(actor_state)
        actor = make_actor(members, obs_dim, act_dim, cfg.actor)
        actor.load_state_dict(actor_state)
        return ExportedPolicy(actor, functools.partial(tanh_gaussian_actions, cfg.actor), act_dim)

    # ----------------------------------------------------------------------------- losses
    def policy(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Sample ``a ~ π(·|obs)`` with given standard-normal ``noise``; returns ``(a, log π(a))``."""
        return tanh_gaussian(*actor_mean_log_std(self.actor, obs, self.cfg.actor), noise)

    @torch.no_grad()
    def critic_target(self, batch: Metrics, noise: Tensor) -> Tensor:
        """Soft TD target ``r + γ(1 − terminated)(min_j Q̄_j(s′, a′) − α log π(a′|s′))`` ``[N, B]``
        (or the critic head's target, :func:`head_target`), ``a′`` by ``noise [N, B, A]``."""
        next_action, next_logp = self.policy(batch["next_obs"], noise)
        next_out = self.critic_outputs(self.target_critic, batch["next_obs"], next_action)
        return head_target(self.head, batch, next_out, self.cfg.gamma, self.log_alpha.exp().unsqueeze(-1) * next_logp)

    def critic_losses(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Tensor]:
        """Per-example TD losses ``ℓ_{n,j,i} = (Q_{n,j}(s_i, a_i) − y_{n,i})²`` ``[N, C, B]`` (or the
        critic head's loss) with the target ``y`` (:meth:`critic_target` on ``noise["next_action"]``)
        held fixed, and the Q-values ``[N, C, B]``."""
        target = self.critic_target(batch, noise["next_action"])
        out = self.critic_outputs(self.critic, batch["obs"], batch["action"])
        return self.head.losses(out, target), self.head.expectation(out)

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

    def critic_step(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Metrics]:
        """``Σ_n Σ_j mean_i ℓ_{n,j,i}`` of :meth:`critic_losses`; metrics: critic loss and mean Q."""
        return td_step(*self.critic_losses(batch, noise))

    def actor_step(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Metrics]:
        """Actor loss ``mean_i ℓ_{n,i}`` of :meth:`actor_losses` plus (when α is learned) the
        temperature loss ``α(H − H̄)``, summed over seeds."""
        losses, logp = self.actor_losses(batch, noise)
        return self._soft_actor_step(losses, logp)
