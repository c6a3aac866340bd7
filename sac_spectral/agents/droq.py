"""Dropout Q-functions (DroQ; Hiraoka, Imagawa, Hashimoto, Onishi & Tsuruoka, "Dropout Q-Functions
for Doubly Efficient Reinforcement Learning", ICLR 2022), member-batched, on SAC's networks, policy
and temperature (:mod:`~sac_spectral.agents.networks`).

- ``M = critic.num_critics`` (2 in the paper) Q-networks and their target copies, each hidden layer
  ``Linear → Dropout(p) → LayerNorm → ReLU`` (``p = droq.dropout``, 0.01 in the paper); the critic
  is an MLP with LayerNorm whatever ``critic.layer_norm`` says (DroQ's critic has it).
- Target on the dropout target critics (Algorithm 2, line 6):
  ``y = r + γ(1 − terminated)·(min_i Q̄_Dr,i(s′, a′) − α log π(a′|s′))``, ``a′ ~ π(·|s′)``.
- Actor (every ``droq.policy_delay``-th update: once per env step at the paper's UTD 20, Algorithm 2
  line 10) on the dropout critics' mean: ``L(φ) = mean_s [α log π(ã|s) − (1/M) Σ_i Q_Dr,i(s, ã)]``;
  the temperature as in SAC. Targets move by Polyak averaging (``τ``) every update.

Dropout is on wherever the authors' code forwards a critic in an update (its networks stay in train
mode): the TD forward, the target's forward and the actor's Q, each with its own masks. Outside an
update (:meth:`q_values`: Q-scale and feature diagnostics) the critic runs without dropout, as torch's
eval mode; evaluation acts with the actor only. The masks are named noise: ``dropout_q`` and
``dropout_target`` per update, ``dropout_actor`` per update with an actor step (every
``policy_delay``-th), each one standard normal ``z`` per (batch row, critic, hidden unit) ``[B, M,
Σ hidden]``; a unit is kept where ``Φ(z) ≥ p`` (probability ``1 − p``) and scaled by ``1/(1 − p)``,
so compiled updates and each seed draw what eager ones and a single-seed run draw.

Run config: ``run_configs/droq.yaml`` (M = 2, p = 0.01, UTD 20).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sac_spectral.agents.actor_critic import ActorCritic, head_target
from sac_spectral.agents.base import register_agent
from sac_spectral.agents.heads import head_width
from sac_spectral.agents.networks import make_critic
from sac_spectral.agents.steps import BATCH, Metrics, Noise
from sac_spectral.core.config import at_least, check, option
from sac_spectral.core.nets import ACTIVATIONS, BatchedMLP, BatchedNetwork
from sac_spectral.core.precision import full
from sac_spectral.core.seeding import SeedStreams

#: the named draws of the dropout masks: the TD forward, the target's forward, the actor's Q
MASKS = ("dropout_q", "dropout_target", "dropout_actor")


@dataclass
class DroQConfig:
    """DroQ's own options (Hiraoka et al. 2022); the critics' number is ``critic.num_critics``."""

    dropout: float = option(0.01, "p: the dropout rate after each hidden linear layer of the critics")
    policy_delay: int = option(20,
                               "actor and temperature step every N updates (the paper: once per env step at UTD 20)")

    def validate(self) -> None:
        check(0 <= self.dropout < 1, "dropout", f"must lie in [0, 1), got {self.dropout}")
        at_least(self, 1, "policy_delay")


def keep_threshold(p: float) -> float:
    """``Φ⁻¹(p)``: a standard normal lies above it with probability ``1 − p``."""
    return statistics.NormalDist().inv_cdf(p) if p > 0 else -math.inf


def dropout_masks(noise: Tensor, p: float, threshold: float, widths: list[int]) -> list[Tensor]:
    """Inverted-dropout masks ``[N·M, B, h]`` per hidden layer of width ``h`` from standard normals
    ``noise [N, B, M, Σ widths]``: ``1/(1 − p)`` where ``z ≥ threshold`` (:func:`keep_threshold`), else 0."""
    n, b, m, _ = noise.shape
    z = noise.permute(0, 2, 1, 3).reshape(n * m, b, -1)
    return [(part >= threshold).to(z.dtype) / (1 - p) for part in z.split(widths, dim=-1)]


@register_agent("droq", config=DroQConfig)
class DroQ(ActorCritic):
    """``len(seeds)`` independent DroQ agents in member-batched networks."""

    sections = ("alpha",)  # SAC's temperature options
    actor_delay = "droq.policy_delay"

    def __init__(self, obs_dim: int, act_dim: int, cfg: Any, streams: SeedStreams,
                 device: str | torch.device = "cpu") -> None:
        super().__init__(obs_dim, act_dim, cfg, streams, device)
        self.widths, self.threshold = list(cfg.critic.hidden), keep_threshold(cfg.droq.dropout)
        self.draws.update(dict.fromkeys(MASKS, (BATCH, self.num_critics, sum(self.widths))))
        self.drawn_with["dropout_actor"] = "actor"

    @classmethod
    def critic_network(cls, members: int, obs_dim: int, act_dim: int, cfg: Any,
                       generators: list[torch.Generator] | None = None) -> BatchedNetwork:
        """SAC's critic with LayerNorm after each hidden linear layer, whatever ``critic.layer_norm`` says."""
        return make_critic(members, obs_dim, act_dim, dataclasses.replace(cfg.critic, layer_norm=True), generators,
                           head_width(cfg.critic))

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        """DroQ's dropout sits between an MLP's hidden linear layers and their LayerNorm."""
        super().check_config(cfg)
        check(cfg.critic.arch == "mlp", "critic.arch", f"must be mlp for agent droq (dropout and LayerNorm after each "
              f"hidden linear layer), got {cfg.critic.arch}")

    # ----------------------------------------------------------------------------- losses
    def dropout_q(self, net: BatchedMLP, obs: Tensor, action: Tensor, noise: Tensor, detach: bool = False) -> Tensor:
        """Head outputs ``[N, M, B, *head.shape]`` (a scalar head: Q-values ``[N, M, B]``) of the critics
        ``net`` with dropout masks from ``noise [N, B, M, Σ h]``: each hidden layer
        ``ReLU(LayerNorm(mask ⊙ (W x + b)))``."""
        n, b = obs.shape[:2]
        x, act = self.critic_inputs(obs, action), ACTIVATIONS[net.activation][0]
        masks = dropout_masks(noise, self.cfg.droq.dropout, self.threshold, self.widths)
        for layer, norm, mask in zip(net.layers, net.norms, masks):
            x = act(norm(layer(x, detach) * mask, detach))
        return full(net.heads[0](x, detach)).view(n, self.num_critics, b, *self.head.shape)

    @torch.no_grad()
    def critic_target(self, batch: Metrics, noise: Noise) -> Tensor:
        """``[N, B]`` target on the minimum of the dropout target critics (masks ``dropout_target``; or
        the critic head's target, :func:`head_target`), next actions by ``noise["next_action"]``."""
        next_obs = batch["next_obs"]
        next_action, next_logp = self.policy(next_obs, noise["next_action"])
        next_out = self.dropout_q(self.target_critic, next_obs, next_action, noise["dropout_target"])
        return head_target(self.head, batch, next_out, self.cfg.gamma, self.log_alpha.exp().unsqueeze(-1) * next_logp)

    def critic_losses(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Tensor]:
        """Per-example TD losses ``(Q_Dr,i(s, a) − y)²`` ``[N, M, B]`` (masks ``dropout_q``) and the Q-values."""
        target = self.critic_target(batch, noise)
        out = self.dropout_q(self.critic, batch["obs"], batch["action"], noise["dropout_q"])
        return self.head.losses(out, target), self.head.expectation(out)

    def actor_losses(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Tensor]:
        """Per-example ``α log π(ã|s) − mean_i Q_Dr,i(s, ã)`` ``[N, B]`` on detached critic weights
        (masks ``dropout_actor``), ``ã`` by ``noise["action"]``, and ``log π``."""
        obs = batch["obs"]
        action, logp = self.policy(obs, noise["action"])
        out = self.dropout_q(self.critic, obs, action, noise["dropout_actor"], detach=True)
        q_pi = self.head.expectation(out).mean(dim=1)
        return self.log_alpha.detach().exp().unsqueeze(-1) * logp - q_pi, logp
