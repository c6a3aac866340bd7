"""A trained policy, loaded from a run of ``sac_spectral.train``: ``load_policy(RUN_DIR)``.

It reads the actor's weights, its regularizers' state and the config from the checkpoint
(``weights_only=True``, the file memory-mapped, so the replay buffer is never read into memory)
and acts as the trainer's
evaluation does (the agent's exported policy: SAC's ``tanh(mean)``, TD3's ``μ(s)``), or explores as
its agent does (a tanh-Gaussian sample; TD3's Gaussian noise). Its
:meth:`Policy.make_env` builds the env as the trainer's evaluation does, so playing the episodes
of an evaluation (reset seeds :func:`~sac_spectral.envs.evaluate.eval_seed`) gives the returns recorded
in ``evals.csv``.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from sac_spectral.agents import agent_class
from sac_spectral.agents.base import actor_dims
from sac_spectral.agents.engine import upgrade_state
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.apps.rl.kind import KIND
from sac_spectral.apps.rl.run import check_format
from sac_spectral.core.config import ConfigError, merge_sources, one_line
from sac_spectral.core.device import check_device
from sac_spectral.core.seeding import derive_seed
from sac_spectral.envs import UnknownEnvError, run_episode
from sac_spectral.envs.evaluate import eval_env_seed, eval_seed
from sac_spectral.envs.tasks import TaskError, stage_env
from sac_spectral.regularizers import Regularizer, build_regularizers
from sac_spectral.runs.checkpoint import CheckpointError, load_checkpoint
from sac_spectral.runs.kinds import run_kind
from sac_spectral.runs.layout import CHECKPOINT

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

    step: int  # its env step (the ``step`` argument of eval_seed)
    episodes: int
    mean_return: float  # over its episodes, of this policy's seed

    def reset_seeds(self, seed: int) -> list[int]:
        return [eval_seed(seed, self.step, ep) for ep in range(self.episodes)]


class Policy:
    """Seed ``seed_index`` of a trained run: ``act(obs)`` for one observation ``[obs_dim]`` or a
    batch ``[B, obs_dim]``; actions lie in ``action_space`` (``[-1, 1]``, as :func:`sac_spectral.envs.make_env`
    rescales them)."""

    def __init__(self, cfg: TrainConfig, actor_state: dict[str, torch.Tensor], seed_index: int,
                 device: str | torch.device = "cpu", step: int = 0, recorded: Recorded | None = None,
                 source: Path | None = None, actor_regularizers: Sequence[dict[str, Any]] = ()) -> None:
        self.cfg = cfg
        try:
            self.members, self.obs_dim, self.act_dim = actor_dims(actor_state)
        except (KeyError, StopIteration):
            raise CheckpointError(f"checkpoint {source}: its actor has no input layer or no head") from None
        if self.members != cfg.num_seeds:
            raise CheckpointError(f"checkpoint {source}: its config says num_seeds={cfg.num_seeds} but its actor "
                                  f"holds {self.members} member{'s' * (self.members > 1)}")
        _check_finite(actor_state, source)
        self.seed_index, self.seed = seed_index, cfg.seed + seed_index
        #: the stage it last trained in (a plain run's one stage); its env is the one it plays
        self.stage = cfg.sequence().ending(step)
        self.env_id, self.action_repeat = self.stage.spec.env, cfg.action_repeat
        self.step, self.recorded, self.source = step, recorded, source
        self.device = torch.device(device)
        try:
            self.net = agent_class(cfg.agent).export_policy(cfg, actor_state)
        except RuntimeError as err:
            raise CheckpointError(f"checkpoint {source}: its actor does not match its config "
                                  f"({one_line(err, 160)})") from None
        self.net.requires_grad_(False).eval().to(self.device)
        self.regularizers = self._carry(cfg, actor_regularizers, source)
        self.generator = torch.Generator(self.device)
        self.reseed(derive_seed(self.seed, "play"))

    def _carry(self, cfg: TrainConfig, states: Sequence[dict[str, Any]], source: Path | None) -> list[Regularizer]:
        """The actor's regularizers whose state its forward reads (:meth:`~sac_spectral.regularizers.
        Regularizer.traced_state`: plasticity injection's frozen branches, added by forward hooks),
        rebuilt on the exported actor in their checkpointed state, so that they act on the policy
        as they did in training; the others hold only training state and are left out."""
        regs = build_regularizers(self.net.actor, cfg.actor.regularizers, "actor.regularizers") if states else []
        kept = []
        try:
            for reg, state in zip(regs, states, strict=True):
                if reg.traced_state() is not None:
                    reg.load_state_dict(state)
                    kept.append(reg)
        except (KeyError, ValueError) as err:
            raise CheckpointError(f"checkpoint {source}: its actor's regularizer state does not fit: "
                                  f"{one_line(err, 160)}") from None
        return kept

    def __repr__(self) -> str:
        return (f"Policy({self.env_id}, seed {self.seed} (index {self.seed_index} of {self.members}), step "
                f"{self.step}, "
                f"obs {self.obs_dim}, actions {self.act_dim})")

    def reseed(self, seed: int) -> None:
        """Seed the noise of stochastic actions."""
        self.generator.manual_seed(seed % 2**63)

    @torch.inference_mode()
    def act(self, obs: Any, deterministic: bool = True) -> np.ndarray:
        """The deterministic action the trainer evaluates (SAC: ``tanh(mean)``), or the agent's
        exploring one (SAC: a tanh-Gaussian sample), as float32 ``[act_dim]`` for one observation or
        ``[B, act_dim]`` for a batch."""
        x = torch.as_tensor(_finite_float32(obs), device=self.device)
        single = x.dim() == 1
        if x.dim() not in (1, 2) or x.shape[-1] != self.obs_dim:
            raise ValueError(f"expected an observation [{self.obs_dim}] or a batch [B, {self.obs_dim}], got "
                             f"{tuple(x.shape)}")
        x = x.reshape(1, -1, self.obs_dim)
        # every member sees the batch, as in the trainer's batched act (the same kernels, so the same bits)
        x = x.expand(self.members, -1, -1).contiguous()
        out = self.net(x, self.seed_index, deterministic, self.generator).cpu().numpy()
        return out[0] if single else out

    __call__ = act

    def make_env(self) -> gym.Env:
        """An env built as the trainer builds this seed's evaluation env (of a task sequence: of the
        stage it last trained in, its dynamics and permutations drawn as in training); a
        ``CheckpointError`` where its spaces do not fit the actor."""
        try:
            env = stage_env(self.stage, self.seed, eval_env_seed(self.seed), self.action_repeat)
        except (UnknownEnvError, TaskError) as err:
            raise ConfigError(f"env: {err}") from None
        obs_shape, act_shape = env.observation_space.shape, env.action_space.shape
        if obs_shape != (self.obs_dim,) or act_shape != (self.act_dim,):
            env.close()
            raise CheckpointError(f"checkpoint {self.source}: its actor maps {self.obs_dim} observations to "
                                  f"{self.act_dim} "
                                  f"actions, but {self.env_id} has {obs_shape} and {act_shape}")
        return env

    @cached_property
    def _spaces(self) -> tuple[spaces.Space, spaces.Space]:
        env = self.make_env()
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()

    @property
    def observation_space(self) -> spaces.Space:
        return self._spaces[0]

    @property
    def action_space(self) -> spaces.Space:
        return self._spaces[1]


def load_policy(run_dir_or_checkpoint: str | Path, seed_index: int = 0, device: str | torch.device = "cpu") -> Policy:
    """The policy of seed ``seed_index`` of an RL run (a run directory or its checkpoint file).

    Only the actor's tensors and the config are read (the checkpoint is memory-mapped and loaded
    with ``weights_only=True``). A missing file, a continual run, a checkpoint of another format,
    an actor that does not match its config or holds non-finite weights, a seed index that is not
    an integer (``bool`` and ``str`` are not) or out of range, or a ``device`` other than ``cpu`` or
    an available ``cuda`` raise a one-line :class:`CheckpointError` / ``ConfigError``."""
    check_device(str(device))
    path = checkpoint_path(run_dir_or_checkpoint)
    state = load_checkpoint(path, mmap=True)
    saved = state.get("config")
    if run_kind(saved if isinstance(saved, Mapping) else {}, state) != KIND.name:
        raise CheckpointError(f"checkpoint {path} is a continual (supervised) run's; a policy comes from a run of "
                              "sac_spectral.train")
    try:
        check_format(state)
    except ValueError as err:
        raise CheckpointError(f"checkpoint {path}: {err}") from None
    try:
        saved = dict(state["config"])
        saved["device"] = "cpu"  # where it trained does not matter here,
        saved["precision"] = "fp32"  # nor bf16 (acting never used it): a bf16 run loads on a CPU without bf16
        cfg = merge_sources(TrainConfig, saved)
        modules = state["agent"]["modules"]
        actor_state = {k[len(_ACTOR):]: v.clone() for k, v in modules.items() if k.startswith(_ACTOR)}
        step = int(state["step"])
        evals = list(state["evals"])
        actor_regularizers = upgrade_state(state["agent"])["regularizers"]["actor"]
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} lacks part of a run's state ({type(err).__name__}: {err})") from None
    except ConfigError as err:
        raise CheckpointError(f"checkpoint {path}: its config is not valid here: {err}") from None
    valid = f"the run has {cfg.num_seeds} seed{'s' * (cfg.num_seeds > 1)} (indices 0..{cfg.num_seeds - 1})"
    if not isinstance(seed_index, numbers.Integral) or isinstance(seed_index, bool):
        raise ConfigError(f"seed index {seed_index!r} is not an integer: {valid}")
    seed_index = int(seed_index)
    if not 0 <= seed_index < cfg.num_seeds:
        raise ConfigError(f"seed index {seed_index} is out of range: {valid}")
    del state, modules
    # checks the actor against the config
    policy = Policy(cfg, actor_state, seed_index, device, step, None, path, actor_regularizers)
    stage_name = policy.stage.spec.name
    scored = [e for e in evals if int(e["step"]) == step and e.get("task", stage_name) == stage_name]
    if scored:
        policy.recorded = Recorded(step, cfg.eval_episodes, float(scored[-1]["returns"][seed_index]))
    return policy


def _check_finite(actor_state: Mapping[str, torch.Tensor], source: Path | None) -> None:
    """A one-line ``CheckpointError`` naming the actor's tensors that hold NaN or infinity."""
    bad = {k: int((~torch.isfinite(v)).sum()) for k, v in actor_state.items() if v.is_floating_point()}
    bad = {k: n for k, n in bad.items() if n}
    if bad:
        total = sum(bad.values())
        raise CheckpointError(f"checkpoint {source}: its actor holds {total} non-finite value{'s' * (total > 1)} "
                              f"(in {', '.join(bad)}); the trainer never saves such weights")


def _finite_float32(obs: Any) -> np.ndarray:
    """``obs`` as float32; a one-line ``ValueError`` naming the entries that are NaN, infinite or
    beyond float32's range."""
    raw = np.asarray(obs)
    with np.errstate(over="ignore"):
        x = raw.astype(np.float32)
    bad = ~np.isfinite(x)
    if bad.any():
        where = [f"[{', '.join(map(str, i))}] ({float(raw[tuple(i)]):g})" for i in np.argwhere(bad)[:3]]
        more = f" and {int(bad.sum()) - 3} more" if bad.sum() > 3 else ""
        raise ValueError(f"observation not finite in float32 at {', '.join(where)}{more}")
    return x


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
