"""SAC's networks and its losses, defined once, member-batched.

- Actor: an MLP trunk with separate mean and log-std heads (rl_with_resets' ``NormalTanhPolicy``);
  tanh-Gaussian ``a = tanh(μ + σ·ε)``, log σ squashed into ``[log_std_min, log_std_max]`` by
  ``lo + (hi − lo)·(tanh(x) + 1)/2`` as rl_with_resets does (jaxrl's older policy clips instead);
  log-prob with the exact tanh correction ``log(1 − tanh(u)²) = 2(log 2 − u − softplus(−2u))``.
- Critics: ``num_critics`` Q-networks as members of one :class:`BatchedMLP`; target critics start
  as copies (the update moves them by Polyak averaging).
- Initialization (``init: orthogonal``, rl_with_resets' ``default_init``): every linear layer of
  critics and actor orthogonal with gain √2 and zero bias, except the log-std head (gain 1).
- Losses are defined once, per example (as TorchRL's ``reduction="none"``):
  :meth:`SACNetworks.critic_losses` and :meth:`SACNetworks.actor_losses`. The update takes their
  means; the gradient-rank diagnostics differentiate them example by example.
- Critic target ``y = r + γ·(1 − terminated)·(min_j Q̄_j(s′, a′) − α·log π(a′|s′))``: a time-limit
  truncation keeps bootstrapping, only a true termination stops it.

``len(streams)`` seeds are members: the actor has ``N`` members, the critic ``N·num_critics``
(seed ``n``'s critics are members ``n·C … n·C + C − 1``).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sac_spectral.agents.base import ActorCritic
from sac_spectral.agents.config import ActorConfig, CriticConfig, SACConfig
from sac_spectral.core.nets import BatchedNetwork
from sac_spectral.core.residual import make_network
from sac_spectral.core.seeding import SeedStreams

_LOG2 = math.log(2.0)
_GAIN = math.sqrt(2.0)  # rl_with_resets' default_init: orthogonal with gain √2
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def tanh_gaussian(mean: Tensor, log_std: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """Reparameterized tanh-Gaussian sample and its log-density (summed over action dims)."""
    u = mean + log_std.exp() * noise
    log_prob = (-0.5 * noise.square() - log_std - _HALF_LOG_2PI).sum(-1)
    log_prob = log_prob - (2.0 * (_LOG2 - u - F.softplus(-2.0 * u))).sum(-1)
    return torch.tanh(u), log_prob


def make_actor(
    members: int, obs_dim: int, act_dim: int, cfg: ActorConfig, generators: list[torch.Generator] | None = None
) -> BatchedNetwork:
    """The policy network: an MLP trunk with a mean head (gain √2) and a log-std head (gain 1)."""
    return make_network(cfg.arch, members, obs_dim, cfg.hidden, (act_dim, act_dim), cfg.activation, cfg.layer_norm,
                        cfg.init, out_gains=(_GAIN, 1.0), generators=generators)


def actor_mean_log_std(actor: BatchedNetwork, obs: Tensor, cfg: ActorConfig) -> tuple[Tensor, Tensor]:
    """Mean and log σ of the pre-tanh Gaussian, log σ squashed into ``[log_std_min, log_std_max]``."""
    mean, raw = actor(obs)
    lo, hi = cfg.log_std_min, cfg.log_std_max
    return mean.float(), lo + 0.5 * (hi - lo) * (torch.tanh(raw.float()) + 1.0)


def make_critic(
    members: int, obs_dim: int, act_dim: int, cfg: CriticConfig, generators: list[torch.Generator] | None = None
) -> BatchedNetwork:
    """``members`` Q-networks ``(obs, action) → Q`` (every layer gain √2)."""
    return make_network(cfg.arch, members, obs_dim + act_dim, cfg.hidden, 1, cfg.activation, cfg.layer_norm, cfg.init,
                        out_gains=_GAIN, generators=generators)


class SACNetworks(ActorCritic):
    """The actor, the critics and their targets, and ``log α`` of ``len(streams)`` seeds, with the
    policy, the Q-values and SAC's per-example losses."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: SACConfig, streams: SeedStreams,
                 device: str | torch.device = "cpu") -> None:
        super().__init__(obs_dim, act_dim, cfg, streams)
        n = self.num_seeds
        self.target_entropy = -cfg.alpha.target_entropy_scale * act_dim
        self.actor = make_actor(n, obs_dim, act_dim, cfg.actor, streams["init"])
        self.critic = make_critic(n * self.num_critics, obs_dim, act_dim, cfg.critic, self._critic_generators())
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.full((n,), math.log(cfg.alpha.init)), requires_grad=cfg.alpha.learn)
        self.to(device)

    def policy(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Sample ``a ~ π(·|obs)`` with given standard-normal ``noise``; returns ``(a, log π(a))``."""
        mean, log_std = self._mean_log_std(obs)
        return tanh_gaussian(mean, log_std, noise)

    def _mean_log_std(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return actor_mean_log_std(self.actor, obs, self.cfg.actor)

    @torch.inference_mode()
    def act(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """Actions ``[N, A]`` for observations ``[N, obs_dim]`` (one per seed)."""
        mean, log_std = self._mean_log_std(obs.unsqueeze(1))
        if deterministic:
            return torch.tanh(mean).squeeze(1)
        noise = self.streams.randn("act", (1, self.act_dim))
        return torch.tanh(mean + log_std.exp() * noise).squeeze(1)  # tanh_gaussian's sample, no log-density

    # ----------------------------------------------------------------------------- losses
    @torch.no_grad()
    def critic_target(self, batch: dict[str, Tensor], noise: Tensor) -> Tensor:
        """``[N, B]`` soft TD target ``r + γ(1 − terminated)(min_j Q̄_j(s′, a′) − α log π(a′|s′))``."""
        next_obs = batch["next_obs"]
        next_action, next_logp = self.policy(next_obs, noise)
        next_q = self.q_values(self.target_critic, next_obs, next_action).amin(dim=1)
        alpha = self.log_alpha.exp().unsqueeze(-1)
        return batch["reward"] + self.cfg.gamma * (1.0 - batch["terminated"]) * (next_q - alpha * next_logp)

    def critic_losses(self, batch: dict[str, Tensor], noise: Tensor) -> tuple[Tensor, Tensor]:
        """Per-example TD losses ``ℓ_{n,j,i} = (Q_{n,j}(s_i, a_i) − y_{n,i})²`` ``[N, C, B]`` with the
        target ``y`` (:meth:`critic_target`, next-state ``noise [N, B, A]``) held fixed, and the
        Q-values ``[N, C, B]``."""
        target = self.critic_target(batch, noise)
        q = self.q_values(self.critic, batch["obs"], batch["action"])
        return (q - target.unsqueeze(1)).square(), q

    def actor_losses(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Per-example actor losses ``ℓ_{n,i} = α_n log π_n(ã_i|s_i) − min_j Q_{n,j}(s_i, ã_i)`` ``[N, B]``
        on critics whose weights are detached (no critic weight gradients are built; α is a
        constant here), with ``ã_i`` reparameterized by ``noise [N, B, A]``, and ``log π`` ``[N, B]``."""
        action, logp = self.policy(obs, noise)
        q_pi = self.q_values(self.critic, obs, action, detach=True).amin(dim=1)
        return self.log_alpha.detach().exp().unsqueeze(-1) * logp - q_pi, logp
