"""``make_env(env_id, seed)``: DMC tasks through shimmy and gymnasium ids, as flat float32
observations and actions in [-1, 1].

Accepted ids: ``dmc:<domain>-<task>`` (short form, e.g. ``dmc:cheetah-run``), the shimmy id
``dm_control/<domain>-<task>-v0``, and any registered gymnasium id with a Box action space
(``HalfCheetah-v5`` needs the ``mujoco`` extra). DMC's 1000-step limit is reported as
``truncated`` (the critic bootstraps through it); only a true task end is ``terminated``.
"""

from __future__ import annotations

import difflib
import os
import warnings
from functools import lru_cache

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import DtypeObservation, FlattenObservation, RescaleAction

from sac_spectral.core.config import one_line

DMC_PREFIX = "dmc:"
SHIMMY_PREFIX = "dm_control/"


class UnknownEnvError(ValueError):
    """An environment id that no registry knows, or whose registered entry point fails to build."""


class ActionRepeat(gym.Wrapper):
    """Repeat each action ``repeat`` times, summing rewards; stop early when the episode ends."""

    def __init__(self, env: gym.Env, repeat: int) -> None:
        super().__init__(env)
        if repeat < 1:
            raise ValueError(f"action_repeat must be >= 1, got {repeat}")
        self.repeat = repeat

    def step(self, action):  # type: ignore[override]
        total = 0.0
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


def _register_dmc() -> None:
    os.environ.setdefault("MUJOCO_GL", "disable")  # no rendering here; set MUJOCO_GL=egl to render
    import shimmy
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)

    gym.register_envs(shimmy)


@lru_cache(maxsize=1)
def _dmc_suite_ids() -> tuple[str, ...]:
    from dm_control import suite

    return tuple(f"{DMC_PREFIX}{d}-{t}" for d, t in suite.ALL_TASKS)


def known_env_ids() -> list[str]:
    """Short DMC ids plus every gymnasium-registered id."""
    _register_dmc()
    return list(_dmc_suite_ids()) + sorted(gym.registry)


def resolve_env_id(env_id: str) -> str:
    """Map ``dmc:domain-task`` to its shimmy id; check that the id exists."""
    _register_dmc()
    gym_id = env_id
    if env_id.startswith(DMC_PREFIX):
        gym_id = f"{SHIMMY_PREFIX}{env_id[len(DMC_PREFIX):]}-v0"
    if gym_id not in gym.registry:
        close = difflib.get_close_matches(env_id, known_env_ids(), n=5, cutoff=0.5)
        hint = f"; close matches: {', '.join(close)}" if close else "; DMC tasks look like dmc:cheetah-run"
        raise UnknownEnvError(f"unknown environment '{env_id}'{hint}")
    return gym_id


def reward_bound(env_id: str) -> float | None:
    """The largest absolute reward of one simulator step, where the id says it: 1 for DMC tasks
    (rewards in [0, 1]); ``None`` for others (gymnasium declares no reward range)."""
    return 1.0 if env_id.startswith((DMC_PREFIX, SHIMMY_PREFIX)) else None


def make_env(env_id: str, seed: int, action_repeat: int = 1) -> gym.Env:
    """Build a seeded env with flat float32 observations and actions rescaled to [-1, 1]."""
    gym_id = resolve_env_id(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            env = gym.make(gym_id, disable_env_checker=True)
        except gym.error.DependencyNotInstalled as err:
            raise UnknownEnvError(f"environment '{env_id}' needs an extra: {err} "
                                  "(pip install -e '.[mujoco]')") from None
        except Exception as err:  # noqa: BLE001 - a registered id whose entry point fails in any way
            raise UnknownEnvError(f"environment '{env_id}' is registered but cannot be built here "
                                  f"({type(err).__name__}: {one_line(err)})") from None
        if not isinstance(env.action_space, spaces.Box):
            raise UnknownEnvError(
                f"environment '{env_id}' has a {type(env.action_space).__name__} action space; SAC needs a continuous "
                "Box"
            )
        if not isinstance(env.observation_space, spaces.Box) or len(env.observation_space.shape) != 1:
            env = FlattenObservation(env)
        if env.observation_space.dtype != np.float32:
            env = DtypeObservation(env, np.float32)
        low, high = env.action_space.low, env.action_space.high
        if not (np.all(low == -1.0) and np.all(high == 1.0)):
            env = RescaleAction(env, -1.0, 1.0)
    if action_repeat != 1:
        env = ActionRepeat(env, action_repeat)
    env.action_space.seed(seed)
    env.reset(seed=seed)
    return env
