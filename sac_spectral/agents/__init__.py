"""Agents: member-batched Soft Actor-Critic and its replay buffer."""

from sac_spectral.agents.config import ActorConfig, AlphaConfig, CriticConfig, NetConfig, SACConfig
from sac_spectral.agents.networks import tanh_gaussian
from sac_spectral.agents.replay import ReplayBuffer
from sac_spectral.agents.sac import SAC

__all__ = ["SAC", "ActorConfig", "AlphaConfig", "CriticConfig", "NetConfig", "ReplayBuffer", "SACConfig", "tanh_gaussian"]
