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
Noise ``ε`` comes from each seed's ``sample`` stream (``noise[0]`` of an update; ``noise[1]`` is unused).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from sac_spectral.agents.base import ActorCritic, Metrics, NetStep, actor_dims, make_optimizers, register_agent
from sac_spectral.agents.networks import make_critic
from sac_spectral.core.nets import BatchedNetwork
from sac_spectral.core.residual import make_network
from sac_spectral.core.seeding import SeedStreams


def make_deterministic_actor(members: int, obs_dim: int, act_dim: int, cfg: Any,
                             generators: list[torch.Generator] | None = None) -> BatchedNetwork:
    """``f_φ``: an MLP from observations to pre-tanh actions (one head, gain 1)."""
    return make_network(cfg.arch, members, obs_dim, cfg.hidden, act_dim, cfg.activation, cfg.layer_norm, cfg.init,
                        out_gains=1.0, generators=generators)


@register_agent("td3")
class TD3(ActorCritic):
    """``len(seeds)`` independent TD3 agents in member-batched networks."""


    def __init__(self, obs_dim: int, act_dim: int, cfg: Any, streams: SeedStreams,
                 device: str | torch.device = "cpu") -> None:
        super().__init__(obs_dim, act_dim, cfg, streams)
        n, self.opts = self.num_seeds, cfg.td3
        self.actor = make_deterministic_actor(n, obs_dim, act_dim, cfg.actor, streams["init"])
        self.critic = make_critic(n * self.num_critics, obs_dim, act_dim, cfg.critic, self._critic_generators())
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.to(device)
        self._setup(make_optimizers(cfg, [{"params": list(self.actor.parameters()), "lr": cfg.actor.lr}], self.critic), {
            "actor": (self.actor, True), "critic": (self.critic, True),
            "target": (self.target_critic, False), "target_actor": (self.target_actor, False),
        }, cfg.precision)
        self._online = [p.detach() for p in [*self.critic.parameters(), *self.actor.parameters()]]
        self._targets = list(self.target_critic.parameters()) + list(self.target_actor.parameters())
        self._actor_loss = torch.zeros(n, device=device)

    @classmethod
    def networks(cls, members: int, obs_dim: int, act_dim: int, cfg: Any) -> dict[str, nn.Module]:
        actor = make_deterministic_actor(members, obs_dim, act_dim, cfg.actor)
        critic = make_critic(members * cfg.critic.num_critics, obs_dim, act_dim, cfg.critic)
        return {"actor": actor, "critic": critic, "target_actor": copy.deepcopy(actor), "target_critic": copy.deepcopy(critic)}

    @classmethod
    def export_policy(cls, cfg: Any, actor_state: dict[str, Tensor]) -> nn.Module:
        actor = make_deterministic_actor(*actor_dims(actor_state), cfg.actor)
        actor.load_state_dict(actor_state)
        return DeterministicPolicy(actor, cfg.td3.exploration_noise)

    # ----------------------------------------------------------------------------- acting and losses
    @torch.inference_mode()
    def act(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """Actions ``[N, A]``: ``μ(s)``, plus clipped exploration noise unless ``deterministic``."""
        action = torch.tanh(self.actor(obs.unsqueeze(1)).float()).squeeze(1)
        if deterministic:
            return action
        noise = self.streams.randn("act", (self.act_dim,))
        return (action + self.opts.exploration_noise * noise).clamp(-1.0, 1.0)

    @torch.no_grad()
    def critic_target(self, batch: dict[str, Tensor], noise: Tensor) -> Tensor:
        """``[N, B]`` target ``r + γ(1 − terminated)·min_j Q′_j(s′, ã′)`` with the smoothed target action."""
        smoothing = (self.opts.policy_noise * noise).clamp(-self.opts.noise_clip, self.opts.noise_clip)
        next_action = (torch.tanh(self.target_actor(batch["next_obs"]).float()) + smoothing).clamp(-1.0, 1.0)
        next_q = self.q_values(self.target_critic, batch["next_obs"], next_action).amin(dim=1)
        return batch["reward"] + self.cfg.gamma * (1.0 - batch["terminated"]) * next_q

    def critic_losses(self, batch: dict[str, Tensor], noise: Tensor) -> tuple[Tensor, Tensor]:
        """Per-example TD losses ``[N, C, B]`` (target held fixed) and the Q-values ``[N, C, B]``."""
        q = self.q_values(self.critic, batch["obs"], batch["action"])
        return (q - self.critic_target(batch, noise).unsqueeze(1)).square(), q

    def actor_losses(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Per-example actor losses ``−Q_1(s_i, μ(s_i))`` ``[N, B]`` on detached critic weights, and
        the actions' mean absolute value ``[N, B]`` (``noise`` is unused: the actor is deterministic)."""
        action = torch.tanh(self.actor(obs).float())
        q1 = self.q_values(self.critic, obs, action, detach=True)[:, 0]
        return -q1, action.detach().abs().mean(dim=-1)

    # ----------------------------------------------------------------------------- the update
    def steps(self, update: int) -> list[NetStep]:
        """The critic step; every ``policy_delay``-th update also the actor step, then the Polyak
        step of both targets."""
        critic = NetStep("critic", self.critic_step)
        if update % self.opts.policy_delay:
            return [critic]
        return [critic, NetStep("actor", self.actor_step, self.polyak)]

    def critic_step(self, batch: Metrics, noise: Tensor) -> tuple[Tensor, Metrics]:
        """``Σ_n Σ_j mean_i ℓ_{n,j,i}``; metrics: per-seed critic loss and mean Q. ``noise[0]``
        smooths the target action."""
        losses, q = self.critic_losses(batch, noise[0])
        per_seed = losses.mean(dim=-1).sum(dim=1)
        return per_seed.sum(), {"loss/critic": per_seed.detach(), "q/mean": q.detach().mean(dim=(1, 2))}

    def actor_step(self, batch: Metrics, noise: Tensor) -> tuple[Tensor, Metrics]:
        """``Σ_n −mean_i Q_1(s_i, μ(s_i))``; metric: the per-seed actor loss."""
        per_seed = self.actor_losses(batch["obs"], noise[1])[0].mean(dim=-1)
        return per_seed.sum(), {"loss/actor": per_seed.detach()}

    def polyak(self) -> None:
        """``φ′ ← φ′ + τ(φ − φ′)``, ``θ′ ← θ′ + τ(θ − θ′)``."""
        torch._foreach_lerp_(self._targets, self._online, self.cfg.tau)
        self.precision.refresh("target", "target_actor")

    def update(self, batch: Metrics, noise: Tensor) -> Metrics:
        """:meth:`ActorCritic.update`; ``loss/actor`` is the last actor step's."""
        info = super().update(batch, noise)
        self._actor_loss = info.get("loss/actor", self._actor_loss)
        return {**info, "loss/actor": self._actor_loss}

    # ----------------------------------------------------------------------------- state
    def full_state_dict(self) -> dict[str, Any]:
        return {**super().full_state_dict(), "actor_loss": self._actor_loss}

    def load_full_state_dict(self, state: dict[str, Any]) -> None:
        super().load_full_state_dict(state)
        self._actor_loss = state["actor_loss"].to(self._actor_loss.device)


class DeterministicPolicy(nn.Module):
    """TD3's acting policy: ``μ(s)``, or ``μ(s)`` plus clipped Gaussian exploration noise."""

    def __init__(self, actor: BatchedNetwork, exploration_noise: float) -> None:
        super().__init__()
        self.actor, self.exploration_noise = actor, exploration_noise

    def forward(self, obs: Tensor, member: int, deterministic: bool, generator: torch.Generator) -> Tensor:
        action = torch.tanh(self.actor(obs).float()[member])
        if deterministic:
            return action
        noise = torch.randn(action.shape, generator=generator, device=action.device)
        return (action + self.exploration_noise * noise).clamp(-1.0, 1.0)
