"""``python -m sac_spectral.train [--config FILE] [--resume RUN_DIR] [key=value ...]``

The RL runner: collects experience with the configured agent (``agent``: SAC by default), runs ``replay_ratio`` gradient
updates per env step after ``random_steps`` uniform warm-up steps, evaluates the deterministic policy ``tanh(mean)``
every ``eval_every`` steps on separately seeded envs, resets the agent on a schedule, logs to
TensorBoard and checkpoints atomically. With no arguments it runs the embedded default, which is
exactly ``run_configs/default.yaml``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from functools import cached_property
from typing import Any

import numpy as np
import torch

from sac_spectral.agents import Agent, ReplayBuffer
from sac_spectral.agents.probes import DiagnosticsConfig, agent_diagnostics, probe_batch
from sac_spectral.apps.rl.compile_choice import remember_compiled
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.apps.rl.evaluation import Evaluation
from sac_spectral.apps.rl.kind import KIND
from sac_spectral.apps.rl.run import CHECKPOINT_FORMAT, RLRun, check_format
from sac_spectral.core.config import to_dict
from sac_spectral.core.seeding import derive_seed
from sac_spectral.diagnostics import layer_sigma_max
from sac_spectral.runs.logger import RunLogger, tensor_is_finite
from sac_spectral.runs.run import NonFinite, Run, Schedule, every

__all__ = ["CHECKPOINT_FORMAT", "RESUMABLE_KEYS", "TrainConfig", "Trainer", "check_format", "main"]

#: keys that may change on --resume; ``compile``: the compiled and the eager update share the
#: agent's parameters and Adam state; a task sequence is extended by ``cycles`` (its ``total_steps`` follows)
RESUMABLE_KEYS = (
    "total_steps", "cycles", "eval_every", "eval_episodes", "video_every", "log_every", "checkpoint_every", "progress",
    "threads", "compile", *(f"diagnostics.{f.name}" for f in fields(DiagnosticsConfig)),
)
#: priming runs in chunks of this many updates: the progress bar, ``priming/*`` logs, a stop
#: request and checkpoints (every ``PRIMING_CHECKPOINT`` updates) act between chunks
PRIMING_CHUNK = 1000
PRIMING_CHECKPOINT = 10_000


class Rates:
    """Steps and updates per second of training time over an interval, restarted on each reading:
    the time :meth:`exclude` is told of (evaluations, videos, diagnostics) does not count."""

    def __init__(self, step: int, updates: int) -> None:
        self.restart(step, updates)

    def restart(self, step: int, updates: int) -> None:
        self.time, self.step, self.updates, self.excluded = time.perf_counter(), step, updates, 0.0

    def exclude(self, seconds: float) -> None:
        self.excluded += seconds

    def elapsed(self) -> float:
        """Training seconds since the last reading."""
        return time.perf_counter() - self.time - self.excluded

    def read(self, step: int, updates: int) -> dict[str, float]:
        dt = max(self.elapsed(), 1e-9)
        rates = {"perf/env_steps_per_s": (step - self.step) / dt, "perf/updates_per_s": (updates - self.updates) / dt}
        self.restart(step, updates)
        return rates


def log_training(logger: RunLogger, agent: Agent, info: dict[str, torch.Tensor], step: int) -> None:
    """The last update's metrics, the agent's state metrics and σ_max per layer; a non-finite
    metric ends the run."""
    metrics = {**info, **agent.metrics()}
    logger.scalars(metrics, step)
    for net, module in agent.nets().items():
        for i, sigma in enumerate(layer_sigma_max(module)):
            logger.per_seed(f"spectral/{net}/layer{i}/sigma_max", agent.per_seed(net, sigma), step)
    if not tensor_is_finite(metrics):
        raise NonFinite


def random_policy(seeds: Sequence[int], act_dim: int) -> Callable[[np.ndarray], np.ndarray]:
    """Uniform actions in [-1, 1], each seed from its own stream (the baseline of ``random_policy_return``)."""
    rngs = [np.random.default_rng(derive_seed(s, "random_policy")) for s in seeds]
    return lambda obs: np.stack([rng.uniform(-1.0, 1.0, act_dim) for rng in rngs])


def log_diagnostics(logger: RunLogger, agent: Agent, buffer: ReplayBuffer, cfg: TrainConfig, seeds: Sequence[int],
                    step: int, prefix: str = "", logged: bool = False) -> dict[str, list[float]]:
    """Log gradient rank, spectra, features and dormant units on a probe batch of its own (under
    ``prefix`` + the usual tags; σ_max not where the training metrics were ``logged`` at this
    step, which hold it); returns every per-seed scalar, σ_max included."""
    batch, noise = probe_batch(agent, buffer, cfg.diagnostics.batch_size, seeds, agent.num_updates)
    out: dict[str, list[float]] = {}
    for net, report in agent_diagnostics(agent, batch, noise, cfg.diagnostics).items():
        for tag, value in report.scalars.items():
            per_seed = agent.per_seed(net, value)
            out[tag] = per_seed.reshape(-1).tolist()
            if not (logged and tag.startswith("spectral/") and tag.endswith("/sigma_max")):
                logger.per_seed(prefix + tag, per_seed, step)  # σ_max: one point per step
        for tag, values in report.histograms.items():
            logger.histograms(prefix + tag, values.reshape(len(seeds), -1), step)
    return out


def eval_rows(evals: Sequence[dict[str, Any]], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """The evaluation history as ``evals.csv``'s rows (one per seed)."""
    return [{**{k: e.get(k) for k in ("step", "updates", "task", "stage", "warmup")}, "seed": s, "return": r}
            for e in evals for s, r in zip(seeds, e["returns"])]


def summary(t: Trainer) -> dict[str, Any]:
    """``summary.json`` of an RL run: final, best (null where no evaluation followed the first
    update of its stage) and random-policy returns (means and per seed), counts — ``steps`` are the agent's
    actions, ``simulator_steps`` those times ``action_repeat`` — and rates, the warnings of its
    start, the evaluation history and the priming diagnostics. A task sequence's final return is
    the average over its tasks, its best the current task's, and ``continual`` holds
    :func:`~sac_spectral.apps.rl.stages.stage_metrics` and the diagnostics at each switch."""
    current = [e for e in t.evals if e.get("task", t.cfg.env) == t.sequence.ending(e["step"]).spec.name]
    finals = t.evals[-1]["returns"] if t.evals else [float("nan")] * len(t.seeds)
    continual = None
    measured = KIND.stages(eval_rows(t.evals, t.seeds), to_dict(t.cfg))
    if measured is not None:
        continual = {**measured, "switches": t.switches}
        finals = [float("nan") if f is None else f for f in continual["final_average"]]
    trained = [e["returns"] for e in current if not e.get("warmup", t.warming_up(e["step"]))]  # warm-ups don't count
    best = np.max(trained, axis=0).tolist() if trained else [None] * len(t.seeds)
    randoms = t.random_return or []
    return {
        "env": t.cfg.env, "seeds": t.seeds, "steps": t.step, "simulator_steps": t.step * t.cfg.action_repeat,
        "updates": t.agent.num_updates, "priming_updates": t.primed, "wall_time_s": t.wall_time,
        "updates_per_s": t.agent.num_updates / max(t.wall_time, 1e-9),
        "steps_per_s": t.step / max(t.wall_time, 1e-9),
        "warnings": t.warnings,
        "final_eval_return": float(np.mean(finals)), "best_eval_return": float(np.mean(best)) if trained else None,
        "random_policy_return": float(np.mean(t.random_return or [float("nan")])),
        "per_seed": [{"seed": s, "final_eval_return": f, "best_eval_return": b, "random_policy_return": r}
                     for s, f, b, r in zip(t.seeds, finals, best, randoms)],
        "eval_history": t.evals,
        "priming": t.priming_report,
        "q_scale": t.q_scale_end,
        **({"continual": continual} if continual is not None else {}),
    }


class Trainer(RLRun):
    """The RL loop, driven by a :class:`Run`.

    :meth:`train` is the loop — act, step the envs, store, learn — and :meth:`schedule` the
    periodic work after each env step, in this order: logging, diagnostics, evaluation, the reset
    (so an evaluation at a reset step scores the trained agent, as rl_with_resets does), then a
    checkpoint.
    """

    @cached_property
    def evaluation(self) -> Evaluation:
        """The run's evaluations, videos and value scale."""
        return Evaluation(self)

    # ----------------------------------------------------------------------------- the loop
    def train(self, run: Run) -> None:
        """Act, step the envs, store, learn, and the periodic work, until ``total_steps``."""
        for warning in self.warnings:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        if self.random_return is None:
            self.random_return = self.evaluation.returns(random_policy(self.seeds, self.pool.act_dim),
                                                         "random_policy", self.stage().task).tolist()
            self.logger.per_seed("eval/random_policy_return", self.random_return, 0)
        self.rates = {"bar": Rates(self.step, self.agent.num_updates), "log": Rates(self.step, self.agent.num_updates)}
        self.logged_step, self.logged_updates = -1, self.agent.num_updates
        self.bar = run.begin(self.schedule(), self.cfg.total_steps, self.step, "step")
        self.postfix = {"eval": f"{float(np.mean(self.evals[-1]['returns'])):.1f}"} if self.evals else {}
        if self._reset_due():  # a run that ended at a reset step and is now extended
            self._reset()
        if self.sequence.is_switch(self.step) and all(s["step"] != self.step for s in self.switches):
            self._switch()  # a sequence that ended there and now runs more cycles
        if self._priming_due():  # resumed in the middle of priming: finish it and this step's periodic work
            self.learn(run)
            run.after(self.step)
        while self.step < self.cfg.total_steps:
            obs, actions = self.pool.obs, self._act()
            if not np.isfinite(actions).all():
                raise NonFinite
            with self.simulating(self.sequence.stage_at(self.step)):
                tr = self.pool.step(actions)
            self.buffer.add(obs, actions, tr.reward, tr.next_obs, tr.terminated, tr.terminated | tr.truncated)
            self.step += 1
            self.logger.episodes(tr.finished, self.step)
            self.learn(run)
            run.after(self.step)
        if self.cfg.compile is True and self.agent.num_updates > 0:
            remember_compiled(self.compile_key)
        if self.cfg.diagnostics.q_scale:
            self.q_scale_end = self.evaluation.value_scale(self.stage().task, "")

    def schedule(self) -> Schedule:
        """The periodic work after each env step, in its order, and when to checkpoint."""
        cfg = self.cfg
        return Schedule(
            jobs=[
                ("log", self._log_due, self._log),
                ("diagnose", self._diagnosis_due, self._untimed(self._diagnose_now)),
                ("evaluate",
                 lambda step: every(cfg.eval_every, end=cfg.total_steps)(step) or self.sequence.is_switch(step),
                 self._untimed(self.evaluation.run)),
                ("video", every(cfg.video_every, end=cfg.total_steps if cfg.video_every else None),
                 self._untimed(self.evaluation.video)),
                ("reset", lambda step: step < cfg.total_steps and self._reset_due(), self._reset),
                ("switch", self.sequence.is_switch, self._switch),
                ("threads", lambda step: self.thread_watch is not None and self.thread_watch.due(), self._rethread),
                ("progress", lambda step: True, self._progress),
            ],
            checkpoint=every(cfg.checkpoint_every, end=cfg.total_steps),
        )

    def learn(self, run: Run) -> None:
        """Priming when due, then the updates this step owes."""
        if self._priming_due():
            Priming(self, run).run()
        n = self.sequence.updates_by(self.step) - (self.agent.num_updates - self.primed)
        if n > 0 and self._log_due(self.step, n):  # the log at this step reports this step's last update
            self.last_info, self.update_metrics = self.plasticity.train_steps(self.buffer, n, self.cfg.batch_size)
        elif n > 0:
            self.last_info = self.agent.train_steps(self.buffer, n, self.cfg.batch_size)

    def _act(self) -> np.ndarray:
        if self.step < self.sequence.warmup_end(self.sequence.stage_at(self.step).index):
            return (self.streams.rand("act", (self.pool.act_dim,)) * 2.0 - 1.0).cpu().numpy()
        return self.agent.act(torch.as_tensor(self.pool.obs, device=self.device)).cpu().numpy()

    def _reset_due(self) -> bool:
        return self.step > 0 and self.cfg.resets.due(self.step) and self.last_reset < self.step

    def _reset(self) -> None:
        """Nikishin et al.'s reset (the buffer stays). A run that ends at a reset step skips it (its
        final checkpoint keeps the trained agent); extending that run applies it on resume."""
        self.agent.reset(self.cfg.resets.layers(), self.cfg.resets.networks or None)
        self.last_reset = self.step

    def _switch(self) -> None:
        """A task switch, after the ended stage's evaluations: diagnostics of the agent as the stage
        left it (``switch/…``, and in ``summary.json``), then ``on_switch``, then the next stage's envs."""
        ended, sw = self.stage(), self.cfg.on_switch
        record: dict[str, Any] = {"step": self.step, "stage": ended.index, "task": ended.spec.name}
        if self.cfg.diagnostics.every:
            record["diagnostics"] = self.diagnose("switch/")
        if self.cfg.diagnostics.q_scale:
            record["q_scale"] = self.evaluation.value_scale(ended.task, "switch/")
        self.switches.append(record)
        self.buffer.end_episodes()  # the pool starts new ones below
        if sw.buffer == "clear":
            self.buffer.clear()
        layers = sw.layers()
        if layers is not False:
            self.agent.reset(layers, sw.networks or None)
        if sw.optimizer == "reset":
            self.agent.forget_optimizers()
        with self.simulating(self.sequence.stage_at(self.step)):
            self.pool.replace(self.stage_envs(self.sequence.stage_at(self.step)))
        self.logger.scalar("task/stage", self.sequence.stage_at(self.step).index, self.step)

    # ----------------------------------------------------------------------------- logging
    def _untimed(self, action: Callable[[], None]) -> Callable[[], None]:
        """``action``, its time left out of the training rates (``perf/*`` and the bar's)."""
        def timed() -> None:
            start = time.perf_counter()
            action()
            for rates in self.rates.values():
                rates.exclude(time.perf_counter() - start)
        return timed

    def _progress(self) -> None:
        """The bar's rates, refreshed about once a second of training time."""
        if self.rates["bar"].elapsed() >= 1.0:
            rates = self.rates["bar"].read(self.step, self.agent.num_updates)
            self.postfix.update(sps=f"{rates['perf/env_steps_per_s']:.0f}", ups=f"{rates['perf/updates_per_s']:.0f}")
        self.postfix.pop("priming", None)
        self.bar.set_postfix(self.postfix, refresh=False)

    def _rethread(self) -> None:
        """``threads=0``: follow the cores that other processes leave idle (:class:`ThreadWatch`)."""
        count = self.thread_watch.choose()
        if count is not None and count != torch.get_num_threads():
            torch.set_num_threads(count)

    def _log_due(self, step: int, pending: int = 0) -> bool:
        """At the multiples of ``log_every``, and at the run's last step if updates (``pending``
        ones included) ran since the last log."""
        return step % self.cfg.log_every == 0 or (
            step == self.cfg.total_steps and self.agent.num_updates + pending > self.logged_updates)

    def _log(self) -> None:
        for tag, value in self.rates["log"].read(self.step, self.agent.num_updates).items():
            self.logger.scalar(tag, value, self.step)
        self.logger.scalar("perf/threads", torch.get_num_threads(), self.step)
        log_training(self.logger, self.agent, {**self.last_info, **self.update_metrics, **self.plasticity.weights()},
                     self.step)
        self.update_metrics = {}
        self.logged_step, self.logged_updates = self.step, self.agent.num_updates

    def _diagnosis_due(self, step: int) -> bool:
        every, updates = self.cfg.diagnostics.every, self.agent.num_updates
        return bool(every) and ((updates == 0 and step == self.cfg.random_steps)
                                or updates // every > self.diagnosed // every)

    def _diagnose_now(self) -> None:
        self.diagnose()
        self.diagnosed = self.agent.num_updates

    def diagnose(self, prefix: str = "") -> dict[str, list[float]]:
        """:func:`log_diagnostics` of the agent now."""
        return log_diagnostics(self.logger, self.agent, self.buffer, self.cfg, self.seeds, self.step, prefix,
                               logged=self.logged_step == self.step)

    # ----------------------------------------------------------------------------- the end
    def summary(self) -> dict[str, Any]:
        return summary(self)

    def headline(self, summary: dict[str, Any]) -> tuple[str, dict[str, float]]:
        return (f"done: {summary['steps']} steps, {summary['updates']} updates in {summary['wall_time_s']:.0f} s; "
                f"final eval return {summary['final_eval_return']:.1f} (random policy "
                f"{summary['random_policy_return']:.1f})",
                {k: summary[k] for k in ("final_eval_return", "best_eval_return",
                                         "updates_per_s") if summary[k] is not None})


class Priming:
    """Heavy priming: ``priming.updates`` updates on the transitions stored so far, in chunks, with
    diagnostics before and after (``priming/before/…``, ``priming/after/…``, and in ``summary.json``)
    and, under ``priming/…`` by priming update, the losses and the plasticity metrics of each chunk's
    last update (gradient norm, effective learning rate, churn, weight magnitude and distance from
    init; the last chunk's are in ``after`` too); a checkpoint every ``PRIMING_CHECKPOINT``."""

    def __init__(self, trainer: Trainer, run: Run) -> None:
        self.trainer, self.run_ = trainer, run

    def run(self) -> None:
        t, cfg = self.trainer, self.trainer.cfg
        total = cfg.priming.updates
        if t.primed == 0 and cfg.diagnostics.every:
            t.priming_report["before"] = t.diagnose("priming/before/")
        measured: dict[str, torch.Tensor] = {}
        while t.primed < total:
            n = min(PRIMING_CHUNK, total - t.primed)
            info, measured = t.plasticity.train_steps(t.buffer, n, cfg.batch_size)
            t.primed += n
            self.run_.tick()
            if not tensor_is_finite(info):
                raise NonFinite
            measured.update(t.plasticity.weights())
            t.logger.scalars({f"priming/{k}": v for k, v in {**info, **t.agent.metrics(), **measured}.items()},
                             t.primed)
            t.bar.set_postfix({**t.postfix, "priming": f"{t.primed}/{total}"})
            if t.primed < total:  # a stop after the last chunk waits for the diagnostics after priming
                self.run_.check_stop()
                if t.primed % PRIMING_CHECKPOINT == 0:
                    self.run_.checkpoint()
        if cfg.diagnostics.every:
            after = {k: v.tolist() for k, v in measured.items()}
            t.priming_report["after"] = {**t.diagnose("priming/after/"), **after}
        self.run_.check_stop()


def main(argv: Sequence[str] | None = None) -> int:
    return Run.main("sac_spectral.train", __doc__.split("\n\n")[1], TrainConfig, RESUMABLE_KEYS, Trainer, argv)
