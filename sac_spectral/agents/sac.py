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

from dataclasses import dataclass

import torch
from torch import Tensor

from sac_spectral.agents.actor_critic import ActorCritic, head_target
from sac_spectral.agents.base import register_agent
from sac_spectral.agents.networks import actor_mean_log_std, make_actor, make_critic, tanh_gaussian
from sac_spectral.agents.steps import Metrics, Noise
from sac_spectral.core.config import check, option

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
    """``len(seeds)`` independent SAC agents in member-batched networks: :class:`ActorCritic`'s
    networks, temperature and plan (critic step, Polyak step, actor and temperature step every
    update), with SAC's losses."""

    # ----------------------------------------------------------------------------- losses
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
