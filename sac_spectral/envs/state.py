"""Exact save and restore of an environment's mid-episode state, as tensors and plain values.

Checkpoints must resume bit-identically, so the simulator state is saved with
``mujoco.mj_getState(..., mjSTATE_INTEGRATION)`` (positions, velocities, warm-start
accelerations, time, controls, …) and restored with ``mj_setState`` followed by ``mj_forward``,
together with the episode step counter and the task's random state. Supported: DMC tasks
(through shimmy) and gymnasium MuJoCo envs. For other envs :func:`get_env_state` returns ``None``
and a resumed run starts a new episode instead.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.wrappers import TimeLimit


def _random_state_to_dict(rs: np.random.RandomState) -> dict[str, Any]:
    name, keys, pos, has_gauss, gauss = rs.get_state()
    return {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "gauss": float(gauss)}


def _random_state_from_dict(rs: np.random.RandomState, d: dict[str, Any]) -> None:
    rs.set_state((d["name"], d["keys"].numpy().astype(np.uint32), d["pos"], d["has_gauss"], d["gauss"]))


def _physics_state(model: Any, data: Any) -> torch.Tensor:
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    out = np.empty(mujoco.mj_stateSize(model, spec))
    mujoco.mj_getState(model, data, out, spec)
    return torch.from_numpy(out)


def _set_physics_state(model: Any, data: Any, state: torch.Tensor) -> None:
    import mujoco

    mujoco.mj_setState(model, data, state.numpy(), mujoco.mjtState.mjSTATE_INTEGRATION)
    mujoco.mj_forward(model, data)


def _time_limit(env: gym.Env) -> TimeLimit | None:
    e: Any = env
    while isinstance(e, gym.Wrapper):
        if isinstance(e, TimeLimit):
            return e
        e = e.env
    return None


def get_env_state(env: gym.Env) -> dict[str, Any] | None:
    """Everything needed to continue ``env`` exactly, or ``None`` if unsupported."""
    base = env.unwrapped
    limit = _time_limit(env)
    elapsed = getattr(limit, "_elapsed_steps", None) if limit is not None else None
    dm_env = getattr(base, "_env", None)
    if dm_env is not None and hasattr(dm_env, "physics") and hasattr(dm_env, "_task"):
        ph = dm_env.physics
        return {
            "kind": "dm_control",
            "physics": _physics_state(ph.model.ptr, ph.data.ptr),
            "step_count": int(dm_env._step_count),
            "reset_next_step": bool(dm_env._reset_next_step),
            "task_random": _random_state_to_dict(dm_env._task._random),
            "elapsed": elapsed,
        }
    if hasattr(base, "model") and hasattr(base, "data") and hasattr(base, "np_random"):
        return {
            "kind": "mujoco",
            "physics": _physics_state(base.model, base.data),
            "np_random": base.np_random.bit_generator.state,
            "elapsed": elapsed,
        }
    return None


def set_env_state(env: gym.Env, state: dict[str, Any]) -> None:
    """Restore a state captured by :func:`get_env_state` on an env built with the same id."""
    base = env.unwrapped
    limit = _time_limit(env)
    if limit is not None and state["elapsed"] is not None:
        limit._elapsed_steps = state["elapsed"]
    if state["kind"] == "dm_control":
        dm_env = base._env
        ph = dm_env.physics
        _set_physics_state(ph.model.ptr, ph.data.ptr, state["physics"])
        dm_env._step_count = state["step_count"]
        dm_env._reset_next_step = state["reset_next_step"]
        _random_state_from_dict(dm_env._task._random, state["task_random"])
    elif state["kind"] == "mujoco":
        _set_physics_state(base.model, base.data, state["physics"])
        base.np_random.bit_generator.state = state["np_random"]
    else:
        raise ValueError(f"unknown env state kind '{state['kind']}'")
