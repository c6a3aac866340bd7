"""``python -m sac_spectral.train [--config FILE] [--resume RUN_DIR] [key=value ...]``

The RL runner: collects experience with SAC, runs ``replay_ratio`` gradient updates per env step
after ``random_steps`` uniform warm-up steps, evaluates the deterministic policy ``tanh(mean)``
every ``eval_every`` steps on separately seeded envs, resets the agent on a schedule, logs to
TensorBoard and checkpoints atomically. With no arguments it runs the embedded default, which is
exactly ``run_configs/default.yaml``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents import SAC, ActorConfig, CriticConfig, ReplayBuffer, SACConfig
from envs import EnvPool, UnknownEnvError, make_env
from sac_spectral.config import ConfigError, check, option, section, to_dict
from sac_spectral.diagnostics import layer_sigma_max
from sac_spectral.diagnostics.rl import DiagnosticsConfig, probe_batch, sac_diagnostics
from sac_spectral.logging import RunLogger, flatten, tensor_is_finite
from sac_spectral.runs import (
    CHECKPOINT,
    SUMMARY,
    GracefulStop,
    open_run_dir,
    progress_bar,
    reopen_run_dir,
    end_nonfinite,
    end_stopped,
    report_done,
    run_cli,
    runner_main,
    save_checkpoint,
    set_torch_threads,
    write_json,
)
from sac_spectral.seeding import SeedStreams, derive_seed

DEFAULT_REGULARIZERS = [{"name": "spectral", "coef": 1e-4, "k": 2}]
RESUMABLE_KEYS = (
    "total_steps", "eval_every", "eval_episodes", "log_every", "checkpoint_every", "progress", "threads",
    *(f"diagnostics.{f.name}" for f in fields(DiagnosticsConfig)),
)
RESET_CHOICES = ("all", "last_layers")


@dataclass
class ResetConfig:
    every: int = option(0, "reset the agent every N env steps (0 = never; Nikishin et al. 2022: 200000)")
    what: str = option("all", f"what a reset re-draws: {' | '.join(RESET_CHOICES)}")
    last_layers: int = option(1, "number of final linear layers re-drawn by what=last_layers")

    def validate(self) -> None:
        check(self.every >= 0, "every", f"must be >= 0, got {self.every}")
        check(self.what in RESET_CHOICES, "what", f"'{self.what}' is not one of {', '.join(RESET_CHOICES)}")
        check(self.last_layers >= 1, "last_layers", f"must be >= 1, got {self.last_layers}")


@dataclass
class TrainConfig(SACConfig):
    env: str = option("dmc:cheetah-run", "environment: dmc:<domain>-<task>, dm_control/<domain>-<task>-v0 or a gymnasium id")
    seed: int = option(0, "random seed (seed i of a multi-seed run uses seed + i)")
    num_seeds: int = option(1, "independent agents trained together as members of batched networks")
    total_steps: int = option(100_000, "environment steps")
    replay_ratio: float = option(1.0, "gradient updates per env step (0.5 = one update every 2 steps)")
    batch_size: int = option(256, "transitions per gradient update")
    buffer_size: int = option(1_000_000, "replay capacity per seed")
    random_steps: int = option(5_000, "uniform-random warm-up steps before the policy acts and updates start")
    action_repeat: int = option(1, "env steps per agent action")
    eval_every: int = option(10_000, "evaluate every N env steps (0 = only at the end)")
    eval_episodes: int = option(10, "episodes per evaluation")
    log_every: int = option(1_000, "write training metrics every N env steps")
    checkpoint_every: int = option(25_000, "checkpoint every N env steps (0 = only at the end)")
    run_dir: str | None = option(None, "run directory (default: runs/<env>__<tag>__s<seed>__<time>)")
    device: str = option("cpu", "torch device: cpu, cuda, cuda:<i>")
    threads: int = option(0, "torch CPU threads (0 = the cores other processes leave idle at start)")
    progress: bool = option(True, "show a progress bar")
    resets: ResetConfig = section(ResetConfig)
    diagnostics: DiagnosticsConfig = section(DiagnosticsConfig, "gradient-rank, spectra, feature and dormant diagnostics")
    actor: ActorConfig = section(lambda: ActorConfig(regularizers=list(DEFAULT_REGULARIZERS)), "policy network")
    critic: CriticConfig = section(lambda: CriticConfig(regularizers=list(DEFAULT_REGULARIZERS)), "Q-networks")

    def validate(self) -> None:
        super().validate()
        for key in ("num_seeds", "total_steps", "batch_size", "buffer_size", "action_repeat", "eval_episodes", "log_every"):
            check(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        for key in ("random_steps", "eval_every", "checkpoint_every", "threads"):
            check(getattr(self, key) >= 0, key, f"must be >= 0, got {getattr(self, key)}")
        check(self.replay_ratio > 0, "replay_ratio", f"must be > 0 (updates per env step), got {self.replay_ratio}")
        check(
            self.device == "cpu" or (self.device.startswith("cuda") and torch.cuda.is_available()),
            "device",
            f"'{self.device}' is not available here; valid: cpu" + (", cuda" if torch.cuda.is_available() else ""),
        )


def eval_seed(seed: int, episode: int) -> int:
    """Reset seed of evaluation episode ``episode``; the same episodes at every evaluation."""
    return derive_seed(seed, f"eval/{episode}") % (2**31)


def run_tag(cfg: TrainConfig) -> str:
    names = [r["name"] for r in cfg.critic.regularizers + cfg.actor.regularizers]
    tag = "+".join(dict.fromkeys(names)) or "sac"
    return f"{tag}+resets" if cfg.resets.every else tag


class Trainer:
    """Everything of one run: envs, agent, buffer, counters, logging, checkpoints."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        set_torch_threads(cfg.threads)
        self.device = torch.device(cfg.device)
        self.seeds = [cfg.seed + i for i in range(cfg.num_seeds)]
        try:
            self.pool = EnvPool(cfg.env, self.seeds, cfg.action_repeat)
        except UnknownEnvError as err:
            raise ConfigError(f"env: {err}") from None
        self.eval_envs = [make_env(cfg.env, derive_seed(s, "eval") % (2**31), cfg.action_repeat) for s in self.seeds]
        self.streams = SeedStreams(self.seeds, self.device)
        self.agent = SAC(self.pool.obs_dim, self.pool.act_dim, cfg, self.streams, self.device)
        self.buffer = ReplayBuffer(
            cfg.buffer_size, self.pool.obs_dim, self.pool.act_dim, cfg.num_seeds, self.device
        )
        self.step = 0
        self.updates_done = 0
        self.evals: list[dict[str, Any]] = []
        self.random_return: list[float] | None = None
        self.wall_time = 0.0
        self.run_dir: Path | None = None
        self.logger: RunLogger | None = None

    # ----------------------------------------------------------------------------- run directory
    def open_new(self) -> Path:
        cfg = self.cfg
        slug = cfg.env.replace(":", "-").replace("/", "-")
        self.run_dir = open_run_dir(cfg, f"{slug}__{run_tag(cfg)}__s{cfg.seed}")
        self.logger = RunLogger(self.run_dir, cfg.num_seeds)
        return self.run_dir

    def open_resume(self, path: Path) -> None:
        self.load_state_dict(reopen_run_dir(self.cfg, path))
        self.run_dir = path
        self.logger = RunLogger(path, self.cfg.num_seeds, purge_step=self.step + 1)

    def position(self) -> str:
        return f"step {self.step}"

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "format": 1,
            "step": self.step,
            "updates_done": self.updates_done,
            "agent": self.agent.full_state_dict(),
            "buffer": self.buffer.state_dict(),
            "streams": self.streams.state_dict(),
            "pool": self.pool.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "evals": self.evals,
            "random_return": self.random_return,
            "wall_time": self.wall_time,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.updates_done = int(state["step"]), int(state["updates_done"])
        self.agent.load_full_state_dict(state["agent"])
        self.buffer.load_state_dict(state["buffer"])
        self.streams.load_state_dict(state["streams"])
        if not self.pool.load_state_dict(state["pool"]):
            print("note: this env's state cannot be restored exactly; the resumed run starts a new episode", file=sys.stderr)
        torch.set_rng_state(state["torch_rng"])
        self.evals, self.random_return = list(state["evals"]), state["random_return"]
        self.wall_time = float(state["wall_time"])

    def checkpoint(self) -> None:
        assert self.run_dir is not None
        save_checkpoint(self.state_dict(), self.run_dir / CHECKPOINT)

    def finite(self) -> bool:
        return tensor_is_finite(self.agent.state_dict()) and tensor_is_finite(self.agent.metrics())

    # ----------------------------------------------------------------------------- evaluation
    def evaluate(self, policy: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Mean return per seed over ``eval_episodes`` episodes with the same reset seeds each time."""
        n, episodes = len(self.seeds), self.cfg.eval_episodes
        returns = np.zeros((n, episodes))
        for ep in range(episodes):
            obs = np.stack([env.reset(seed=eval_seed(s, ep))[0] for env, s in zip(self.eval_envs, self.seeds)])
            done = np.zeros(n, dtype=bool)
            while not done.all():
                actions = policy(obs)
                for i, env in enumerate(self.eval_envs):
                    if done[i]:
                        continue
                    o, r, te, tr, _ = env.step(actions[i])
                    returns[i, ep] += r
                    obs[i] = o
                    done[i] = te or tr
        return returns.mean(axis=1)

    def _policy(self, obs: np.ndarray) -> np.ndarray:
        return self.agent.act(torch.as_tensor(obs, device=self.device), deterministic=True).cpu().numpy()

    def _random_policy(self) -> Callable[[np.ndarray], np.ndarray]:
        rngs = [np.random.default_rng(derive_seed(s, "random_policy")) for s in self.seeds]
        return lambda obs: np.stack([rng.uniform(-1.0, 1.0, self.pool.act_dim) for rng in rngs])

    def _eval_and_log(self) -> float:
        assert self.logger is not None
        returns = self.evaluate(self._policy)
        self.evals.append({"step": self.step, "returns": returns.tolist()})
        self.logger.per_seed("eval/return", returns.tolist(), self.step)
        return float(returns.mean())

    # ----------------------------------------------------------------------------- training
    def _act(self) -> np.ndarray:
        if self.step < self.cfg.random_steps:
            return (self.streams.rand("act", (self.pool.act_dim,)) * 2.0 - 1.0).cpu().numpy()
        obs = torch.as_tensor(self.pool.obs, device=self.device)
        return self.agent.act(obs).cpu().numpy()

    def _updates_due(self) -> int:
        learned = self.step - self.cfg.random_steps
        if learned <= 0:
            return 0
        return math.floor(learned * self.cfg.replay_ratio + 1e-9) - self.updates_done

    def _log_training(self, interval: dict[str, float]) -> tuple[dict[str, float], bool]:
        """Log rates, agent metrics and σ_max; returns the rates and whether the metrics are finite."""
        assert self.logger is not None
        now = time.perf_counter()
        dt = max(now - interval["time"], 1e-9)
        rates = {
            "perf/env_steps_per_s": (self.step - interval["step"]) / dt,
            "perf/updates_per_s": (self.updates_done - interval["updates"]) / dt,
        }
        for tag, value in rates.items():
            self.logger.scalar(tag, value, self.step)
        metrics = self.agent.metrics()
        if self.updates_done > 0:
            self.logger.scalars(metrics, self.step)
        for net, module in self.agent.nets().items():
            for i, sigma in enumerate(layer_sigma_max(module)):
                self.logger.per_seed(f"spectral/{net}/layer{i}/sigma_max", self.agent.per_seed(net, sigma), self.step)
        interval.update(time=now, step=self.step, updates=self.updates_done)
        return rates, tensor_is_finite(metrics)

    def _diagnose(self) -> None:
        """Log gradient rank, spectra, features and dormant units on a probe batch of its own."""
        assert self.logger is not None
        batch, noise = probe_batch(self.agent, self.buffer, self.cfg.diagnostics.batch_size, self.seeds, self.updates_done)
        for net, report in sac_diagnostics(self.agent, batch, noise, self.cfg.diagnostics).items():
            for tag, value in report.scalars.items():
                self.logger.per_seed(tag, self.agent.per_seed(net, value), self.step)
            for tag, values in report.histograms.items():
                for i, seed_values in enumerate(values.reshape(len(self.seeds), -1)):
                    self.logger.histogram(tag if len(self.seeds) == 1 else f"seed{i}/{tag}", seed_values, self.step)

    def train(self, stop: GracefulStop) -> int:
        """Run until ``total_steps``; returns the process exit code."""
        cfg, logger = self.cfg, self.logger
        assert logger is not None and self.run_dir is not None
        if self.random_return is None:
            self.random_return = self.evaluate(self._random_policy()).tolist()
            logger.per_seed("eval/random_policy_return", self.random_return, 0)
        start = time.perf_counter() - self.wall_time
        interval = {"time": time.perf_counter(), "step": self.step, "updates": self.updates_done}
        bar = progress_bar(cfg.total_steps, self.step, "step", cfg.progress)
        postfix = {"eval": f"{float(np.mean(self.evals[-1]['returns'])):.1f}"} if self.evals else {}
        while self.step < cfg.total_steps:
            obs, actions = self.pool.obs, self._act()
            if not np.isfinite(actions).all():
                return end_nonfinite(self, bar)
            tr = self.pool.step(actions)
            self.buffer.add(*(
                torch.as_tensor(x, dtype=torch.float32, device=self.device)
                for x in (obs, actions, tr.reward, tr.next_obs, tr.terminated)
            ))
            self.step += 1
            for i, ret, length in tr.finished:
                logger.writer.add_scalar(
                    "train/episode_return" if len(self.seeds) == 1 else f"seed{i}/train/episode_return", ret, self.step
                )
            n_updates, every = self._updates_due(), cfg.diagnostics.every
            if n_updates > 0:
                if every and self.updates_done == 0:
                    self._diagnose()  # the untrained networks, as a baseline
                self.agent.train_steps(self.buffer, n_updates, cfg.batch_size)
                self.updates_done += n_updates
                if every and self.updates_done // every > (self.updates_done - n_updates) // every:
                    self._diagnose()
            if cfg.resets.every and self.step % cfg.resets.every == 0 and self.step < cfg.total_steps:
                self.agent.reset(cfg.resets.what, cfg.resets.last_layers)
            if self.step % cfg.log_every == 0:
                rates, finite = self._log_training(interval)
                if not finite:
                    return end_nonfinite(self, bar)
                postfix.update(sps=f"{rates['perf/env_steps_per_s']:.0f}", ups=f"{rates['perf/updates_per_s']:.0f}")
            if (cfg.eval_every and self.step % cfg.eval_every == 0) or self.step == cfg.total_steps:
                postfix["eval"] = f"{self._eval_and_log():.1f}"
            bar.set_postfix(postfix, refresh=False)
            bar.update(1)
            self.wall_time = time.perf_counter() - start
            if stop.requested is not None:
                return end_stopped(self, bar, "sac_spectral.train", stop.requested)
            if (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0) or self.step == cfg.total_steps:
                if not self.finite():
                    return end_nonfinite(self, bar)
                self.checkpoint()
        bar.close()
        self._finish()
        return 0

    def summary(self) -> dict[str, Any]:
        finals = self.evals[-1]["returns"] if self.evals else [float("nan")] * len(self.seeds)
        best = np.max([e["returns"] for e in self.evals], axis=0).tolist() if self.evals else finals
        return {
            "env": self.cfg.env,
            "seeds": self.seeds,
            "steps": self.step,
            "updates": self.updates_done,
            "wall_time_s": self.wall_time,
            "updates_per_s": self.updates_done / max(self.wall_time, 1e-9),
            "env_steps_per_s": self.step / max(self.wall_time, 1e-9),
            "final_eval_return": float(np.mean(finals)),
            "best_eval_return": float(np.mean(best)),
            "random_policy_return": float(np.mean(self.random_return or [float("nan")])),
            "per_seed": [
                {"seed": s, "final_eval_return": f, "best_eval_return": b, "random_policy_return": r}
                for s, f, b, r in zip(self.seeds, finals, best, self.random_return or [])
            ],
            "eval_history": self.evals,
        }

    def _finish(self) -> None:
        assert self.logger is not None and self.run_dir is not None
        summary = self.summary()
        write_json(self.run_dir / SUMMARY, summary)
        hp = {k: v for k, v in flatten(to_dict(self.cfg)).items() if k != "run_dir"}
        self.logger.hparams(hp, {k: summary[k] for k in ("final_eval_return", "best_eval_return", "updates_per_s")})
        self.logger.close()
        report_done(
            f"done: {summary['steps']} steps, {summary['updates']} updates in {summary['wall_time_s']:.0f} s; "
            f"final eval return {summary['final_eval_return']:.1f} "
            f"(random policy {summary['random_policy_return']:.1f})",
            self.run_dir,
        )


def main(argv: Sequence[str] | None = None) -> int:
    return runner_main("sac_spectral.train", __doc__.split("\n\n")[1], TrainConfig, RESUMABLE_KEYS, Trainer, argv)


if __name__ == "__main__":
    sys.exit(run_cli(main))
