import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sac_spectral.core.config import ConfigError
from sac_spectral.core.nets import BatchedMLP
from sac_spectral.regularizers import Spectral, build_regularizers


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
    "make",
    [
        lambda: nn.Sequential(nn.Linear(7, 20), nn.ReLU(), nn.Linear(20, 3)),
        lambda: BatchedMLP(3, 7, [20, 11], 2, init="torch"),
        lambda: nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 2)),
    ],
    ids=["linear", "member-batched", "conv"],
)
def test_power_iteration_converges_to_sigma_max_per_member(make):
    """Seeded weights, and enough steps for close top singular values: at 200 steps about one
    random draw in 200 (σ₂/σ₁ near 1) was still 0.6 % short of σ_max."""
    torch.manual_seed(0)
    model = make()
    reg = Spectral(model, coef=1.0)
    for _ in range(1000):
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


def _formula_with_fixed_vectors(reg, model, coef, k):
    """coef·Σ[(uᵀWv)^k − 1)² + ‖b‖^{2k}] over layers and members with the regularizer's current
    u, v held fixed, differentiated by autograd (the independent reference)."""
    total = 0.0
    for i, view in enumerate(reg.views):
        w, b = view.weight(), view.bias()
        u, v = reg.state[f"u{i}"], reg.state[f"v{i}"]
        sigma = torch.einsum("mi,mij,mj->m", u, w, v)
        total = total + ((sigma ** k - 1.0) ** 2).sum()
        if b is not None:
            total = total + (b.square().sum(dim=1) ** k).sum()
    return coef * total


_FORMULA_MODELS = {
    "linear": lambda: nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6),
                                    nn.Linear(6, 3)),
    "member-batched": lambda: BatchedMLP(3, 5, [6, 6, 6], 2, init="torch"),
    "conv": lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 2 * 2, 2)),
}


@pytest.mark.parametrize("k", [1.0, 2.0, 3.0])
@pytest.mark.parametrize("name", sorted(_FORMULA_MODELS))
def test_gradient_equals_autograd_of_the_formula_with_u_v_fixed(name, k):
    torch.manual_seed(1)
    model = _FORMULA_MODELS[name]().double()
    for p in model.parameters():  # nonzero biases, so their term and gradient count
        p.data.add_(0.1 * torch.randn_like(p))
    reg = Spectral(model, coef=0.7, k=k, power_iters=2)
    pen = reg.penalty()  # one power step: the vectors below are this call's
    pen.backward()
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = _formula_with_fixed_vectors(reg, model, 0.7, k)
    ref.backward()
    torch.testing.assert_close(pen, ref, rtol=1e-10, atol=1e-12)
    for got, want in zip(ours, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_gradient_matches_finite_differences_of_the_formula():
    torch.manual_seed(2)
    model = BatchedMLP(2, 4, [5, 5], 3, init="torch").double()
    reg = Spectral(model, coef=0.5, k=2.0)
    reg.penalty().backward()
    eps = 1e-6
    for p in model.parameters():
        flat = p.data.view(-1)
        for idx in range(0, flat.numel(), 4):
            orig = flat[idx].item()
            flat[idx] = orig + eps
            up = _formula_with_fixed_vectors(reg, model, 0.5, 2.0).item()
            flat[idx] = orig - eps
            down = _formula_with_fixed_vectors(reg, model, 0.5, 2.0).item()
            flat[idx] = orig
            assert p.grad.view(-1)[idx].item() == pytest.approx((up - down) / (2 * eps), rel=1e-6, abs=1e-9)


def test_autograd_semantics_retain_graph_accumulation_scaling_and_a_larger_loss():
    torch.manual_seed(3)
    model = BatchedMLP(2, 4, [8, 8], 2, init="torch")
    reg = Spectral(model, coef=0.3)
    x = torch.randn(2, 5, 4)
    pen = reg.penalty()
    pen.backward(retain_graph=True)
    once = [p.grad.clone() for p in model.parameters()]
    pen.backward(retain_graph=True)  # the same graph again: the gradients accumulate
    for p, g in zip(model.parameters(), once):
        torch.testing.assert_close(p.grad, 2 * g)
    model.zero_grad()
    (3.0 * pen).backward(retain_graph=True)
    for p, g in zip(model.parameters(), once):
        torch.testing.assert_close(p.grad, 3 * g)
    model.zero_grad()
    task = model(x).square().mean()
    task.backward(retain_graph=True)
    task_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (task + pen).backward()
    for p, g, t in zip(model.parameters(), once, task_grads):
        torch.testing.assert_close(p.grad, g + t)


def test_double_backward_raises_clearly():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    pen = Spectral(model, coef=1.0).penalty()
    with pytest.raises(RuntimeError, match="cannot be differentiated again"):
        torch.autograd.grad(pen, list(model.parameters()), create_graph=True)


# Batched products round differently from a lone product on some CPUs (e.g. AVX-512 kernels chosen by
# batch size): measured ≤ 1.5e-7 on unit vectors and ≤ 1.1e-7 relative on σ̂ after 3 steps; bound 1e-6.
MEMBER_TOL = {"rtol": 1e-6, "atol": 1e-6}


@pytest.mark.parametrize("threads", [1, 2])
def test_power_step_gives_each_member_its_own_result_to_float_rounding_for_any_member_count(threads):
    from sac_spectral.regularizers.spectral import power_step

    torch.manual_seed(4)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows, cols in [(256, 256), (23, 256), (256, 23), (256, 1), (20, 7)]:
            w = torch.randn(5, rows, cols)
            u, v = F.normalize(torch.randn(5, rows), dim=1), torch.zeros(5, cols)
            singles = [(u[m : m + 1].clone(), v[m : m + 1].clone()) for m in range(5)]
            sigma = power_step(w, u, v, 3)
            for m, (um, vm) in enumerate(singles):
                torch.testing.assert_close(power_step(w[m : m + 1], um, vm, 3), sigma[m : m + 1], **MEMBER_TOL)
                torch.testing.assert_close(um, u[m : m + 1], **MEMBER_TOL)
                torch.testing.assert_close(vm, v[m : m + 1], **MEMBER_TOL)
    finally:
        torch.set_num_threads(before)


def test_power_step_result_does_not_depend_on_the_thread_count():
    """Exact: the power step runs on one thread whatever the process's thread count."""
    from sac_spectral.regularizers.spectral import power_step

    torch.manual_seed(7)
    w = torch.randn(4, 256, 64)
    u0, v0 = F.normalize(torch.randn(4, 256), dim=1), torch.zeros(4, 64)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            u, v = u0.clone(), v0.clone()
            results.append((power_step(w, u, v, 3), u, v))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_member_gradients_and_vectors_do_not_depend_on_the_member_count():
    """To float rounding, for the same reason as the power step's test above."""
    torch.manual_seed(5)
    multi = BatchedMLP(3, 6, [16, 16, 16], 2, init="torch")
    singles = [BatchedMLP(1, 6, [16, 16, 16], 2, init="torch") for _ in range(3)]
    with torch.no_grad():
        for m, single in enumerate(singles):
            for ps, pm in zip(single.parameters(), multi.parameters()):
                ps.copy_(pm[m : m + 1])
    reg_multi = Spectral(multi, coef=0.2)
    reg_singles = [Spectral(s, coef=0.2) for s in singles]
    for _ in range(3):
        reg_multi.penalty().backward()
        for reg in reg_singles:
            reg.penalty().backward()
    for m, (single, reg) in enumerate(zip(singles, reg_singles)):
        for ps, pm in zip(single.parameters(), multi.parameters()):
            torch.testing.assert_close(ps.grad, pm.grad[m : m + 1], **MEMBER_TOL)
        for key, value in reg.state.items():
            torch.testing.assert_close(value, reg_multi.state[key][m : m + 1], **MEMBER_TOL, msg=key)


def test_same_shape_layers_are_power_iterated_as_one_batch_with_the_per_layer_result():
    from sac_spectral.regularizers.spectral import power_step

    torch.manual_seed(6)
    model = BatchedMLP(2, 5, [12, 12, 12], 3, init="torch")  # two 12×12 hidden layers
    reg = Spectral(model, coef=0.1)
    assert len(reg._plan.groups) == 3 < len(reg.views)
    expected = {key: value.clone() for key, value in reg.state.items()}
    reg.penalty()
    for i, view in enumerate(reg.views):
        u, v = expected[f"u{i}"], expected[f"v{i}"]
        power_step(view.weight().detach(), u, v)
        assert torch.equal(reg.state[f"u{i}"], u) and torch.equal(reg.state[f"v{i}"], v)


@pytest.mark.parametrize("mode", ["max", "all"])
@pytest.mark.parametrize("layer_norm", [False, True], ids=["mlp", "layer-norm"])
def test_target_init_gives_zero_penalty_and_gradient_at_construction(mode, layer_norm):
    """``target="init"`` pulls each layer toward its own σ at construction: on a fresh orthogonally
    initialized network (σ_max = √2 per hidden layer, where ``target="one"`` is far from 0) the
    penalty is below 1e-3 of ``target="one"``'s and the gradient is 0."""
    torch.manual_seed(0)
    net = BatchedMLP(2, 5, [16, 16], 3, layer_norm=layer_norm)
    one = Spectral(net, coef=1.0, mode=mode).penalty()
    init = Spectral(net, coef=1.0, mode=mode, target="init")
    value, grads = init.penalty_and_grads([p.detach() for p in init.penalized()])
    assert one.item() > 1.0
    assert value.item() < 1e-3 * one.item()
    assert max(g.abs().max().item() for g in grads) < 1e-5


def _reference_init_penalty(model, sigma0, bias0, k, bias):
    total = torch.zeros((), dtype=torch.float64)
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for m, s0, b0 in zip(layers, sigma0, bias0):
        total = total + (torch.linalg.matrix_norm(m.weight, ord=2) ** k - s0**k) ** 2
        if bias:
            total = total + (m.bias.norm() ** k - b0**k) ** 2
    return total


@pytest.mark.parametrize(("k", "bias"), [(1.0, True), (2.0, True), (2.0, False), (3.0, True)])
def test_target_init_value_and_gradient_match_finite_differences(k, bias):
    """After the weights move away from their initialization, the ``target="init"`` penalty equals
    ``coef·Σ[(σ^k − σ₀^k)² + (‖b‖^k − ‖b₀‖^k)²]`` (σ₀, ‖b₀‖ exact at construction; no bias term with
    ``bias=False``) and its gradient that formula's finite differences."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4)).double()
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    sigma0 = [torch.linalg.matrix_norm(m.weight, ord=2).detach() for m in layers]
    bias0 = [m.bias.norm().detach() for m in layers]
    reg = Spectral(model, coef=0.3, k=k, target="init", bias=bias)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    for _ in range(300):
        reg.penalty()
    pen = reg.penalty()
    reference = lambda: 0.3 * _reference_init_penalty(model, sigma0, bias0, k, bias)  # noqa: E731
    torch.testing.assert_close(pen, reference(), rtol=1e-8, atol=1e-10)
    pen.backward()
    eps = 1e-6
    for p in model.parameters():
        flat = p.data.view(-1)
        for idx in range(0, flat.numel(), 3):
            orig = flat[idx].item()
            flat[idx] = orig + eps
            up = reference().item()
            flat[idx] = orig - eps
            down = reference().item()
            flat[idx] = orig
            fd = (up - down) / (2 * eps)
            grad = 0.0 if p.grad is None else p.grad.view(-1)[idx].item()
            assert grad == pytest.approx(fd, rel=1e-4, abs=1e-7)


def test_bias_false_leaves_biases_alone():
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.bias.fill_(3.0)
    reg = Spectral(model, coef=1.0, bias=False)
    reg.penalty().backward()
    assert all(m.bias.grad is None or not m.bias.grad.any() for m in model.modules() if isinstance(m, nn.Linear))
    assert all(m.weight.grad.abs().sum() > 0 for m in model.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize("mode", ["max", "all"])
def test_target_init_state_survives_a_state_dict_roundtrip(mode):
    """The recorded targets are state: a regularizer built on other weights and loaded from the
    first one's state dict penalizes toward the first one's initialization."""
    torch.manual_seed(0)
    a_net, b_net = BatchedMLP(2, 5, [8, 8], 2), BatchedMLP(2, 5, [8, 8], 2)
    a = Spectral(a_net, coef=1.0, mode=mode, target="init")
    b = Spectral(b_net, coef=1.0, mode=mode, target="init")
    with torch.no_grad():
        for p in a_net.parameters():
            p.mul_(1.5)
    b_net.load_state_dict(a_net.state_dict())
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b.penalty(), a.penalty())
    assert b.penalty().item() > 1e-2
    assert sorted(Spectral(b_net, mode=mode).state_dict()) == sorted(k for k in a.state_dict() if k[0] in "uv")
