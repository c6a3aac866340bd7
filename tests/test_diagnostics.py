"""Diagnostics against independent references: closed-form spectra, a loop of single-example
autograd, torch.linalg, planted dead units, and the low-rank-gradient paper's regimes."""

import math
from functools import partial

import pytest
import torch
from torch import nn

from sac_spectral.agents import AGENTS, SAC, ReplayBuffer, SACConfig
from sac_spectral.agents.probes import (
    DiagnosticsConfig,
    agent_diagnostics,
    network_loss,
    probe_batch,
)
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core.nets import BatchedMLP
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.diagnostics import (
    as_floats,
    coupled_gradients,
    dormant_fraction,
    dormant_scores,
    gradient_grams,
    gradient_matrix,
    gradient_spectra,
    hidden_activations,
    model_diagnostics,
    network_diagnostics,
    per_example_gradients,
    spectrum_summary,
    weight_spectra,
)
from sac_spectral.diagnostics.lowrank import (
    TwoLayer,
    lab_alignments,
    mse_gradient,
    spiked_data,
    top_direction_alignment,
)
from sac_spectral.diagnostics.metrics import singular_values_from_gram
from sac_spectral.supervised.models import build_model


def matrix_with_spectrum(sigma: torch.Tensor, rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(rows, rows, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, cols, generator=g, dtype=torch.float64))
    k = sigma.numel()
    return u[:, :k] @ torch.diag(sigma) @ v[:, :k].T


def summary_of(m: torch.Tensor) -> dict[str, float]:
    return {k: float(v) for k, v in spectrum_summary(torch.linalg.svdvals(m), rtol=1e-5).items()}


def test_identity_has_full_ranks_and_unit_condition_number():
    s = summary_of(matrix_with_spectrum(torch.ones(40, dtype=torch.float64), 50, 60))
    assert s["erank"] == pytest.approx(40, rel=1e-9)
    assert s["frobenius_stable_rank"] == pytest.approx(40, rel=1e-9)
    assert s["rank99"] == math.ceil(0.99 * 40)
    assert s["cond"] == pytest.approx(1.0, rel=1e-9)


def test_rank_one_matrix_has_rank_one():
    s = summary_of(matrix_with_spectrum(torch.tensor([3.0], dtype=torch.float64), 30, 20))
    assert s["erank"] == pytest.approx(1.0, abs=1e-6)
    assert s["frobenius_stable_rank"] == pytest.approx(1.0, abs=1e-9)
    assert s["rank99"] == 1 and s["cond"] == pytest.approx(1.0) and s["sigma_max"] == pytest.approx(3.0)


@pytest.mark.parametrize("r, n", [(0.9, 40), (0.5, 30), (0.97, 60)])
def test_geometric_decay_matches_closed_forms(r, n):
    sigma = torch.tensor([r**i for i in range(n)], dtype=torch.float64)
    s = summary_of(matrix_with_spectrum(sigma, n + 5, n + 10))
    c = (1 - r) / (1 - r**n)  # p_i = c r^i
    mean_i = r * (1 - n * r ** (n - 1) + (n - 1) * r**n) / (1 - r) ** 2 * c  # Σ i p_i
    assert s["erank"] == pytest.approx(math.exp(-math.log(c) - math.log(r) * mean_i), rel=1e-6)
    assert s["frobenius_stable_rank"] == pytest.approx((1 - r ** (2 * n)) / (1 - r**2), rel=1e-6)
    k99 = math.ceil(math.log(1 - 0.99 * (1 - r ** (2 * n))) / (2 * math.log(r)))
    assert s["rank99"] == k99
    kept = max(i for i in range(n) if r**i > 1e-5)  # the stated floor: σ_i > 1e-5·σ_max
    assert s["cond"] == pytest.approx(r**-kept, rel=1e-6)


def test_zero_matrix_has_rank_zero_and_undefined_condition_number():
    s = spectrum_summary(torch.zeros(2, 5))
    assert all(s[key].tolist() == [0, 0] for key in ("erank", "frobenius_stable_rank", "rank99"))
    assert torch.isnan(s["cond"]).all()


def _mlp_case():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    batch = (torch.randn(9, 5), torch.randn(9, 3))
    return model, (lambda m, b: (m(b[0]) - b[1]).square().sum(-1)), batch


def _batched_case():
    torch.manual_seed(1)
    model = BatchedMLP(3, 5, [8, 6], 2, init="torch", layer_norm=True)
    batch = (torch.randn(3, 9, 5), torch.randn(3, 9, 2))
    return model, (lambda m, b: (m(b[0]) - b[1]).square().sum(-1)), batch


def test_per_example_gradients_equal_a_loop_of_autograd_for_a_linear_mlp():
    model, loss_fn, (x, y) = _mlp_case()
    grads = per_example_gradients(model, loss_fn, (x, y), chunk_size=4)
    for i in range(x.shape[0]):
        ref = torch.autograd.grad(loss_fn(model, (x[i : i + 1], y[i : i + 1])).sum(), list(model.parameters()))
        for (name, g), r in zip(grads.items(), ref):
            torch.testing.assert_close(g[i], r, atol=1e-5, rtol=1e-5, msg=name)


def test_per_example_gradients_of_a_member_batched_net_stay_within_each_member():
    model, loss_fn, (x, y) = _batched_case()
    grads = per_example_gradients(model, loss_fn, (x, y), example_dim=1)
    params = list(model.parameters())
    for m in range(3):
        for i in range(x.shape[1]):
            out = model(x[:, i : i + 1])  # every member sees its own example i
            loss = (out[m] - y[m, i : i + 1]).square().sum()  # member m's loss only
            ref = torch.autograd.grad(loss, params)
            for (name, g), r in zip(grads.items(), ref):
                assert torch.count_nonzero(r[torch.arange(3) != m]) == 0  # member m never reaches j ≠ m
                torch.testing.assert_close(g[i, m], r[m], atol=1e-5, rtol=1e-5, msg=name)
    G = gradient_matrix(grads, members=3)
    assert G.shape == (3, 9, sum(p[0].numel() for p in params))


@pytest.mark.parametrize("case", [_mlp_case, _batched_case], ids=["linear-mlp", "member-batched"])
def test_gram_and_singular_values_match_the_explicit_gradient_matrix(case):
    model, loss_fn, batch = case()
    dim = 0 if isinstance(model, nn.Sequential) else 1
    members = 1 if dim == 0 else 3
    G = gradient_matrix(per_example_gradients(model, loss_fn, batch, example_dim=dim), members).double()
    grams = gradient_grams(model, loss_fn, batch, example_dim=dim, method="func")
    torch.testing.assert_close(grams["all"], G @ G.transpose(1, 2))
    torch.testing.assert_close(singular_values_from_gram(grams["all"]), torch.linalg.svdvals(G), atol=1e-6, rtol=1e-6)
    n_layers = 2 if dim == 0 else 3
    assert set(grams) == {"all"} | {f"layer{i}" for i in range(n_layers)}


@pytest.mark.parametrize("members", [1, 3])
def test_factored_gram_equals_torch_func(members):
    torch.manual_seed(2)
    model = BatchedMLP(members, 4, [10, 10], 2, init="torch")
    batch = (torch.randn(members, 12, 4), torch.randn(members, 12, 2))
    loss_fn = lambda m, b: (m(b[0]) - b[1]).square().sum(-1)  # noqa: E731
    a = gradient_grams(model, loss_fn, batch, example_dim=1, method="func", chunk_size=5)
    b = gradient_grams(model, loss_fn, batch, example_dim=1, method="factored")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6 * float(a[k].abs().max()))
    mlp, fn, batch2 = _mlp_case()
    for k, v in gradient_grams(mlp, fn, batch2, method="factored").items():
        torch.testing.assert_close(v, gradient_grams(mlp, fn, batch2, method="func")[k], rtol=1e-5,
                                   atol=1e-6 * float(v.abs().max()))


def test_factored_gram_refuses_what_it_cannot_factor_and_auto_falls_back():
    lin = nn.Linear(4, 4)
    model = nn.Sequential(lin, nn.Tanh(), lin)
    x = torch.randn(6, 4)
    loss_fn = lambda m, b: m(b).square().sum(-1)  # noqa: E731
    with pytest.raises(ValueError, match="ran 2 times"):
        gradient_grams(model, loss_fn, x, method="factored")
    tied = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1))
    penalized = lambda m, b: m(b).squeeze(-1) + m[0].weight.square().sum()  # noqa: E731  weight used outside its layer
    with pytest.raises(ValueError, match="used outside the layer"):
        gradient_grams(tied, penalized, x, method="factored")
    scaled = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1))
    scaled.register_parameter("scale", nn.Parameter(torch.ones(())))  # not a layer's: auto uses torch.func
    scaled_fn = lambda m, b: (m(b) * m.scale).squeeze(-1)  # noqa: E731
    auto = gradient_grams(scaled, scaled_fn, x)
    torch.testing.assert_close(auto["all"], gradient_grams(scaled, scaled_fn, x, method="func")["all"])
    with pytest.raises(ValueError, match="method='factored' needs"):
        gradient_grams(scaled, scaled_fn, x, method="factored")


def _plain_layer_norm_case():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(5, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    with torch.no_grad():  # gains and shifts away from their initial 1 and 0
        model[1].weight.normal_(1.0, 0.3), model[1].bias.normal_(0.0, 0.3)
    batch = (torch.randn(9, 5), torch.randn(9, 2))
    return model, (lambda m, b: (m(b[0]) - b[1]).square().sum(-1)), batch


@pytest.mark.parametrize("case", [_batched_case, _plain_layer_norm_case], ids=["member-batched", "nn.LayerNorm"])
def test_layer_norm_gains_and_shifts_factor_exactly(case):
    """A LayerNorm's per-example gradients δ∘n(x) (gain) and δ (shift) give the Gram that torch.func's
    explicit per-example gradients give, and auto now takes the factored path."""
    model, fn, batch = case()
    dim = 1 if isinstance(model, BatchedMLP) else 0
    ref = gradient_grams(model, fn, batch, example_dim=dim, method="func")
    for method in ("factored", "auto"):
        got = gradient_grams(model, fn, batch, example_dim=dim, method=method)
        assert got.keys() == ref.keys()
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-6 * float(ref[k].abs().max()))


def test_gradient_rank_of_a_linear_model_is_the_data_rank():
    """ℓ_i = ½(wᵀx_i − y_i)²: g_i = r_i x_i, so rank(G) = rank(X) when residues are non-zero."""
    model = nn.Linear(8, 1, bias=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 3, generator=g) @ torch.randn(3, 8, generator=g)  # rank 3
    y = torch.randn(20, 1, generator=g) + 5.0
    sigma, summary = gradient_spectra(model, lambda m, b: 0.5 * (m(b[0]) - b[1]).square().sum(-1), (x, y))["all"]
    assert summary["rank99"].item() <= 3 and (sigma[0, 3:] < 1e-4 * sigma[0, 0]).all()
    assert 1.0 <= summary["erank"].item() <= 3.0


def test_weight_spectra_match_torch_linalg_per_member():
    net = BatchedMLP(2, 6, [9], 4, init="torch")
    for (sigma, summary), layer in zip(weight_spectra(net), net.layers):
        ref = torch.linalg.svdvals(layer.weight)
        torch.testing.assert_close(sigma, ref)
        torch.testing.assert_close(summary["sigma_min"], ref[:, -1])
        torch.testing.assert_close(summary["cond"], torch.linalg.cond(layer.weight))


def test_dormant_fraction_equals_the_planted_fraction_per_member():
    net = BatchedMLP(2, 6, [40, 30], 1, init="torch", generators=[torch.Generator().manual_seed(s) for s in (2, 3)])
    dead = {0: [3, 7, 11, 20], 1: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]}  # member → dead units of layer 0
    weak = 25  # member 0: active but with a score far below 0.1
    with torch.no_grad():
        for m, units in dead.items():
            net.layers[0].weight[m, units] = 0.0
            net.layers[0].bias[m, units] = -1.0  # ReLU(−1) = 0 on every input
        net.layers[0].weight[0, weak] *= 1e-3
        net.layers[0].bias[0, weak] = 0.0
    x = torch.randn(512, 6, generator=torch.Generator().manual_seed(3))
    h0 = hidden_activations(net, x)[0]
    assert dormant_fraction(h0, 0.0).tolist() == pytest.approx([4 / 40, 10 / 40])
    assert dormant_fraction(h0, 0.1).tolist() == pytest.approx([5 / 40, 10 / 40])
    scores = dormant_scores(h0)
    assert scores[0, weak] > 0 and torch.allclose(scores.mean(dim=-1), torch.ones(2))


def test_hidden_activations_of_plain_and_conv_models():
    mlp = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 1))
    feats = hidden_activations(mlp, torch.randn(7, 3))
    assert [tuple(f.shape) for f in feats] == [(7, 5), (7, 4)]
    conv = nn.Sequential(nn.Conv2d(1, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 2))
    (h,) = hidden_activations(conv, torch.randn(5, 1, 6, 6))
    assert h.shape == (5, 6)  # one feature per channel: mean |h| over positions


def test_network_diagnostics_reports_every_tag_for_a_supervised_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    x, y = torch.randn(64, 10), torch.randint(0, 4, (64,))
    loss_fn = lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1], reduction="none")  # noqa: E731
    rep = network_diagnostics(model, loss_fn, (x, y), "model", hidden_activations(model, x), tau=0.025)
    for tag in ("grad_rank/model/erank", "grad_rank/model/cond", "grad_rank/model/layer2/rank99",
                "spectral/model/layer1/sigma_min", "features/model/erank", "features/model/layer0/erank",
                "dormant/model/fraction", "dormant/model/fraction_tau0", "dormant/model/layer1/fraction"):
        assert rep.scalars[tag].shape == (1,), tag
    assert rep.histograms["spectra/model/grad"].shape == (1, 64)
    assert 1.0 <= rep.scalars["grad_rank/model/erank"].item() <= 64.0
    short = model_diagnostics(model, partial(nn.functional.cross_entropy, reduction="none"), x, y, tau=0.025)
    assert as_floats(short) == as_floats(rep)
    conv = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))  # torch.func path
    rep = model_diagnostics(conv, partial(nn.functional.cross_entropy, reduction="none"),
                            torch.randn(16, 1, 6, 6), torch.randint(0, 3, (16,)))
    assert 1.0 <= rep.scalars["grad_rank/model/layer0/erank"].item() <= 16.0
    assert rep.scalars["spectral/model/layer0/sigma_max"].shape == rep.scalars["dormant/model/fraction"].shape == (1,)


# --------------------------------------------------------------------------------------------- SAC


def _agent_and_buffer(seeds=(0, 1), arch="mlp"):
    cfg = SACConfig()
    cfg.actor.hidden = cfg.critic.hidden = [16, 16]
    cfg.actor.arch = cfg.critic.arch = arch
    cfg.critic.regularizers = [{"name": "spectral", "coef": 1e-3}]
    agent = SAC(5, 2, cfg, SeedStreams(list(seeds)))
    buf = ReplayBuffer(500, 5, 2, len(seeds))
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        n = len(seeds)
        buf.add(torch.randn(n, 5, generator=g), torch.rand(n, 2, generator=g) * 2 - 1, torch.randn(n, generator=g),
                torch.randn(n, 5, generator=g), (torch.rand(n, generator=g) < 0.1).float())
    return agent, buf


@pytest.mark.parametrize("arch", ["mlp", "bronet", "simba", "simbav2"])
@pytest.mark.parametrize("which", ["critic", "actor"])
def test_sac_closures_factored_equals_torch_func_per_member(which, arch):
    agent, buf = _agent_and_buffer(arch=arch)
    batch, noise = probe_batch(agent, buf, 24, [0, 1], tick=5)
    loss, probe = network_loss(agent, which, batch, noise)
    net = agent.critic if which == "critic" else agent.actor
    a = gradient_grams(net, loss, probe, example_dim=1, method="func")
    b = gradient_grams(net, loss, probe, example_dim=1, method="factored")
    assert a["all"].shape == (net.members, 24, 24)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6 * float(a[k].abs().max()))


def test_sac_critic_per_example_gradient_matches_single_example_autograd():
    agent, buf = _agent_and_buffer(seeds=(0,))
    batch, noise = probe_batch(agent, buf, 6, [0], tick=0)
    loss, probe = network_loss(agent, "critic", batch, noise)
    grads = per_example_gradients(agent.critic, loss, probe, example_dim=1)
    for i in range(6):
        one = {k: v[:, i : i + 1] for k, v in probe.items()}
        per_member = loss(agent.critic, one)  # [C, 1]
        for m in range(agent.num_critics):
            ref = torch.autograd.grad(per_member[m].sum(), list(agent.critic.parameters()), retain_graph=True)
            for (name, g), r in zip(grads.items(), ref):
                torch.testing.assert_close(g[i, m], r[m], atol=1e-5, rtol=1e-5, msg=name)


def test_agent_diagnostics_leave_the_agent_and_its_streams_untouched():
    agent, buf = _agent_and_buffer()
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    streams = agent.streams.state_dict()
    rng = torch.get_rng_state()
    batch, noise = probe_batch(agent, buf, 32, [0, 1], tick=7)
    reports = agent_diagnostics(agent, batch, noise, DiagnosticsConfig())
    assert all(torch.equal(before[k], v) for k, v in agent.state_dict().items())
    assert all(p.grad is None for p in agent.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    after = agent.streams.state_dict()
    assert all(torch.equal(a, b) for p in streams for a, b in zip(streams[p], after[p]))
    assert reports["critic"].scalars["grad_rank/critic/erank"].shape == (4,)  # 2 seeds × 2 critics
    assert reports["actor"].scalars["dormant/actor/fraction"].shape == (2,)
    assert len(set(batch["obs"][0].sum(-1).tolist())) == 32  # drawn without replacement


def _built_in_agent(name: str, seeds=(0, 1), **critic):
    """A small ``name`` agent (REDQ: 4 critics, a random 2 in the target; CrossQ: batch
    renormalization on from the start; ``critic``: options of its critic) and a replay buffer of 300
    transitions."""
    cfg = TrainConfig(agent=name)
    cfg.actor.hidden = cfg.critic.hidden = [16, 16]
    for key, value in critic.items():
        setattr(cfg.critic, key, value)
    cfg.critic.num_critics = 4 if name == "redq" else 2
    cfg.crossq.warmup = 0
    agent, buf = AGENTS[name](5, 2, cfg, SeedStreams(list(seeds))), _agent_and_buffer(seeds)[1]
    agent.train_steps(buf, 4, 16)  # away from the initial parameters and statistics
    return agent, buf


HEADS = {"scalar": {}, "categorical": {"head": "categorical", "num_atoms": 11, "v_min": -5.0, "v_max": 5.0},
         "quantile": {"head": "quantile", "num_quantiles": 5, "drop_top": 1}}


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("name", ["sac", "td3", "redq", "crossq", "droq"])
def test_the_diagnostics_critic_loss_is_the_updates(name, head):
    """One loss per network: on the same batch and noise, the mean of the per-example critic losses
    the gradient-rank diagnostics differentiate is the critic loss the update minimizes (REDQ's on
    its update's random subset, CrossQ's in the joint forward with batch statistics), for every
    critic head, and forming them changes nothing (CrossQ's running statistics included)."""
    agent, buf = _built_in_agent(name, **HEADS[head])
    batch, noise = probe_batch(agent, buf, 24, [0, 1], tick=1)
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    loss, probe = network_loss(agent, "critic", batch, noise)
    with torch.no_grad():
        per_example = loss(agent.critic, probe)
    assert per_example.shape == (2 * agent.num_critics, 24)
    assert all(torch.equal(before[k], v) for k, v in agent.state_dict().items())
    update = agent.update(batch, noise)["loss/critic"]
    torch.testing.assert_close(per_example.mean(-1).view(2, agent.num_critics).sum(1), update, rtol=1e-6, atol=1e-6)


def test_coupled_gradients_are_each_examples_loss_through_the_whole_batch():
    """CrossQ's critic losses couple the examples through batch statistics: the diagnostics' rows
    are the gradients of each example's loss with the whole batch in the forward, as autograd gives
    them one by one; for losses that do not couple them (SAC's) they equal the per-example ones."""
    agent, buf = _built_in_agent("crossq", seeds=(0,))
    batch, noise = probe_batch(agent, buf, 6, [0], tick=0)
    loss, probe = network_loss(agent, "critic", batch, noise)
    grads = coupled_gradients(agent.critic, loss, probe)
    losses = loss(agent.critic, probe)  # [C, 6]
    for i in range(6):
        ref = torch.autograd.grad(losses[:, i].sum(), list(agent.critic.parameters()), retain_graph=True)
        for (name, g), r in zip(grads.items(), ref):
            torch.testing.assert_close(g[i], r, atol=1e-5, rtol=1e-5, msg=name)
    sac, buf = _agent_and_buffer()
    batch, noise = probe_batch(sac, buf, 12, [0, 1], tick=0)
    loss, probe = network_loss(sac, "critic", batch, noise)
    coupled = gradient_grams(sac.critic, loss, probe, example_dim=1, method="jacobian")
    for key, k in gradient_grams(sac.critic, loss, probe, example_dim=1, method="func").items():
        torch.testing.assert_close(coupled[key], k, rtol=1e-5, atol=1e-6 * float(k.abs().max()))


def test_crossqs_diagnostics_differentiate_its_coupled_loss():
    agent, buf = _built_in_agent("crossq")
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    batch, noise = probe_batch(agent, buf, 16, [0, 1], tick=2)
    reports = agent_diagnostics(agent, batch, noise, DiagnosticsConfig(histograms=False))
    assert all(torch.equal(before[k], v) for k, v in agent.state_dict().items())
    erank = reports["critic"].scalars["grad_rank/critic/erank"]
    assert erank.shape == (4,) and bool(((erank > 1) & (erank <= 16)).all())


# --------------------------------------------------------------------------- low-rank gradient lab

N, D, M = 375, 500, 625
LAB_SEEDS = (0, 1, 2)


def _lab(seed, nu, scaling, activation):
    g = torch.Generator().manual_seed(seed)
    data = spiked_data(N, D, nu, alpha=0.0, generator=g)
    return lab_alignments(TwoLayer(D, M, scaling, activation, generator=g), data)


def test_lab_gradient_matches_its_closed_form():
    g = torch.Generator().manual_seed(0)
    data = spiked_data(40, 30, 0.25, alpha=0.5, target="triple_index", generator=g)
    model = TwoLayer(30, 50, "ntk", "tanh", generator=g)
    grad, r = mse_gradient(model, data)
    pre = data.x @ model.weight.detach().T
    ref = model.gamma / 40 * ((r[:, None] * model.a[None, :]) * (1 - torch.tanh(pre) ** 2)).T @ data.x
    torch.testing.assert_close(grad, ref)


@pytest.mark.parametrize("seed", LAB_SEEDS)
def test_small_spike_gradient_aligns_with_the_residue_direction(seed):
    out = _lab(seed, 0.0, "ntk", "tanh")  # measured over seeds 0–7: ≥ 0.997; σ1/σ5 ≥ 14
    assert out["residue"] > 0.95
    assert out["singular_values"][0] / out["singular_values"][4] > 5


@pytest.mark.parametrize("seed", LAB_SEEDS)
def test_large_spike_gradient_aligns_with_the_spike(seed):
    out = _lab(seed, 0.75, "ntk", "relu")  # measured over seeds 0–7: ≥ 0.9999
    assert out["spike"] > 0.95


@pytest.mark.parametrize("seed", LAB_SEEDS)
def test_mean_field_aligns_with_the_target_direction_and_ntk_less(seed):
    mf, ntk = _lab(seed, 0.0, "mf", "relu"), _lab(seed, 0.0, "ntk", "relu")
    # measured over seeds 0–7: MF ≥ 0.993; NTK 0.34–0.75 (mean 0.58)
    assert mf["target"] > 0.95
    assert ntk["target"] < 0.85 and mf["target"] - ntk["target"] > 0.15


def test_top_direction_alignment_finds_a_planted_direction_on_either_side():
    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(20, generator=g), torch.randn(30, generator=g)
    grad = 5 * torch.outer(u, v) / (u.norm() * v.norm()) + 0.01 * torch.randn(20, 30, generator=g)
    assert top_direction_alignment(grad, v) > 0.999
    assert top_direction_alignment(grad, u, side="left") > 0.999
    assert top_direction_alignment(grad, torch.randn(30, generator=g)) < 0.7
    with pytest.raises(ValueError, match="v has length 20"):
        top_direction_alignment(grad, u)


# --------------------------------------------------------------------------------- runner and CLI


@pytest.mark.slow
def test_training_with_diagnostics_is_identical_logs_the_tags_and_can_be_diagnosed(tmp_path, capsys):
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from conftest import SMALL
    from sac_spectral.apps.rl.diagnose import main as diagnose_main
    from sac_spectral.apps.rl.train import main as train_main
    from sac_spectral.runs.checkpoint import load_checkpoint
    from sac_spectral.runs.cli import run_cli
    from sac_spectral.runs.layout import CHECKPOINT

    args = [*SMALL, "random_steps=200", "eval_every=0", "log_every=100", "buffer_size=5000", "total_steps=450",
            "num_seeds=2", "critic.num_critics=3"]
    off, on = tmp_path / "off", tmp_path / "on"
    assert run_cli(train_main, [*args, "diagnostics.every=0", f"run_dir={off}"]) == 0
    assert run_cli(train_main, [*args, "diagnostics.every=60", "diagnostics.batch_size=48", f"run_dir={on}"]) == 0
    a, b = load_checkpoint(off / CHECKPOINT), load_checkpoint(on / CHECKPOINT)
    for key in ("modules",):
        assert all(torch.equal(a["agent"][key][k], b["agent"][key][k]) for k in a["agent"][key])
    for p in a["streams"]:
        assert all(torch.equal(x, y) for x, y in zip(a["streams"][p], b["streams"][p]))
    assert torch.equal(a["torch_rng"], b["torch_rng"])

    events = EventAccumulator(str(on), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    scalars, hists = set(events.Tags()["scalars"]), set(events.Tags()["histograms"])
    assert {"grad_rank/critic/erank", "seed1/grad_rank/actor/cond", "features/critic/erank",
            "dormant/actor/fraction", "spectral/critic/layer2/cond"} <= scalars
    # untrained (end of warm-up), then every 60
    assert [e.step for e in events.Scalars("grad_rank/critic/erank")] == [200, 260, 320, 380, 440]
    assert {"seed0/spectra/critic/grad", "seed1/spectra/actor/layer0"} <= hists
    quiet = EventAccumulator(str(off))
    quiet.Reload()
    assert not any(t.startswith("grad_rank/") for t in quiet.Tags()["scalars"])

    capsys.readouterr()
    assert run_cli(diagnose_main, [str(on), "--batch-size", "32", "--json", str(tmp_path / "d.json")]) == 0
    out = capsys.readouterr().out
    assert "grad_rank/critic/erank" in out and "probe batch of 32 transitions" in out
    values = json.loads((tmp_path / "d.json").read_text())["values"]
    assert len(values["grad_rank/critic/erank"]) == 2 and 1 <= values["grad_rank/critic/erank"][0] <= 32
    assert run_cli(diagnose_main, [str(on), "--q-scale", "1", "--json", str(tmp_path / "q.json")]) == 0
    q = json.loads((tmp_path / "q.json").read_text())["values"]
    assert len(q["q_scale/q_mean"]) == len(q["q_scale/mc_return"]) == 2
    assert all(math.isfinite(v) for v in q["q_scale/q_mean"] + q["q_scale/mc_return"])
    assert run_cli(diagnose_main, [str(on), "--q-scale", "-1"]) == 2
    assert run_cli(diagnose_main, [str(tmp_path / "missing")]) == 2
    assert "is not a run directory" in capsys.readouterr().err


@pytest.mark.parametrize("name, shape", [("mlp", (1, 8, 8)), ("cnn", (1, 8, 8))])
def test_supervised_models_expose_their_hidden_features(name, shape):
    model = build_model(name, shape, 10)
    x = torch.randn(32, *shape, generator=torch.Generator().manual_seed(0))
    feats = hidden_activations(model, x)
    assert len(feats) >= 2 and all(f.shape[0] == 32 for f in feats)
    report = model_diagnostics(model, lambda out, y: torch.nn.functional.cross_entropy(out, y, reduction="none"),
                               x, torch.randint(10, (32,)), "model", 0.1)
    assert {"features/model/erank", "dormant/model/fraction", "grad_rank/model/erank"} <= set(report.scalars)
