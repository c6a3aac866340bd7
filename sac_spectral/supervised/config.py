"""The configuration of a continual supervised run (``python -m sac_spectral.continual``): dataset,
stream, model, optimizer, regularizers and the run's own settings, validated with the valid
choices named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sac_spectral.core.config import at_least, check, option, section
from sac_spectral.core.device import check_device
from sac_spectral.core.optim import OPTIMIZERS
from sac_spectral.regularizers import validate_specs
from sac_spectral.supervised.datasets import (
    DATASETS,
)
from sac_spectral.supervised.models import MODELS, NORMS
from sac_spectral.supervised.streams import (
    LOSSES,
    SEQUENCES,
    STREAMS,
)

DTYPES = {"float32": torch.float32, "float64": torch.float64}


MAX_SEED = 2**63 - 1  # seeds go through numpy's SeedSequence and torch's 64-bit generators


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
        at_least(self, 1, "dim", "test")
        check(self.train >= self.classes, "train", f"must be >= classes ({self.classes}), got {self.train}")
        at_least(self, 0, "separation")
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
    subset: int = option(512,
                         "training examples used by every task: a fixed random subset (0 = the whole training split)")
    classes_per_task: int = option(2, "class_incremental: classes added per task")
    dim: int = option(4, "deep_linear: input/output dimension d")
    sequence: str = option("flip", f"deep_linear targets: {' | '.join(SEQUENCES)}")
    loss: str = option("population", f"deep_linear loss: {' | '.join(LOSSES)}")

    def validate(self) -> None:
        _choice(self.kind, STREAMS, "kind")
        _choice(self.sequence, SEQUENCES, "sequence")
        _choice(self.loss, LOSSES, "loss")
        at_least(self, 1, "num_tasks", "iters_per_task", "classes_per_task", "dim")
        at_least(self, 0, "subset")


@dataclass
class ModelConfig:
    name: str = option("mlp", f"architecture: {' | '.join(MODELS)}")
    width: int = option(256, "mlp/cnn hidden units, resnet18 base channels (64 = standard), vit embedding width")
    depth: int = option(2, "mlp hidden layers, vit blocks, deep_linear layers")
    activation: str = option("relu", "activation of mlp, cnn and resnet18: "
                                     "relu | tanh | elu | gelu | silu | leaky_relu | crelu")
    norm: str = option("none", f"normalization of mlp, cnn and resnet18: {' | '.join(NORMS)}")
    heads: int = option(4, "vit attention heads")
    patch: int = option(4, "vit patch size")

    def validate(self) -> None:
        _choice(self.name, MODELS, "name")
        _choice(self.norm, NORMS, "norm")
        at_least(self, 1, "width", "depth", "heads", "patch")


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
        at_least(self, 0, "weight_decay")
        for key in ("beta1", "beta2", "momentum"):
            check(0 <= getattr(self, key) < 1, key, f"must be in [0, 1), got {getattr(self, key)}")
        at_least(self, 0, "eps")


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
    diagnostics_every: int = option(0,
                                    "run diagnostics every N iterations as well as at every task end (0 = task ends "
                                    "only)")
    log_every: int = option(100, "write training loss and regularizer metrics every N iterations")
    checkpoint_every: int = option(1, "checkpoint every N tasks (0 = only at the end)")
    run_dir: str | None = option(None,
                                 "run directory (default: "
                                 "runs/continual/<dataset>-<stream>__<regularizers>__s<seed>__<time>)")
    device: str = option("cpu", "torch device: cpu, cuda, cuda:<i>")
    dtype: str = option("float32", "parameter and input precision: float32 | float64")
    threads: int = option(0, "torch CPU threads (0 = the cores other processes leave idle at start)")
    progress: bool = option(True, "show a progress bar")

    def validate(self) -> None:
        check(0 <= self.seed <= MAX_SEED, "seed", f"must lie in [0, {MAX_SEED}], got {self.seed}")
        check(self.run_dir is None or bool(self.run_dir.strip()), "run_dir",
              "empty; give a directory, or leave run_dir out for runs/<name>__<time>")
        check(0.0 <= self.dormant_tau <= 1.0, "dormant_tau", f"must be in [0, 1], got {self.dormant_tau}")
        at_least(self, 1, "batch_size", "probe_size", "log_every")
        at_least(self, 0, "eval_examples", "diagnostics_every", "checkpoint_every", "threads")
        _choice(self.dtype, tuple(DTYPES), "dtype")
        validate_specs(self.regularizers, "regularizers")
        linear = (self.stream.kind == "deep_linear", self.model.name == "deep_linear")
        check(linear[0] == linear[1], "model.name",
              "the deep_linear stream and the deep_linear model go together "
              f"(stream.kind={self.stream.kind}, model.name={self.model.name})")
        check_device(self.device)


def run_tag(cfg: ContinualConfig) -> str:
    return "+".join(dict.fromkeys(r["name"] for r in cfg.regularizers)) or "none"
