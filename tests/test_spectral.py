import pytest
import torch
from torch import nn

from sac_spectral.nets import BatchedMLP
from sac_spectral.regularizers import Spectral, build_regularizers
from sac_spectral.config import ConfigError


def _exact_sigmas(model):
    out = []
    for m in model.modules():
        if isinstance(m, nn.Linear):
            out.append(torch.linalg.matrix_norm(m.weight, ord=2).reshape(1))
        elif isinstance(m, nn.Conv2d):
            out.append(torch.linalg.matrix_norm(m.weight.reshape(m.weight.shape[0], -1), ord=2).reshape(1))
        elif hasattr(m, "members") and hasattr(m, "in_features"):
            out.append(torch.linalg.matrix_norm(m.weight, ord=2))
    return out


@pytest.mark.parametrize(
    "model",
    [
        nn.Sequential(nn.Linear(7, 20), nn.ReLU(), nn.Linear(20, 3)),
        BatchedMLP(3, 7, [20, 11], 2, init="torch"),
        nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 2)),
    ],
    ids=["linear", "member-batched", "conv"],
)
def test_power_iteration_converges_to_sigma_max_per_member(model):
    reg = Spectral(model, coef=1.0)
    for _ in range(200):
        reg.penalty()
    for est, exact in zip(reg.sigma_estimates(), _exact_sigmas(model)):
        torch.testing.assert_close(est, exact, rtol=1e-4, atol=1e-5)


def _reference_penalty(model, k):
    total = torch.zeros((), dtype=torch.float64)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            total = total + (torch.linalg.matrix_norm(m.weight, ord=2) ** k - 1) ** 2 + (m.bias.norm() ** k) ** 2
    return total


@pytest.mark.parametrize("k", [1.0, 2.0, 4.0])
def test_penalty_value_and_gradient_match_finite_differences(k):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4)).double()
    reg = Spectral(model, coef=0.3, k=k)
    for _ in range(300):
        reg.penalty()
    pen = reg.penalty()
    torch.testing.assert_close(pen, 0.3 * _reference_penalty(model, k), rtol=1e-8, atol=1e-10)
    pen.backward()
    eps = 1e-6
    for p in model.parameters():
        flat = p.data.view(-1)
        for idx in range(0, flat.numel(), 3):
            orig = flat[idx].item()
            flat[idx] = orig + eps
            up = _reference_penalty(model, k).item()
            flat[idx] = orig - eps
            down = _reference_penalty(model, k).item()
            flat[idx] = orig
            fd = 0.3 * (up - down) / (2 * eps)
            assert p.grad.view(-1)[idx].item() == pytest.approx(fd, rel=1e-4, abs=1e-7)


def test_gradient_is_finite_at_zero_bias_and_pulls_sigma_toward_one():
    model = BatchedMLP(2, 4, [8], 2)  # orthogonal init: zero biases, σ = √2 hidden
    reg = Spectral(model, coef=1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(300):
        opt.zero_grad()
        reg.penalty().backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
        opt.step()
    for sigma in _exact_sigmas(model):
        torch.testing.assert_close(sigma, torch.ones_like(sigma), atol=2e-2, rtol=0)


def test_hidden_layers_option_skips_output_layer():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    assert len(Spectral(model, layers="hidden").views) == 1
    assert len(Spectral(model).views) == 2


def test_state_roundtrip_restores_power_vectors():
    model = BatchedMLP(2, 4, [8], 2)
    a, b = Spectral(model, seed=1), Spectral(model, seed=2)
    for _ in range(3):
        a.penalty()
    b.load_state_dict(a.state_dict())
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)


@pytest.mark.parametrize("kw, msg", [({"coef": -1}, "coef must be >= 0"), ({"k": 0}, "k must be > 0"),
                                     ({"layers": "some"}, "layers must be one of all, hidden")])
def test_bad_hyperparameters_are_rejected(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        build_regularizers(nn.Linear(2, 2), [{"name": "spectral", **kw}])
