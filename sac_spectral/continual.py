"""``python -m sac_spectral.continual [--config FILE] [--resume RUN_DIR] [key=value ...]``

The continual supervised runner: trains one model on a stream of tasks, ``stream.iters_per_task``
Adam (or SGD) updates each, without telling it when the task changes. At the end of every task it
measures the task's training accuracy (trainability), test accuracy (generalization) and losses;
logs them to TensorBoard by task index (``task/*``) and by iteration (``step/*``), checkpoints
atomically, and writes the per-task table to ``summary.json``. With no arguments it runs the
embedded default, which is exactly ``run_configs/continual_default.yaml``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sac_spectral.core.config import ConfigError, check, option, section, to_dict
from sac_spectral.core.seeding import derive_seed
from sac_spectral.regularizers import build_regularizers, validate_specs
from sac_spectral.runs.checkpoint import save_checkpoint
from sac_spectral.runs.cli import (
    check_device,
    recorded_config,
    run_cli,
    set_torch_threads,
)
from sac_spectral.runs.evals import append_task_evals
from sac_spectral.runs.layout import CHECKPOINT, SUMMARY_TASKS
from sac_spectral.runs.logger import RunLogger, state_is_finite
from sac_spectral.runs.memory import (
    FLOAT32,
    check_fits,
    model_size,
    supervised_estimate,
)
from sac_spectral.runs.run import (
    GracefulStop,
    end_nonfinite,
    end_stopped,
    finish_run,
    progress_bar,
    runner_main,
)
from sac_spectral.runs.rundir import open_run_dir, reopen_run_dir
from sac_spectral.supervised.datasets import (
    DATASETS,
    DataError,
    SyntheticSpec,
    load_dataset,
)
from sac_spectral.supervised.learner import (
    OPTIMIZERS,
    ContinualLearner,
    make_optimizer,
    plasticity_diagnostics,
    weight_spectra,
)
from sac_spectral.supervised.models import MODELS, NORMS, build_model
from sac_spectral.supervised.streams import (
    LOSSES,
    SEQUENCES,
    STREAMS,
    ClassificationTask,
    Stream,
    Task,
)

RESUMABLE_KEYS = ("stream.num_tasks", "log_every", "diagnostics_every", "checkpoint_every", "progress", "threads")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
EVAL_BATCH = 1024
#: continual runs default to their own root so TensorBoard's HPARAMS tab of ``runs/`` (RL runs)
#: and of ``runs/continual/`` each show one schema
CONTINUAL_ROOT = "runs/continual"
MAX_SEED = 2**63 - 1  # seeds go through numpy's SeedSequence and torch's 64-bit generators
MEMORY_HINT = "batch_size, model.width, model.depth or the dataset's size"


def _choice(value: str, choices: Sequence[str], key: str) -> None:
    check(value in choices, key, f"'{value}' is not one of {', '.join(choices)}")


@dataclass
class SyntheticConfig:
    classes: int = option(10, "number of Gaussian classes")
    dim: int = option(32, "input dimension")
    train: int = option(2000, "training examples")
    test: int = option(1000, "test examples")
    separation: float = option(3.0, "class means ~ N(0, separation²/dim · I): two means lie ≈ separation·√2 apart")
    seed: int = option(0, "seed of the data (independent of the run's seed)")

    def validate(self) -> None:
        check(self.classes >= 2, "classes", f"must be >= 2, got {self.classes}")
        for key in ("dim", "test"):
            check(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        check(self.train >= self.classes, "train", f"must be >= classes ({self.classes}), got {self.train}")
        check(self.separation >= 0, "separation", f"must be >= 0, got {self.separation}")
        check(0 <= self.seed <= MAX_SEED, "seed", f"must lie in [0, {MAX_SEED}], got {self.seed}")


@dataclass
class DatasetConfig:
    name: str = option("digits", f"dataset: {' | '.join(DATASETS)} (digits, mnist1d, synthetic are embedded)")
    data_dir: str = option("data", "folder holding the file datasets (mnist/, cifar-10-batches-py/, …)")
    synthetic: SyntheticConfig = section(SyntheticConfig)

    def validate(self) -> None:
        _choice(self.name, DATASETS, "name")


@dataclass
class StreamConfig:
    kind: str = option("random_label", f"nonstationarity: {' | '.join(STREAMS)}")
    num_tasks: int = option(30, "number of tasks")
    iters_per_task: int = option(400, "updates per task")
    subset: int = option(512, "training examples used by every task: a fixed random subset (0 = the whole training split)")
    classes_per_task: int = option(2, "class_incremental: classes added per task")
    dim: int = option(4, "deep_linear: input/output dimension d")
    sequence: str = option("flip", f"deep_linear targets: {' | '.join(SEQUENCES)}")
    loss: str = option("population", f"deep_linear loss: {' | '.join(LOSSES)}")

    def validate(self) -> None:
        _choice(self.kind, STREAMS, "kind")
        _choice(self.sequence, SEQUENCES, "sequence")
        _choice(self.loss, LOSSES, "loss")
        for key in ("num_tasks", "iters_per_task", "classes_per_task", "dim"):
            check(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        check(self.subset >= 0, "subset", f"must be >= 0, got {self.subset}")


@dataclass
class ModelConfig:
    name: str = option("mlp", f"architecture: {' | '.join(MODELS)}")
    width: int = option(256, "mlp/cnn hidden units, resnet18 base channels (64 = standard), vit embedding width")
    depth: int = option(2, "mlp hidden layers, vit blocks, deep_linear layers")
    activation: str = option("relu", "activation of mlp, cnn and resnet18: relu | tanh | elu | gelu | silu | leaky_relu | crelu")
    norm: str = option("none", f"normalization of mlp, cnn and resnet18: {' | '.join(NORMS)}")
    heads: int = option(4, "vit attention heads")
    patch: int = option(4, "vit patch size")

    def validate(self) -> None:
        _choice(self.name, MODELS, "name")
        _choice(self.norm, NORMS, "norm")
        for key in ("width", "depth", "heads", "patch"):
            check(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")


@dataclass
class OptimizerConfig:
    name: str = option("adam", f"optimizer: {' | '.join(OPTIMIZERS)}")
    lr: float = option(1e-3, "learning rate")
    weight_decay: float = option(0.0, "weight decay (adam: L2 in the gradient; adamw: decoupled)")
    momentum: float = option(0.0, "sgd momentum")
    beta1: float = option(0.9, "adam/adamw β₁")
    beta2: float = option(0.999, "adam/adamw β₂")
    eps: float = option(1e-8, "adam/adamw ε")

    def validate(self) -> None:
        _choice(self.name, OPTIMIZERS, "name")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        check(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        for key in ("beta1", "beta2", "momentum"):
            check(0 <= getattr(self, key) < 1, key, f"must be in [0, 1), got {getattr(self, key)}")
        check(self.eps >= 0, "eps", f"must be >= 0, got {self.eps}")


@dataclass
class ContinualConfig:
    seed: int = option(0, "random seed (initialization, stream, batches)")
    batch_size: int = option(64, "examples per update")
    dataset: DatasetConfig = section(DatasetConfig, "data (ignored by the deep_linear stream)")
    stream: StreamConfig = section(StreamConfig, "the sequence of tasks")
    model: ModelConfig = section(ModelConfig, "the network")
    optimizer: OptimizerConfig = section(OptimizerConfig, "the optimizer")
    regularizers: list[dict[str, Any]] = option(
        [{"name": "spectral", "coef": 1e-3, "k": 2}], "regularizers, e.g. [{name: spectral, coef: 1e-3}]; [] for none"
    )
    eval_examples: int = option(0, "end-of-task evaluation uses the first N examples of each split (0 = all)")
    probe_size: int = option(256, "examples of the current task shown to diagnostics")
    gradient_diagnostics: bool = option(True, "gradient rank, feature rank and dormant units (else σ_max only)")
    dormant_tau: float = option(0.025, "ReDo score threshold of a dormant unit in the diagnostics")
    diagnostics_every: int = option(0, "run diagnostics every N iterations as well as at every task end (0 = task ends only)")
    log_every: int = option(100, "write training loss and regularizer metrics every N iterations")
    checkpoint_every: int = option(1, "checkpoint every N tasks (0 = only at the end)")
    run_dir: str | None = option(None, "run directory (default: runs/continual/<dataset>-<stream>__<regularizers>__s<seed>__<time>)")
    device: str = option("cpu", "torch device: cpu, cuda, cuda:<i>")
    dtype: str = option("float32", "parameter and input precision: float32 | float64")
    threads: int = option(0, "torch CPU threads (0 = the cores other processes leave idle at start)")
    progress: bool = option(True, "show a progress bar")

    def validate(self) -> None:
        check(0 <= self.seed <= MAX_SEED, "seed", f"must lie in [0, {MAX_SEED}], got {self.seed}")
        check(self.run_dir is None or bool(self.run_dir.strip()), "run_dir",
              "empty; give a directory, or leave run_dir out for runs/<name>__<time>")
        check(0.0 <= self.dormant_tau <= 1.0, "dormant_tau", f"must be in [0, 1], got {self.dormant_tau}")
        for key in ("batch_size", "probe_size", "log_every"):
            check(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        for key in ("eval_examples", "diagnostics_every", "checkpoint_every", "threads"):
            check(getattr(self, key) >= 0, key, f"must be >= 0, got {getattr(self, key)}")
        _choice(self.dtype, tuple(DTYPES), "dtype")
        validate_specs(self.regularizers, "regularizers")
        linear = (self.stream.kind == "deep_linear", self.model.name == "deep_linear")
        check(linear[0] == linear[1], "model.name",
              "the deep_linear stream and the deep_linear model go together "
              f"(stream.kind={self.stream.kind}, model.name={self.model.name})")
        check_device(self.device)


def summary_window(tasks: int) -> int:
    """Tasks in the summary's first and last windows: ``SUMMARY_TASKS``, or half the tasks when
    there are fewer than ``2·SUMMARY_TASKS`` (so the two windows never overlap)."""
    return SUMMARY_TASKS if tasks >= 2 * SUMMARY_TASKS else max(1, tasks // 2)


def run_tag(cfg: ContinualConfig) -> str:
    return "+".join(dict.fromkeys(r["name"] for r in cfg.regularizers)) or "none"


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


class ContinualRunner:
    """Everything of one continual run: data, stream, learner, counters, logging, checkpoints."""

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
        optimizer = make_optimizer(o.name, model.parameters(), o.lr, o.weight_decay, o.momentum, (o.beta1, o.beta2), o.eps)
        regs = build_regularizers(model, cfg.regularizers, "regularizers")
        diagnostics = (plasticity_diagnostics(cfg.dormant_tau),) if cfg.gradient_diagnostics else (weight_spectra,)
        self.learner = ContinualLearner(model, first.objective, optimizer, regs, diagnostics)
        self.gen = torch.Generator().manual_seed(derive_seed(cfg.seed, "sample"))
        self.iteration = 0
        self.results: list[dict[str, Any]] = []
        self.wall_time = 0.0
        self.run_dir: Path | None = None
        self.logger: RunLogger | None = None

    # ----------------------------------------------------------------------------- run directory
    def open_new(self) -> Path:
        cfg = self.cfg
        data = "linear" if cfg.stream.kind == "deep_linear" else cfg.dataset.name
        self.run_dir = open_run_dir(cfg, f"{data}-{cfg.stream.kind}__{run_tag(cfg)}__s{cfg.seed}", CONTINUAL_ROOT)
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
        return (f"{cfg.stream.kind} stream on {data}: {cfg.stream.num_tasks} tasks × {cfg.stream.iters_per_task} updates "
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

    def checkpoint(self) -> None:
        assert self.run_dir is not None
        save_checkpoint(self.state_dict(), self.run_dir / CHECKPOINT)

    def finite(self) -> bool:
        return state_is_finite(self.state_dict())

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
        append_task_evals(self.logger.run_dir, row, self.cfg.seed, self.wall_time)
        for key, tag in (("train_acc", "train_acc"), ("test_acc", "test_acc"), ("loss", "loss"), ("test_loss", "test_loss")):
            if row[key] is not None:
                self.logger.scalar(f"task/{tag}", row[key], task.index)
                self.logger.scalar(f"step/{tag}", row[key], self.iteration)
        self._diagnose(task, task_end=True)
        return row

    # ----------------------------------------------------------------------------- training
    def train(self, stop: GracefulStop) -> int:
        """Run every task of the stream; returns the process exit code."""
        cfg, logger = self.cfg, self.logger
        assert logger is not None and self.run_dir is not None
        per_task = cfg.stream.iters_per_task
        total = len(self.stream) * per_task
        start = time.perf_counter() - self.wall_time
        bar = progress_bar(total, self.iteration, "it", cfg.progress)
        postfix: dict[str, str] = {}
        if self.results and self.results[-1]["train_acc"] is not None:
            postfix["train_acc"] = f"{self.results[-1]['train_acc']:.3f}"
        task = self.stream.task(min(self.iteration // per_task, len(self.stream) - 1))
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        correct_sum = torch.zeros((), dtype=torch.long, device=self.device)
        interval_iters, interval_start = 0, time.perf_counter()
        while self.iteration < total:
            if task.index != self.iteration // per_task:
                task = self.stream.task(self.iteration // per_task)
            x, y = self._batch(task.train_batch(self.gen, cfg.batch_size, self.dtype))
            loss, correct = self.learner.train_step(x, y)
            loss_sum += loss
            correct_sum += correct
            interval_iters += 1
            self.iteration += 1
            if self.iteration % cfg.log_every == 0:
                now = time.perf_counter()
                mean_loss = float(loss_sum) / interval_iters
                if not np.isfinite(mean_loss):
                    return end_nonfinite(self, bar)
                logger.scalar("step/batch_loss", mean_loss, self.iteration)
                if task.objective == "classification":
                    logger.scalar("step/batch_acc", float(correct_sum) / (interval_iters * cfg.batch_size), self.iteration)
                logger.scalar("perf/iters_per_s", interval_iters / max(now - interval_start, 1e-9), self.iteration)
                logger.scalars(self.learner.metrics(), self.iteration)
                loss_sum.zero_()
                correct_sum.zero_()
                interval_iters, interval_start = 0, now
            task_end = self.iteration % per_task == 0
            diagnose = bool(cfg.diagnostics_every) and self.iteration % cfg.diagnostics_every == 0 and not task_end
            if (task_end or diagnose) and not self.finite():  # before diagnostics see a broken model
                return end_nonfinite(self, bar)
            if diagnose:
                self._diagnose(task, task_end=False)
            if task_end:
                row = self._end_task(task)
                if not np.isfinite(row["loss"]):
                    return end_nonfinite(self, bar)
                postfix["task"] = f"{task.index + 1}/{len(self.stream)}"
                if row["train_acc"] is not None:
                    postfix["train_acc"] = f"{row['train_acc']:.3f}"
                else:
                    postfix["loss"] = f"{row['loss']:.3g}"
                bar.set_postfix(postfix, refresh=False)
            bar.update(1)
            self.wall_time = time.perf_counter() - start
            if stop.requested is not None:
                return end_stopped(self, bar, "sac_spectral.continual", stop.requested)
            done_tasks = self.iteration // per_task
            if task_end and (self.iteration == total or (cfg.checkpoint_every and done_tasks % cfg.checkpoint_every == 0)):
                self.checkpoint()
        bar.close()
        self._finish()
        return 0

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

    def _finish(self) -> None:
        summary = self.summary()
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
        finish_run(
            self, summary, metrics,
            f"done: {summary['tasks_done']} tasks, {summary['iterations']} iterations in {summary['wall_time_s']:.0f} s; "
            + result,
        )


def main(argv: Sequence[str] | None = None) -> int:
    return runner_main(
        "sac_spectral.continual", __doc__.split("\n\n")[1], ContinualConfig, RESUMABLE_KEYS, ContinualRunner, argv
    )


if __name__ == "__main__":
    sys.exit(run_cli(main))
