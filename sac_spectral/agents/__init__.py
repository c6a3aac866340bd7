"""Agents: the agent protocol and registry, the update engine, member-batched SAC, TD3, REDQ,
CrossQ and DroQ, and the replay buffer."""

# SAC first: the default agent is the first registered, so the first listed (--help, refusals)
from sac_spectral.agents.sac import SAC, AlphaConfig  # isort: skip
from sac_spectral.agents.actor_critic import ActorCritic
from sac_spectral.agents.base import AGENTS, Agent, agent_class, build_agent, register_agent
from sac_spectral.agents.config import ActorConfig, CriticConfig, NetConfig, SACConfig
from sac_spectral.agents.crossq import CrossQ
from sac_spectral.agents.droq import DroQ
from sac_spectral.agents.engine import Engine, Trained
from sac_spectral.agents.networks import tanh_gaussian
from sac_spectral.agents.redq import REDQ
from sac_spectral.agents.replay import ReplayBuffer
from sac_spectral.agents.steps import NetStep
from sac_spectral.agents.td3 import TD3

__all__ = [
    "AGENTS", "SAC", "ActorConfig", "ActorCritic", "Agent", "AlphaConfig", "CriticConfig", "CrossQ", "DroQ", "Engine",
    "NetConfig", "NetStep", "REDQ", "ReplayBuffer", "SACConfig", "TD3", "Trained", "agent_class", "build_agent",
    "register_agent", "tanh_gaussian",
]
