"""Plasticity metrics (sac_spectral.diagnostics.plasticity) against independent computations: numpy
SVD for srank, hand-made networks with known values, explicit loops over members, a real Adam step."""

from __future__ import annotations

import copy
import io
import math

import numpy as np
import pytest
import torch
from torch import nn

from conftest import named_noise
from sac_spectral.agents import SAC, ReplayBuffer, SACConfig
from sac_spectral.core.nets import BatchedMLP
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.diagnostics import (
    ParamSnapshot,
    UpdateProbe,
    active_fraction,
    churn,
    dormant_fraction,
    effective_lr,
    feature_metrics,
    feature_norm,
    feature_srank,
    frobenius_stable_rank,
    grad_norm,
    hidden_activations,
    reference_outputs,
    srank,
    weight_magnitude,
    weight_metrics,
)


def numpy_srank(h: np.ndarray, delta: float = 0.01) -> int:
    """Kumar et al.'s srank_δ from numpy's SVD, by a plain loop over k."""
    s = np.linalg.svd(h.astype(np.float64), compute_uv=False)
    total = s.sum()
    for k in range(1, len(s) + 1):
        if s[:k].sum() >= (1 - delta) * total:
            return k
    raise AssertionError("unreachable")


def batched(members: int = 3, hidden=(16, 16), out=2, seed: int = 0) -> BatchedMLP:
    gens = [torch.Generator().manual_seed(seed + m) for m in range(members)]
    return BatchedMLP(members, 5, list(hidden), out, generators=gens)


def member_linear_params(net: BatchedMLP, m: int) -> list[torch.Tensor]:
    """Member ``m``'s parameters, sliced one tensor at a time (the loop the batched code avoids)."""
    return [p[m] for p in net.parameters()]


# ----------------------------------------------------------------------------- srank
def test_srank_matches_numpy_svd_per_member():
    g = torch.Generator().manual_seed(0)
    # low-rank-ish features: a few strong directions plus noise, per member different
    h = torch.stack([torch.randn(64, 6, generator=g) @ torch.randn(6, 32, generator=g) * (m + 1)
                     + 0.05 * torch.randn(64, 32, generator=g) for m in range(3)])
    got = feature_srank(h)
    assert got.shape == (3,)
    assert got.tolist() == [numpy_srank(h[m].numpy()) for m in range(3)]
    assert feature_srank(h, delta=0.1).tolist() == [numpy_srank(h[m].numpy(), 0.1) for m in range(3)]


def test_srank_closed_forms_and_differs_from_frobenius_stable_rank():
    assert srank(torch.ones(40)).item() == 40                # flat: all 40 needed for 99 %
    assert srank(torch.tensor([10.0, 0.05, 0.05])).item() == 1   # 10/10.1 ≥ 0.99
    assert srank(torch.tensor([0.05, 10.0, 0.05])).item() == 1   # order does not matter
    sigma = 0.8 ** torch.arange(30, dtype=torch.float64)
    # geometric spectrum: srank counts to 99 % of Σσ, the Frobenius ratio is Σσ²/σ_max²
    k = next(k for k in range(1, 31) if sigma[:k].sum() >= 0.99 * sigma.sum())
    assert srank(sigma).item() == k == 21
    assert frobenius_stable_rank(sigma).item() == pytest.approx((1 - 0.8**60) / (1 - 0.64))
    assert srank(torch.zeros(2, 5)).tolist() == [0, 0]
    with pytest.raises(ValueError, match="delta"):
        srank(sigma, delta=0.0)


def test_feature_srank_of_a_plain_matrix_is_one_member():
    h = torch.randn(50, 20, generator=torch.Generator().manual_seed(1))
    assert feature_srank(h).tolist() == [numpy_srank(h.numpy())]


# ----------------------------------------------------------------------------- feature norm, active units
def test_feature_norm_hand_values_and_member_loop():
    h = torch.tensor([[[3.0, 4.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 2.0]]])  # [M=2, B=2, F=2]
    assert feature_norm(h).tolist() == [2.5, 1.5]
    x = torch.randn(4, 10, 7, generator=torch.Generator().manual_seed(2))
    loop = [np.mean([np.sqrt((x[m, b] ** 2).sum().item()) for b in range(10)]) for m in range(4)]
    torch.testing.assert_close(feature_norm(x), torch.tensor(loop, dtype=torch.float32))
    assert feature_norm(x[0]).shape == (1,)


def test_active_fraction_of_a_hand_made_network_and_how_it_differs_from_dormant():
    # unit 1 = relu(x) fires for x > 0, unit 2 = relu(−x) for x < 0
    model = nn.Sequential(nn.Linear(1, 2, bias=False), nn.ReLU())
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0], [-1.0]]))
    x = torch.tensor([[1.0], [2.0], [-1.0], [3.0]])
    (h,) = hidden_activations(model, x)
    assert active_fraction(h).tolist() == [0.5]            # 3/4 + 1/4 of the entries, over 8
    assert dormant_fraction(h, 0.0).item() == 0.0          # but no unit is silent on the whole batch
    # one silent unit out of two: half the entries and half the units
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0], [0.0]]))
    (h,) = hidden_activations(model, x.abs())
    assert active_fraction(h).tolist() == [0.5] and dormant_fraction(h, 0.0).item() == 0.5


def test_active_fraction_rules_and_member_loop():
    t = torch.tensor([[0.995, 0.5], [-0.5, -0.2]])
    assert active_fraction(t, "tanh").tolist() == [0.75]   # saturated |h| > 0.99 is inactive
    assert active_fraction(t, "silu").tolist() == [0.5]    # positive where the input is
    net = batched()
    x = torch.randn(3, 32, 5, generator=torch.Generator().manual_seed(3))
    last = net(x, return_hidden=True)[1][-1]
    loop = [float((last[m] > 0).float().mean()) for m in range(3)]
    assert active_fraction(last).tolist() == loop
    with pytest.raises(ValueError, match="activation"):
        active_fraction(last, "softsign")


def test_feature_metrics_tags_and_sigma_reuse():
    h = torch.relu(torch.randn(2, 40, 12, generator=torch.Generator().manual_seed(4)))
    out = feature_metrics(h, "critic")
    assert set(out) == {"features/critic/stable_rank", "features/critic/norm", "active/critic/fraction"}
    assert all(v.shape == (2,) for v in out.values())
    reused = feature_metrics(h, "critic", sigma=torch.linalg.svdvals(h))
    assert reused["features/critic/stable_rank"].tolist() == out["features/critic/stable_rank"].tolist()


# ----------------------------------------------------------------------------- weights
def test_weight_magnitude_hand_values_and_member_loop():
    lin = nn.Linear(2, 1)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, -2.0]]))
        lin.bias.fill_(3.0)
    assert weight_magnitude(lin).tolist() == [2.0]
    net = batched()
    loop = [torch.cat([p.abs().reshape(-1) for p in member_linear_params(net, m)]).mean() for m in range(3)]
    torch.testing.assert_close(weight_magnitude(net), torch.stack(loop))


def test_distance_from_init_per_member_and_through_a_checkpoint():
    net = batched()
    init = ParamSnapshot(net)
    assert init.distance(net).tolist() == [0.0, 0.0, 0.0]
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in net.parameters():
            p[1] += torch.randn(p[1].shape, generator=g)
            p[2] += 0.5
    loop = [math.sqrt(sum(((p - q) ** 2).sum().item() for p,
                          q in zip(member_linear_params(net, m), [t[m] for t in init.params.values()])))
            for m in range(3)]
    got = init.distance(net)
    assert got[0].item() == 0.0
    torch.testing.assert_close(got, torch.tensor(loop, dtype=torch.float32))
    assert weight_metrics(net, "actor", init)["weights/actor/distance_from_init"].tolist() == got.tolist()
    # survives a checkpoint: a fresh snapshot of the moved net, loaded with θ₀, measures from θ₀
    buf = io.BytesIO()
    torch.save(init.state_dict(), buf)
    resumed = ParamSnapshot(net)
    resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    assert resumed.distance(net).tolist() == got.tolist()
    with pytest.raises(KeyError):
        resumed.load_state_dict({"nope": torch.zeros(1)})
    with pytest.raises(ValueError, match="differ"):
        init.distance(batched(hidden=(16,)))


# ----------------------------------------------------------------------------- one update
def test_grad_norm_member_loop_plain_module_and_list():
    net = batched()
    x = torch.randn(3, 8, 5, generator=torch.Generator().manual_seed(6))
    scale = torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1)
    (net(x) * scale).square().sum().backward()
    loop = [math.sqrt(sum((p.grad[m] ** 2).sum().item() for p in net.parameters())) for m in range(3)]
    torch.testing.assert_close(grad_norm(net), torch.tensor(loop, dtype=torch.float32))
    torch.testing.assert_close(grad_norm([p.grad for p in net.parameters()], members=3), grad_norm(net))
    with pytest.raises(ValueError, match="members"):
        grad_norm([p.grad for p in net.parameters()])
    plain = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 1))
    with pytest.raises(ValueError, match="no gradient"):
        grad_norm(plain)
    plain(x[0]).sum().backward()
    expected = torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in plain.parameters()]))
    torch.testing.assert_close(grad_norm(plain), expected.reshape(1))


@pytest.mark.parametrize("members", [1, 3])
def test_effective_lr_of_a_real_adam_step_matches_the_formula(members):
    net = batched(members) if members > 1 else nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.Adam(net.parameters(), lr=3e-3, eps=1e-8)
    x = torch.randn(members, 8, 5, generator=torch.Generator().manual_seed(7)) if members > 1 else torch.randn(8, 5)
    net(x).square().sum().backward()
    before = ParamSnapshot(net)
    grads = [p.grad.clone() for p in net.parameters()]
    theta0 = [p.detach().clone() for p in net.parameters()]
    opt.step()
    got = effective_lr(before, net)
    # Adam's first step: m̂ = g, v̂ = g², Δ = −lr·g/(|g| + eps)
    steps = [-3e-3 * g / (g.abs() + 1e-8) for g in grads]
    if members == 1:
        steps, theta0 = [s.unsqueeze(0) for s in steps], [t.unsqueeze(0) for t in theta0]
    expected = [math.sqrt(sum((s[m] ** 2).sum().item() for s in steps))
                / math.sqrt(sum((t[m] ** 2).sum().item() for t in theta0))
                for m in range(members)]
    assert got.shape == (members,)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), rtol=1e-4, atol=0)


def test_churn_of_a_known_change_per_member_and_tuple_outputs():
    net = batched(out=(2, 3))  # two heads, as the actor
    ref = torch.randn(3, 20, 5, generator=torch.Generator().manual_seed(8))
    before = reference_outputs(net, ref)
    assert before.shape == (3, 20 * 5)
    with torch.no_grad():
        net.heads[0].bias[1] += 0.5        # member 1: head 0 moves by 0.5 everywhere
        net.heads[1].bias[2] -= 1.0        # member 2: head 1 moves by 1 everywhere
    got = churn(net, ref, before)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.5 * 2 / 5, 1.0 * 3 / 5]))
    torch.testing.assert_close(churn(net, ref, before, squared=True), torch.tensor([0.0, 0.25 * 2 / 5, 3 / 5]))
    # raw outputs work as ``outputs_before`` too, and a function of the inputs as the network
    head0 = lambda x: net(x)[0]  # noqa: E731
    raw = head0(ref).detach()
    with torch.no_grad():
        net.heads[0].bias[0] += 2.0
    torch.testing.assert_close(churn(head0, ref, raw), torch.tensor([2.0, 0.0, 0.0]))


def test_churn_of_a_plain_module_is_one_member_and_matches_a_loop():
    lin = nn.Linear(3, 2)
    ref = torch.randn(10, 3, generator=torch.Generator().manual_seed(9))
    before = lin(ref).detach()
    with torch.no_grad():
        lin.weight.mul_(1.1)
    expected = (lin(ref) - before).abs().mean()
    torch.testing.assert_close(churn(lin, ref, before), expected.reshape(1))


def _agent_and_buffer(seeds=(0, 1)):
    cfg = SACConfig()
    cfg.actor.hidden = cfg.critic.hidden = [16, 16]
    agent = SAC(5, 2, cfg, SeedStreams(list(seeds)))
    buf = ReplayBuffer(500, 5, 2, len(seeds))
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        n = len(seeds)
        buf.add(torch.randn(n, 5, generator=g), torch.rand(n, 2, generator=g) * 2 - 1, torch.randn(n, generator=g),
                torch.randn(n, 5, generator=g), (torch.rand(n, generator=g) < 0.1).float())
    return agent, buf


def test_update_probe_on_a_sac_update_changes_nothing_and_reads_the_update():
    agent, buf = _agent_and_buffer()
    twin, _ = _agent_and_buffer()
    agent.train_steps(buf, 3, 32)
    twin.train_steps(buf, 3, 32)
    idx = torch.randperm(len(buf), generator=torch.Generator().manual_seed(1))[:64].expand(2, -1)
    ref = buf.gather(idx)
    probes = {
        "actor": (UpdateProbe(agent.actor, "actor", lambda x: torch.tanh(agent.actor(x)[0])), ref["obs"]),
        "critic": (UpdateProbe(agent.critic, "critic"), agent.critic_inputs(ref["obs"], ref["action"])),
    }
    critic_before = ParamSnapshot(agent.critic)
    q_before = agent.critic(probes["critic"][1]).detach()
    for probe, inputs in probes.values():
        probe.before(inputs)
    agent.train_steps(buf, 1, 32)
    twin.train_steps(buf, 1, 32)
    out = {k: v for probe, _ in probes.values() for k, v in probe.after().items()}
    # the probe draws nothing and writes nothing: training is bit-identical to the twin's
    for p, q in zip(agent.parameters(), twin.parameters()):
        assert torch.equal(p, q)
    assert set(out) == {"grads/actor/norm", "grads/critic/norm", "weights/actor/effective_lr",
                        "weights/critic/effective_lr", "churn/actor", "churn/critic"}
    assert out["churn/actor"].shape == (2,) and out["churn/critic"].shape == (4,)   # seeds, seeds × twin critics
    assert (out["grads/critic/norm"] > 0).all() and (out["churn/critic"] > 0).all()
    torch.testing.assert_close(out["grads/critic/norm"], grad_norm(agent.critic))
    torch.testing.assert_close(out["weights/critic/effective_lr"],
                               critic_before.distance(agent.critic) / critic_before.norm())
    torch.testing.assert_close(out["churn/critic"],
                               (agent.critic(probes["critic"][1]) - q_before).abs().mean(dim=(1, 2)))
    with pytest.raises(RuntimeError, match="before"):
        probes["critic"][0].after()


def test_grads_left_by_a_sac_update_are_that_updates_gradient():
    agent, buf = _agent_and_buffer()
    agent.train_steps(buf, 2, 32)
    batch = buf.gather(torch.randint(len(buf), (2, 32), generator=torch.Generator().manual_seed(2)))
    noise = torch.randn(2, 2, 32, 2, generator=torch.Generator().manual_seed(3))
    twin = copy.deepcopy(agent)
    agent.update(batch, named_noise(agent, noise))
    # the same critic loss on the pre-update parameters, differentiated by hand
    loss = twin.critic_step(batch, named_noise(twin, noise))[0]
    grads = torch.autograd.grad(loss, list(twin.critic.parameters()))
    torch.testing.assert_close(grad_norm(agent.critic), grad_norm(list(grads), members=4))
