"""The dry run's cost of an RL trial (:attr:`RunKind.cost <sac_spectral.runs.kinds.RunKind>` of
``train``): its updates times the measured time of one, plus its env steps (training and
evaluation) times the measured time of one env step, both timed here through the public API."""

from __future__ import annotations

import copy
from dataclasses import fields
from typing import Any

import torch

from sac_spectral.agents import ReplayBuffer, SACConfig, build_agent
from sac_spectral.apps.rl.compile_choice import auto_compile
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core.config import ConfigError, one_line, to_dict
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.envs import make_env

#: run keys besides the actor-critic ones (SACConfig) that change what one update costs
UPDATE_KEYS = ("agent", "batch_size", "num_seeds", "device")


def update_key(cfg: TrainConfig, obs_dim: int, act_dim: int) -> list[Any]:
    """What the measured time of one update depends on: the shapes, every field of the resolved
    agent config (the agent, its own section, precision, compile, networks, regularizers, …), the
    batch, members and device."""
    resolved = to_dict(cfg)
    names = [f.name for f in fields(SACConfig)] + list(UPDATE_KEYS) + ([cfg.agent] if cfg.agent in resolved else [])
    return ["update", obs_dim, act_dim, {k: resolved[k] for k in names}]


def _built_env(cfg: TrainConfig) -> Any:
    """The trial's env, built here to time its steps; an id gymnasium registers but cannot build
    (a missing package, a stale entry point) is a one-line error naming the exception."""
    try:
        return make_env(cfg.env, 0, cfg.action_repeat)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever an env's constructor raises, said in one line
        raise ConfigError(f"env: '{cfg.env}' cannot be built here ({type(err).__name__}: {one_line(err)})") from None


def estimate_cost(cfg: TrainConfig, model: Any) -> tuple[int, float]:
    """``(updates, seconds)`` of a run of ``cfg``; ``model`` (a
    :class:`~sac_spectral.studies.cost.CostModel`) measures and caches the timings."""
    if cfg.compile == "auto":  # timed as the run will train: compiled or eager
        cfg = copy.copy(cfg)
        cfg.compile = auto_compile(cfg, torch.device(cfg.device))[0]
    env = _built_env(cfg)
    obs_dim, act_dim = int(env.observation_space.shape[0]), int(env.action_space.shape[0])
    torch.set_num_threads(model.threads)

    def update_time() -> float:
        agent = build_agent(obs_dim, act_dim, cfg, SeedStreams(list(range(cfg.num_seeds)), cfg.device), cfg.device)
        buf = ReplayBuffer(4 * cfg.batch_size, obs_dim, act_dim, cfg.num_seeds, cfg.device, cfg.reward_scaling())
        m = cfg.num_seeds
        for _ in range(4 * cfg.batch_size):
            buf.add(torch.randn(m, obs_dim), torch.rand(m, act_dim) * 2 - 1, torch.randn(m), torch.randn(m, obs_dim),
                    torch.zeros(m))
        agent.train_steps(buf, 2, cfg.batch_size)
        return model.measure(lambda: agent.train_steps(buf, 4, cfg.batch_size)) / 4

    def env_step_time() -> float:
        env.reset(seed=0)

        def steps() -> None:
            for _ in range(100):
                if any(env.step(env.action_space.sample())[2:4]):
                    env.reset()

        return model.measure(steps) / 100

    t_update = model.cached(update_key(cfg, obs_dim, act_dim), update_time)
    t_env = model.cached(["env", cfg.env, cfg.action_repeat], env_step_time)
    evals = 1 + (cfg.total_steps // cfg.eval_every + bool(cfg.total_steps % cfg.eval_every) if cfg.eval_every else 1)
    if cfg.tasks:  # every task at each switch and at the end
        evals += len(cfg.tasks) * len(cfg.tasks) * cfg.cycles
    episode = (env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else 1000)
    env_steps = cfg.num_seeds * (cfg.total_steps + evals * cfg.eval_episodes * episode)
    updates = cfg.total_updates
    return updates, updates * t_update + env_steps * t_env
