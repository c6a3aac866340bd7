"""Penalty regularizers against closed forms, numpy/torch.linalg references and finite differences."""

import numpy as np
import pytest
import torch
from torch import nn

from sac_spectral.core.config import ConfigError
from sac_spectral.core.nets import BatchedMLP
from sac_spectral.regularizers import (
    L2,
    REGISTRY,
    L2Init,
    Parseval,
    Spectral,
    WassersteinInit,
    build_regularizers,
)

MODELS = {
    "linear": lambda: nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)),
    "member-batched": lambda: BatchedMLP(3, 5, [7, 6], 2, init="torch", layer_norm=True),
    "conv": lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 2 * 2, 2)),
    "layernorm": lambda: nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(7), nn.ReLU(), nn.Linear(7, 3)),
}


def _perturb(model, scale=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def _member_params(model):
    """Every parameter as ``[M, n]`` (plain layers: M = 1), independent of the layer views."""
    m = getattr(model, "members", 1)
    return [p.detach().reshape(m, -1) for p in model.parameters()]


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("cls", [L2Init, WassersteinInit])
def test_distance_to_init_penalties_are_zero_at_initialization(cls, kind):
    model = MODELS[kind]()
    assert cls(model, coef=1.0).penalty().item() == 0.0


@pytest.mark.parametrize("kind", list(MODELS))
def test_wasserstein_is_zero_for_any_permutation_of_the_initial_values(kind):
    model = MODELS[kind]()
    reg = WassersteinInit(model, coef=1.0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            flat = p.view(getattr(model, "members", 1), -1)
            for row in flat:
                row.copy_(row[torch.randperm(row.numel(), generator=g)])
    assert reg.penalty().item() == 0.0


@pytest.mark.parametrize("kind", list(MODELS))
def test_wasserstein_equals_the_sorted_difference_formula(kind):
    model = MODELS[kind]()
    init = [p.numpy().copy() for p in _member_params(model)]
    reg = WassersteinInit(model, coef=0.7)
    _perturb(model)
    ref = sum(
        ((np.sort(cur, axis=1) - np.sort(ini, axis=1)) ** 2).sum()
        for cur, ini in zip((p.numpy() for p in _member_params(model)), init)
    )
    assert reg.penalty().item() == pytest.approx(0.7 * ref, rel=1e-5)
    per_member = reg.metrics()["penalty"]
    assert per_member.shape == (getattr(model, "members", 1),)
    assert per_member.sum().item() == pytest.approx(0.7 * ref, rel=1e-5)


@pytest.mark.parametrize("cls", [L2Init, WassersteinInit])
def test_gradients_point_toward_the_initial_parameters(cls):
    model = MODELS["member-batched"]()
    reg = cls(model, coef=1.0)
    _perturb(model, scale=0.1)
    before = reg.metrics()["penalty"]
    reg.penalty().backward()
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(0.1 * p.grad)
    after = reg.metrics()["penalty"]
    assert torch.all(after < before)


def test_l2_init_gradient_is_the_closed_form():
    model = MODELS["layernorm"]()
    init = [p.detach().clone() for p in model.parameters()]
    reg = L2Init(model, coef=0.3)
    _perturb(model)
    reg.penalty().backward()
    for p, p0 in zip(model.parameters(), init):
        torch.testing.assert_close(p.grad, 0.6 * (p.detach() - p0))


def test_l2_value_and_metrics_match_the_sum_of_squares():
    model = MODELS["member-batched"]()
    reg = L2(model, coef=0.5)
    ref = sum(p.detach().square().sum() for p in model.parameters())
    torch.testing.assert_close(reg.penalty(), 0.5 * ref)
    per_member = torch.stack([p.square().sum(1) for p in _member_params(model)]).sum(0)
    torch.testing.assert_close(reg.metrics()["param_norm"], per_member.sqrt())


def _orthogonal(rows, cols, seed):
    w = torch.empty(rows, cols, dtype=torch.float64)
    return nn.init.orthogonal_(w, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", [(3, 8), (8, 3), (5, 5)], ids=["wide", "tall", "square"])
def test_parseval_is_zero_for_orthogonal_matrices_in_both_orientations(shape):
    lin = nn.Linear(shape[1], shape[0]).double()
    with torch.no_grad():
        lin.weight.copy_(_orthogonal(*shape, 0))
    assert Parseval(nn.Sequential(lin), layers="all").penalty().item() == pytest.approx(0.0, abs=1e-24)
    batched = BatchedMLP(2, shape[0], [], shape[1])  # weight [M, in, out], orthogonal init (fp32)
    assert Parseval(batched, layers="all").penalty().item() == pytest.approx(0.0, abs=1e-10)


@pytest.mark.parametrize("shape", [(3, 8), (8, 3)], ids=["wide", "tall"])
def test_parseval_equals_the_singular_value_formula(shape):
    lin = nn.Linear(shape[1], shape[0]).double()
    reg = Parseval(nn.Sequential(lin), coef=0.2, layers="all")
    s = torch.linalg.svdvals(lin.weight.detach())
    assert reg.penalty().item() == pytest.approx(0.2 * ((s**2 - 1) ** 2).sum().item(), rel=1e-10)


def _with_singular_values(s, rows, cols, seed):
    u, v = _orthogonal(rows, rows, seed), _orthogonal(cols, cols, seed + 1)
    return u[:, : len(s)] @ torch.diag(s) @ v[:, : len(s)].T


@pytest.mark.parametrize("shape", [(4, 6), (6, 4)], ids=["wide", "tall"])
@pytest.mark.parametrize("k", [1.0, 2.0])
def test_spectral_all_is_zero_iff_every_singular_value_is_one(shape, k):
    lin = nn.Linear(shape[1], shape[0]).double()
    with torch.no_grad():
        lin.bias.zero_()
        lin.weight.copy_(_with_singular_values(torch.ones(4, dtype=torch.float64), *shape, 3))
    model = nn.Sequential(lin)
    assert Spectral(model, coef=1.0, k=k, mode="all").penalty().item() == pytest.approx(0.0, abs=1e-20)
    s = torch.tensor([1.0, 1.0, 0.5, 0.2], dtype=torch.float64)  # σ_max = 1, the others not
    with torch.no_grad():
        lin.weight.copy_(_with_singular_values(s, *shape, 3))
    assert Spectral(model, coef=1.0, k=k, mode="max").penalty().item() == pytest.approx(0.0, abs=1e-12)
    expected = ((s**k - 1) ** 2).sum().item()
    assert Spectral(model, coef=1.0, k=k, mode="all").penalty().item() == pytest.approx(expected, rel=1e-10)


def test_spectral_norm_layers_follow_their_targets():
    """A LayerNorm gain is diag(g): σ_j = |g_j| → 1, shift → 0 (mode all); max |g| → 1 (mode max)."""
    ln = nn.LayerNorm(4).double()
    with torch.no_grad():
        ln.weight.copy_(torch.tensor([1.0, -2.0, 0.5, 1.0]))
        ln.bias.copy_(torch.tensor([0.0, 1.0, 0.0, 1.0]))
    model = nn.Sequential(ln)
    b4 = 2.0**2  # (‖b‖²)^k with k = 2
    assert Spectral(model, coef=1.0, mode="all").penalty().item() == pytest.approx((4 - 1) ** 2 + (0.25 - 1) ** 2 + b4)
    assert Spectral(model, coef=1.0, mode="max").penalty().item() == pytest.approx((4 - 1) ** 2 + b4)


FD_CASES = {
    "l2": lambda m: L2(m, coef=0.3),
    "l2_init": lambda m: L2Init(m, coef=0.3),
    "wasserstein_init": lambda m: WassersteinInit(m, coef=0.3),
    "parseval": lambda m: Parseval(m, coef=0.3, layers="all"),
    "spectral_all_k1": lambda m: Spectral(m, coef=0.3, k=1.0, mode="all"),
    "spectral_all_k2": lambda m: Spectral(m, coef=0.3, k=2.0, mode="all"),
}


@pytest.mark.parametrize("name", list(FD_CASES))
def test_penalty_gradients_match_finite_differences(name):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.LayerNorm(5), nn.ReLU(), nn.Linear(5, 3)).double()
    reg = FD_CASES[name](model)
    _perturb(model, scale=0.2, seed=2)
    reg.penalty().backward()
    eps = 1e-6
    for p in model.parameters():
        flat = p.data.view(-1)
        for idx in range(flat.numel()):
            orig = flat[idx].item()
            flat[idx] = orig + eps
            up = reg.penalty().item()
            flat[idx] = orig - eps
            down = reg.penalty().item()
            flat[idx] = orig
            grad = 0.0 if p.grad is None else p.grad.view(-1)[idx].item()  # parseval leaves biases alone
            assert grad == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-8)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ({"name": "l2", "coef": -1}, "coef must be >= 0"),
        ({"name": "l2_init", "coef": -1e-3}, "coef must be >= 0"),
        ({"name": "wasserstein_init", "coef": -2}, "coef must be >= 0"),
        ({"name": "parseval", "coef": -1}, "coef must be >= 0"),
        ({"name": "spectral", "k": 0}, "k must be > 0"),
        ({"name": "spectral", "mode": "min"}, "mode must be one of max, all"),
        ({"name": "redo", "tau": 1.5}, "tau must be in [0, 1]"),
        ({"name": "redo", "tau": -0.1}, "tau must be in [0, 1]"),
        ({"name": "redo", "every": 0}, "every must be an integer >= 1"),
        ({"name": "shrink_perturb", "shrink": 2}, "shrink must be in [0, 1]"),
        ({"name": "shrink_perturb", "sigma": -1}, "sigma must be >= 0"),
        ({"name": "reset", "last": -1}, "last must be an integer >= 0"),
        ({"name": "l2", "layers": "some"}, "layers must be one of all, hidden"),
        ({"name": "l2", "coef": "big"}, "coef: expected a number"),
        ({"name": "l2init"}, "unknown regularizer 'l2init' (did you mean 'l2_init'?)"),
        ({"name": "redo", "threshold": 0.1}, "has no option 'threshold'; valid: tau, every, seed"),
    ],
)
def test_bad_hyperparameters_name_the_valid_range(spec, fragment):
    model = MODELS["linear"]()
    with pytest.raises(ConfigError) as err:
        build_regularizers(model, [spec], "critic.regularizers")
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_unsupported_layers_are_refused_at_construction(name):
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=f"{name} cannot handle the parameters of 0"):
        REGISTRY[name](model)


def test_redo_refuses_modules_whose_layer_order_it_cannot_know():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    with pytest.raises(ValueError, match="redo needs the layer order"):
        REGISTRY["redo"](Custom())
    with pytest.raises(ValueError, match="cannot map the 4 units"):
        REGISTRY["redo"](nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(5, 2)))
