"""Environments: ``make_env`` (DMC via shimmy, gymnasium ids), exact state save/restore, seed pools."""

from sac_spectral.envs.episode import run_episode
from sac_spectral.envs.make import (
    ActionRepeat,
    UnknownEnvError,
    known_env_ids,
    make_env,
    resolve_env_id,
)
from sac_spectral.envs.pool import EnvPool, Transition
from sac_spectral.envs.state import get_env_state, set_env_state

__all__ = [
    "ActionRepeat",
    "EnvPool",
    "Transition",
    "UnknownEnvError",
    "get_env_state",
    "known_env_ids",
    "make_env",
    "resolve_env_id",
    "run_episode",
    "set_env_state",
]
