"""Twin Delayed DDPG (TD3; Fujimoto, van Hoof & Meger 2018, "Addressing Function Approximation
Error in Actor-Critic Methods"), member-batched.

- Deterministic actor ``μ_φ(s) = tanh(f_φ(s))`` (an MLP with one head), ``num_critics`` (2) critics
  and target copies of both (``φ′``, ``θ′``).
- Clipped double Q with target policy smoothing: ``ã′ = clip(μ_φ′(s′) + clip(σ̃ε, −c, c), −1, 1)``,
  ``y = r + γ(1 − terminated)·min_j Q_θ′_j(s′, ã′)``; critic loss ``Σ_j mean_i (Q_θ_j(s_i, a_i) − y_i)²``.
- Delayed updates: every ``d``-th update the actor takes a step on ``−mean_i Q_θ_1(s_i, μ_φ(s_i))``
  (the first critic, on detached critic weights) and the targets move by Polyak averaging (``τ``).
- Exploration: ``a = clip(μ_φ(s) + σ_x ε, −1, 1)``; ``random_steps`` uniform actions first.

Defaults (the authors' code): ``σ̃ = 0.2`` (``td3.policy_noise``), ``c = 0.5`` (``td3.noise_clip``),
``d = 2`` (``td3.policy_delay``), ``σ_x = 0.1`` (``td3.exploration_noise``); ``γ``, ``τ``, networks,
learning rates, batch and regularizers are the run's (``gamma``, ``tau``, ``actor.*``, ``critic.*``).
Noise ``ε`` comes from each seed's ``sample`` stream: an update draws ``next_action`` (the smoothing
noise) and ``action``, which the deterministic actor leaves unused (drawn so that TD3 draws what it
always has).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sac_spectral.agents.actor_critic import Acting, ActorCritic, head_target
from sac_spectral.agents.base import register_agent
from sac_spectral.agents.steps import Metrics, Noise
from sac_spectral.core.config import at_least, option
from sac_spectral.core.nets import BatchedNetwork
from sac_spectral.core.precision import full
from sac_spectral.core.residual import make_network


def make_deterministic_actor(members: int, obs_dim: int, act_dim: int, cfg: Any,
                             generators: list[torch.Generator] | None = None) -> BatchedNetwork:
    """``f_φ``: an MLP from observations to pre-tanh actions (one head, gain 1)."""
    return make_network(cfg.arch, members, obs_dim, cfg.hidden, act_dim, cfg.activation, cfg.layer_norm, cfg.init,
                        out_gains=1.0, generators=generators)


def deterministic_actions(exploration_noise: float, actor: BatchedNetwork, obs: Tensor, noise: Tensor | None) -> Tensor:
    """TD3's acting (the trainer's and ``load_policy``'s): ``μ(s)``, or ``clip(μ(s) + σ_x·noise, −1, 1)``."""
    action = torch.tanh(full(actor(obs)))
    return action if noise is None else (action + exploration_noise * noise).clamp(-1.0, 1.0)


@dataclass
class TD3Config:
    """TD3's own options (Fujimoto et al. 2018; defaults as the authors' code)."""

    policy_noise: float = option(0.2, "target policy smoothing: std of the noise added to the target action")
    noise_clip: float = option(0.5, "target policy smoothing: the noise is clipped to [-noise_clip, noise_clip]")
    policy_delay: int = option(2, "actor and target updates every policy_delay critic updates")
    exploration_noise: float = option(0.1, "std of the Gaussian noise added to actions while collecting")

    def validate(self) -> None:
        at_least(self, 0, "policy_noise", "noise_clip", "exploration_noise")
        at_least(self, 1, "policy_delay")


@register_agent("td3", config=TD3Config)
class TD3(ActorCritic):
    """``len(seeds)`` independent TD3 agents in member-batched networks."""

    actor_delay = "td3.policy_delay"
    targets = ("actor", "critic")
    polyak_after = "actor"  # delayed target updates
    soft = False

    @classmethod
    def actor_network(cls, members: int, obs_dim: int, act_dim: int, cfg: Any,
                      generators: list[torch.Generator] | None = None) -> BatchedNetwork:
        """The deterministic actor ``f_φ`` (:func:`make_deterministic_actor`)."""
        return make_deterministic_actor(members, obs_dim, act_dim, cfg.actor, generators)

    @classmethod
    def acting_function(cls, cfg: Any) -> Acting:
        """``μ(s)``, or ``clip(μ(s) + σ_x·noise, −1, 1)`` while collecting (:func:`deterministic_actions`)."""
        return functools.partial(deterministic_actions, cfg.td3.exploration_noise)

    # ----------------------------------------------------------------------------- losses
    @torch.no_grad()
    def critic_target(self, batch: Metrics, noise: Tensor) -> Tensor:
        """``[N, B]`` target ``r + γ(1 − terminated)·min_j Q′_j(s′, ã′)`` (or the critic head's,
        :func:`head_target`) with the target action smoothed by ``noise [N, B, A]``."""
        opts = self.cfg.td3
        smoothing = (opts.policy_noise * noise).clamp(-opts.noise_clip, opts.noise_clip)
        next_action = (torch.tanh(full(self.target_actor(batch["next_obs"]))) + smoothing).clamp(-1.0, 1.0)
        next_out = self.critic_outputs(self.target_critic, batch["next_obs"], next_action)
        return head_target(self.head, batch, next_out, self.cfg.gamma)

    def critic_losses(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Tensor]:
        """Per-example TD losses ``[N, C, B]`` (target held fixed, smoothed by ``noise["next_action"]``)
        and the Q-values ``[N, C, B]``."""
        out = self.critic_outputs(self.critic, batch["obs"], batch["action"])
        return self.head.losses(out, self.critic_target(batch, noise["next_action"])), self.head.expectation(out)

    def actor_losses(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Tensor]:
        """Per-example actor losses ``−Q_1(s_i, μ(s_i))`` ``[N, B]`` on detached critic weights, and
        the actions' mean absolute value ``[N, B]`` (no noise: the actor is deterministic)."""
        obs = batch["obs"]
        action = torch.tanh(full(self.actor(obs)))
        q1 = self.q_values(self.critic, obs, action, detach=True)[:, 0]
        return -q1, action.detach().abs().mean(dim=-1)

    # ----------------------------------------------------------------------------- the update
    def actor_step(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Metrics]:
        """``Σ_n −mean_i Q_1(s_i, μ(s_i))``; metric: the per-seed actor loss."""
        per_seed = self.actor_losses(batch, noise)[0].mean(dim=-1)
        return per_seed.sum(), {"loss/actor": per_seed.detach()}
