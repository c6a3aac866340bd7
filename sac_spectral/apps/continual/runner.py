"""``python -m sac_spectral.continual [--config FILE] [--resume RUN_DIR] [key=value ...]``

The continual supervised runner: trains one model on a stream of tasks, ``stream.iters_per_task``
Adam (or SGD) updates each, without telling it when the task changes. At the end of every task it
measures the task's training accuracy (trainability), test accuracy (generalization) and losses;
logs them to TensorBoard by task index (``task/*``) and by iteration (``step/*``), checkpoints
atomically, and writes the per-task table to ``summary.json``. With no arguments it runs the
embedded default, which is exactly ``run_configs/continual_default.yaml``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sac_spectral.apps.continual.kind import KIND, SUMMARY_TASKS
from sac_spectral.core.config import ConfigError, to_dict
from sac_spectral.core.optim import make_optimizer
from sac_spectral.core.seeding import derive_seed
from sac_spectral.core.sizes import FLOAT32, model_size
from sac_spectral.regularizers import build_regularizers
from sac_spectral.runs.cli import recorded_config, set_torch_threads
from sac_spectral.runs.evals import append_rows
from sac_spectral.runs.layout import EVALS
from sac_spectral.runs.logger import RunLogger, state_is_finite
from sac_spectral.runs.memory import check_fits, supervised_estimate
from sac_spectral.runs.run import NonFinite, Run, Schedule, every
from sac_spectral.runs.rundir import open_run_dir, reopen_run_dir
from sac_spectral.supervised.config import DTYPES, ContinualConfig, run_tag
from sac_spectral.supervised.datasets import (
    DataError,
    SyntheticSpec,
    load_dataset,
)
from sac_spectral.supervised.learner import (
    ContinualLearner,
    plasticity_diagnostics,
    weight_sigma_max,
)
from sac_spectral.supervised.models import build_model
from sac_spectral.supervised.streams import (
    ClassificationTask,
    Stream,
    Task,
)

RESUMABLE_KEYS = ("stream.num_tasks", "log_every", "diagnostics_every", "checkpoint_every", "progress", "threads")
EVAL_BATCH = 1024
#: continual runs default to their own root so TensorBoard's HPARAMS tab of ``runs/`` (RL runs)
#: and of ``runs/continual/`` each show one schema
CONTINUAL_ROOT = "runs/continual"
MEMORY_HINT = "batch_size, model.width, model.depth or the dataset's size"


def summary_window(tasks: int) -> int:
    """Tasks in the summary's first and last windows: ``SUMMARY_TASKS``, or half the tasks when
    there are fewer than ``2·SUMMARY_TASKS`` (so the two windows never overlap)."""
    return SUMMARY_TASKS if tasks >= 2 * SUMMARY_TASKS else max(1, tasks // 2)


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


class Interval:
    """Sums of the batch losses and correct predictions since the last log, kept on the device (no
    host sync per iteration)."""

    def __init__(self, device: torch.device) -> None:
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.correct = torch.zeros((), dtype=torch.long, device=device)
        self.iters, self.start = 0, time.perf_counter()

    def add(self, loss: torch.Tensor, correct: torch.Tensor) -> None:
        self.loss += loss
        self.correct += correct
        self.iters += 1

    def read(self, batch_size: int) -> tuple[float, float, float]:
        """Mean loss, mean accuracy and iterations per second since the last read; restarts."""
        now = time.perf_counter()
        out = (float(self.loss) / self.iters, float(self.correct) / (self.iters * batch_size),
               self.iters / max(now - self.start, 1e-9))
        self.loss.zero_()
        self.correct.zero_()
        self.iters, self.start = 0, now
        return out


class ContinualRun:
    """What one continual run holds — data, stream, learner, counters, results — and its run
    directory and checkpoint state (the :class:`~sac_spectral.runs.run.Loop` side that is not the loop)."""

    kind = KIND.name

    def __init__(self, cfg: ContinualConfig) -> None:
        self.cfg = cfg
        self.threads = set_torch_threads(cfg.threads)
        self.device, self.dtype = torch.device(cfg.device), DTYPES[cfg.dtype]
        s = cfg.stream
        self.dataset = None
        if s.kind != "deep_linear":
            d = cfg.dataset
            if d.name == "synthetic":  # generated here: (train + test)·dim values, drawn and summed
                sy = d.synthetic
                check_fits({"synthetic dataset": 3 * FLOAT32 * (sy.train + sy.test) * sy.dim}, self.device,
                           "dataset.synthetic.dim, .train or .test")
            try:
                self.dataset = load_dataset(d.name, d.data_dir, SyntheticSpec(**to_dict(d.synthetic)))
            except DataError as err:
                raise ConfigError(f"dataset: {err}") from None
        try:
            self.stream = Stream(s.kind, s.num_tasks, cfg.seed, self.dataset, s.subset, s.classes_per_task,
                                 s.dim, s.sequence, s.loss)
        except ValueError as err:
            raise ConfigError(f"stream.{err}") from None
        first = self.stream.task(0)
        input_shape = self.dataset.input_shape if self.dataset is not None else (s.dim,)
        m = cfg.model

        def build() -> torch.nn.Module:
            try:
                return build_model(m.name, input_shape, first.num_outputs, m.width, m.depth, m.activation, m.norm,
                                   m.heads, m.patch)
            except ValueError as err:
                raise ConfigError(f"model: {err}") from None

        params, activations = model_size(build, input_shape)
        examples = len(first.train) if isinstance(first, ClassificationTask) else s.dim  # bounds eval and probe
        batches = (cfg.batch_size, min(EVAL_BATCH, examples), min(cfg.probe_size, examples))
        check_fits(supervised_estimate(params, activations, int(np.prod(input_shape)), batches, self.dtype.itemsize,
                                       cfg.regularizers), self.device, MEMORY_HINT)
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed(cfg.seed, "init"))
            model = build()
        model.to(device=self.device, dtype=self.dtype)
        o = cfg.optimizer
        optimizer = make_optimizer(o.name, model.parameters(), o.lr, o.weight_decay, o.momentum, (o.beta1, o.beta2),
                                   o.eps)
        regs = build_regularizers(model, cfg.regularizers, "regularizers")
        diagnostics = (plasticity_diagnostics(cfg.dormant_tau),) if cfg.gradient_diagnostics else (weight_sigma_max,)
        self.learner = ContinualLearner(model, first.objective, optimizer, regs, diagnostics)
        self.gen = torch.Generator().manual_seed(derive_seed(cfg.seed, "sample"))
        self.iteration = 0
        self.results: list[dict[str, Any]] = []
        self.wall_time = 0.0
        self.total = len(self.stream) * s.iters_per_task
        self.run_dir: Path | None = None
        self.logger: RunLogger | None = None
        self.postfix: dict[str, str] = {}

    # ----------------------------------------------------------------------------- run directory
    def open_new(self) -> Path:
        cfg = self.cfg
        data = "linear" if cfg.stream.kind == "deep_linear" else cfg.dataset.name
        self.run_dir = open_run_dir(cfg, self.kind, f"{data}-{cfg.stream.kind}__{run_tag(cfg)}__s{cfg.seed}",
                                    CONTINUAL_ROOT)
        self.logger = RunLogger(self.run_dir)
        return self.run_dir

    def open_resume(self, path: Path) -> None:
        self.load_state_dict(reopen_run_dir(self.cfg, path))
        self.run_dir = path
        self.logger = RunLogger(path, purge_step=self.iteration + 1)

    def describe(self) -> str:
        """One line: what this run does."""
        cfg = self.cfg
        data = "deep linear" if cfg.stream.kind == "deep_linear" else cfg.dataset.name
        return (f"{cfg.stream.kind} stream on {data}: {cfg.stream.num_tasks} tasks × {cfg.stream.iters_per_task} "
                "updates "
                f"| {cfg.model.name} | {cfg.optimizer.name} lr {cfg.optimizer.lr:g} | regularizers: {run_tag(cfg)} "
                f"| seed {cfg.seed} | {cfg.device}, {self.threads}")

    def position(self) -> str:
        t = self.cfg.stream.iters_per_task
        return f"iteration {self.iteration} (task {self.iteration // t}, iteration {self.iteration % t} of {t})"

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "format": 1,
            "config": recorded_config(self.cfg),
            "iteration": self.iteration,
            "learner": self.learner.state_dict(),
            "sample_rng": self.gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "results": self.results,
            "wall_time": self.wall_time,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        per_task, done = self.cfg.stream.iters_per_task, int(state["iteration"])
        if done > len(self.stream) * per_task:
            raise ConfigError(f"stream.num_tasks={len(self.stream)} is below the tasks this run has done "
                              f"({done / per_task:g}); give stream.num_tasks >= {-(-done // per_task)}")
        self.iteration = done
        self.learner.load_state_dict(state["learner"])
        self.gen.set_state(state["sample_rng"])
        torch.set_rng_state(state["torch_rng"])
        self.results = list(state["results"])
        self.wall_time = float(state["wall_time"])

    def finite(self) -> bool:
        return state_is_finite(self.state_dict())

class ContinualRunner(ContinualRun):
    """The continual loop, task after task, driven by a :class:`Run`."""

    # ----------------------------------------------------------------------------- tasks
    def _batch(self, pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = pair
        return x.to(self.device), y.to(self.device)

    def _evaluate(self, task: Task, split: str) -> dict[str, float] | None:
        batches = (self._batch(b) for b in task.eval_batches(split, EVAL_BATCH, self.cfg.eval_examples, self.dtype))
        return self.learner.evaluate(batches)

    def _diagnose(self, task: Task, task_end: bool) -> None:
        assert self.logger is not None
        x, y = self._batch(next(task.eval_batches("train", self.cfg.probe_size, self.cfg.probe_size, self.dtype)))
        values = self.learner.diagnose(x, y, task.index, self.iteration, task_end)
        for tag, value in values.items():
            self.logger.scalar(tag, value, self.iteration)

    def _end_task(self, task: Task) -> dict[str, Any]:
        """Evaluate, record and log the task that just ended; run the diagnostics."""
        assert self.logger is not None
        train, test = self._evaluate(task, "train"), self._evaluate(task, "test")
        assert train is not None
        row = {
            "task": task.index,
            "iteration": self.iteration,
            "train_acc": train.get("acc"),
            "loss": train["loss"],
            "test_acc": test.get("acc") if test else None,
            "test_loss": test["loss"] if test else None,
        }
        self.results.append(row)
        append_rows(self.logger.run_dir / EVALS, KIND.columns,
                    [{**row, "seed": self.cfg.seed, "wall_time_s": self.wall_time}])
        for key, tag in (("train_acc", "train_acc"), ("test_acc", "test_acc"), ("loss", "loss"),
                         ("test_loss", "test_loss")):
            if row[key] is not None:
                self.logger.scalar(f"task/{tag}", row[key], task.index)
                self.logger.scalar(f"step/{tag}", row[key], self.iteration)
        self._diagnose(task, task_end=True)
        return row

    # ----------------------------------------------------------------------------- training
    def train(self, run: Run) -> None:
        """One batch and update per iteration, task after task, and the periodic work."""
        cfg = self.cfg
        self.bar = run.begin(self.schedule(), self.total, self.iteration, "it")
        if self.results and self.results[-1]["train_acc"] is not None:
            self.postfix["train_acc"] = f"{self.results[-1]['train_acc']:.3f}"
        self.task = self.stream.task(min(self.iteration // cfg.stream.iters_per_task, len(self.stream) - 1))
        self.interval = Interval(self.device)
        while self.iteration < self.total:
            if self.task.index != self.iteration // cfg.stream.iters_per_task:
                self.task = self.stream.task(self.iteration // cfg.stream.iters_per_task)
            x, y = self._batch(self.task.train_batch(self.gen, cfg.batch_size, self.dtype))
            self.interval.add(*self.learner.train_step(x, y))
            self.iteration += 1
            run.after(self.iteration)

    def schedule(self) -> Schedule:
        """After each iteration, in order: logging, a finiteness check before any diagnostics see a
        broken model, diagnostics within a task, the end of a task; a checkpoint every
        ``checkpoint_every`` tasks and at the end."""
        cfg, per_task = self.cfg, self.cfg.stream.iters_per_task

        def task_end(it: int) -> bool:
            return it % per_task == 0

        def diagnose(it: int) -> bool:
            return every(cfg.diagnostics_every)(it) and not task_end(it)

        return Schedule(
            jobs=[
                ("log", every(cfg.log_every), self._log),
                ("finite", lambda it: task_end(it) or diagnose(it), self._check_finite),
                ("diagnose", diagnose, lambda: self._diagnose(self.task, task_end=False)),
                ("task end", task_end, self._task_done),
            ],
            checkpoint=lambda it: task_end(it) and (it == self.total or every(cfg.checkpoint_every)(it // per_task)),
        )

    def _log(self) -> None:
        """The interval's mean batch loss (and accuracy), iterations per second and the learner's metrics."""
        mean_loss, mean_acc, rate = self.interval.read(self.cfg.batch_size)
        if not np.isfinite(mean_loss):
            raise NonFinite
        self.logger.scalar("step/batch_loss", mean_loss, self.iteration)
        if self.task.objective == "classification":
            self.logger.scalar("step/batch_acc", mean_acc, self.iteration)
        self.logger.scalar("perf/iters_per_s", rate, self.iteration)
        self.logger.scalars(self.learner.metrics(), self.iteration)

    def _check_finite(self) -> None:
        if not self.finite():
            raise NonFinite

    def _task_done(self) -> None:
        row = self._end_task(self.task)
        if not np.isfinite(row["loss"]):
            raise NonFinite
        self.postfix["task"] = f"{self.task.index + 1}/{len(self.stream)}"
        if row["train_acc"] is not None:
            self.postfix["train_acc"] = f"{row['train_acc']:.3f}"
        else:
            self.postfix["loss"] = f"{row['loss']:.3g}"
        self.bar.set_postfix(self.postfix, refresh=False)

    def summary(self) -> dict[str, Any]:
        rows = self.results
        window = summary_window(len(rows))
        head, tail = rows[:window], rows[-window:]
        out: dict[str, Any] = {
            "dataset": None if self.dataset is None else self.dataset.name,
            "stream": self.cfg.stream.kind,
            "model": self.cfg.model.name,
            "regularizers": self.cfg.regularizers,
            "seed": self.cfg.seed,
            "tasks_done": len(rows),
            "iterations": self.iteration,
            "wall_time_s": self.wall_time,
            "iters_per_s": self.iteration / max(self.wall_time, 1e-9),
        }
        for key in ("train_acc", "test_acc", "loss", "test_loss"):
            out[f"first{SUMMARY_TASKS}_{key}"] = _mean([r[key] for r in head])
            out[f"last{SUMMARY_TASKS}_{key}"] = _mean([r[key] for r in tail])
            out[f"final_{key}"] = rows[-1][key] if rows else None
        out["window_tasks"] = window
        out["tasks"] = rows
        return out

    def headline(self, summary: dict[str, Any]) -> tuple[str, dict[str, float]]:
        n = summary["window_tasks"]
        if summary[f"first{SUMMARY_TASKS}_train_acc"] is not None:
            result = (f"end-of-task train accuracy: first {n} tasks {summary[f'first{SUMMARY_TASKS}_train_acc']:.3f}, "
                      f"last {n} tasks {summary[f'last{SUMMARY_TASKS}_train_acc']:.3f}")
            if summary[f"first{SUMMARY_TASKS}_test_acc"] is not None:
                result += (f"; test accuracy: first {n} {summary[f'first{SUMMARY_TASKS}_test_acc']:.3f}, "
                           f"last {n} {summary[f'last{SUMMARY_TASKS}_test_acc']:.3f}")
        else:
            result = (f"end-of-task loss: first {n} tasks {summary[f'first{SUMMARY_TASKS}_loss']:.4g}, "
                      f"last {n} tasks {summary[f'last{SUMMARY_TASKS}_loss']:.4g}")
        if n < SUMMARY_TASKS:
            result += f" (halves of the {summary['tasks_done']} tasks: fewer than {2 * SUMMARY_TASKS})"
        metrics = {k: v for k, v in summary.items() if k.startswith(("first", "last", "final")) and v is not None}
        return (f"done: {summary['tasks_done']} tasks, {summary['iterations']} iterations in "
                f"{summary['wall_time_s']:.0f} s; "
                + result, metrics)


def main(argv: Sequence[str] | None = None) -> int:
    return Run.main(
        "sac_spectral.continual", __doc__.split("\n\n")[1], ContinualConfig, RESUMABLE_KEYS, ContinualRunner, argv
    )
