"""Classification datasets for continual streams: embedded ones and standard files on disk.

Embedded (no files, no download):

- ``digits``: scikit-learn's 1797 real 8×8 handwritten digits as ``[1, 8, 8]`` images, split once
  (fixed permutation, seed 0) into 1437 train / 360 test;
- ``mnist1d``: the procedural MNIST-1D generator (Greydanus 2020; default arguments, 4000 train /
  1000 test signals of length 40) — generated in memory, never downloaded;
- ``synthetic``: Gaussian classes in ``R^dim`` with unit covariance (see :class:`SyntheticSpec`).

Read from ``data_dir`` in their distribution formats (torchvision's download folders work too):
``mnist``, ``fashion_mnist`` (IDX files, optionally ``.gz``), ``cifar10``, ``cifar100`` (python
pickle batches), ``svhn`` (``.mat``), ``tiny_imagenet`` (the ``tiny-imagenet-200`` folder; its
labelled ``val`` split serves as the test split).

Inputs keep their stored dtype (``uint8`` images stay ``uint8``) and are normalized when a batch
is taken (:meth:`Dataset.inputs`): per channel with the training split's mean and standard
deviation, where a feature vector counts as one channel.
"""

from __future__ import annotations

import gzip
import pickle
import random
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

EMBEDDED = ("digits", "mnist1d", "synthetic")
ON_DISK = ("mnist", "fashion_mnist", "cifar10", "cifar100", "svhn", "tiny_imagenet")
DATASETS = EMBEDDED + ON_DISK


class DataError(ValueError):
    """A dataset cannot be loaded: unknown name, missing or malformed files (one-line message)."""


@dataclass(frozen=True)
class SyntheticSpec:
    """Gaussian classes: ``x = μ_y + ε`` with ``ε ~ N(0, I)`` and ``μ_c ~ N(0, (separation²/dim)·I)``,
    so two class means lie about ``separation·√2`` apart; classes are balanced."""

    classes: int = 10
    dim: int = 32
    train: int = 2000
    test: int = 1000
    separation: float = 3.0
    seed: int = 0


@dataclass(frozen=True)
class Dataset:
    """Train and test splits; ``x_*`` as stored (``[N, *shape]``), ``y_*`` int64 class indices."""

    name: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int
    mean: Tensor
    std: Tensor

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def is_image(self) -> bool:
        return len(self.input_shape) == 3

    def inputs(self, split: str, rows: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """Normalized inputs ``[len(rows), *shape]`` of ``split`` (``"train"`` or ``"test"``)."""
        x = (self.x_train if split == "train" else self.x_test)[rows].to(dtype)
        return (x - self.mean.to(dtype)) / self.std.to(dtype)


def _channel_stats(x: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and std per channel (dim 1 of an image batch; one channel for vectors), broadcastable."""
    xf = x.double()
    if x.dim() == 4:
        mean = xf.mean(dim=(0, 2, 3), keepdim=True)[0]
        std = xf.std(dim=(0, 2, 3), keepdim=True)[0]
    else:
        mean, std = xf.mean().reshape(1), xf.std().reshape(1)
    return mean.float(), std.clamp_min(1e-8).float()


def make_dataset(name: str, x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor) -> Dataset:
    """Wrap splits, computing normalization statistics from the training split; refuses splits
    whose inputs and labels differ in number, an empty training split, and negative labels."""
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if len(x) != len(y):
            raise DataError(f"dataset '{name}': the {split} split has {len(x)} inputs but {len(y)} labels")
        if len(y) and int(y.min()) < 0:
            raise DataError(f"dataset '{name}': the {split} split has a negative label ({int(y.min())})")
    if len(x_train) == 0:
        raise DataError(f"dataset '{name}': the training split is empty")
    y_train, y_test = y_train.long(), y_test.long()
    num_classes = int(max(int(y_train.max()), int(y_test.max()) if len(y_test) else 0)) + 1
    mean, std = _channel_stats(x_train)
    return Dataset(name, x_train, y_train, x_test, y_test, num_classes, mean, std)


# ----------------------------------------------------------------------------------- embedded
def _digits() -> Dataset:
    from sklearn.datasets import load_digits

    raw = load_digits()
    x = torch.tensor(raw.data, dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.tensor(raw.target)
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(y)))
    n_test = 360
    train, test = order[n_test:], order[:n_test]
    return make_dataset("digits", x[train], y[train], x[test], y[test])


def _mnist1d() -> Dataset:
    """The procedural generator with its default arguments; it seeds numpy's and Python's global
    random state, which are restored afterwards."""
    from mnist1d.data import get_dataset_args
    from mnist1d.data import make_dataset as generate

    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        raw = generate(get_dataset_args())
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return make_dataset(
        "mnist1d",
        torch.tensor(raw["x"], dtype=torch.float32),
        torch.tensor(raw["y"]),
        torch.tensor(raw["x_test"], dtype=torch.float32),
        torch.tensor(raw["y_test"]),
    )


def _synthetic(spec: SyntheticSpec) -> Dataset:
    if spec.classes < 2 or spec.dim < 1 or spec.train < spec.classes or spec.test < 1:
        raise DataError(f"synthetic: need classes >= 2, dim >= 1, train >= classes, test >= 1; got {spec}")
    gen = torch.Generator().manual_seed(spec.seed)
    means = torch.randn(spec.classes, spec.dim, generator=gen) * (spec.separation / spec.dim**0.5)

    def draw(n: int) -> tuple[Tensor, Tensor]:
        y = torch.arange(n) % spec.classes
        y = y[torch.randperm(n, generator=gen)]
        return means[y] + torch.randn(n, spec.dim, generator=gen), y

    x_train, y_train = draw(spec.train)
    x_test, y_test = draw(spec.test)
    return make_dataset("synthetic", x_train, y_train, x_test, y_test)


# ----------------------------------------------------------------------------------- file formats
def _find(root: Path, candidates: Sequence[str], files: Sequence[str], name: str, source: str) -> Path:
    """The first candidate folder under ``root`` that holds every file (each also as ``.gz``)."""
    for folder in candidates:
        base = root / folder
        if all((base / f).is_file() or (base / f"{f}.gz").is_file() for f in files):
            return base
    where = " or ".join(str(root / c) for c in candidates)
    raise DataError(f"dataset '{name}': expected {', '.join(files)} in {where}; get them from {source}")


def _open(path: Path) -> bytes:
    if path.is_file():
        return path.read_bytes()
    gz = path.with_name(path.name + ".gz")
    try:
        return gzip.decompress(gz.read_bytes())
    except (gzip.BadGzipFile, zlib.error, EOFError) as err:
        raise DataError(f"{gz}: not a readable gzip file ({err})") from None


_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST's format): zero bytes, a type code, the rank, big-endian int32 sizes, data."""
    data = _open(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise DataError(f"{path}: not an IDX file (bad magic number)")
    ndim = data[3]
    if len(data) < 4 + 4 * ndim:
        raise DataError(f"{path}: truncated IDX header (promises {ndim} sizes, the file has {len(data)} bytes)")
    dims = struct.unpack(f">{ndim}i", data[4 : 4 + 4 * ndim])
    if any(d < 0 for d in dims):
        raise DataError(f"{path}: IDX header holds a negative size {dims}")
    dtype = np.dtype(_IDX_TYPES[data[2]])
    count = int(np.prod(dims))
    body = data[4 + 4 * ndim :]
    if len(body) != count * dtype.itemsize:
        raise DataError(f"{path}: IDX header promises {dims} values, the file holds {len(body) // dtype.itemsize}")
    return np.frombuffer(body, dtype=dtype).reshape(dims)


def _idx_dataset(root: Path, name: str) -> Dataset:
    files = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    if name == "mnist":
        folders, source = ["mnist", "MNIST/raw"], ("https://ossci-datasets.s3.amazonaws.com/mnist/ (the mirror "
                                                   "torchvision uses; yann.lecun.com no longer serves the files)")
    else:
        folders, source = ["fashion_mnist", "FashionMNIST/raw"], "https://github.com/zalandoresearch/fashion-mnist"
    base = _find(root, folders, files, name, source)
    xtr, ytr, xte, yte = (torch.from_numpy(read_idx(base / f).copy()) for f in files)
    for images, labels, x, y in ((files[0], files[1], xtr, ytr), (files[2], files[3], xte, yte)):
        if x.dim() != 3 or y.dim() != 1 or len(x) != len(y):
            raise DataError(f"{base}: {images} holds {list(x.shape)} images and {labels} {list(y.shape)} labels; "
                            "expected [N, H, W] and [N]")
    return make_dataset(name, xtr.unsqueeze(1), ytr, xte.unsqueeze(1), yte)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles only plain containers and numpy arrays (what CIFAR's batches hold)."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self._ALLOWED:
            raise DataError(f"refusing to unpickle {module}.{name}: a CIFAR batch holds only arrays and lists")
        return super().find_class(module, name)


def read_cifar_batch(path: Path) -> dict[bytes, object]:
    """One CIFAR python-version batch: a pickled dict with ``b"data"`` ``[N, 3072]`` uint8 and labels."""
    with open(path, "rb") as f:
        try:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
        except DataError:
            raise
        except Exception as err:  # noqa: BLE001 - a damaged pickle fails in many ways
            raise DataError(f"{path}: not a readable CIFAR python batch ({type(err).__name__}: {err})") from None
    if not isinstance(batch, dict) or b"data" not in batch:
        raise DataError(f"{path}: not a CIFAR python batch (no b'data' entry)")
    return batch


def _cifar_split(paths: Sequence[Path], label_key: bytes) -> tuple[Tensor, Tensor]:
    xs, ys = [], []
    for p in paths:
        batch = read_cifar_batch(p)
        try:
            x = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
            y = np.asarray(batch[label_key], dtype=np.int64).reshape(-1)
        except (KeyError, ValueError, TypeError) as err:
            raise DataError(f"{p}: not a CIFAR python batch ({type(err).__name__}: {err})") from None
        if len(x) != len(y):
            raise DataError(f"{p}: {len(x)} images but {len(y)} labels")
        xs.append(x)
        ys.append(y)
    return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))


def _cifar(root: Path, name: str) -> Dataset:
    source = "https://www.cs.toronto.edu/~kriz/cifar.html (python version, extracted)"
    if name == "cifar10":
        train_files, test_files, key = [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], b"labels"
        base = _find(root, ["cifar-10-batches-py"], train_files + test_files, name, source)
    else:
        train_files, test_files, key = ["train"], ["test"], b"fine_labels"
        base = _find(root, ["cifar-100-python"], train_files + test_files, name, source)
    xtr, ytr = _cifar_split([base / f for f in train_files], key)
    xte, yte = _cifar_split([base / f for f in test_files], key)
    return make_dataset(name, xtr, ytr, xte, yte)


def _svhn(root: Path) -> Dataset:
    from scipy.io import loadmat

    files = ["train_32x32.mat", "test_32x32.mat"]
    base = _find(root, ["svhn", "SVHN", "."], files, "svhn",
                 "http://ufldl.stanford.edu/housenumbers/ (format 2, cropped digits)")

    def split(f: str) -> tuple[Tensor, Tensor]:
        try:
            mat = loadmat(base / f)
        except Exception as err:  # noqa: BLE001 - scipy raises many kinds of errors on a damaged file
            raise DataError(f"{base / f}: not a readable MATLAB file ({type(err).__name__}: {err})") from None
        if "X" not in mat or "y" not in mat:
            raise DataError(f"{base / f}: expected variables 'X' [32, 32, 3, N] and 'y' [N, 1]")
        x = torch.from_numpy(np.ascontiguousarray(np.transpose(mat["X"], (3, 2, 0, 1))))
        y = torch.from_numpy(mat["y"].reshape(-1).astype(np.int64)) % 10  # SVHN stores digit 0 as 10
        return x, y

    return make_dataset("svhn", *split(files[0]), *split(files[1]))


def _tiny_imagenet(root: Path) -> Dataset:
    from PIL import Image

    base = _find(root, ["tiny-imagenet-200"], ["wnids.txt", "val/val_annotations.txt"], "tiny_imagenet",
                 "http://cs231n.stanford.edu/tiny-imagenet-200.zip (extracted)")
    wnids = [w.strip() for w in (base / "wnids.txt").read_text().split() if w.strip()]
    index = {w: i for i, w in enumerate(wnids)}

    def image(p: Path) -> np.ndarray:
        try:
            return np.asarray(Image.open(p).convert("RGB"))
        except (OSError, ValueError) as err:
            raise DataError(f"{p}: not a readable image ({err})") from None

    def load(paths: list[Path]) -> Tensor:
        images = [image(p) for p in paths]
        shapes = {im.shape for im in images}
        if len(shapes) > 1:
            raise DataError(f"dataset 'tiny_imagenet': images of different sizes {sorted(shapes)[:3]}")
        return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()

    train_paths, train_labels = [], []
    for w in wnids:
        files = sorted((base / "train" / w / "images").glob("*.JPEG"))
        if not files:
            raise DataError(f"dataset 'tiny_imagenet': no images in {base / 'train' / w / 'images'}")
        train_paths += files
        train_labels += [index[w]] * len(files)
    test_paths, test_labels = [], []
    for line in (base / "val" / "val_annotations.txt").read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[1] in index:
            test_paths.append(base / "val" / "images" / parts[0])
            test_labels.append(index[parts[1]])
    return make_dataset("tiny_imagenet", load(train_paths), torch.tensor(train_labels),
                        load(test_paths), torch.tensor(test_labels))


_READERS: dict[str, Callable[[Path], Dataset]] = {
    "mnist": lambda root: _idx_dataset(root, "mnist"),
    "fashion_mnist": lambda root: _idx_dataset(root, "fashion_mnist"),
    "cifar10": lambda root: _cifar(root, "cifar10"),
    "cifar100": lambda root: _cifar(root, "cifar100"),
    "svhn": _svhn,
    "tiny_imagenet": _tiny_imagenet,
}


def load_dataset(name: str, data_dir: str | Path = "data", synthetic: SyntheticSpec | None = None) -> Dataset:
    """Load ``name`` (one of :data:`DATASETS`); file datasets are read from ``data_dir``."""
    if name == "digits":
        return _digits()
    if name == "mnist1d":
        return _mnist1d()
    if name == "synthetic":
        return _synthetic(synthetic or SyntheticSpec())
    if name in _READERS:
        try:
            return _READERS[name](Path(data_dir))
        except (OSError, KeyError, pickle.UnpicklingError, EOFError) as err:
            raise DataError(f"dataset '{name}': cannot read files in {data_dir}: {err}") from None
    raise DataError(f"unknown dataset '{name}'; valid: {', '.join(DATASETS)}")
