"""A trained policy, loaded from a run of ``sac_spectral.train``: ``load_policy(RUN_DIR)``.

It reads the actor's weights and the config from the checkpoint (``weights_only=True``, the file
memory-mapped, so the replay buffer is never read into memory) and acts as the trainer's
evaluation does: ``tanh(mean)`` deterministically, or a sample of the tanh-Gaussian. Its
:meth:`Policy.make_env` builds the env as the trainer's evaluation does, so playing the episodes
of an evaluation (reset seeds :func:`~sac_spectral.envs.evaluate.eval_seed`) gives the returns recorded
in ``evals.csv``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from sac_spectral.agents.config import TrainConfig
from sac_spectral.agents.networks import actor_mean_log_std, make_actor
from sac_spectral.envs import UnknownEnvError, make_env, run_episode
from sac_spectral.envs.evaluate import eval_seed
from sac_spectral.core.config import ConfigError, merge_sources, one_line
from sac_spectral.core.seeding import derive_seed
from sac_spectral.rl_run import check_format
from sac_spectral.runs.checkpoint import CheckpointError, load_checkpoint
from sac_spectral.runs.layout import CHECKPOINT, run_kind

_ACTOR = "actor."


def checkpoint_path(run_dir_or_checkpoint: str | Path) -> Path:
    """``RUN_DIR/checkpoints/latest.pt`` for a run directory, the path itself for a file."""
    path = Path(run_dir_or_checkpoint)
    if path.is_dir():
        ckpt = path / CHECKPOINT
        if not ckpt.is_file():
            raise CheckpointError(f"{path} holds no checkpoint ({CHECKPOINT} is missing): not a run directory, "
                                  "or a run stopped before its first checkpoint")
        return ckpt
    if not path.exists():
        raise CheckpointError(f"no such run directory or checkpoint: {path}")
    return path


@dataclass
class Recorded:
    """The run's last evaluation, when the checkpoint holds the weights it scored."""

    evaluation: int  # its number (the ``evaluation`` argument of eval_seed)
    step: int
    episodes: int
    mean_return: float  # over its episodes, of this policy's seed

    def reset_seeds(self, seed: int) -> list[int]:
        return [eval_seed(seed, self.evaluation, ep) for ep in range(self.episodes)]


class Policy:
    """Seed ``seed_index`` of a trained run: ``act(obs)`` for one observation ``[obs_dim]`` or a
    batch ``[B, obs_dim]``; actions lie in ``action_space`` (``[-1, 1]``, as :func:`sac_spectral.envs.make_env`
    rescales them)."""

    def __init__(self, cfg: TrainConfig, actor_state: dict[str, torch.Tensor], seed_index: int,
                 device: str | torch.device = "cpu", step: int = 0, recorded: Recorded | None = None,
                 source: Path | None = None) -> None:
        weight = actor_state["layers.0.weight"]
        self.cfg = cfg
        self.members, _, self.obs_dim = weight.shape
        self.act_dim = actor_state["heads.0.weight"].shape[1]
        self.seed_index, self.seed = seed_index, cfg.seed + seed_index
        self.env_id, self.action_repeat = cfg.env, cfg.action_repeat
        self.step, self.recorded, self.source = step, recorded, source
        self.device = torch.device(device)
        self.actor = make_actor(self.members, self.obs_dim, self.act_dim, cfg.actor)
        try:
            self.actor.load_state_dict(actor_state)
        except RuntimeError as err:
            raise CheckpointError(f"checkpoint {source}: its actor does not match its config ({one_line(err, 160)})") from None
        self.actor.requires_grad_(False).eval().to(self.device)
        self.generator = torch.Generator(self.device)
        self.reseed(derive_seed(self.seed, "play"))

    def __repr__(self) -> str:
        return (f"Policy({self.env_id}, seed {self.seed} (index {self.seed_index} of {self.members}), step {self.step}, "
                f"obs {self.obs_dim}, actions {self.act_dim})")

    def reseed(self, seed: int) -> None:
        """Seed the noise of stochastic actions."""
        self.generator.manual_seed(seed % 2**63)

    @torch.inference_mode()
    def act(self, obs: Any, deterministic: bool = True) -> np.ndarray:
        """``tanh(mean)`` (deterministic, as the trainer evaluates) or a tanh-Gaussian sample, as
        float32 ``[act_dim]`` for one observation or ``[B, act_dim]`` for a batch."""
        x = torch.as_tensor(np.asarray(obs, dtype=np.float32), device=self.device)
        single = x.dim() == 1
        if x.dim() not in (1, 2) or x.shape[-1] != self.obs_dim:
            raise ValueError(f"expected an observation [{self.obs_dim}] or a batch [B, {self.obs_dim}], got {tuple(x.shape)}")
        x = x.reshape(1, -1, self.obs_dim)
        # every member sees the batch, as in the trainer's batched act (the same kernels, so the same bits)
        x = x.expand(self.members, -1, -1).contiguous()
        mean, log_std = actor_mean_log_std(self.actor, x, self.cfg.actor)
        mean, log_std = mean[self.seed_index], log_std[self.seed_index]
        if deterministic:
            action = torch.tanh(mean)
        else:
            noise = torch.randn(mean.shape, generator=self.generator, device=self.device)
            action = torch.tanh(mean + log_std.exp() * noise)
        out = action.cpu().numpy()
        return out[0] if single else out

    __call__ = act

    def make_env(self) -> gym.Env:
        """An env built as the trainer builds this seed's evaluation env."""
        try:
            return make_env(self.env_id, derive_seed(self.seed, "eval") % (2**31), self.action_repeat)
        except UnknownEnvError as err:
            raise ConfigError(f"env: {err}") from None

    @cached_property
    def _spaces(self) -> tuple[spaces.Space, spaces.Space]:
        env = self.make_env()
        try:
            obs_space, act_space = env.observation_space, env.action_space
        finally:
            env.close()
        if obs_space.shape != (self.obs_dim,) or act_space.shape != (self.act_dim,):
            raise CheckpointError(f"checkpoint {self.source}: its actor maps {self.obs_dim} observations to {self.act_dim} "
                                  f"actions, but {self.env_id} has {obs_space.shape} and {act_space.shape}")
        return obs_space, act_space

    @property
    def observation_space(self) -> spaces.Space:
        return self._spaces[0]

    @property
    def action_space(self) -> spaces.Space:
        return self._spaces[1]


def load_policy(run_dir_or_checkpoint: str | Path, seed_index: int = 0, device: str | torch.device = "cpu") -> Policy:
    """The policy of seed ``seed_index`` of an RL run (a run directory or its checkpoint file).

    Only the actor's tensors and the config are read (the checkpoint is memory-mapped and loaded
    with ``weights_only=True``). A missing file, a continual run, a checkpoint of another format
    or a seed index out of range raise a one-line :class:`CheckpointError` / ``ConfigError``."""
    path = checkpoint_path(run_dir_or_checkpoint)
    state = load_checkpoint(path, mmap=True)
    saved = state.get("config")
    if run_kind(saved if isinstance(saved, Mapping) else {}, state) == "continual":
        raise CheckpointError(f"checkpoint {path} is a continual (supervised) run's; a policy comes from a run of "
                              "sac_spectral.train")
    try:
        check_format(state)
    except ValueError as err:
        raise CheckpointError(f"checkpoint {path}: {err}") from None
    try:
        saved = dict(state["config"])
        saved["device"] = "cpu"  # where it trained does not matter here
        cfg = merge_sources(TrainConfig, saved)
        modules = state["agent"]["modules"]
        actor_state = {k[len(_ACTOR):]: v.clone() for k, v in modules.items() if k.startswith(_ACTOR)}
        step = int(state["step"])
        evals = list(state["evals"])
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} lacks part of a run's state ({type(err).__name__}: {err})") from None
    except ConfigError as err:
        raise CheckpointError(f"checkpoint {path}: its config is not valid here: {err}") from None
    if not isinstance(seed_index, int) or not 0 <= seed_index < cfg.num_seeds:
        raise ConfigError(f"seed index {seed_index} is out of range: the run has {cfg.num_seeds} "
                          f"seed{'s' * (cfg.num_seeds > 1)} (indices 0..{cfg.num_seeds - 1})")
    recorded = None
    if evals and int(evals[-1]["step"]) == step:
        recorded = Recorded(len(evals) - 1, step, cfg.eval_episodes, float(evals[-1]["returns"][seed_index]))
    del state, modules
    return Policy(cfg, actor_state, seed_index, device, step, recorded, path)


def play_episodes(policy: Policy, reset_seeds: Sequence[int], deterministic: bool = True,
                  env: gym.Env | None = None) -> list[float]:
    """Returns of one episode per reset seed, played in one env built as the trainer's evaluation."""
    own = env is None
    env = policy.make_env() if env is None else env
    try:
        return [run_episode(lambda o: policy.act(o, deterministic), env, s) for s in reset_seeds]
    finally:
        if own:
            env.close()
