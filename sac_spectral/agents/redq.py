"""Randomized Ensembled Double Q-learning (REDQ; Chen, Wang, Zhou & Ross, "Randomized Ensembled
Double Q-Learning: Learning Fast Without a Model", ICLR 2021), member-batched, on SAC's networks,
policy and temperature (:mod:`~sac_spectral.agents.networks`).

- An ensemble of ``N = critic.num_critics`` Q-networks (10 in the paper) with target copies.
- Target with a random subset ``𝓜`` of ``M = redq.num_min`` (2) of them, drawn anew every update:
  ``y = r + γ(1 − terminated)·(min_{i∈𝓜} Q̄_i(s′, ã′) − α log π(ã′|s′))``, ``ã′ ~ π(·|s′)``; every
  critic regresses onto the same ``y``. Targets move by Polyak averaging (``τ``) every update.
- The actor (every ``redq.policy_delay``-th update) on the ensemble's mean:
  ``L(φ) = mean_i [α log π(ã_i|s_i) − (1/N) Σ_j Q_j(s_i, ã_i)]``; the temperature as in SAC.
- Update-to-data ratio ``G`` (20 in the paper) is the run's ``replay_ratio``; with
  ``policy_delay = G`` the actor takes one step per env step, after that step's last critic
  update, as the authors' code does.

The subset of each seed and update comes from the update's noise: besides SAC's draws, ``N``
standard normals (``subset``), whose ranks are a uniformly random permutation (the first ``M`` of
it are the subset), so compiled updates draw exactly what eager ones draw.
Steps are sequential (critic step, Polyak step, then actor and temperature on the updated
critics), as this package's SAC; the authors' code forms the actor's loss before the critics' step.

Run config: ``run_configs/redq.yaml`` (N = 10, M = 2, UTD 20, target entropy −|A|).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sac_spectral.agents.actor_critic import ActorCritic, head_target
from sac_spectral.agents.base import register_agent
from sac_spectral.agents.steps import Metrics, Noise
from sac_spectral.core.config import at_least, check, option
from sac_spectral.core.seeding import SeedStreams


@dataclass
class REDQConfig:
    """REDQ's own options (Chen et al. 2021); the ensemble's size is ``critic.num_critics``."""

    num_min: int = option(2, "M: critics in the random subset whose minimum forms the target")
    policy_delay: int = option(20,
                               "actor and temperature step every N updates (the paper: once per env step at UTD 20)")

    def validate(self) -> None:
        at_least(self, 1, "num_min", "policy_delay")


def random_subset(noise: Tensor, size: int, of: int) -> Tensor:
    """``[N, size]`` indices of a uniformly random subset of ``range(of)`` per seed, from standard
    normals ``noise [N, ...]`` (their first ``of`` values' ranks)."""
    return noise.flatten(1)[:, :of].argsort(dim=1)[:, :size]


@register_agent("redq", config=REDQConfig)
class REDQ(ActorCritic):
    """``len(seeds)`` independent REDQ agents in member-batched networks."""

    sections = ("alpha",)  # SAC's temperature options
    actor_delay = "redq.policy_delay"

    def __init__(self, obs_dim: int, act_dim: int, cfg: Any, streams: SeedStreams,
                 device: str | torch.device = "cpu") -> None:
        super().__init__(obs_dim, act_dim, cfg, streams, device)
        self.draws["subset"] = (self.num_critics,)

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        """The subset of ``redq.num_min`` critics is drawn from the ``critic.num_critics`` of the ensemble."""
        super().check_config(cfg)
        n, m = cfg.critic.num_critics, cfg.redq.num_min
        check(m <= n, "redq.num_min",
              f"must be <= critic.num_critics ({n}): the target's subset is drawn from the ensemble, got {m}")

    # ----------------------------------------------------------------------------- losses
    @torch.no_grad()
    def critic_target(self, batch: Metrics, noise: Tensor, subset: Tensor) -> Tensor:
        """``[N, B]`` target on the minimum of the target critics in ``subset`` ``[N, M]`` (or the critic
        head's target of them, :func:`head_target`), next actions by ``noise [N, B, A]``."""
        next_obs = batch["next_obs"]
        next_action, next_logp = self.policy(next_obs, noise)
        next_out = self.critic_outputs(self.target_critic, next_obs, next_action)
        index = subset.view(*subset.shape, *(1,) * (next_out.dim() - 2)).expand(-1, -1, *next_out.shape[2:])
        return head_target(self.head, batch, next_out.gather(1, index), self.cfg.gamma,
                           self.log_alpha.exp().unsqueeze(-1) * next_logp)

    def critic_losses(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Tensor]:
        """Per-example TD losses ``[N, C, B]`` of every critic against the target of this update's
        subset (drawn from ``noise["subset"]``), and the Q-values."""
        subset = random_subset(noise["subset"], self.cfg.redq.num_min, self.num_critics)
        target = self.critic_target(batch, noise["next_action"], subset)
        out = self.critic_outputs(self.critic, batch["obs"], batch["action"])
        return self.head.losses(out, target), self.head.expectation(out)

    def actor_losses(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Tensor]:
        """Per-example ``α log π(ã_i|s_i) − mean_j Q_j(s_i, ã_i)`` ``[N, B]`` on detached critic
        weights, with ``ã_i`` by ``noise["action"]``, and ``log π``."""
        obs = batch["obs"]
        action, logp = self.policy(obs, noise["action"])
        q_pi = self.q_values(self.critic, obs, action, detach=True).mean(dim=1)
        return self.log_alpha.detach().exp().unsqueeze(-1) * logp - q_pi, logp
