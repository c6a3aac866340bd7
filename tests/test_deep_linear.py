"""Claims of Bartlett, Helmbold & Long on deep linear networks (ICML 2018; docs/papers.md), checked with the
library's deep-linear model, stream tasks and learner: plain gradient descent from the identity,
population loss ½‖Θ_L⋯Θ_1 − Φ‖_F², float64."""

import math

import pytest
import torch

from sac_spectral.supervised.learner import ContinualLearner
from sac_spectral.supervised.models import DeepLinear
from sac_spectral.supervised.streams import LinearTargetTask, Stream, random_orthogonal


def gd_learner(depth: int, lr: float, dim: int = 4) -> ContinualLearner:
    model = DeepLinear(dim, depth).double()
    return ContinualLearner(model, "regression", torch.optim.SGD(model.parameters(), lr=lr), diagnostics=())


def excess(learner: ContinualLearner, target: torch.Tensor) -> float:
    """½‖P − Φ‖_F² from the product itself (independent of the task's population batch)."""
    return 0.5 * float((learner.model.product().detach() - target).square().sum())


def layer_singular_values(learner: ContinualLearner) -> torch.Tensor:
    return torch.stack([torch.linalg.svdvals(layer.weight.detach()) for layer in learner.model])


def test_population_batch_gives_the_population_loss():
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(5, 5, generator=gen, dtype=torch.float64)
    learner = gd_learner(3, 0.0, dim=5)
    with torch.no_grad():
        for layer in learner.model:
            layer.weight.add_(0.3 * torch.randn(5, 5, generator=gen, dtype=torch.float64))
    task = LinearTargetTask(0, target)
    assert learner.evaluate(task.eval_batches("train", 0))["loss"] == pytest.approx(excess(learner, target), rel=1e-12)
    sampled = LinearTargetTask(0, target, loss="sampled")
    x, y = sampled.train_batch(gen, 50_000)
    with torch.no_grad():
        mc = float(learner.loss_fn(learner.model(x), y).mean())
    assert mc == pytest.approx(excess(learner, target), rel=0.05)


def test_near_identity_target_is_learned_with_layers_near_isometric():
    """Φ = I + Δ with ½‖Δ‖² = 0.5, L = 10: excess < 1e-10 in < 1000 steps; every layer's singular
    values stay near 1, inside [σ_min(Φ)^{1/L}, σ_max(Φ)^{1/L}] up to a small overshoot."""
    gen = torch.Generator().manual_seed(0)
    delta = torch.randn(4, 4, generator=gen, dtype=torch.float64)
    target = torch.eye(4, dtype=torch.float64) + delta / delta.norm()
    learner, task = gd_learner(10, 0.05), LinearTargetTask(0, target)
    lo, hi, converged_at = math.inf, 0.0, None
    for step in range(1000):
        learner.train_step(*task.train_batch(gen, 0))
        sv = layer_singular_values(learner)
        lo, hi = min(lo, float(sv.min())), max(hi, float(sv.max()))
        if excess(learner, target) < 1e-10:
            converged_at = step
            break
    assert converged_at is not None and converged_at < 999
    s_phi = torch.linalg.svdvals(target)
    assert 0.85 < lo and hi < 1.1
    assert float(s_phi.min()) ** 0.1 - 5e-3 < lo and hi < float(s_phi.max()) ** 0.1 + 5e-3


@pytest.mark.slow
def test_spd_target_is_learned_with_equal_symmetric_layers():
    """Φ = Q diag(0.2, 0.5, 2, 5) Qᵀ, η = 1/(L(1 + ‖Φ‖²)): the layers stay equal and symmetric and
    each converges to Φ^{1/L}."""
    depth = 10
    q = random_orthogonal(4, torch.Generator().manual_seed(1))
    eig = torch.tensor([0.2, 0.5, 2.0, 5.0], dtype=torch.float64)
    target = q @ torch.diag(eig) @ q.T
    target = (target + target.T) / 2
    learner = gd_learner(depth, 1.0 / (depth * (1.0 + 25.0)))
    task = LinearTargetTask(0, target)
    for _ in range(4000):
        learner.train_step(*task.train_batch(torch.Generator(), 0))
    assert excess(learner, target) < 1e-8
    layers = [layer.weight.detach() for layer in learner.model]
    for w in layers:
        torch.testing.assert_close(w, layers[0], rtol=0, atol=1e-12)
        torch.testing.assert_close(w, w.T, rtol=0, atol=1e-12)
    root = q @ torch.diag(eig ** (1.0 / depth)) @ q.T
    torch.testing.assert_close(layers[0], root, rtol=0, atol=1e-4)


@pytest.mark.parametrize("depth", [3, 4, 10])
def test_negative_eigenvalues_keep_the_excess_at_the_half_lambda_squared_floor(depth):
    """Φ = diag(−1, −1, 1, 1) (exactly diagonal): the excess never drops below ½·1² + ½·1² = 1."""
    target = torch.diag(torch.tensor([-1.0, -1.0, 1.0, 1.0], dtype=torch.float64))
    learner, task = gd_learner(depth, 0.02), LinearTargetTask(0, target)
    lowest = math.inf
    for _ in range(2000):
        learner.train_step(*task.train_batch(torch.Generator(), 0))
        lowest = min(lowest, excess(learner, target))
    assert lowest >= 1.0 - 1e-12
    assert excess(learner, target) < 1.01


def test_flip_stream_loses_plasticity_under_plain_gd():
    """Φ₁ → −Φ₁ → Φ₁: Φ₁ is learned, −Φ₁ stays at its floor ½‖Φ₁‖² (all eigenvalues negative)
    while the layers shrink, and Φ₁ is no longer learned in the steps that sufficed at first."""
    stream = Stream("deep_linear", 3, seed=0, dim=4, sequence="flip")
    learner, gen, steps = gd_learner(10, 0.05), torch.Generator(), 300
    ends, sigma_max = [], []
    for task in stream:
        for _ in range(steps):
            learner.train_step(*task.train_batch(gen, 0))
        ends.append(learner.evaluate(task.eval_batches("train", 0))["loss"])
        sigma_max.append(float(layer_singular_values(learner).max()))
    floor = 0.5 * float(stream[0].target.square().sum())
    assert ends[0] < 1e-12
    assert ends[1] >= floor
    assert sigma_max[1] < 0.6
    assert ends[2] > 1.0
