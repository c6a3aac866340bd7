"""Continual streams: determinism, task switching, and that each nonstationarity does what it says."""

import pytest
import torch

from sac_spectral.supervised.datasets import SyntheticSpec, load_dataset, make_dataset
from sac_spectral.supervised.streams import Stream, permute_features


@pytest.fixture(scope="module")
def vectors():
    return load_dataset("synthetic", synthetic=SyntheticSpec(classes=6, dim=5, train=120, test=60))


@pytest.fixture(scope="module")
def images():
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (40, 3, 4, 5), generator=gen, dtype=torch.uint8)
    xt = torch.randint(0, 256, (20, 3, 4, 5), generator=gen, dtype=torch.uint8)
    return make_dataset("tiny_images", x, torch.arange(40) % 4, xt, torch.arange(20) % 4)


def all_train(task):
    return task.train.batch(torch.arange(len(task.train)))


def same_task(a, b) -> bool:
    xa, ya = all_train(a)
    xb, yb = all_train(b)
    return torch.equal(xa, xb) and torch.equal(ya, yb)


KINDS = ["random_label", "permuted_input", "label_flip", "class_incremental"]


@pytest.mark.parametrize("kind", KINDS)
def test_tasks_depend_only_on_seed_and_index(vectors, kind):
    a = Stream(kind, 3, seed=7, dataset=vectors, subset=90)
    b = Stream(kind, 3, seed=7, dataset=vectors, subset=90)
    c = Stream(kind, 3, seed=8, dataset=vectors, subset=90)
    backwards = [b[i] for i in (2, 1, 0)][::-1]
    for x, y in zip(a, backwards):
        assert same_task(x, y)
    assert all(same_task(x, y) for x, y in zip(a[1:], b.tasks(start=1)))
    assert [t.index for t in a[1:3]] == [1, 2] and len(a) == 3 and a[-1].index == 2
    assert not same_task(a[1], c[1])
    assert not same_task(a[0], a[1])
    longer = Stream(kind, 3 if kind == "class_incremental" else 6, seed=7, dataset=vectors, subset=90)
    assert same_task(a[2], longer[2])
    with pytest.raises(IndexError):
        a[3]


def test_train_batches_are_reproducible_from_the_generator_state(vectors):
    task = Stream("label_flip", 2, dataset=vectors)[1]
    gen = torch.Generator().manual_seed(3)
    state = gen.get_state()
    x1, y1 = task.train_batch(gen, 16)
    gen.set_state(state)
    x2, y2 = task.train_batch(gen, 16)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_random_label_keeps_a_fixed_subset_and_draws_fresh_labels(vectors):
    stream = Stream("random_label", 4, seed=1, dataset=vectors, subset=50)
    rows = stream[0].train.rows
    assert len(rows) == 50 and len(set(rows.tolist())) == 50
    labels = []
    for task in stream:
        assert torch.equal(task.train.rows, rows) and task.test is None
        x, y = all_train(task)
        torch.testing.assert_close(x, vectors.inputs("train", rows))
        assert 0 <= int(y.min()) and int(y.max()) < vectors.num_classes
        labels.append(y)
    assert all(not torch.equal(labels[i], labels[i + 1]) for i in range(3))
    agreement = (labels[0] == labels[1]).float().mean()
    assert agreement < 0.5  # independent labels agree on about 1/6 of the examples


def test_permuted_input_applies_one_permutation_of_features(vectors):
    stream = Stream("permuted_input", 3, dataset=vectors)
    perms = [t.train.perm for t in stream]
    for task, perm in zip(stream, perms):
        assert torch.equal(perm.sort().values, torch.arange(5))
        x, y = all_train(task)
        base = vectors.inputs("train", torch.arange(120))
        assert torch.equal(y, vectors.y_train)
        for j in range(5):
            torch.testing.assert_close(x[:, j], base[:, int(perm[j])])
        xt, _ = task.test.batch(torch.arange(60))
        torch.testing.assert_close(xt, vectors.inputs("test", torch.arange(60))[:, perm])
    assert not torch.equal(perms[0], perms[1])


def test_permuted_input_moves_pixels_identically_in_every_channel(images):
    task = Stream("permuted_input", 1, dataset=images)[0]
    perm = task.train.perm
    assert torch.equal(perm.sort().values, torch.arange(20))
    x, _ = all_train(task)
    base = images.inputs("train", torch.arange(40))
    for p in range(20):
        h, w = divmod(p, 5)
        sh, sw = divmod(int(perm[p]), 5)
        torch.testing.assert_close(x[:, :, h, w], base[:, :, sh, sw])
    torch.testing.assert_close(permute_features(base, torch.arange(20)), base)


def test_label_flip_relabels_classes_bijectively(vectors):
    for task in Stream("label_flip", 3, seed=2, dataset=vectors):
        x, y = all_train(task)
        torch.testing.assert_close(x, vectors.inputs("train", torch.arange(120)))
        mapping = {}
        for old, new in zip(vectors.y_train.tolist(), y.tolist()):
            assert mapping.setdefault(old, new) == new
        assert sorted(mapping.values()) == list(range(6))
        _, yt = task.test.batch(torch.arange(60))
        assert all(mapping[o] == n for o, n in zip(vectors.y_test.tolist(), yt.tolist()))


def test_class_incremental_label_sets_grow(vectors):
    stream = Stream("class_incremental", 3, seed=4, dataset=vectors, classes_per_task=2)
    seen_before: set[int] = set()
    for i, task in enumerate(stream):
        _, y = all_train(task)
        _, yt = task.test.batch(torch.arange(len(task.test)))
        seen = set(y.tolist())
        assert len(seen) == 2 * (i + 1) and seen_before < seen and set(yt.tolist()) == seen
        assert len(y) == int(torch.isin(vectors.y_train, torch.tensor(sorted(seen))).sum())
        seen_before = seen
    assert seen_before == set(range(6))
    with pytest.raises(ValueError, match="num_tasks must be <= 3"):
        Stream("class_incremental", 4, dataset=vectors, classes_per_task=2)


def test_deep_linear_sequences():
    flip = Stream("deep_linear", 4, seed=0, dim=4, sequence="flip")
    phi = flip[0].target
    torch.testing.assert_close(phi, phi.T)
    eig = torch.linalg.eigvalsh(phi)
    torch.testing.assert_close(eig, torch.logspace(-0.30103, 0.30103, 4, dtype=torch.float64), rtol=1e-4, atol=1e-6)
    assert torch.equal(flip[1].target, -phi) and torch.equal(flip[2].target, phi)
    pd = Stream("deep_linear", 3, seed=0, sequence="random_pd")
    neg = Stream("deep_linear", 3, seed=0, sequence="random_negative")
    for a, b in zip(pd, neg):
        ea = torch.linalg.eigvalsh(a.target)
        assert 0.5 - 1e-9 <= float(ea.min()) and float(ea.max()) <= 2.0 + 1e-9
        assert float(torch.linalg.eigvalsh(b.target).min()) < 0
    assert not torch.equal(pd[0].target, pd[1].target)
