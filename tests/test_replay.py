import torch

from sac_spectral.agents.replay import ReplayBuffer


def _fill(buf, n, offset=0):
    for i in range(offset, offset + n):
        v = float(i)
        buf.add(torch.full((2, 3), v), torch.full((2, 1), v), torch.full((2,), v), torch.full((2, 3), v + 0.5),
                torch.zeros(2))


def test_sampling_stays_in_the_filled_part():
    buf = ReplayBuffer(100, 3, 1, num_seeds=2)
    _fill(buf, 10)
    gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
    batch = buf.sample(gens, 500)
    assert batch.batch_size == torch.Size([2, 500])
    assert batch["reward"].min() >= 0 and batch["reward"].max() <= 9
    assert set(batch["reward"][0].tolist()) == set(range(10))
    torch.testing.assert_close(batch["next_obs"][..., 0], batch["obs"][..., 0] + 0.5)


def test_wrap_around_overwrites_the_oldest():
    buf = ReplayBuffer(5, 3, 1, num_seeds=2)
    _fill(buf, 7)
    assert len(buf) == 5 and buf.ptr == 2
    stored = sorted(buf.storage["reward"][0].tolist())
    assert stored == [2.0, 3.0, 4.0, 5.0, 6.0]


def test_seeds_sample_with_their_own_generators():
    buf = ReplayBuffer(50, 3, 1, num_seeds=2)
    _fill(buf, 50)
    idx = buf.sample_indices([torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)], (4, 16))
    single = torch.randint(50, (4, 16), generator=torch.Generator().manual_seed(8))
    assert torch.equal(idx[1], single)


def test_state_dict_roundtrip():
    buf = ReplayBuffer(8, 3, 1, num_seeds=2)
    _fill(buf, 5)
    other = ReplayBuffer(8, 3, 1, num_seeds=2)
    other.load_state_dict(buf.state_dict())
    assert other.ptr == 5 and other.size == 5
    for key, value in buf.storage.items():  # the filled part; the rest is never read
        assert torch.equal(other.storage[key][:, :5], value[:, :5])
