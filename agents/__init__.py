"""Agents: member-batched Soft Actor-Critic and its replay buffer."""

from agents.replay import ReplayBuffer
from agents.sac import SAC, ActorConfig, AlphaConfig, CriticConfig, NetConfig, SACConfig, tanh_gaussian

__all__ = ["SAC", "ActorConfig", "AlphaConfig", "CriticConfig", "NetConfig", "ReplayBuffer", "SACConfig", "tanh_gaussian"]
