"""Dataset readers on tiny files written here in the real formats, and the embedded datasets."""

import gzip
import pickle
import random
import socket
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from sac_spectral.supervised.datasets import DataError, SyntheticSpec, load_dataset

RNG = np.random.default_rng(0)


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def idx_files(folder: Path, compress: bool) -> dict[str, np.ndarray]:
    arrays = {
        "train-images-idx3-ubyte": RNG.integers(0, 256, (7, 28, 28)),
        "train-labels-idx1-ubyte": np.array([0, 1, 2, 3, 4, 5, 9]),
        "t10k-images-idx3-ubyte": RNG.integers(0, 256, (3, 28, 28)),
        "t10k-labels-idx1-ubyte": np.array([9, 8, 7]),
    }
    for name, arr in arrays.items():
        write_idx(folder / name, arr, compress)
    return arrays


@pytest.mark.parametrize(
    "name, folder, compress",
    [("mnist", "mnist", False), ("mnist", "MNIST/raw", True), ("fashion_mnist", "FashionMNIST/raw", False)],
)
def test_idx_reader(tmp_path, name, folder, compress):
    arrays = idx_files(tmp_path / folder, compress)
    ds = load_dataset(name, tmp_path)
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10
    np.testing.assert_array_equal(ds.x_train[:, 0].numpy(), arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(ds.y_test.numpy(), arrays["t10k-labels-idx1-ubyte"])
    pixels = arrays["train-images-idx3-ubyte"].astype(np.float64)
    x = ds.inputs("test", torch.arange(3))
    expected = (arrays["t10k-images-idx3-ubyte"] - pixels.mean()) / pixels.std(ddof=1)
    np.testing.assert_allclose(x[:, 0].numpy(), expected, rtol=1e-5, atol=1e-5)


def test_idx_with_a_wrong_length_is_rejected(tmp_path):
    idx_files(tmp_path / "mnist", False)
    path = tmp_path / "mnist" / "train-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DataError, match="IDX header promises"):
        load_dataset("mnist", tmp_path)


def cifar_batch(n: int, label_key: str, classes: int) -> tuple[dict, np.ndarray, list[int]]:
    data = RNG.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = RNG.integers(0, classes, n).tolist()
    return {b"batch_label": b"x", label_key.encode(): labels, b"data": data, b"filenames": [b"f"] * n}, data, labels


def test_cifar10_reader_keeps_the_channel_layout(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    datas, labels = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch, data, lab = cifar_batch(2, "labels", 10)
        (folder / name).write_bytes(pickle.dumps(batch))
        datas.append(data)
        labels += lab
    ds = load_dataset("cifar10", tmp_path)
    assert ds.x_train.shape == (10, 3, 32, 32) and ds.x_test.shape == (2, 3, 32, 32)
    assert ds.y_train.tolist() == labels[:10]
    flat = np.concatenate(datas[:5])
    i, c, h, w = 7, 2, 5, 30
    assert int(ds.x_train[i, c, h, w]) == int(flat[i, c * 1024 + h * 32 + w])
    assert ds.mean.shape == (3, 1, 1)
    np.testing.assert_allclose(ds.mean[:, 0, 0].numpy(), flat.reshape(10, 3, 1024).mean(axis=(0, 2)), rtol=1e-6)


def test_cifar100_reader_uses_fine_labels(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    train, _, labels = cifar_batch(4, "fine_labels", 100)
    train[b"coarse_labels"] = [0, 0, 0, 0]
    test, _, _ = cifar_batch(2, "fine_labels", 100)
    (folder / "train").write_bytes(pickle.dumps(train))
    (folder / "test").write_bytes(pickle.dumps(test))
    ds = load_dataset("cifar100", tmp_path)
    assert ds.y_train.tolist() == labels


def test_cifar_reader_refuses_pickled_code(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    (folder / "train").write_bytes(pickle.dumps({b"data": random.Random}))
    (folder / "test").write_bytes(pickle.dumps({b"data": 0}))
    with pytest.raises(DataError, match="refusing to unpickle random.Random"):
        load_dataset("cifar100", tmp_path)


def test_svhn_reader_transposes_and_maps_label_ten_to_zero(tmp_path):
    from scipy.io import savemat

    folder = tmp_path / "svhn"
    folder.mkdir()
    x = RNG.integers(0, 256, (32, 32, 3, 4), dtype=np.uint8)
    savemat(folder / "train_32x32.mat", {"X": x, "y": np.array([[10], [1], [9], [10]], dtype=np.uint8)})
    savemat(folder / "test_32x32.mat", {"X": x[..., :2], "y": np.array([[3], [10]], dtype=np.uint8)})
    ds = load_dataset("svhn", tmp_path)
    assert ds.y_train.tolist() == [0, 1, 9, 0] and ds.y_test.tolist() == [3, 0]
    assert ds.x_train.shape == (4, 3, 32, 32)
    assert int(ds.x_train[3, 1, 4, 17]) == int(x[4, 17, 1, 3])


def test_tiny_imagenet_reader(tmp_path):
    from PIL import Image

    root = tmp_path / "tiny-imagenet-200"
    wnids = ["n01443537", "n01629819"]
    (root / "val" / "images").mkdir(parents=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    colours = {wnids[0]: (250, 0, 0), wnids[1]: (0, 0, 250)}
    for w in wnids:
        folder = root / "train" / w / "images"
        folder.mkdir(parents=True)
        for k in range(3):
            Image.new("RGB", (64, 64), colours[w]).save(folder / f"{w}_{k}.JPEG", quality=95)
    lines = []
    for k, w in enumerate([wnids[1], wnids[0]]):
        Image.new("RGB", (64, 64), colours[w]).save(root / "val" / "images" / f"val_{k}.JPEG", quality=95)
        lines.append(f"val_{k}.JPEG\t{w}\t0\t0\t63\t63")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    ds = load_dataset("tiny_imagenet", tmp_path)
    assert ds.x_train.shape == (6, 3, 64, 64) and ds.y_train.tolist() == [0, 0, 0, 1, 1, 1]
    assert ds.y_test.tolist() == [1, 0]
    red = ds.x_test[1].float().mean(dim=(1, 2))
    assert red[0] > 200 and red[2] < 50


@pytest.mark.parametrize(
    "name, fragments",
    [
        ("mnist", ["train-images-idx3-ubyte", "mnist or", "MNIST/raw", "yann.lecun.com"]),
        ("cifar10", ["data_batch_1", "cifar-10-batches-py", "cs.toronto.edu"]),
        ("svhn", ["train_32x32.mat", "ufldl.stanford.edu"]),
        ("tiny_imagenet", ["wnids.txt", "tiny-imagenet-200"]),
    ],
)
def test_missing_files_name_the_expected_paths_and_the_source(tmp_path, name, fragments):
    with pytest.raises(DataError) as err:
        load_dataset(name, tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path) in msg
    for fragment in fragments:
        assert fragment in msg


def test_unknown_dataset_lists_the_choices():
    with pytest.raises(DataError, match="unknown dataset 'mnistt'; valid: digits, mnist1d, synthetic, mnist"):
        load_dataset("mnistt")


def test_digits_split_and_normalization():
    ds = load_dataset("digits")
    assert ds.input_shape == (1, 8, 8) and (len(ds.y_train), len(ds.y_test)) == (1437, 360)
    assert ds.num_classes == 10 and set(ds.y_test.tolist()) == set(range(10))
    x = ds.inputs("train", torch.arange(1437))
    assert abs(float(x.mean())) < 1e-5 and float(x.std()) == pytest.approx(1.0, abs=1e-4)
    assert torch.equal(ds.x_train, load_dataset("digits").x_train)


def test_mnist1d_is_generated_without_network_or_global_rng_side_effects(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("mnist1d tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    np_state, py_state = np.random.get_state()[1].copy(), random.getstate()
    ds = load_dataset("mnist1d")
    assert np.array_equal(np.random.get_state()[1], np_state) and random.getstate() == py_state
    assert ds.input_shape == (40,) and (len(ds.y_train), len(ds.y_test)) == (4000, 1000)
    assert ds.num_classes == 10 and torch.bincount(ds.y_train).min() > 300


def test_synthetic_classes_are_balanced_and_separable():
    spec = SyntheticSpec(classes=4, dim=8, train=400, test=200, separation=6.0)
    ds = load_dataset("synthetic", synthetic=spec)
    assert torch.bincount(ds.y_train).tolist() == [100] * 4 and ds.input_shape == (8,)
    means = torch.stack([ds.x_train[ds.y_train == c].mean(0) for c in range(4)])
    nearest = torch.cdist(ds.x_test, means).argmin(dim=1)
    assert (nearest == ds.y_test).float().mean() > 0.9
    with pytest.raises(DataError, match="synthetic"):
        load_dataset("synthetic", synthetic=SyntheticSpec(classes=1))
