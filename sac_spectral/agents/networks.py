"""SAC's networks, its policy and its temperature, defined once, member-batched (SAC, REDQ and
CrossQ share them; TD3 the critic).

- Actor: an MLP trunk with separate mean and log-std heads (rl_with_resets' ``NormalTanhPolicy``);
  tanh-Gaussian ``a = tanh(μ + σ·ε)``, log σ squashed into ``[log_std_min, log_std_max]`` by
  ``lo + (hi − lo)·(tanh(x) + 1)/2`` as rl_with_resets does (jaxrl's older policy clips instead);
  log-prob with the exact tanh correction ``log(1 − tanh(u)²) = 2(log 2 − u − softplus(−2u))``.
- Critics: ``num_critics`` Q-networks as members of one :class:`BatchedMLP`; target critics start
  as copies (the update moves them by Polyak averaging).
- Initialization (``init: orthogonal``, rl_with_resets' ``default_init``): every linear layer of
  critics and actor orthogonal with gain √2 and zero bias, except the log-std head (gain 1).

- Temperature: ``log α`` per seed, trained with the actor's optimizer (a parameter group of its
  own) on ``L(α) = α·(H − H̄)``, the entropy ``H = −mean_i log π``.

The agents that use them define their losses per example, as TorchRL's ``reduction="none"``; the
update takes their means, the gradient-rank diagnostics differentiate them example by example.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sac_spectral.agents.config import ActorConfig, CriticConfig
from sac_spectral.agents.steps import Metrics
from sac_spectral.core.nets import BatchedNetwork
from sac_spectral.core.precision import full
from sac_spectral.core.residual import make_network

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
    return full(mean), lo + 0.5 * (hi - lo) * (torch.tanh(full(raw)) + 1.0)


def make_critic(
    members: int, obs_dim: int, act_dim: int, cfg: CriticConfig, generators: list[torch.Generator] | None = None,
    width: int = 1,
) -> BatchedNetwork:
    """``members`` Q-networks ``(obs, action) →`` a head of ``width`` outputs (1: the scalar Q;
    every layer gain √2)."""
    return make_network(cfg.arch, members, obs_dim + act_dim, cfg.hidden, width, cfg.activation, cfg.layer_norm,
                        cfg.init, out_gains=_GAIN, generators=generators)


def tanh_gaussian_actions(cfg: ActorConfig, actor: BatchedNetwork, obs: Tensor, noise: Tensor | None) -> Tensor:
    """SAC's acting (the trainer's and ``load_policy``'s): ``tanh(mean)`` without ``noise``, else the
    tanh-Gaussian sample ``tanh(mean + σ·noise)`` (no log-density)."""
    mean, log_std = actor_mean_log_std(actor, obs, cfg)
    return torch.tanh(mean) if noise is None else torch.tanh(mean + log_std.exp() * noise)


def temperature(seeds: int, init: float, learn: bool) -> nn.Parameter:
    """``log α`` ``[N]``, at ``log init`` (trained where ``learn``)."""
    return nn.Parameter(torch.full((seeds,), math.log(init)), requires_grad=learn)


def actor_groups(actor: BatchedNetwork, log_alpha: nn.Parameter, actor_lr: float,
                 alpha_lr: float) -> list[dict[str, Any]]:
    """The actor optimizer's parameter groups: the actor's, and ``log α`` (no weight decay) where it
    is trained; the two losses touch disjoint parameters, so one Adam equals two."""
    groups: list[dict[str, Any]] = [{"params": list(actor.parameters()), "lr": actor_lr}]
    if log_alpha.requires_grad:
        groups.append({"params": [log_alpha], "lr": alpha_lr, "weight_decay": 0.0})
    return groups


def soft_actor_step(losses: Tensor, logp: Tensor, log_alpha: Tensor, target_entropy: float,
                    learn: bool) -> tuple[Tensor, Metrics]:
    """The actor and temperature step's loss: ``mean_i ℓ_{n,i}`` of the per-example actor losses
    ``[N, B]`` plus (where α is learned) ``α(H − H̄)``, summed over seeds. Metrics: per-seed actor
    and temperature losses and entropy ``[N]``."""
    entropy = -logp.detach().mean(dim=-1)
    actor_loss = losses.mean(dim=-1)
    alpha_loss = log_alpha.exp() * (entropy - target_entropy)
    total = actor_loss.sum() + alpha_loss.sum() if learn else actor_loss.sum()
    return total, {"loss/actor": actor_loss.detach(), "loss/alpha": alpha_loss.detach(), "entropy": entropy}


@torch.no_grad()
def reset_temperature(log_alpha: nn.Parameter, optimizer: torch.optim.Optimizer, init: float) -> None:
    """``log α`` back to ``log init``, its Adam state cleared."""
    log_alpha.fill_(math.log(init))
    optimizer.state.pop(log_alpha, None)
