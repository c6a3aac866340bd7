"""Agents: the agent protocol and registry, member-batched SAC and TD3, and the replay buffer."""

from sac_spectral.agents.base import AGENTS, ActorCritic, Agent, agent_class, build_agent, register_agent
from sac_spectral.agents.config import ActorConfig, AlphaConfig, CriticConfig, NetConfig, SACConfig
from sac_spectral.agents.networks import tanh_gaussian
from sac_spectral.agents.replay import ReplayBuffer
from sac_spectral.agents.sac import SAC
from sac_spectral.agents.td3 import TD3

__all__ = [
    "AGENTS", "SAC", "ActorConfig", "ActorCritic", "Agent", "AlphaConfig", "CriticConfig", "NetConfig", "ReplayBuffer",
    "SACConfig", "TD3", "agent_class", "build_agent", "register_agent", "tanh_gaussian",
]
