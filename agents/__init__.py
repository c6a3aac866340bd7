"""Agents: member-batched Soft Actor-Critic and its replay buffer."""

# First, before torch loads libgomp: importing sac_spectral sets OpenMP's spin-wait (sac_spectral/__init__.py).
import sac_spectral  # noqa: F401, I001
from agents.config import ActorConfig, AlphaConfig, CriticConfig, NetConfig, SACConfig
from agents.networks import tanh_gaussian
from agents.replay import ReplayBuffer
from agents.sac import SAC

__all__ = ["SAC", "ActorConfig", "AlphaConfig", "CriticConfig", "NetConfig", "ReplayBuffer", "SACConfig", "tanh_gaussian"]
