"""The dry run of a sweep: every trial with its state and estimated cost, measured here by timing
the agent's update (or the continual learner's step) and an env step through their public API."""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from sac_spectral.core.config import ConfigError, merge_sources, one_line, to_dict
from sac_spectral.studies.spec import Sweep, invalid_trials, runner_config
from sac_spectral.studies.status import Status, read_status
from sac_spectral.studies.trial import trial_state


def _measure(fn: Any, repeats: int = 3) -> float:
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


#: run keys besides the actor-critic ones (SACConfig) that change what one update costs
UPDATE_KEYS = ("agent", "batch_size", "num_seeds", "device")


def update_key(cfg: Any, obs_dim: int, act_dim: int) -> list[Any]:
    """What the measured time of one update depends on: the shapes, every field of the resolved
    agent config (the agent, its own section, precision, compile, networks, regularizers, …), the
    batch, members and device."""
    from sac_spectral.agents import SACConfig

    resolved = to_dict(cfg)
    names = [f.name for f in fields(SACConfig)] + list(UPDATE_KEYS) + ([cfg.agent] if cfg.agent in resolved else [])
    return ["update", obs_dim, act_dim, {k: resolved[k] for k in names}]


def _built_env(make_env: Any, cfg: Any) -> Any:
    """The trial's env, built here to time its steps; an id gymnasium registers but cannot build
    (a missing package, a stale entry point) is a one-line error naming the exception."""
    try:
        return make_env(cfg.env, 0, cfg.action_repeat)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever an env's constructor raises, said in one line
        raise ConfigError(f"env: '{cfg.env}' cannot be built here ({type(err).__name__}: {one_line(err)})") from None


class CostModel:
    """Seconds a trial costs here: its updates (or iterations) times the measured time of one,
    plus its env steps (training and evaluation) times the measured time of one env step."""

    def __init__(self, threads: int) -> None:
        self.threads, self.cache = threads, {}

    def _cached(self, key: Any, fn: Any) -> Any:
        key = json.dumps(key, sort_keys=True, default=str)
        if key not in self.cache:
            self.cache[key] = fn()
        return self.cache[key]

    def train(self, cfg: Any) -> tuple[int, float]:
        import torch

        from sac_spectral.agents import ReplayBuffer, build_agent
        from sac_spectral.envs import make_env
        from sac_spectral.core.seeding import SeedStreams

        updates = cfg.total_updates
        env = _built_env(make_env, cfg)
        obs_dim, act_dim = int(env.observation_space.shape[0]), int(env.action_space.shape[0])
        torch.set_num_threads(self.threads)

        def update_time() -> float:
            agent = build_agent(obs_dim, act_dim, cfg, SeedStreams(list(range(cfg.num_seeds)), cfg.device), cfg.device)
            buf = ReplayBuffer(4 * cfg.batch_size, obs_dim, act_dim, cfg.num_seeds, cfg.device)
            m = cfg.num_seeds
            for _ in range(4 * cfg.batch_size):
                buf.add(torch.randn(m, obs_dim), torch.rand(m, act_dim) * 2 - 1, torch.randn(m), torch.randn(m, obs_dim), torch.zeros(m))
            agent.train_steps(buf, 2, cfg.batch_size)
            return _measure(lambda: agent.train_steps(buf, 4, cfg.batch_size)) / 4

        def env_step_time() -> float:
            env.reset(seed=0)

            def steps() -> None:
                for _ in range(100):
                    if any(env.step(env.action_space.sample())[2:4]):
                        env.reset()

            return _measure(steps) / 100

        t_update = self._cached(update_key(cfg, obs_dim, act_dim), update_time)
        t_env = self._cached(["env", cfg.env, cfg.action_repeat], env_step_time)
        evals = 1 + (cfg.total_steps // cfg.eval_every + bool(cfg.total_steps % cfg.eval_every) if cfg.eval_every else 1)
        episode = (env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else 1000)
        env_steps = cfg.num_seeds * (cfg.total_steps + evals * cfg.eval_episodes * episode)
        return updates, updates * t_update + env_steps * t_env

    def continual(self, cfg: Any) -> tuple[int, float]:
        import torch

        from sac_spectral.continual import ContinualRunner

        iterations = cfg.stream.num_tasks * cfg.stream.iters_per_task
        torch.set_num_threads(self.threads)

        def times() -> tuple[float, float]:
            runner = ContinualRunner(cfg)
            task = runner.stream.task(0)
            x, y = task.train_batch(runner.gen, cfg.batch_size, runner.dtype)
            runner.learner.train_step(x, y)
            t_iter = _measure(lambda: [runner.learner.train_step(x, y) for _ in range(5)]) / 5
            px, py = next(task.eval_batches("train", cfg.probe_size, cfg.probe_size, runner.dtype))

            def task_end() -> None:
                for split in ("train", "test"):
                    runner.learner.evaluate(task.eval_batches(split, 1024, cfg.eval_examples, runner.dtype))
                runner.learner.diagnose(px, py, 0, 0, True)

            return t_iter, _measure(task_end, repeats=1)

        key = {k: v for k, v in to_dict(cfg).items() if k not in ("seed", "run_dir", "threads", "progress", "stream")}
        key["stream"] = {k: v for k, v in to_dict(cfg.stream).items() if k != "num_tasks"}
        t_iter, t_task_end = self._cached(["iter", key], times)
        return iterations, iterations * t_iter + cfg.stream.num_tasks * t_task_end


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def dry_run(sweep: Sweep, root: Path, retry_failed: bool, num_cpus: int | None) -> int:
    """List the trials with their state and estimated cost; starts nothing, writes nothing."""
    import torch

    cls = runner_config(sweep.cfg.kind)
    res = sweep.cfg.resources_per_trial
    status, invalid = Status(sweep, root, read_status(root)), invalid_trials(sweep)
    device = "cuda" if res.gpu and torch.cuda.is_available() else "cpu"
    model = CostModel(res.cpu)
    unit = "updates" if sweep.cfg.kind == "train" else "iterations"
    width = max(len(t.id) for t in sweep.trials)
    print(f"{'trial':<{width}}  {'state':<8} {unit:>12}  {'estimate':>9}  note")
    total_updates, total_s, n_run = 0, 0.0, 0
    for t in sweep.trials:
        entry = status.trials[t.id]
        if t.id in invalid:
            print(f"{t.id:<{width}}  {'invalid':<8} {'':>12}  {'':>9}  {invalid[t.id]}")
            continue
        state = "resume" if entry["status"] == "pending" and trial_state(root / t.id) == "resume" else entry["status"]
        cfg = merge_sources(cls, sweep.base, [*t.overrides, f"threads={res.cpu}", f"device={device}"])
        updates, seconds = model.train(cfg) if sweep.cfg.kind == "train" else model.continual(cfg)
        if entry["status"] == "pending" or (retry_failed and entry["status"] == "failed"):
            total_updates, total_s, n_run = total_updates + updates, total_s + seconds, n_run + 1
        note = entry["error"] if entry["status"] == "failed" else ""
        print(f"{t.id:<{width}}  {state:<8} {updates:>12,}  {_duration(seconds):>9}  {note}")
    slots = max(1, (num_cpus or os.cpu_count() or 1) // res.cpu)
    print(f"\n{n_run} of {len(sweep.trials)} trials to run ({len(invalid)} invalid): {total_updates:,} {unit}, "
          f"≈ {_duration(total_s)} of trial time ({unit} and env steps timed here on {device} with {res.cpu} "
          f"thread(s); process start-up not counted), ≈ {_duration(total_s / min(slots, max(n_run, 1)))} "
          f"with {slots} trial(s) at a time on this machine")
    return 0
