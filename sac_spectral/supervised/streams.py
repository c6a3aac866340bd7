"""Continual streams: a sequence of tasks on one dataset (or one family of linear targets).

A learner trains on each task for a fixed number of iterations and is not told when the task
changes. Task ``i`` of a stream depends only on the stream's kind, options, seed and ``i``, so a
stream can be indexed, sliced, iterated and resumed at any task, and extended by asking for more
tasks. Nonstationarities (Lewandowski et al. 2025, §5; Dohare et al. 2024; Kumar et al. 2023):

- ``random_label``: a fixed subset of the training set, fresh uniform random labels every task
  (memorization; measures trainability; there is no test split);
- ``permuted_input``: a fresh fixed permutation of the input features every task (of pixel
  positions for images, the same for every channel), applied to train and test inputs;
- ``label_flip``: a fresh permutation of the class labels every task, on train and test;
- ``class_incremental``: classes in a seeded random order, ``classes_per_task`` more each task;
  task ``i`` trains on every class seen so far and is evaluated on their test examples;
- ``deep_linear``: targets ``Φ_τ`` for a deep linear network (Bartlett, Helmbold & Long 2018;
  ``docs/papers.md``) on isotropic inputs, loss ``½ E‖f(x) − Φx‖²``. Sequences: ``flip``
  (``Φ₁, −Φ₁, Φ₁, …`` with ``Φ₁ = Q diag(λ) Qᵀ``, λ geometric from 0.5 to 2), ``random_pd``
  (fresh ``Q`` and eigenvalues log-uniform in [0.5, 2] per task) and ``random_negative`` (the same
  with each eigenvalue's sign flipped with probability ½, at least one negative). ``population``
  loss uses the exact expectation (the batch ``√d·I``, whose rows have identity covariance);
  ``sampled`` draws ``x ~ N(0, I)``.

Every task draws its training batches (uniformly, with replacement) from a generator the learner
owns and checkpoints; everything else about a task is fixed by the stream.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, overload

import torch
from torch import Tensor

from sac_spectral.core.seeding import derive_seed
from sac_spectral.supervised.datasets import Dataset

STREAMS = ("random_label", "permuted_input", "label_flip", "class_incremental", "deep_linear")
SEQUENCES = ("flip", "random_pd", "random_negative")
LOSSES = ("population", "sampled")
Objective = Literal["classification", "regression"]


def _gen(seed: int, purpose: str) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, purpose))


@dataclass(frozen=True)
class Split:
    """Examples ``rows`` of one split of a dataset with this task's labels and input permutation."""

    dataset: Dataset
    split: str
    rows: Tensor
    labels: Tensor
    perm: Tensor | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, idx: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """Normalized, permuted inputs and labels of examples ``idx`` (positions in this split)."""
        x = self.dataset.inputs(self.split, self.rows[idx], dtype)
        if self.perm is not None:
            x = permute_features(x, self.perm)
        return x, self.labels[idx]


def permute_features(x: Tensor, perm: Tensor) -> Tensor:
    """Permute the features of ``x [N, D]`` or the pixel positions of ``x [N, C, H, W]``."""
    if x.dim() == 4:
        n, c, h, w = x.shape
        return x.reshape(n, c, h * w)[:, :, perm].reshape(n, c, h, w)
    return x.reshape(x.shape[0], -1)[:, perm].reshape(x.shape)


@dataclass(frozen=True)
class ClassificationTask:
    """One classification task: its training examples, test examples (if any) and class count."""

    index: int
    train: Split
    test: Split | None
    num_outputs: int
    objective: Objective = "classification"

    def train_batch(self, gen: torch.Generator, batch_size: int,
                    dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        return self.train.batch(torch.randint(len(self.train), (batch_size,), generator=gen), dtype)

    def eval_batches(
        self, split: str, batch_size: int, limit: int = 0, dtype: torch.dtype = torch.float32
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """The first ``limit`` (0 = all) examples of ``split`` in batches; nothing if the split is absent."""
        data = self.train if split == "train" else self.test
        if data is None:
            return
        n = len(data) if limit <= 0 else min(limit, len(data))
        for start in range(0, n, batch_size):
            yield data.batch(torch.arange(start, min(start + batch_size, n)), dtype)


@dataclass(frozen=True)
class LinearTargetTask:
    """Regression onto ``y = Φ x`` with isotropic inputs (the deep-linear stream)."""

    index: int
    target: Tensor
    loss: str = "population"
    objective: Objective = "regression"

    @property
    def num_outputs(self) -> int:
        return self.target.shape[0]

    def population_batch(self, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
        """``x = √d·I`` (rows with identity second moment) and ``y = x Φᵀ``: the mean loss over
        these rows is the population loss ``½‖P − Φ‖_F²`` of a linear map ``P``."""
        d = self.target.shape[0]
        x = math.sqrt(d) * torch.eye(d, dtype=dtype)
        return x, x @ self.target.to(dtype).T

    def train_batch(self, gen: torch.Generator, batch_size: int,
                    dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
        if self.loss == "population":
            return self.population_batch(dtype)
        x = torch.randn(batch_size, self.target.shape[0], generator=gen, dtype=torch.float64).to(dtype)
        return x, x @ self.target.to(dtype).T

    def eval_batches(
        self, split: str, batch_size: int, limit: int = 0, dtype: torch.dtype = torch.float64
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """The population batch for ``"train"`` (the exact excess loss); no test split."""
        if split == "train":
            yield self.population_batch(dtype)


Task = ClassificationTask | LinearTargetTask


def random_orthogonal(d: int, gen: torch.Generator) -> Tensor:
    """Haar-random ``d×d`` orthogonal matrix (QR of a Gaussian with the sign fix), float64."""
    q, r = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


class Stream(Sequence[Task]):
    """``num_tasks`` tasks of kind ``kind``; ``stream[i]`` builds task ``i`` deterministically.

    Classification streams need ``dataset``; ``subset > 0`` fixes a random subset of that many
    training examples for the whole stream (0 = the whole training split).
    """

    def __init__(
        self,
        kind: str,
        num_tasks: int,
        seed: int = 0,
        dataset: Dataset | None = None,
        subset: int = 0,
        classes_per_task: int = 2,
        dim: int = 4,
        sequence: str = "flip",
        loss: str = "population",
    ) -> None:
        if kind not in STREAMS:
            raise ValueError(f"unknown stream '{kind}'; valid: {', '.join(STREAMS)}")
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
        self.kind, self.num_tasks, self.seed = kind, num_tasks, seed
        self.dataset, self.classes_per_task = dataset, classes_per_task
        self.dim, self.sequence, self.loss = dim, sequence, loss
        if kind == "deep_linear":
            if sequence not in SEQUENCES:
                raise ValueError(f"sequence must be one of {', '.join(SEQUENCES)}, got '{sequence}'")
            if loss not in LOSSES:
                raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got '{loss}'")
            if dim < 1:
                raise ValueError(f"dim must be >= 1, got {dim}")
            return
        if dataset is None:
            raise ValueError(f"stream '{kind}' needs a dataset")
        n = len(dataset.y_train)
        if subset < 0 or subset > n:
            raise ValueError(f"subset must be in [0, {n}] (the training split's size; 0 = all), got {subset}")
        rows = torch.arange(n)
        if subset:
            rows = torch.randperm(n, generator=_gen(seed, "stream/subset"))[:subset].sort().values
        self.rows = rows
        if kind == "class_incremental":
            c = dataset.num_classes
            if not 1 <= classes_per_task <= c:
                raise ValueError(f"classes_per_task must be in [1, {c}] for '{dataset.name}', got {classes_per_task}")
            most = math.ceil(c / classes_per_task)
            if num_tasks > most:
                raise ValueError(
                    f"num_tasks must be <= {most}: '{dataset.name}' has {c} classes, {classes_per_task} added per task"
                )
            self.class_order = torch.randperm(c, generator=_gen(seed, "stream/class_order"))

    def __len__(self) -> int:
        return self.num_tasks

    @overload
    def __getitem__(self, i: int) -> Task: ...

    @overload
    def __getitem__(self, i: slice) -> list[Task]: ...

    def __getitem__(self, i: int | slice) -> Task | list[Task]:
        if isinstance(i, slice):
            return [self.task(j) for j in range(*i.indices(self.num_tasks))]
        if i < 0:
            i += self.num_tasks
        if not 0 <= i < self.num_tasks:
            raise IndexError(f"task {i} of a {self.num_tasks}-task stream")
        return self.task(i)

    def task(self, i: int) -> Task:
        """Task ``i`` (any ``i >= 0``; the stream's length only bounds iteration)."""
        gen = _gen(self.seed, f"stream/{self.kind}/task{i}")
        if self.kind == "deep_linear":
            return LinearTargetTask(i, self._target(i, gen), self.loss)
        ds = self.dataset
        assert ds is not None
        c, y_train, y_test = ds.num_classes, ds.y_train, ds.y_test
        all_test = torch.arange(len(y_test))
        if self.kind == "random_label":
            labels = torch.randint(c, (len(self.rows),), generator=gen)
            return ClassificationTask(i, Split(ds, "train", self.rows, labels), None, c)
        if self.kind == "permuted_input":
            shape = ds.input_shape
            perm = torch.randperm(shape[1] * shape[2] if ds.is_image else math.prod(shape), generator=gen)
            return ClassificationTask(
                i, Split(ds, "train", self.rows, y_train[self.rows], perm), Split(ds, "test", all_test, y_test, perm), c
            )
        if self.kind == "label_flip":
            relabel = torch.randperm(c, generator=gen)
            return ClassificationTask(
                i, Split(ds, "train", self.rows, relabel[y_train[self.rows]]),
                Split(ds, "test", all_test, relabel[y_test]), c
            )
        seen = self.seen_classes(i)
        train_rows = self.rows[torch.isin(y_train[self.rows], seen)]
        test_rows = all_test[torch.isin(y_test, seen)]
        return ClassificationTask(
            i, Split(ds, "train", train_rows, y_train[train_rows]), Split(ds, "test", test_rows, y_test[test_rows]), c
        )

    def seen_classes(self, i: int) -> Tensor:
        """Classes of class-incremental task ``i`` (all classes seen so far)."""
        return self.class_order[: min((i + 1) * self.classes_per_task, len(self.class_order))]

    def _target(self, i: int, gen: torch.Generator) -> Tensor:
        d = self.dim
        if self.sequence == "flip":
            q = random_orthogonal(d, _gen(self.seed, "stream/deep_linear/basis"))
            eig = torch.logspace(math.log10(0.5), math.log10(2.0), d, dtype=torch.float64)
            phi = q @ torch.diag(eig) @ q.T
            return phi if i % 2 == 0 else -phi
        q = random_orthogonal(d, gen)
        eig = torch.exp(torch.empty(d, dtype=torch.float64).uniform_(math.log(0.5), math.log(2.0), generator=gen))
        if self.sequence == "random_negative":
            signs = torch.where(torch.rand(d, generator=gen, dtype=torch.float64) < 0.5, -1.0, 1.0).to(torch.float64)
            signs[torch.randint(d, (1,), generator=gen)] = -1.0
            eig = eig * signs
        return q @ torch.diag(eig) @ q.T

    def tasks(self, start: int = 0) -> Iterator[Task]:
        """Tasks ``start, start + 1, …`` up to the stream's length (to resume a stream)."""
        for j in range(start, self.num_tasks):
            yield self.task(j)
