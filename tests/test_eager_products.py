"""Eager products on oneDNN (sac_spectral.core.onednn.member_bmm, eager_bmm, eager_choice) against ATen's:
gradients, torch.func transforms, the per-machine choice and the engine's use of it."""

import json

import pytest
import torch
from torch.func import grad, vmap

from conftest import named_noise
from sac_spectral.agents import SAC
from sac_spectral.agents.config import SACConfig
from sac_spectral.core import native, onednn
from sac_spectral.core.nets import BatchedLinear, BatchedMLP
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.diagnostics.gradients import coupled_gradients, per_example_gradients

needs_kernels = pytest.mark.skipif(native.load() is not None, reason="oneDNN products are unavailable here")

#: fp32 products of a few dozen terms: both sum in another order
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _net(members: int = 2, onednn_products: bool = True) -> BatchedMLP:
    g = torch.Generator().manual_seed(0)
    net = BatchedMLP(members, 5, [16, 16], 3, generators=[g] * members)
    for layer in net.modules():
        if isinstance(layer, BatchedLinear):
            layer.products = onednn.member_bmm if onednn_products else None
    return net


@needs_kernels
@pytest.mark.parametrize("case", ["row-major", "transposed", "shared input", "expanded gradient", "one needs grad"])
def test_member_bmm_gradients_equal_bmms(case):
    """Backward products (``∂a = g·bᵀ``, ``∂b = aᵀ·g``) equal ``torch.bmm``'s, for the layouts a layer passes."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 6, 7, generator=g)
    b = {"transposed": torch.randn(3, 4, 7, generator=g).transpose(1, 2),
         "shared input": torch.randn(1, 7, 4, generator=g).expand(3, 7, 4)}.get(case, torch.randn(3, 7, 4, generator=g))
    weight = torch.randn(3, 6, 4, generator=g)
    grads = []
    for fn in (onednn.member_bmm, torch.bmm):
        x, y = a.clone().requires_grad_(), b.detach().clone().requires_grad_(case != "one needs grad")
        out = fn(x, y)
        (out.sum() if case == "expanded gradient" else (out * weight).square().sum()).backward()
        grads.append((out, x.grad, y.grad))
    for name, mine, ref in zip(("product", "∂a", "∂b"), *grads):
        if ref is None:
            assert mine is None, name
        else:
            torch.testing.assert_close(mine, ref, **TOL, msg=name)


@needs_kernels
def test_per_example_gradients_under_vmap_and_grad_equal_a_loop_over_atens():
    """``vmap(grad(·))`` over examples (the ``func`` diagnostics), ``vmap`` over members' parameters, and
    ``vmap`` of a backward (the ``jacobian`` diagnostics) through oneDNN's products equal ATen's, one
    example or parameter set at a time."""
    g = torch.Generator().manual_seed(2)
    net, ref = _net(), _net(onednn_products=False)
    batch = torch.randn(6, 2, 5, generator=g)  # examples first
    params = {k: p.detach() for k, p in net.named_parameters()}

    def loss(p, x):
        return torch.func.functional_call(net, p, (x.unsqueeze(1),)).square().sum()

    def ref_loss(p, x):
        return torch.func.functional_call(ref, p, (x.unsqueeze(1),)).square().sum()

    got = vmap(grad(loss), in_dims=(None, 0))(params, batch)
    for i, x in enumerate(batch):
        for k, want in grad(ref_loss)(params, x).items():
            torch.testing.assert_close(got[k][i], want, **TOL, msg=k)
    stacked = {k: torch.stack([p, 2 * p]) for k, p in params.items()}
    got = vmap(grad(loss))(stacked, batch[:2])
    for i in range(2):
        for k, want in grad(ref_loss)({k: p[i] for k, p in stacked.items()}, batch[i]).items():
            torch.testing.assert_close(got[k][i], want, **TOL, msg=k)

    def losses(module, x):
        return module(x).square().sum(-1)

    xs = batch.transpose(0, 1)  # [M, B, in]
    for method in (per_example_gradients, coupled_gradients):
        got = method(net, losses, xs, **({"example_dim": 1} if method is per_example_gradients else {}))
        want = method(ref, losses, xs, **({"example_dim": 1} if method is per_example_gradients else {}))
        for k in want:
            torch.testing.assert_close(got[k], want[k], **TOL, msg=f"{method.__name__} {k}")


@needs_kernels
def test_eager_bmm_leaves_small_bf16_autocast_and_untracked_products_to_aten(monkeypatch):
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 128, 128, generator=g), torch.randn(2, 128, 128, generator=g)
    monkeypatch.setattr(onednn, "MIN_PRODUCT", 2 * 128**3)
    torch.testing.assert_close(onednn.eager_bmm(a, b), torch.bmm(a, b), **TOL)
    assert onednn.eager_bmm(a[:, :64], b) is None
    assert onednn.eager_bmm(a.bfloat16(), b.bfloat16()) is None
    with torch.no_grad():
        assert onednn.eager_bmm(a, b) is None
    with torch.autocast("cpu", torch.bfloat16):
        assert onednn.eager_bmm(a, b) is None


def test_the_choice_is_measured_once_per_build_and_kept_beside_it(tmp_path):
    calls = []

    def fake(aten_ms: float, onednn_ms: float):
        def measurement():
            calls.append(1)
            return {"aten_ms": aten_ms, "onednn_ms": onednn_ms, "threads": 1}
        return measurement

    assert onednn.eager_choice(tmp_path, fake(8.0, 6.0)) is True and len(calls) == 1
    assert json.loads((tmp_path / onednn.VERDICT).read_text())["onednn"] is True
    assert onednn.eager_choice(tmp_path, fake(1.0, 9.0)) is True and len(calls) == 1  # read, not measured
    (tmp_path / onednn.VERDICT).write_text("{")  # cut off: measured again
    assert onednn.eager_choice(tmp_path, fake(6.2, 6.0)) is False and len(calls) == 2  # within MARGIN: ATen
    assert json.loads((tmp_path / onednn.VERDICT).read_text())["onednn"] is False
    missing = tmp_path / "not-a-folder"
    assert onednn.eager_choice(missing, fake(9.0, 6.0)) is True and not missing.exists()  # unwritable: kept nowhere


def test_without_a_build_eager_products_stay_atens(monkeypatch):
    monkeypatch.setattr(native, "load", lambda build=True: None if build else "no finished build")
    onednn.eager_onednn.cache_clear()
    try:
        assert onednn.eager_onednn() is False
    finally:
        onednn.eager_onednn.cache_clear()


def _batch(g: torch.Generator, b: int) -> dict[str, torch.Tensor]:
    return {"obs": torch.randn(1, b, 5, generator=g), "action": torch.rand(1, b, 2, generator=g) * 2 - 1,
            "reward": torch.randn(1, b, generator=g), "next_obs": torch.randn(1, b, 5, generator=g),
            "terminated": torch.zeros(1, b)}


@needs_kernels
@pytest.mark.parametrize("verdict", [True, False])
def test_the_engine_follows_the_choice_and_compile_products_aten_opts_out(monkeypatch, verdict):
    """Where this machine measured oneDNN faster, an eager SAC update multiplies on it and equals
    ATen's (``compile_products: aten``) to rounding; where not, no layer does."""
    monkeypatch.setattr(onednn, "eager_onednn", lambda: verdict)
    monkeypatch.setattr(onednn, "MIN_PRODUCT", 0)
    agents = {}
    for products in ("onednn", "aten"):
        cfg = SACConfig(compile=False, compile_products=products)
        cfg.actor.hidden = cfg.critic.hidden = [32, 32]
        agents[products] = SAC(5, 2, cfg, SeedStreams([0]))
    g = torch.Generator().manual_seed(4)
    for _ in range(3):
        batch, noise = _batch(g, 16), torch.randn(2, 1, 16, 2, generator=g)
        calls = {}
        for products, agent in agents.items():
            with torch.profiler.profile() as prof:
                agent.update(batch, named_noise(agent, noise))
            calls[products] = {e.key for e in prof.key_averages()}
    assert ("sac_spectral::member_bmm" in calls["onednn"]) is verdict
    assert "sac_spectral::member_bmm" not in calls["aten"]
    for (name, p), q in zip(agents["onednn"].state_dict().items(), agents["aten"].state_dict().values()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
