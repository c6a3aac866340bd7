"""Task sequences for continual RL: the stages of a run, what each changes, and its envs.

A sequence is a list of tasks (``{env, dynamics, permute_obs, permute_actions, name}``) repeated
``cycles`` times; each repetition of a task is one **stage** of ``steps_per_task`` env steps. A
stage can change

- ``env``: another task of the same domain (the shapes must match);
- ``dynamics``: factors on the simulator's sliding ``friction``, body ``mass`` (and inertia),
  ``gravity`` and actuator ``gear``, each a number or a ``[low, high]`` range drawn log-uniformly
  per stage (Dohare et al. 2024's slippery ant changes friction this way);
- ``permute_obs`` / ``permute_actions``: a fixed permutation of the observation, and a permutation
  with sign flips of the action, drawn per stage (the RL analogue of permuted MNIST).

Everything a stage draws comes from ``derive_seed(seed, "stage/<k>")``, per run seed: seed *i* of
a multi-seed run draws what a single-seed run with ``seed=i`` draws, and a resumed run rebuilds
the same stage. Factors multiply the model's own values (MuJoCo's ``MjModel`` of a DMC task or a
gymnasium MuJoCo env), set once when the stage's env is built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sac_spectral.core.seeding import derive_seed
from sac_spectral.envs.make import DMC_PREFIX, make_env

#: what ``dynamics`` may scale
DYNAMICS = ("friction", "mass", "gravity", "gear")
TASK_KEYS = ("env", "name", "dynamics", "permute_obs", "permute_actions")
#: the most stages (tasks × cycles) a sequence may have
MAX_STAGES = 10_000


class TaskError(ValueError):
    """A task list that cannot be run, in one line."""


@dataclass(frozen=True)
class Task:
    """One entry of the sequence; ``dynamics`` maps a :data:`DYNAMICS` name to a factor or a range."""

    env: str
    name: str
    dynamics: Mapping[str, float | tuple[float, float]] = field(default_factory=dict)
    permute_obs: bool = False
    permute_actions: bool = False

    @property
    def changes_env(self) -> bool:
        """Whether the stage's env differs from ``make_env(env)`` (dynamics or permutations)."""
        return bool(self.dynamics) or self.permute_obs or self.permute_actions


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and math.isfinite(value)


def _factor(value: Any, where: str) -> float | tuple[float, float]:
    if _positive(value):
        return float(value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(map(_positive, value)) and value[0] <= value[1]:
        return (float(value[0]), float(value[1]))
    raise TaskError(f"{where}: expected a finite factor > 0 or a range [low, high] with 0 < low <= high < inf, got "
                    f"{value!r}")


def describe_dynamics(dynamics: Mapping[str, float | tuple[float, float]]) -> str:
    """``gravity=2, friction=[0.5, 2]``, or ``unchanged``."""
    return ", ".join(f"{k}=[{v[0]:g}, {v[1]:g}]" if isinstance(v, tuple) else f"{k}={v:g}"
                     for k, v in dynamics.items()) or "unchanged"


def physics_errors() -> tuple[type[Exception], ...]:
    """What a simulator raises when its state blows up (dm_control's ``PhysicsError``; a
    gymnasium MuJoCo env returns non-finite observations instead)."""
    from dm_control.rl.control import PhysicsError

    return (PhysicsError,)


def parse_tasks(raw: Sequence[Any], default_env: str) -> list[Task]:
    """The tasks of a config's ``tasks`` list, every key and value checked; names default to
    ``<index>-<domain>-<task>`` and must be unique."""
    tasks = []
    for i, entry in enumerate(raw):
        where = f"tasks[{i}]"
        if not isinstance(entry, Mapping):
            raise TaskError(f"{where}: expected a mapping such as {{env: dmc:walker-walk}}, got {entry!r}")
        unknown = [k for k in entry if k not in TASK_KEYS]
        if unknown:
            raise TaskError(f"{where}: unknown key '{unknown[0]}'; valid keys: {', '.join(TASK_KEYS)}")
        env = entry.get("env", default_env)
        dyn = entry.get("dynamics") or {}
        if not isinstance(env, str) or not isinstance(dyn, Mapping):
            raise TaskError(f"{where}: env must be an id and dynamics a mapping, got {env!r} and {dyn!r}")
        for key in dyn:
            if key not in DYNAMICS:
                raise TaskError(f"{where}.dynamics: unknown '{key}'; valid: {', '.join(DYNAMICS)}")
        flags = {k: entry.get(k, False) for k in ("permute_obs", "permute_actions")}
        for k, v in flags.items():
            if not isinstance(v, bool):
                raise TaskError(f"{where}.{k}: expected true or false, got {v!r}")
        name = entry.get("name", f"{i}-{env.removeprefix(DMC_PREFIX).replace('/', '-')}")
        if not isinstance(name, str) or not name or any(c in name for c in ",\n\""):
            raise TaskError(f"{where}.name: expected a non-empty name without commas or quotes, got {name!r}")
        tasks.append(Task(env, name, {k: _factor(v, f"{where}.dynamics.{k}") for k, v in dyn.items()}, **flags))
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise TaskError(f"tasks: names must be unique, got {', '.join(names)}")
    return tasks


@dataclass(frozen=True)
class Stage:
    """Stage ``index`` of a sequence: cycle ``cycle`` of task ``task`` (its index in the list)."""

    index: int
    cycle: int
    task: int
    spec: Task


def owed(step: int, random_steps: int, replay_ratio: float) -> int:
    """Updates the replay ratio owes after ``step`` env steps, ``random_steps`` of them warm-up."""
    return math.floor(max(0, step - random_steps) * replay_ratio + 1e-9)


@lru_cache(maxsize=8)
def rewarm_totals(random_steps: int, replay_ratio: float, steps_per_task: int, stages: int) -> tuple[int, ...]:
    """``totals[k]``: the updates :func:`owed` counts in the warm-ups of stages 1 … k of a sequence
    whose switches clear the buffer (which those stages do not run)."""
    window, totals = min(random_steps, steps_per_task), [0]
    for k in range(1, stages):
        start = k * steps_per_task
        totals.append(totals[-1] + owed(start + window, random_steps, replay_ratio)
                      - owed(start, random_steps, replay_ratio))
    return tuple(totals)


class TaskSequence:
    """The stages of ``tasks`` × ``cycles``, ``steps_per_task`` env steps each, built when asked
    for. A plain run is the sequence of its one env, one stage of all its steps.

    Its schedule of updates: ``random_steps`` uniform-random warm-up steps begin the run and, where
    ``rewarm`` (a switch clears the buffer), every later stage; after them the replay ratio owes
    ``replay_ratio`` updates per env step."""

    def __init__(self, tasks: Sequence[Task], steps_per_task: int, cycles: int = 1, random_steps: int = 0,
                 replay_ratio: float = 1.0, rewarm: bool = False) -> None:
        self.tasks, self.steps_per_task, self.cycles = list(tasks), steps_per_task, cycles
        self.random_steps, self.replay_ratio, self.rewarm = random_steps, replay_ratio, rewarm

    def __len__(self) -> int:
        return len(self.tasks) * self.cycles

    def stage(self, index: int) -> Stage:
        """Stage ``index`` (0-based)."""
        cycle, task = divmod(index, len(self.tasks))
        return Stage(index, cycle, task, self.tasks[task])

    @property
    def total_steps(self) -> int:
        return len(self) * self.steps_per_task

    def stage_at(self, step: int) -> Stage:
        """The stage whose env acts at env step ``step`` (0-based; the last stage after the end)."""
        return self.stage(min(step // self.steps_per_task, len(self) - 1))

    def ending(self, step: int) -> Stage:
        """The stage that env step ``step`` (the count of steps taken) ends or is in: the one its
        last action, step ``step − 1``, acted in."""
        return self.stage_at(max(step - 1, 0))

    def warmup_end(self, stage: int) -> int:
        """The env step up to which stage ``stage`` acts uniformly at random without updates:
        ``random_steps`` into the run, and into each stage that starts from a cleared buffer."""
        return stage * self.steps_per_task * (stage > 0 and self.rewarm) + self.random_steps

    def updates_by(self, step: int) -> int:
        """Updates the replay ratio owes after ``step`` env steps (priming's are extra), less those of
        the warm-ups of the stages after a cleared buffer."""
        done = owed(step, self.random_steps, self.replay_ratio)
        if not self.rewarm or step <= self.steps_per_task:
            return done
        stage = self.ending(step).index
        start, window = stage * self.steps_per_task, min(self.random_steps, self.steps_per_task)
        earlier = rewarm_totals(self.random_steps, self.replay_ratio, self.steps_per_task, len(self))[stage - 1]
        return (done - earlier - owed(min(step, start + window), self.random_steps, self.replay_ratio)
                + owed(start, self.random_steps, self.replay_ratio))

    def is_switch(self, step: int) -> bool:
        """Whether env step ``step`` ends a stage that another follows."""
        return 0 < step < self.total_steps and step % self.steps_per_task == 0

    def latest(self, task: int, step: int) -> Stage:
        """The last stage of ``task`` begun by ``step`` (its first stage if none has begun): the one
        an evaluation of that task plays."""
        begun = min(step // self.steps_per_task, len(self) - 1)  # the last stage begun
        cycle = (begun - task) // len(self.tasks)
        return self.stage(max(cycle, 0) * len(self.tasks) + task)


@dataclass(frozen=True)
class Draw:
    """What a stage drew for one seed: observation permutation, action permutation and signs, and
    the dynamics factors."""

    obs_perm: np.ndarray | None
    act_perm: np.ndarray | None
    act_sign: np.ndarray | None
    factors: Mapping[str, float]


def draw(stage: Stage, seed: int, obs_dim: int, act_dim: int) -> Draw:
    """Stage ``stage``'s draws for run seed ``seed``."""
    rng = np.random.default_rng(derive_seed(seed, f"stage/{stage.index}"))
    spec = stage.spec
    factors = {}
    for key in DYNAMICS:  # a fixed order: each draw is independent of which others are given
        value = spec.dynamics.get(key)
        u = rng.uniform()
        if isinstance(value, tuple):
            factors[key] = float(math.exp(math.log(value[0]) + u * (math.log(value[1]) - math.log(value[0]))))
        elif value is not None:
            factors[key] = value
    obs_perm = rng.permutation(obs_dim) if spec.permute_obs else None
    act_perm = rng.permutation(act_dim) if spec.permute_actions else None
    act_sign = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), act_dim) if spec.permute_actions else None
    return Draw(obs_perm, act_perm, act_sign, factors)


def mujoco_model(env: gym.Env) -> Any:
    """The ``MjModel`` under a DMC (shimmy) or gymnasium MuJoCo env, or None."""
    base = env.unwrapped
    dm_env = getattr(base, "_env", None)
    if dm_env is not None and hasattr(dm_env, "physics"):
        return dm_env.physics.model.ptr
    return getattr(base, "model", None)


def apply_dynamics(env: gym.Env, factors: Mapping[str, float]) -> None:
    """Multiply the env's friction, masses, gravity and gear by ``factors``."""
    if not factors:
        return
    model = mujoco_model(env)
    if model is None:
        raise TaskError(f"dynamics {dict(factors)} need a MuJoCo env (DMC or gymnasium MuJoCo), not "
                        f"{env.spec.id if env.spec else env}")
    for key, f in factors.items():
        if key == "friction":
            model.geom_friction[:, 0] *= f
        elif key == "mass":
            model.body_mass[:] *= f
            model.body_inertia[:] *= f
        elif key == "gravity":
            model.opt.gravity[:] *= f
        else:
            model.actuator_gear[:, 0] *= f


class Permuted(gym.Wrapper):
    """Observations ``obs[obs_perm]``; the agent's action ``a`` acts as ``act_sign * a[act_perm]``."""

    def __init__(self, env: gym.Env, d: Draw) -> None:
        super().__init__(env)
        self.d = d

    def _obs(self, obs: np.ndarray) -> np.ndarray:
        return obs if self.d.obs_perm is None else obs[self.d.obs_perm]

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return self._obs(obs), info

    def step(self, action: np.ndarray):  # type: ignore[override]
        if self.d.act_perm is not None:
            action = self.d.act_sign * np.asarray(action)[self.d.act_perm]
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._obs(obs), reward, terminated, truncated, info


def stage_env(stage: Stage, seed: int, env_seed: int, action_repeat: int = 1) -> gym.Env:
    """The env of ``stage`` for run seed ``seed``, built and reset with ``env_seed``: exactly
    ``make_env`` where the stage changes nothing."""
    spec = stage.spec
    env = make_env(spec.env, env_seed, action_repeat)
    if not spec.changes_env:
        return env
    assert isinstance(env.observation_space, spaces.Box) and isinstance(env.action_space, spaces.Box)
    d = draw(stage, seed, env.observation_space.shape[0], env.action_space.shape[0])
    apply_dynamics(env, d.factors)
    if spec.permute_obs or spec.permute_actions:
        env = Permuted(env, d)
    env.reset(seed=env_seed)
    return env
