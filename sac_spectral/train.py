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
from tqdm import tqdm

from agents import SAC, ActorConfig, CriticConfig, ReplayBuffer, SACConfig
from agents.probes import DiagnosticsConfig, probe_batch, sac_diagnostics
from envs import EnvPool, UnknownEnvError, make_env
from sac_spectral.core.config import ConfigError, check, option, section
from sac_spectral.core.seeding import SeedStreams, derive_seed
from sac_spectral.diagnostics import layer_sigma_max
from sac_spectral.runs.checkpoint import save_checkpoint
from sac_spectral.runs.cli import (
    check_device,
    recorded_config,
    run_cli,
    set_torch_threads,
)
from sac_spectral.runs.evals import append_rl_evals
from sac_spectral.runs.layout import CHECKPOINT
from sac_spectral.runs.logger import RunLogger, state_is_finite, tensor_is_finite
from sac_spectral.runs.memory import check_fits, sac_estimate
from sac_spectral.runs.run import (
    GracefulStop,
    end_nonfinite,
    end_stopped,
    finish_run,
    progress_bar,
    runner_main,
)
from sac_spectral.runs.rundir import open_run_dir, reopen_run_dir

DEFAULT_REGULARIZERS = [{"name": "spectral", "coef": 1e-4, "k": 2}]
RESUMABLE_KEYS = (
    "total_steps", "eval_every", "eval_episodes", "log_every", "checkpoint_every", "progress", "threads",
    *(f"diagnostics.{f.name}" for f in fields(DiagnosticsConfig)),
)
RESET_CHOICES = ("all", "last_layers")
#: priming runs in chunks of this many updates: the progress bar, ``priming/*`` logs, a stop
#: request and checkpoints (every ``PRIMING_CHECKPOINT`` updates) act between chunks
PRIMING_CHUNK = 1000
PRIMING_CHECKPOINT = 10_000
#: version of the checkpoint layout; 2: members stored like nn.Linear, actor heads, priming
CHECKPOINT_FORMAT = 2
MAX_SEED = 2**31 - 1  # env seeds go through numpy's and MuJoCo's 32-bit seeding


@dataclass
class ResetConfig:
    every: int = option(0, "reset the agent every N env steps, after that step's evaluation (0 = never; Nikishin et al. 2022: 200000)")
    what: str = option("all", f"what a reset re-draws: {' | '.join(RESET_CHOICES)}")
    last_layers: int = option(1, "number of final levels re-drawn by what=last_layers (1 = the output heads)")

    def validate(self) -> None:
        check(self.every >= 0, "every", f"must be >= 0, got {self.every}")
        check(self.what in RESET_CHOICES, "what", f"'{self.what}' is not one of {', '.join(RESET_CHOICES)}")
        check(self.last_layers >= 1, "last_layers", f"must be >= 1, got {self.last_layers}")


@dataclass
class PrimingConfig:
    transitions: int = option(0, "heavy priming (Nikishin et al. 2022 §3): after this many env steps (0 = off) …")
    updates: int = option(0, "… run this many updates on the transitions collected so far, then train as usual")

    def validate(self) -> None:
        check(self.transitions >= 0, "transitions", f"must be >= 0 (0 = no priming), got {self.transitions}")
        check(self.updates >= 0, "updates", f"must be >= 0, got {self.updates}")
        check(self.updates == 0 or self.transitions >= 1, "transitions", "must be >= 1 when priming.updates > 0")


@dataclass
class TrainConfig(SACConfig):
    env: str = option("dmc:cheetah-run", "environment: dmc:<domain>-<task>, dm_control/<domain>-<task>-v0 or a gymnasium id")
    seed: int = option(0, "random seed (seed i of a multi-seed run uses seed + i)")
    num_seeds: int = option(1, "independent agents trained together as members of batched networks")
    total_steps: int = option(100_000, "environment steps")
    replay_ratio: float = option(1.0, "gradient updates per env step (0.5 = one update every 2 steps)")
    batch_size: int = option(256, "transitions per gradient update")
    buffer_size: int = option(1_000_000, "replay capacity per seed")
    random_steps: int = option(10_000, "uniform-random warm-up steps before the policy acts and updates start")
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
    priming: PrimingConfig = section(PrimingConfig, "heavy priming: many updates on the first transitions")
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
        check(0 <= self.seed and self.seed + self.num_seeds <= MAX_SEED + 1, "seed",
              f"seeds must lie in [0, {MAX_SEED}]; got seed={self.seed} with num_seeds={self.num_seeds}")
        check(self.run_dir is None or bool(self.run_dir.strip()), "run_dir",
              "empty; give a directory, or leave run_dir out for runs/<name>__<time>")
        check(
            self.priming.transitions <= min(self.buffer_size, self.total_steps), "priming.transitions",
            f"must be <= buffer_size ({self.buffer_size}) and total_steps ({self.total_steps}), got {self.priming.transitions}",
        )
        check_device(self.device)

    def updates_by(self, step: int) -> int:
        """Updates the replay ratio owes after ``step`` env steps (priming updates are extra)."""
        return math.floor(max(0, step - self.random_steps) * self.replay_ratio + 1e-9)

    @property
    def total_updates(self) -> int:
        """Every update of the run: the replay ratio's over ``total_steps`` plus priming's."""
        return self.updates_by(self.total_steps) + self.priming.updates


def check_format(state: dict[str, Any]) -> None:
    """``ValueError`` for a checkpoint of another layout (the runners report it in one line)."""
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"its layout is format {state.get('format')!r}, this version reads format {CHECKPOINT_FORMAT} "
            "(format 1 predates the nn.Linear weight layout and the actor's separate heads); start a new run"
        )


def eval_seed(seed: int, evaluation: int, episode: int) -> int:
    """Reset seed of episode ``episode`` of evaluation number ``evaluation``: every evaluation plays
    fresh episodes (a stream that continues between evaluations), deterministically and resumably."""
    return derive_seed(seed, f"eval/{evaluation}/{episode}") % (2**31)


def seed_label(seeds: Sequence[int]) -> str:
    """``s3`` for one seed, ``s0-2`` for seeds 0, 1, 2."""
    return f"s{seeds[0]}" if len(seeds) == 1 else f"s{seeds[0]}-{seeds[-1]}"


def run_tag(cfg: TrainConfig) -> str:
    names = [r["name"] for r in cfg.critic.regularizers + cfg.actor.regularizers]
    tag = "+".join(dict.fromkeys(names)) or "sac"
    if cfg.priming.updates:
        tag += "+primed"
    return f"{tag}+resets" if cfg.resets.every else tag


class Rates:
    """Env steps and updates per second over an interval, restarted on each reading."""

    def __init__(self, step: int, updates: int) -> None:
        self.restart(step, updates)

    def restart(self, step: int, updates: int) -> None:
        self.time, self.step, self.updates = time.perf_counter(), step, updates

    def read(self, step: int, updates: int) -> dict[str, float]:
        dt = max(time.perf_counter() - self.time, 1e-9)
        rates = {"perf/env_steps_per_s": (step - self.step) / dt, "perf/updates_per_s": (updates - self.updates) / dt}
        self.restart(step, updates)
        return rates


class Trainer:
    """Everything of one run: envs, agent, buffer, counters, logging, checkpoints.

    :meth:`train` is the loop — act, step the envs, store, learn — and after each env step
    :meth:`periodic` does, in this order: logging, diagnostics, evaluation, the reset (so an
    evaluation at a reset step scores the trained agent, as rl_with_resets does), a checkpoint.
    """

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.threads = set_torch_threads(cfg.threads)
        self.device = torch.device(cfg.device)
        self.seeds = [cfg.seed + i for i in range(cfg.num_seeds)]
        try:
            self.pool = EnvPool(cfg.env, self.seeds, cfg.action_repeat)
        except UnknownEnvError as err:
            raise ConfigError(f"env: {err}") from None
        check_fits(sac_estimate(cfg, self.pool.obs_dim, self.pool.act_dim), self.device,
                   "buffer_size, batch_size, replay_ratio, num_seeds or the hidden widths")
        self.eval_envs = [make_env(cfg.env, derive_seed(s, "eval") % (2**31), cfg.action_repeat) for s in self.seeds]
        self.streams = SeedStreams(self.seeds, self.device)
        self.agent = SAC(self.pool.obs_dim, self.pool.act_dim, cfg, self.streams, self.device)
        self.buffer = ReplayBuffer(
            cfg.buffer_size, self.pool.obs_dim, self.pool.act_dim, cfg.num_seeds, self.device
        )
        self.step = 0
        self.primed = 0
        self.diagnosed = 0
        self.last_reset = 0
        self.evals: list[dict[str, Any]] = []
        self.random_return: list[float] | None = None
        self.priming_report: dict[str, dict[str, list[float]]] = {}
        self.wall_time = 0.0
        self.last_info: dict[str, torch.Tensor] = {}
        self.run_dir: Path | None = None
        self.logger: RunLogger | None = None

    # ----------------------------------------------------------------------------- run directory
    def open_new(self) -> Path:
        cfg = self.cfg
        slug = cfg.env.replace(":", "-").replace("/", "-")
        self.run_dir = open_run_dir(cfg, f"{slug}__{run_tag(cfg)}__{seed_label(self.seeds)}")
        self.logger = RunLogger(self.run_dir, cfg.num_seeds)
        return self.run_dir

    def open_resume(self, path: Path) -> None:
        self.load_state_dict(reopen_run_dir(self.cfg, path))
        self.run_dir = path
        self.logger = RunLogger(path, self.cfg.num_seeds, purge_step=self.step + 1)

    def position(self) -> str:
        if self._priming_due():
            return f"step {self.step} (priming update {self.primed} of {self.cfg.priming.updates})"
        return f"step {self.step}"

    def describe(self) -> str:
        """One line: what this run does."""
        cfg = self.cfg
        regs = {net: "+".join(r["name"] for r in getattr(cfg, net).regularizers) or "none" for net in ("actor", "critic")}
        parts = [
            cfg.env, f"seed{'s' if len(self.seeds) > 1 else ''} {seed_label(self.seeds)[1:]}",
            f"{cfg.total_steps} steps at replay ratio {cfg.replay_ratio:g} after {cfg.random_steps} random",
            f"regularizers actor: {regs['actor']}, critic: {regs['critic']}",
        ]
        if cfg.resets.every:
            parts.append(f"resets ({cfg.resets.what}) every {cfg.resets.every}")
        if cfg.priming.updates:
            parts.append(f"priming {cfg.priming.updates} updates on the first {cfg.priming.transitions} transitions")
        parts.append(f"{cfg.device}, {self.threads}")
        return " | ".join(parts)

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "config": recorded_config(self.cfg),
            "step": self.step,
            "primed": self.primed,
            "diagnosed": self.diagnosed,
            "last_reset": self.last_reset,
            "agent": self.agent.full_state_dict(),
            "buffer": self.buffer.state_dict(),
            "streams": self.streams.state_dict(),
            "pool": self.pool.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "evals": self.evals,
            "random_return": self.random_return,
            "priming_report": self.priming_report,
            "wall_time": self.wall_time,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_format(state)
        if int(state["step"]) > self.cfg.total_steps:
            raise ConfigError(f"total_steps={self.cfg.total_steps} is below the run's current step {int(state['step'])}; "
                              f"give total_steps >= {int(state['step'])}")
        self.step, self.primed, self.diagnosed = int(state["step"]), int(state["primed"]), int(state["diagnosed"])
        self.last_reset = int(state["last_reset"])
        self.agent.load_full_state_dict(state["agent"])
        self.buffer.load_state_dict(state["buffer"])
        self.streams.load_state_dict(state["streams"])
        if not self.pool.load_state_dict(state["pool"]):
            print("note: this env's state cannot be restored exactly; the resumed run starts a new episode", file=sys.stderr)
        torch.set_rng_state(state["torch_rng"])
        self.evals, self.random_return = list(state["evals"]), state["random_return"]
        self.priming_report = dict(state["priming_report"])
        self.wall_time = float(state["wall_time"])

    def checkpoint(self) -> None:
        assert self.run_dir is not None
        save_checkpoint(self.state_dict(), self.run_dir / CHECKPOINT)

    def finite(self) -> bool:
        """Networks, optimizer state, α and regularizer state are finite (the replay buffer holds
        what the envs returned and is not checked)."""
        return state_is_finite(self.agent.full_state_dict()) and tensor_is_finite(self.agent.metrics())

    # ----------------------------------------------------------------------------- evaluation
    def evaluate(self, policy: Callable[[np.ndarray], np.ndarray], evaluation: int | str) -> np.ndarray:
        """Mean return per seed over ``eval_episodes`` episodes, seeded by :func:`eval_seed`."""
        n, episodes = len(self.seeds), self.cfg.eval_episodes
        returns = np.zeros((n, episodes))
        for ep in range(episodes):
            obs = np.stack([
                env.reset(seed=eval_seed(s, evaluation, ep))[0] for env, s in zip(self.eval_envs, self.seeds)
            ])
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
        returns = self.evaluate(self._policy, len(self.evals))
        self.evals.append({"step": self.step, "returns": returns.tolist()})
        append_rl_evals(self.logger.run_dir, self.step, self.agent.num_updates, self.seeds, returns,
                        self.cfg.eval_episodes, self.wall_time)
        self.logger.per_seed("eval/return", returns.tolist(), self.step)
        return float(returns.mean())

    # ----------------------------------------------------------------------------- the loop
    def train(self, stop: GracefulStop) -> int:
        """Run until ``total_steps``; returns the process exit code."""
        cfg, logger = self.cfg, self.logger
        assert logger is not None and self.run_dir is not None
        if self.random_return is None:
            self.random_return = self.evaluate(self._random_policy(), "random_policy").tolist()
            logger.per_seed("eval/random_policy_return", self.random_return, 0)
        self._start = time.perf_counter() - self.wall_time
        self._bar_rates = Rates(self.step, self.agent.num_updates)
        self._log_rates = Rates(self.step, self.agent.num_updates)
        bar = progress_bar(cfg.total_steps, self.step, "step", cfg.progress)
        self._postfix = {"eval": f"{float(np.mean(self.evals[-1]['returns'])):.1f}"} if self.evals else {}
        if self._reset_due():  # a run that ended at a reset step and is now extended
            self._reset()
        if self._priming_due():  # resumed in the middle of priming: finish it and this step's periodic work
            code = self.learn(bar, stop)
            if code is None:
                code = self.periodic(bar, stop)
            if code is not None:
                return code
        while self.step < cfg.total_steps:
            obs, actions = self.pool.obs, self._act()
            if not np.isfinite(actions).all():
                return end_nonfinite(self, bar)
            tr = self.pool.step(actions)
            self.buffer.add(obs, actions, tr.reward, tr.next_obs, tr.terminated)
            self.step += 1
            logger.episodes(tr.finished, self.step)
            code = self.learn(bar, stop)
            if code is None:
                code = self.periodic(bar, stop)
            if code is not None:
                return code
        bar.close()
        self._finish()
        return 0

    def _act(self) -> np.ndarray:
        if self.step < self.cfg.random_steps:
            return (self.streams.rand("act", (self.pool.act_dim,)) * 2.0 - 1.0).cpu().numpy()
        obs = torch.as_tensor(self.pool.obs, device=self.device)
        return self.agent.act(obs).cpu().numpy()

    def _priming_due(self) -> bool:
        p = self.cfg.priming
        return self.step >= p.transitions and self.primed < p.updates

    def _updates_due(self) -> int:
        """Updates owed at this step by the replay ratio (priming updates are extra)."""
        return self.cfg.updates_by(self.step) - (self.agent.num_updates - self.primed)

    def learn(self, bar: tqdm, stop: GracefulStop) -> int | None:
        """Priming when due, then the updates this step owes; an exit code if the run must stop."""
        if self._priming_due():
            code = self._prime(bar, stop)
            if code is not None:
                return code
        n = self._updates_due()
        if n > 0:
            self.last_info = self.agent.train_steps(self.buffer, n, self.cfg.batch_size)
        return None

    def _prime(self, bar: tqdm, stop: GracefulStop) -> int | None:
        """Heavy priming: ``priming.updates`` updates on the transitions stored so far, in chunks,
        with diagnostics before and after (``priming/before/…``, ``priming/after/…``, and in
        ``summary.json``) and the losses under ``priming/…`` by priming update."""
        assert self.logger is not None
        total = self.cfg.priming.updates
        if self.primed == 0 and self.cfg.diagnostics.every:
            self.priming_report["before"] = self._diagnose("priming/before/")
        while self.primed < total:
            n = min(PRIMING_CHUNK, total - self.primed)
            info = self.agent.train_steps(self.buffer, n, self.cfg.batch_size)
            self.primed += n
            self.wall_time = time.perf_counter() - self._start
            if not tensor_is_finite(info):
                return end_nonfinite(self, bar)
            self.logger.scalars({f"priming/{k}": v for k, v in {**info, **self.agent.metrics()}.items()}, self.primed)
            bar.set_postfix({**self._postfix, "priming": f"{self.primed}/{total}"})
            if stop.requested is not None:
                return end_stopped(self, bar, "sac_spectral.train", stop.requested)
            if self.primed % PRIMING_CHECKPOINT == 0 and self.primed < total:
                if not self.finite():
                    return end_nonfinite(self, bar)
                self.checkpoint()
        if self.cfg.diagnostics.every:
            self.priming_report["after"] = self._diagnose("priming/after/")
        return None

    def periodic(self, bar: tqdm, stop: GracefulStop) -> int | None:
        """This step's periodic work, in order: logging, diagnostics, evaluation, reset, checkpoint.
        Returns an exit code if the run must stop (non-finite values, a stop request)."""
        cfg, step = self.cfg, self.step
        if step % cfg.log_every == 0 and not self._log_training():
            return end_nonfinite(self, bar)
        every, updates = cfg.diagnostics.every, self.agent.num_updates
        if every and ((updates == 0 and step == cfg.random_steps) or updates // every > self.diagnosed // every):
            self._diagnose()
            self.diagnosed = updates
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.total_steps:
            self._postfix["eval"] = f"{self._eval_and_log():.1f}"
        if self._reset_due() and step < cfg.total_steps:
            self._reset()
        self._progress(bar)
        self.wall_time = time.perf_counter() - self._start
        if stop.requested is not None:
            return end_stopped(self, bar, "sac_spectral.train", stop.requested)
        if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == cfg.total_steps:
            if not self.finite():
                return end_nonfinite(self, bar)
            self.checkpoint()
        return None

    def _reset_due(self) -> bool:
        every = self.cfg.resets.every
        return bool(every) and self.step > 0 and self.step % every == 0 and self.last_reset < self.step

    def _reset(self) -> None:
        """Nikishin et al.'s reset (the buffer stays). A run that ends at a reset step skips it (its
        final checkpoint keeps the trained agent); extending that run applies it on resume."""
        self.agent.reset(self.cfg.resets.what, self.cfg.resets.last_layers)
        self.last_reset = self.step

    def _progress(self, bar: tqdm) -> None:
        """Advance the bar; its rates are refreshed about once a second."""
        if time.perf_counter() - self._bar_rates.time >= 1.0:
            rates = self._bar_rates.read(self.step, self.agent.num_updates)
            self._postfix.update(sps=f"{rates['perf/env_steps_per_s']:.0f}", ups=f"{rates['perf/updates_per_s']:.0f}")
        self._postfix.pop("priming", None)
        bar.set_postfix(self._postfix, refresh=False)
        bar.update(1)

    def _log_training(self) -> bool:
        """Log rates since the last log, the last update's metrics, the agent's state metrics and
        σ_max per layer; returns whether the metrics are finite."""
        assert self.logger is not None
        step = self.step
        for tag, value in self._log_rates.read(step, self.agent.num_updates).items():
            self.logger.scalar(tag, value, step)
        metrics = {**self.last_info, **self.agent.metrics()}
        self.logger.scalars(metrics, step)
        for net, module in self.agent.nets().items():
            for i, sigma in enumerate(layer_sigma_max(module)):
                self.logger.per_seed(f"spectral/{net}/layer{i}/sigma_max", self.agent.per_seed(net, sigma), step)
        return tensor_is_finite(metrics)

    def _diagnose(self, prefix: str = "") -> dict[str, list[float]]:
        """Log gradient rank, spectra, features and dormant units on a probe batch of its own
        (under ``prefix`` + the usual tags); returns the per-seed scalars."""
        assert self.logger is not None
        batch, noise = probe_batch(self.agent, self.buffer, self.cfg.diagnostics.batch_size, self.seeds, self.agent.num_updates)
        out: dict[str, list[float]] = {}
        for net, report in sac_diagnostics(self.agent, batch, noise, self.cfg.diagnostics).items():
            for tag, value in report.scalars.items():
                per_seed = self.agent.per_seed(net, value)
                self.logger.per_seed(prefix + tag, per_seed, self.step)
                out[tag] = per_seed.reshape(-1).tolist()
            for tag, values in report.histograms.items():
                self.logger.histograms(prefix + tag, values.reshape(len(self.seeds), -1), self.step)
        return out

    def summary(self) -> dict[str, Any]:
        finals = self.evals[-1]["returns"] if self.evals else [float("nan")] * len(self.seeds)
        best = np.max([e["returns"] for e in self.evals], axis=0).tolist() if self.evals else finals
        return {
            "env": self.cfg.env,
            "seeds": self.seeds,
            "steps": self.step,
            "updates": self.agent.num_updates,
            "priming_updates": self.primed,
            "wall_time_s": self.wall_time,
            "updates_per_s": self.agent.num_updates / max(self.wall_time, 1e-9),
            "env_steps_per_s": self.step / max(self.wall_time, 1e-9),
            "final_eval_return": float(np.mean(finals)),
            "best_eval_return": float(np.mean(best)),
            "random_policy_return": float(np.mean(self.random_return or [float("nan")])),
            "per_seed": [
                {"seed": s, "final_eval_return": f, "best_eval_return": b, "random_policy_return": r}
                for s, f, b, r in zip(self.seeds, finals, best, self.random_return or [])
            ],
            "eval_history": self.evals,
            "priming": self.priming_report,
        }

    def _finish(self) -> None:
        summary = self.summary()
        finish_run(
            self, summary, {k: summary[k] for k in ("final_eval_return", "best_eval_return", "updates_per_s")},
            f"done: {summary['steps']} steps, {summary['updates']} updates in {summary['wall_time_s']:.0f} s; "
            f"final eval return {summary['final_eval_return']:.1f} (random policy {summary['random_policy_return']:.1f})",
        )


def main(argv: Sequence[str] | None = None) -> int:
    return runner_main("sac_spectral.train", __doc__.split("\n\n")[1], TrainConfig, RESUMABLE_KEYS, Trainer, argv)


if __name__ == "__main__":
    sys.exit(run_cli(main))
