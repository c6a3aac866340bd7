"""The critics' value scale on the policy's own episodes: their mean Q of the actions taken against
the discounted Monte-Carlo return of the same states, and the normalized bias ``(Q − G)/|G|`` (Chen et
al. 2021; :func:`~sac_spectral.envs.evaluate.q_scale`), per seed. ``python -m sac_spectral.diagnose
RUN --q-scale N`` measures it on a saved run, a training run with ``diagnostics.q_scale: N`` at every
task switch and at its end."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch

from sac_spectral.agents import Agent
from sac_spectral.agents.reward_scale import RewardScale
from sac_spectral.core.config import ConfigError
from sac_spectral.envs.evaluate import q_scale


def agent_q_scale(agent: Agent, envs: Sequence[gym.Env], seeds: Sequence[int], step: int | str, episodes: int,
                  gamma: float, reward_scale: RewardScale | None = None) -> dict[str, list[float]]:
    """``q_scale/<name>`` per seed over ``episodes`` deterministic episodes per seed on ``envs`` (one
    per seed, reset with :func:`~sac_spectral.envs.evaluate.eval_seed` of ``step``); Q is the
    critics' mean (a distributional head's expectation) in the env's reward units: with a
    ``reward_scale`` (the run's, whose divided rewards the critics learned) each seed's Q times its
    current divisor. A one-line ``ConfigError`` for an agent without critics."""
    critic, q_values = getattr(agent, "critic", None), getattr(agent, "q_values", None)
    if critic is None or q_values is None:
        raise ConfigError(f"the value scale needs an agent with critics and q_values; '{agent.name}' has none")
    device = next(agent.parameters()).device
    unit = np.ones(len(seeds)) if reward_scale is None else reward_scale.divisor().numpy()

    def policy(obs: np.ndarray) -> np.ndarray:
        return agent.act(torch.as_tensor(obs, dtype=torch.float32, device=device), deterministic=True).cpu().numpy()

    @torch.inference_mode()
    def q_fn(obs: np.ndarray, action: np.ndarray) -> np.ndarray:
        o = torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(1)
        a = torch.as_tensor(action, dtype=torch.float32, device=device).unsqueeze(1)
        return q_values(critic, o, a).mean(dim=(1, 2)).cpu().numpy() * unit

    values = q_scale(policy, q_fn, envs, seeds, step, episodes, gamma)
    return {f"q_scale/{key}": value.tolist() for key, value in values.items()}
