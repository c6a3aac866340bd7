"""Interventions (spectral_norm, shrink_perturb, redo, reset) against loop references, torch's own
initializers and torch.linalg; every method's members are independent."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sac_spectral.core.nets import BatchedMLP
from sac_spectral.core.reinit import draw
from sac_spectral.regularizers import REGISTRY, ReDo, Reset, ShrinkPerturb, SpectralNorm


def _adam_steps(model, x, steps, regs=(), lr=1e-2, seed=0, start=1):
    """``steps`` Adam updates of a member-independent regression loss, with ``regs`` hooked in."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for reg in regs:
        reg.attach(opt)
        reg.set_probe(lambda: x)
    y = torch.randn(model(x).shape[1:], generator=torch.Generator().manual_seed(seed))
    for step in range(start, start + steps):
        loss = (model(x) - y).square().sum()
        for reg in regs:
            if reg.has_penalty:
                loss = loss + reg.penalty()
        opt.zero_grad()
        loss.backward()
        opt.step()
        for reg in regs:
            reg.after_step(step)
    return opt


def _clone_gens(gens):
    out = []
    for g in gens:
        c = torch.Generator()
        c.set_state(g.get_state())
        out.append(c)
    return out


def _snapshot(model, opt):
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = {n: {k: v.clone() for k, v in opt.state[p].items()} for n, p in model.named_parameters()}
    return params, state


# ----------------------------------------------------------------------------- spectral_norm
@pytest.mark.parametrize(
    "build",
    [
        lambda: (BatchedMLP(3, 6, [32, 32], 4, init="torch"), torch.randn(16, 6)),
        lambda: (BatchedMLP(2, 6, [32], 4, layer_norm=True), torch.randn(16, 6)),
        lambda: (nn.Sequential(nn.Conv2d(2, 5, 3), nn.ReLU(), nn.Flatten(), nn.Linear(80, 3)), torch.randn(8, 2, 6, 6)),
    ],
    ids=["member-batched", "layernorm", "conv"],
)
@pytest.mark.parametrize("seed", [0, 1, 12])
def test_spectral_norm_keeps_sigma_max_at_one_after_every_step(build, seed):
    """Large Adam steps from an orthogonal init (all σ equal, so the power vectors start anywhere)."""
    torch.manual_seed(seed)
    model, x = build()
    reg = SpectralNorm(model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    for step in range(1, 31):
        (model(x) - 1.0).square().sum().backward()
        opt.step()
        opt.zero_grad()
        reg.after_step(step)
        for view in reg.views:
            w = view.weight().detach()
            sigma = w.abs().amax(dim=1) if view.kind == "norm" else torch.linalg.matrix_norm(w, ord=2)
            assert sigma.shape == (view.members,)
            assert torch.all(sigma <= 1 + 1e-3), (step, view.name, sigma)
            assert torch.all(sigma >= 1 - 1e-3), (step, view.name, sigma)


# ----------------------------------------------------------------------------- shrink_perturb
MODELS = {
    "linear": lambda: nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)),
    "member-batched": lambda: BatchedMLP(3, 5, [7, 6], 2, layer_norm=True),
    "conv": lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 2 * 2, 2)),
    "layernorm": lambda: nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(7), nn.ReLU(), nn.Linear(7, 3)),
}


@pytest.mark.parametrize("kind", list(MODELS))
def test_shrink_perturb_with_zero_shrink_and_noise_is_a_no_op(kind):
    model = MODELS[kind]()
    before = [p.detach().clone() for p in model.parameters()]
    reg = ShrinkPerturb(model, shrink=0.0, sigma=0.0, every=1)
    for step in range(1, 4):
        reg.after_step(step)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


def test_shrink_perturb_applies_the_formula_with_the_members_own_draws():
    model = BatchedMLP(2, 5, [7], 3, init="torch")
    reg = ShrinkPerturb(model, shrink=0.3, sigma=0.5, every=2)
    before = [p.detach().clone() for p in model.parameters()]
    reg.after_step(1)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    gens = _clone_gens(reg.generators)
    reg.after_step(2)
    for layer, (w0, b0) in zip(model.layers, zip(before[::2], before[1::2])):
        for m in range(2):
            eps_w, eps_b = draw(layer, gens[m])
            torch.testing.assert_close(layer.weight[m], 0.7 * w0[m] + 0.5 * eps_w, rtol=0, atol=1e-7)
            torch.testing.assert_close(layer.bias[m], 0.7 * b0[m] + 0.5 * eps_b, rtol=0, atol=1e-7)


def test_shrink_perturb_noise_has_the_initializers_statistics():
    """shrink = sigma = 1 replaces θ by the noise itself: compare it with the initializers."""
    batched = BatchedMLP(3, 64, [48], 32)  # orthogonal: every singular value = gain (√2 hidden, 1 output)
    before = [p.detach().clone() for p in batched.parameters()]
    ShrinkPerturb(batched, shrink=1.0, sigma=1.0).after_step(1)
    for layer, gain in zip(batched.layers, (math.sqrt(2.0), 1.0)):
        s = torch.linalg.svdvals(layer.weight.detach())
        torch.testing.assert_close(s, torch.full_like(s, gain), rtol=1e-5, atol=1e-5)
        assert torch.count_nonzero(layer.bias) == 0
        assert not torch.equal(layer.weight[0], layer.weight[1])  # each member its own draw
    assert not any(torch.equal(a, b) for a, b in zip(batched.parameters(), before) if a.abs().sum() > 0)

    lin = nn.Linear(300, 200)
    ShrinkPerturb(nn.Sequential(lin), shrink=1.0, sigma=1.0).after_step(1)
    torch.manual_seed(0)
    reference = nn.Linear(300, 200).weight.detach()  # torch's own default initializer
    q = torch.linspace(0.01, 0.99, 99)
    bound = 1 / math.sqrt(300)
    assert lin.weight.abs().max() <= bound
    torch.testing.assert_close(torch.quantile(lin.weight.detach(), q), torch.quantile(reference, q), rtol=0,
                               atol=0.03 * bound)


# ----------------------------------------------------------------------------- redo
def _mlp_features(net, x, m):
    """Post-activation features of every hidden layer of member ``m`` (a loop reference)."""
    feats, h = [], x
    for i, layer in enumerate(net.layers):
        h = F.linear(h, layer.weight[m], layer.bias[m])
        if net.norms is not None:
            h = F.layer_norm(h, (h.shape[-1],), net.norms[i].weight[m], net.norms[i].bias[m])
        h = torch.cat([F.relu(h), F.relu(-h)], -1) if net.activation == "crelu" else F.relu(h)
        feats.append(h)
    return feats


@pytest.mark.parametrize("activation, layer_norm", [("relu", False), ("crelu", True)])
def test_redo_recycles_exactly_the_dormant_units(activation, layer_norm):
    torch.manual_seed(0)
    net = BatchedMLP(2, 5, [12, 10], 3, activation=activation, layer_norm=layer_norm)
    x = torch.randn(64, 5)
    reg = ReDo(net, tau=0.1, every=4)
    opt = _adam_steps(net, x, 3, [reg])
    with torch.no_grad():  # make units dormant: member 0 layer 0 units 1, 4; member 1 layer 1 unit 2
        for m, layer, unit in ((0, 0, 1), (0, 0, 4), (1, 1, 2)):
            if layer_norm:
                net.norms[layer].weight[m, unit] = 0.0
                net.norms[layer].bias[m, unit] = 0.0
            else:
                net.layers[layer].bias[m, unit] = -100.0
    params, state = _snapshot(net, opt)
    gens = _clone_gens(reg.generators)

    with torch.no_grad():  # the reference: scores, then re-draws in the same order, on copies
        expected = {k: v.clone() for k, v in params.items()}
        exp_state = {k: {s: t.clone() for s, t in v.items()} for k, v in state.items()}
        dormant = {}
        for m in range(2):
            for i, f in enumerate(_mlp_features(net, x, m)):
                h = net.layers[i].out_features
                score = f.abs().mean(0).reshape(-1, h).mean(0)
                dormant[m, i] = torch.nonzero(score / score.mean() <= 0.1).flatten()
        assert set(dormant[0, 0].tolist()) >= {1, 4} and 2 in dormant[1, 1].tolist()
        for i in range(2):
            for m in range(2):
                d = dormant[m, i]
                if len(d) == 0:
                    continue
                w, b = net.layers[i].draw(gens[m])
                expected[f"layers.{i}.weight"][m][d] = w[d]
                expected[f"layers.{i}.bias"][m][d] = b[d]
                touched = [(f"layers.{i}.weight", (m, d)), (f"layers.{i}.bias", (m, d))]
                if layer_norm:
                    expected[f"norms.{i}.weight"][m][d] = 1.0
                    expected[f"norms.{i}.bias"][m][d] = 0.0
                    touched += [(f"norms.{i}.weight", (m, d)), (f"norms.{i}.bias", (m, d))]
                cols = torch.cat([d, d + net.layers[i].out_features]) if activation == "crelu" else d
                consumer = f"layers.{i + 1}.weight" if i + 1 < len(net.layers) else "heads.0.weight"
                expected[consumer][m][:, cols] = 0.0
                touched.append((consumer, (m, slice(None), cols)))
                for name, idx in touched:
                    for key in ("exp_avg", "exp_avg_sq"):
                        exp_state[name][key][idx] = 0.0

    reg.after_step(4)
    for name, p in net.named_parameters():
        assert torch.equal(p, expected[name]), name
        for key, value in opt.state[p].items():
            assert torch.equal(value, exp_state[name][key]), (name, key)
    counts = torch.tensor([sum(len(dormant[m, i]) for i in range(2)) for m in range(2)], dtype=torch.float32)
    torch.testing.assert_close(reg.metrics()["dormant_fraction"], counts / 22)


def test_redo_on_a_conv_net_recycles_channels_and_their_flattened_outgoing_block():
    torch.manual_seed(0)
    conv, lin = nn.Conv2d(2, 4, 3), nn.Linear(4 * 2 * 2, 3)
    model = nn.Sequential(conv, nn.ReLU(), nn.Flatten(), lin)
    x = torch.randn(32, 2, 4, 4)
    reg = ReDo(model, tau=0.05, every=2)
    opt = _adam_steps(model, x, 1, [reg])
    with torch.no_grad():
        conv.bias[1] = -100.0
    params, state = _snapshot(model, opt)
    w_new, b_new = draw(conv, _clone_gens(reg.generators)[0])
    reg.after_step(2)
    assert torch.equal(conv.weight[1], w_new[1]) and torch.equal(conv.bias[1], b_new[1])
    assert torch.count_nonzero(lin.weight[:, 4:8]) == 0
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.count_nonzero(opt.state[conv.weight][key][1]) == 0
        assert torch.count_nonzero(opt.state[lin.weight][key][:, 4:8]) == 0
    keep = [0, 2, 3]
    assert torch.equal(conv.weight[keep], params["0.weight"][keep])
    assert torch.equal(conv.bias[keep], params["0.bias"][keep])
    assert torch.equal(lin.weight[:, :4], params["3.weight"][:, :4])
    assert torch.equal(lin.weight[:, 8:], params["3.weight"][:, 8:])
    assert torch.equal(lin.bias, params["3.bias"])
    assert torch.equal(opt.state[conv.weight]["exp_avg"][keep], state["0.weight"]["exp_avg"][keep])


def test_redo_without_probe_or_optimizer_says_what_is_missing():
    net = BatchedMLP(1, 3, [4], 1)
    reg = ReDo(net, every=1)
    with pytest.raises(RuntimeError, match="attach"):
        reg.after_step(1)
    reg.attach(torch.optim.Adam(net.parameters()))
    with pytest.raises(RuntimeError, match="set_probe"):
        reg.after_step(1)


# ----------------------------------------------------------------------------- reset
def test_reset_redraws_the_last_layer_from_its_initializer_and_clears_its_optimizer_state():
    net = BatchedMLP(2, 6, [16, 16], 8)  # orthogonal: output layer's singular values are all 1
    x = torch.randn(32, 6)
    reg = Reset(net, every=3, last=1)
    opt = _adam_steps(net, x, 2, [reg])
    params, _ = _snapshot(net, opt)
    reg.after_step(3)
    out = net.heads[0]
    assert not torch.equal(out.weight, params["heads.0.weight"])
    s = torch.linalg.svdvals(out.weight.detach())
    torch.testing.assert_close(s, torch.ones_like(s), rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(out.bias) == 0
    assert out.weight not in opt.state and out.bias not in opt.state
    for name, p in net.named_parameters():
        if not name.startswith("heads.0"):
            assert torch.equal(p, params[name]) and p in opt.state, name
    assert reg.metrics()["resets"].item() == 1.0


def test_reset_of_a_plain_torch_model_draws_torchs_default_initializer():
    model = nn.Sequential(nn.Linear(200, 150), nn.ReLU(), nn.Linear(150, 2))
    x = torch.randn(16, 200)
    reg = Reset(model, every=1)
    opt = _adam_steps(model, x, 1, [reg])
    assert len(opt.state) == 0
    torch.manual_seed(1)
    reference = nn.Linear(200, 150).weight.detach()
    q = torch.linspace(0.01, 0.99, 99)
    bound = 1 / math.sqrt(200)
    assert model[0].weight.abs().max() <= bound and model[0].bias.abs().max() <= bound
    torch.testing.assert_close(torch.quantile(model[0].weight.detach(), q), torch.quantile(reference, q), rtol=0,
                               atol=0.03 * bound)


# ----------------------------------------------------------------------------- every method, per member
EVERY_METHOD = {
    "spectral": {"coef": 1e-2},
    "l2": {"coef": 1e-2},
    "l2_init": {"coef": 1e-2},
    "wasserstein_init": {"coef": 1e-2},
    "parseval": {"coef": 1e-2},
    "spectral_norm": {},
    "shrink_perturb": {"shrink": 0.1, "sigma": 0.1, "every": 2},
    "redo": {"tau": 0.6, "every": 2},
    "reset": {"every": 3, "last": 1},
    "plasticity_injection": {"at_step": 3},
    "nap": {"layers": "all"},
    "cbp": {"replacement_rate": 0.2, "maturity_threshold": 1, "decay_rate": 0.9},
}


def test_every_registered_method_is_covered_here():
    assert set(EVERY_METHOD) == set(REGISTRY)


@pytest.mark.parametrize("name", sorted(EVERY_METHOD))
def test_member_i_of_a_batched_network_evolves_as_the_single_member_network(name):
    """The state of member 0 never leaks into member 1: member 1 of a 2-member network trained
    with the method equals a 1-member network from the same generators and random streams."""
    big = BatchedMLP(2, 5, [16, 16], 3, activation="crelu", layer_norm=True,
                     generators=[torch.Generator().manual_seed(s) for s in (7, 8)])
    small = BatchedMLP(1, 5, [16, 16], 3, activation="crelu", layer_norm=True,
                       generators=[torch.Generator().manual_seed(8)])
    reg_big, reg_small = REGISTRY[name](big, **EVERY_METHOD[name]), REGISTRY[name](small, **EVERY_METHOD[name])
    if reg_big.generators:
        reg_big.seed_members([11, 12])
        reg_small.seed_members([12])
    x = torch.randn(32, 5, generator=torch.Generator().manual_seed(3))
    _adam_steps(big, x, 6, [reg_big])
    _adam_steps(small, x, 6, [reg_small])
    for (n, pb), ps in zip(big.named_parameters(), small.parameters()):
        torch.testing.assert_close(pb[1:], ps, rtol=1e-5, atol=1e-6, msg=n)
    for key, value in reg_big.metrics().items():
        if value.dim() == 1:
            torch.testing.assert_close(value[1:], reg_small.metrics()[key], rtol=1e-4, atol=1e-6, msg=key)
